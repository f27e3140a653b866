"""The naive replay step (the reference's ``replay_step`` in float32) with one replay bug planted each:

- ``NoFlush``: never writes the pool at a flush (the ring's end, or a verify's flush first); the lengths
  are reset as a flush resets them, so the ring's records are lost;
- ``DropsRecordDecay``: reads every slot's record 0 without its decay (its g taken as 0), as a kernel
  whose loop over the records starts one late in the decay's running sum;
- ``ReplayDrift``: each token's decay 0.5% too weak (``exp(g) * 1.005``), so the effective state comes
  out 0.5% too large each step and compounds through the records and the flushed checkpoints.
"""

from __future__ import annotations

import importlib
import math
from contextlib import contextmanager
from dataclasses import replace

import torch

from kda_impls.impls.naive import NaiveTorch

reference = importlib.import_module("kda_impls.reference")  # the module: kda_impls.reference is also a function


@contextmanager
def _log_decay(change):
    """``reference.log_decay`` with ``change`` applied to what it returns (``[B, HV, K]`` for a token's
    gate, ``[B, HV, L, K]`` for the records'), for the launch only: the checker's reference runs
    outside it."""
    real = reference.log_decay
    reference.log_decay = lambda inputs, a, dtype: change(real(inputs, a, dtype))
    try:
        yield
    finally:
        reference.log_decay = real


class _PlantedReplay(NaiveTorch):
    """A replay launcher around ``self.step(inputs)``: the step's output ``[B, T, HV, V]``, applied to
    ``inputs``' pool and cache."""

    library = "planted"

    def _replay_launcher(self, inputs, out):
        out_tokens = out.view(inputs.per_token_spelling().out_shape)

        def launch():
            out_tokens.copy_(self.step(inputs))
            return out

        return launch


class NoFlush(_PlantedReplay):
    name = "planted-noflush"

    def step(self, inputs):
        scratch = inputs.state.clone()  # where the flushes go: the pool itself is never written
        return reference.replay_step(replace(inputs, state=scratch), torch.float32)[0]


def _record_zero_undecayed(g):
    if g.dim() == 4:  # the records' decays, [B, HV, L, K]
        g = g.clone()
        g[:, :, 0] = 0
    return g


class DropsRecordDecay(_PlantedReplay):
    name = "planted-record-decay"

    def step(self, inputs):
        with _log_decay(_record_zero_undecayed):
            return reference.replay_step(inputs, torch.float32)[0]


class ReplayDrift(_PlantedReplay):
    name = "planted-replay-drift"
    factor = 1.005

    def step(self, inputs):
        with _log_decay(lambda g: g + math.log(self.factor)):
            return reference.replay_step(inputs, torch.float32)[0]
