"""The float64 reference of one KDA decode step: the semantics every implementation must match.

Multi-token decode (T tokens per row) follows the fla / vLLM / FlashInfer convention for chain
drafts: row i starts from slot ``slots[i, num_accepted[i] - 1]``, applies its T tokens in order
with the one-token rule, outputs every token, and stores the state after token t into
``slots[i, t]`` where that is >= 0; a row whose start slot is -1 is padding. The libraries read
the same arguments differently at the edges (from their source; neither has run here):

- fla-core 0.6.0, ``fused_recurrent_kda_fwd`` (``fla/ops/kda/fused_recurrent.py``) with
  ``ssm_state_indices`` ``[N, T]`` and ``num_accepted_tokens``: the same start slot (it steps
  through a row's indices as if they were contiguous, ignoring their token stride) and the same
  outputs, every token computed whatever num_accepted is; num_accepted is not range-checked; a -1
  is never special: a -1 start slot reads the slot before the pool, and a -1 among a row's slots
  stores that token's state there, outside the pool.
- FlashInfer 0.7.2.post1, ``recurrent_kda(num_spec_tokens=T-1, num_accepted_tokens=...)``,
  whose multi-token calls all run the grouped-CTA CuTe kernel under the default backend
  (``flashinfer/kda_kernels/recurrent_kda.py``, ``_grouped_kda_kernel``): num_accepted is
  clamped into [1, T] instead of refused; a -1 start slot reads slot 0 and the row's tokens whose
  slot is >= 0 still run from that state and are stored (a padding row must therefore have every
  slot -1, as engines send it: it then outputs zeros and writes nothing, as here); a -1 among a
  live row's slots skips that token altogether (no decay, no update, output 0) where here the
  token is applied and only its store is skipped. Its state is bf16 only, and under GVA its
  in-kernel gate reads ``A_log`` and ``dt_bias`` at the q/k head, as at T = 1.
- Both compute the outputs of the tokens before ``num_accepted - 1`` too, and FlashInfer's
  tests check those tokens' outputs and checkpoints only from ``num_accepted - 1`` on; here every
  token's output and every stored state is checked.

Frozen verify (``update_state=False``, any T) computes each row's T outputs exactly as the in-place
step does from the same start state and stores nothing: row i starts from ``S_0`` = slot
``slots[i]``, and token t's output is ``S_t q_t`` where ``S_t`` is the state after tokens 1..t
applied in order with the one-token rule (the states chain through the T tokens as in a T-token
in-place step; only their stores are skipped). Token t's output is therefore the output of token t
of an in-place T-token step from that slot, and of a frozen step of the first t tokens. A padding
row (slot -1) outputs zeros. This is FlashInfer 0.7.2.post1's ``recurrent_kda(...,
disable_state_update=True)`` in its batched ``[B, T, ...]`` form (``flashinfer/kda_decode.py``,
``_run_frozen_recurrent_kda``; ``flashinfer/kda_kernels/kda_decode_wy_output_only.py``), read from
its source: it takes one start slot per row (``initial_state_indices`` ``[B]``), refuses
``num_accepted_tokens``, and computes ``o_t = S_t q_t`` for up to 16 tokens from the read-only pool,
either by the serial recurrence in registers (its grouped kernel, small ``B*HV``) or by the same
recurrence in closed (WY) form on tensor cores; neither writes any state. Where it differs here: a
-1 slot there is no padding row (the grouped kernel reads slot 0 for it, the WY kernel's TMA load
is handed -1 as it is) and its row outputs what that state gives, not zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import DecodeInputs

L2_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def decode_step(inputs: DecodeInputs, S: torch.Tensor, compute_dtype: torch.dtype):
    """The math of one step on gathered state rows ``S`` ``[B, HV, V, K]`` (any slot order).

    Returns ``(out [B, HV, V], new S)`` in ``compute_dtype``; rows are not masked here.
    """
    HV, H = inputs.HV, inputs.H
    group = HV // H
    q = l2_normalize(inputs.q.to(compute_dtype)).repeat_interleave(group, dim=1) * inputs.effective_scale
    k = l2_normalize(inputs.k.to(compute_dtype)).repeat_interleave(group, dim=1)
    dt_bias = inputs.dt_bias.to(compute_dtype).reshape(HV, inputs.K)
    A = torch.exp(inputs.A_log.to(compute_dtype))[None, :, None]
    g = -A * F.softplus(inputs.a.to(compute_dtype) + dt_bias[None])  # [B, HV, K]
    beta = torch.sigmoid(inputs.b.to(compute_dtype))[..., None]  # [B, HV, 1]

    S = S.to(compute_dtype) * torch.exp(g)[:, :, None, :]  # decay along K
    u = beta * (inputs.v.to(compute_dtype) - torch.einsum("bhvk,bhk->bhv", S, k))
    S = S + u[..., None] * k[:, :, None, :]
    out = torch.einsum("bhvk,bhk->bhv", S, q)
    return out, S


def reference(inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, states)`` in float64 on the inputs' device; pure (the inputs are not modified).

    One-token spelling: ``out`` ``[B, HV, V]`` and ``states`` ``[B, HV, V, K]``, ``states[i]``
    being the state slot ``slots[i]`` must hold after the step. Per-token spelling (any T):
    ``out`` ``[B, T, HV, V]`` and ``states`` ``[B, T, HV, V, K]``, ``states[i, t]`` being the state
    of row i after its token t: what slot ``slots[i, t]`` must hold where it is >= 0. Each row
    starts from slot ``slots[i, num_accepted[i] - 1]`` and applies its T tokens in order, each with
    the one-token rule; every token's output is computed, whether or not its state is stored.
    Padding rows (start slot -1) have zeros in both. In frozen verify (``update_state=False``) row i
    starts from ``slots[i]`` and ``states[i, t]`` is the state after token t, which the step computes
    and does not store: nothing is compared with it.
    Float64 on a GPU is IEEE double as on the CPU; computing there keeps large grids fast.
    """
    live = inputs.live_rows()
    x = inputs.per_token_spelling()
    out = torch.empty(x.B, x.T, x.HV, x.V, dtype=torch.float64, device=x.device)
    states = torch.empty(x.B, x.T, x.HV, x.V, x.K, dtype=torch.float64, device=x.device)
    S = x.state[x.start_slots().clamp(min=0)]
    for t in range(x.T):
        out[:, t], S = decode_step(x.token(t), S, torch.float64)
        states[:, t] = S
    out[~live] = 0
    states[~live] = 0
    if not inputs.per_token:
        return out[:, 0], states[:, 0]
    return out, states
