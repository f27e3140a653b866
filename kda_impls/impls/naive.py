"""Plain torch ops in float32: the reference semantics, vectorised over batch and heads.

Runs wherever torch does (CPU and CUDA), any legal pool. It is a correctness baseline and the
floor any kernel must beat, not a fast path: each op materialises a [B, HV, V, K] temporary.
"""

from __future__ import annotations

import torch

from ..contract import Capabilities, Implementation
from ..inputs import DecodeInputs
from ..reference import decode_step


class NaiveTorch(Implementation):
    name = "naive"
    library = "torch"
    variant = "the semantics as vectorised torch ops in float32 (a baseline, one calling convention)"
    capabilities = Capabilities(devices=("cpu", "cuda"),
                                state_dtypes=(torch.bfloat16, torch.float16, torch.float32))

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        # Slot values were validated by bind(); resolving the live rows here keeps the launcher
        # free of the host sync that boolean masking would cost.
        live_rows = torch.nonzero(inputs.slots >= 0).flatten()
        dead_rows = torch.nonzero(inputs.slots < 0).flatten()
        live_slots = inputs.slots[live_rows].long()
        read_slots = inputs.slots.long().clamp(min=0)  # -1 rows read slot 0 and discard it
        state = inputs.state

        def launch() -> torch.Tensor:
            o, S = decode_step(inputs, state[read_slots], torch.float32)
            state[live_slots] = S[live_rows].to(state.dtype)  # in place through the strided view
            out.copy_(o)
            out.index_fill_(0, dead_rows, 0)
            return out

        return launch
