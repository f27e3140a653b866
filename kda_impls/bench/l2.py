"""The L2 state a timed call starts from: the named entry states, the op that makes each, and the
rotation of input sets the default state is made by (docs/timing.md, "The L2 entry state")."""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from ..inputs import DecodeInputs

# What the L2 holds when a timed call starts. docs/timing.md sets them against a decode layer
# (results/h200/timing-evidence/l2-entry.md) and says why the default is the rotation: with an op between calls the
# timer must take the op out, and a subtraction also charges the call for the write-back of the
# lines it left dirty, which the op after it pays (+1 us at B=1, +23% at B=64 on the H200).
ENTRY_STATES = {
    "clean": "clean lines of unrelated data: a read of 3x the L2 runs before every call (the weight "
             "reads of the projections that precede the step in a decode layer leave the L2 so); the op "
             "is taken out by subtraction, which charges the call the write-back of its dirty lines",
    "dirty": "dirty lines of unrelated data: a write of 3x the L2 runs before every call, so the "
             "call pays for writing them back; the op is taken out by subtraction",
    "previous-step": "what the previous steps of other layers left (their pools' last lines, dirty): calls "
                     "rotate over input sets adding up to 3x the L2, nothing between them; steps too "
                     "small for that within MAX_INPUT_SETS sets get the dirty write before every call",
    "hot": "this step's own data, where it fits: one input set called back to back",
}
DEFAULT_ENTRY = "previous-step"

FLUSH_FACTOR = 3  # the entry ops touch this many L2s of bytes
COLD_FACTOR = 3  # previous-step: input sets rotate until their bytes are this many L2s
MIN_INPUT_SETS = 2  # previous-step: consecutive calls in a model update different layers' pools
MAX_INPUT_SETS = 256  # steps under ~0.7 MB (smoke shapes) would need more: they get the dirty write


def as_device(device) -> torch.device:
    """``device`` with the CUDA index made explicit (caches keyed by device need one spelling)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def l2_bytes(device) -> int:
    """The GPU's L2 size in bytes; 0 on the CPU, whose caches these timers do not model."""
    device = as_device(device)
    return torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0


@functools.cache
def _flush_buffers(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    buffer = torch.empty(FLUSH_FACTOR * l2_bytes(device) // 4, dtype=torch.float32, device=device)
    buffer.uniform_()
    return buffer, torch.empty((), dtype=torch.float32, device=device)


def entry_op(entry: str, device) -> Callable[[], None] | None:
    """What runs before each call to leave the L2 in state ``entry``: a read of 3x the L2 (clean
    lines), a write (dirty lines), or nothing (the rotation or the call itself makes the state).
    Graph-capturable: it allocates nothing."""
    device = as_device(device)
    if entry not in ENTRY_STATES:
        raise ValueError(f"unknown L2 entry state {entry!r}; one of {', '.join(ENTRY_STATES)}")
    if device.type != "cuda" or entry in ("previous-step", "hot"):
        return None
    buffer, total = _flush_buffers(device)
    if entry == "clean":
        return lambda: torch.sum(buffer, dim=0, out=total)
    return lambda: buffer.fill_(1.0)


def working_set_bytes(inputs: DecodeInputs) -> int:
    """Bytes of the pool's whole span (slots and the padding between them) and every other input, a
    replay step's cache included."""
    cache = sum(t.nbytes for t in inputs.cache.tensors().values()) if inputs.replay else 0
    return inputs.pool_span().nbytes + inputs.bytes_besides_pool() + cache


def rotation_inputs(entry: str, first: DecodeInputs, device) -> tuple[str, list[DecodeInputs]]:
    """(the entry state the timers make, the input sets one placement rotates over): ``first`` and
    the copies of it :func:`rotation_plan` asks for."""
    made, sets = rotation_plan(entry, first, device)
    return made, [first] + [first.clone() for _ in range(sets - 1)]


def rotation_plan(entry: str, inputs: DecodeInputs, device) -> tuple[str, int]:
    """(the entry state the timers make, input sets per placement) for ``entry`` on steps like
    ``inputs``. One set, except for ``previous-step``, whose sets add up to COLD_FACTOR L2s and are
    at least two (consecutive calls in a model update different layers' pools; on the H200 a single
    pool updated back to back cost fp32 Triton 9% at B >= 256); a step too small for that within
    MAX_INPUT_SETS sets is timed as one set after the dirty write instead. On the CPU: ("none", 1)."""
    if as_device(device).type != "cuda":
        return "none", 1  # the CPU's caches are not modelled
    if entry != "previous-step":
        return entry, 1
    l2 = l2_bytes(device)
    sets = max(MIN_INPUT_SETS, math.ceil(COLD_FACTOR * l2 / working_set_bytes(inputs))) if l2 else 1
    return ("dirty", 1) if sets > MAX_INPUT_SETS else (entry, sets)
