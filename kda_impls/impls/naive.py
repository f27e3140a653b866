"""Plain torch ops in float32: the reference semantics, vectorised over batch and heads.

Runs wherever torch does (CPU and CUDA), any legal pool, any number of tokens per step (one
vectorised step per token), in place or frozen verify (the same steps, no store), and replay (the
reference's ``replay_step`` in float32: the effective state materialised from the checkpoint and the
records, one host sync per launch to select the rows that flush). It is a correctness baseline and
the floor any kernel must beat, not a fast path: each op materialises a [B, HV, V, K] temporary.
"""

from __future__ import annotations

import torch

from ..contract import Capabilities, Implementation
from ..inputs import DecodeInputs
from ..reference import decode_step, replay_step


class NaiveTorch(Implementation):
    name = "naive"
    library = "torch"
    variant = "the semantics as vectorised torch ops in float32 (a baseline, one calling convention)"
    capabilities = Capabilities(devices=("cpu", "cuda"),
                                state_dtypes=(torch.bfloat16, torch.float16, torch.float32), max_tokens=None,
                                frozen=True, replay=True)

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        if inputs.replay:
            return self._replay_launcher(inputs, out)
        # Slot values were validated by bind(); resolving the rows and slots here keeps the launcher
        # free of the host sync that boolean masking would cost.
        x = inputs.per_token_spelling()
        out_tokens = out.view(x.out_shape)
        dead_rows = torch.nonzero(~x.live_rows()).flatten()
        read_slots = x.start_slots().clamp(min=0)  # padding rows read slot 0 and discard it
        stored, token_slots = x.stored(), x.token_slots()
        # per token: its inputs, the rows that store its state, and where (none in frozen verify)
        steps = [(x.token(t), torch.nonzero(stored[:, t]).flatten(), token_slots[:, t][stored[:, t]].long())
                 for t in range(x.T)]
        state = x.state

        def launch() -> torch.Tensor:
            S = state[read_slots]  # every row's start state, read before any token stores
            for t, (token, rows, slots) in enumerate(steps):
                o, S = decode_step(token, S, torch.float32)
                if rows.numel():
                    state[slots] = S[rows].to(state.dtype)  # in place through the strided view
                out_tokens[:, t].copy_(o)
            out_tokens.index_fill_(0, dead_rows, 0)
            return out

        return launch

    def _replay_launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        out_tokens = out.view(inputs.per_token_spelling().out_shape)

        def launch() -> torch.Tensor:
            out_tokens.copy_(replay_step(inputs, torch.float32)[0])
            return out

        return launch
