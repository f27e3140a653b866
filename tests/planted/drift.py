"""The naive decode whose state comes out 0.5% too large each step (computed in fp32, scaled, then
stored in the pool's dtype): within the one-step bf16 tolerance (1e-2), and in decode compounding
over every step after it. In-place decode and frozen verify only: it refuses replay (planted/replay.py
has replay's drift)."""

from dataclasses import replace

import torch

from kda_impls.impls.naive import NaiveTorch
from kda_impls.reference import decode_step


class Drift(NaiveTorch):
    name = "planted-drift"
    library = "planted"
    factor = 1.005
    capabilities = replace(NaiveTorch.capabilities, replay=False)

    def _launcher(self, inputs, out):
        x = inputs.per_token_spelling()
        out_tokens = out.view(x.out_shape)
        live = x.live_rows()
        read_slots = x.start_slots().clamp(min=0)
        stored = x.stored()
        state = x.state

        def launch():
            S = state[read_slots]
            for t in range(x.T):
                o, S = decode_step(x.token(t), S, torch.float32)
                slots = x.slots[:, t][stored[:, t]].long()
                state[slots] = (S[stored[:, t]] * self.factor).to(state.dtype)  # the output keeps the true state
                out_tokens[:, t].copy_(o)
            out_tokens[~live] = 0
            return out

        return launch
