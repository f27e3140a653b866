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

from dataclasses import replace

import torch
import torch.nn.functional as F

from .inputs import DecodeInputs

L2_EPS = 1e-6
# Softplus is linear past this (torch's threshold too): exp would overflow long before it matters.
SOFTPLUS_LINEAR_ABOVE = 20.0


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def log_decay(inputs: DecodeInputs, a: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` for raw gate inputs ``a``: a step's ``[B, HV, K]``,
    or records' ``[B, HV, L, K]``."""
    HV = inputs.HV
    dt_bias = inputs.dt_bias.to(compute_dtype).reshape(HV, inputs.K)
    A = torch.exp(inputs.A_log.to(compute_dtype))
    if a.dim() == 4:  # [B, HV, L, K]: value heads before the records
        return -A[:, None, None] * F.softplus(a.to(compute_dtype) + dt_bias[:, None], threshold=SOFTPLUS_LINEAR_ABOVE)
    return -A[:, None] * F.softplus(a.to(compute_dtype) + dt_bias, threshold=SOFTPLUS_LINEAR_ABOVE)


def _token_math(inputs: DecodeInputs, S: torch.Tensor, compute_dtype: torch.dtype):
    """``(out [B, HV, V], new S, u [B, HV, V])`` of one token on gathered rows ``S``; u is the
    beta-scaled delta (a replay record)."""
    group = inputs.HV // inputs.H
    q = l2_normalize(inputs.q.to(compute_dtype)).repeat_interleave(group, dim=1) * inputs.effective_scale
    k = l2_normalize(inputs.k.to(compute_dtype)).repeat_interleave(group, dim=1)
    g = log_decay(inputs, inputs.a, compute_dtype)  # [B, HV, K]
    beta = torch.sigmoid(inputs.b.to(compute_dtype))[..., None]  # [B, HV, 1]

    S = S.to(compute_dtype) * torch.exp(g)[:, :, None, :]  # decay along K
    u = beta * (inputs.v.to(compute_dtype) - torch.einsum("bhvk,bhk->bhv", S, k))
    S = S + u[..., None] * k[:, :, None, :]
    out = torch.einsum("bhvk,bhk->bhv", S, q)
    return out, S, u


def decode_step(inputs: DecodeInputs, S: torch.Tensor, compute_dtype: torch.dtype):
    """The math of one step on gathered state rows ``S`` ``[B, HV, V, K]`` (any slot order).

    Returns ``(out [B, HV, V], new S)`` in ``compute_dtype``; rows are not masked here.
    """
    out, S, _ = _token_math(inputs, S, compute_dtype)
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
    In replay (``cache`` given) ``states[i, t]`` is row i's state after its token t from its slot's
    effective state after its commit (T = 1: the slot's new effective state, before a flush rounds it
    to the pool's dtype), and neither the pool
    nor the cache of ``inputs`` is modified (:func:`replay_step` runs on a copy).
    Float64 on a GPU is IEEE double as on the CPU; computing there keeps large grids fast.
    """
    if inputs.replay:
        out, states = replay_step(inputs.clone(), torch.float64)
        return (out, states) if inputs.per_token else (out[:, 0], states[:, 0])
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


# ---- replay -------------------------------------------------------------------------------------
def _effective(inputs: DecodeInputs, slots: torch.Tensor, n: torch.Tensor, compute_dtype: torch.dtype):
    """The effective states ``[len(slots), HV, V, K]`` of ``slots`` (int64, >= 0) after the first ``n``
    (int64 per slot) of their records: ``S_0 * exp(G_n) + sum_{j<n} u_j (k^_j * exp(G_n - G_j))^T``.
    Records at and past ``n`` are never read into the result (they may hold anything, NaN included)."""
    cache, K = inputs.cache, inputs.K
    S0 = inputs.state[slots].to(compute_dtype)
    kept = (torch.arange(cache.L, device=slots.device)[None, :] < n[:, None])[:, None, :, None]  # [B, 1, L, 1]
    kg = cache.kg[slots]
    k = torch.where(kept, l2_normalize(kg[..., :K].to(compute_dtype)), 0)
    G = torch.where(kept, log_decay(inputs, kg[..., K:], compute_dtype), 0).cumsum(dim=2)  # [B, HV, L, K]
    G_n = G[:, :, -1:]  # records past n add no decay
    u = torch.where(kept, cache.u[slots].to(compute_dtype), 0)
    return S0 * torch.exp(G_n) + torch.einsum("bhlv,bhlk->bhvk", u, k * torch.exp(G_n - G))


def effective_state(inputs: DecodeInputs) -> torch.Tensor:
    """Every slot's effective state in float64, ``[N, HV, V, K]``: its checkpoint in the pool carried
    through its ``cache.length`` records."""
    slots = torch.arange(inputs.N, device=inputs.device)
    return _effective(inputs, slots, inputs.cache.length.long(), torch.float64)


def replay_step(inputs: DecodeInputs, compute_dtype: torch.dtype):
    """One replay step applied to ``inputs.state`` and ``inputs.cache`` in place: the semantics.

    Returns ``(out [B, T, HV, V], states [B, T, HV, V, K])`` in ``compute_dtype``, zero at padding
    rows. For each live row i, slot ``s = slots[i]``, ``n = length[s]`` cached records, in this order:

    1. commit: ``n += num_accepted[i]`` (0 where num_accepted is None): the records a verify left at
       ``[n, n + num_accepted)`` become part of the state (the contract holds ``n <= L``);
    2. flush first: where ``n + T > L`` (the T records would not fit after the cached ones; at T = 1
       only a commit that filled the ring) the effective state is written into the pool slot in the
       pool's dtype and ``n = 0``: the state is from then on what the pool holds;
    3. tokens: from the effective state, the T tokens in order with the one-token rule (the in-place
       step's math), each token's output and state; token t's record (``u`` in fp32, its raw key and
       raw gate input in the activations' dtype) is written at position ``n + t``;
    4. T = 1 (decode): the record is committed, ``n += 1``, and where that fills the ring (n = L) the
       new effective state is written into the pool slot in the pool's dtype and ``n = 0``. T > 1
       (speculative verify): the records are left uncommitted for the next step's ``num_accepted``;
    5. ``length[s] = n``. No other slot, record or length is written, and the pool slot only at a flush.
    """
    x = inputs.per_token_spelling()
    cache, T, L = x.cache, x.T, x.cache.L
    live = x.live_rows()
    rows = torch.nonzero(live).flatten()
    slots = x.slots.long()[rows]
    n = cache.length.long()[slots]
    if x.num_accepted is not None:
        n = n + x.num_accepted.long()[rows]
    S = _effective(x, slots, n, compute_dtype)
    first = n + T > L
    if first.any():
        x.state[slots[first]] = S[first].to(x.state.dtype)
        S[first] = x.state[slots[first]].to(compute_dtype)
        n = torch.where(first, 0, n)
    out = torch.zeros(x.B, T, x.HV, x.V, dtype=compute_dtype, device=x.device)
    states = torch.zeros(x.B, T, x.HV, x.V, x.K, dtype=compute_dtype, device=x.device)
    group = x.HV // x.H
    for t in range(T):
        token = x.token(t)
        o, S, u = _token_math(_rows(token, rows), S, compute_dtype)
        out[rows, t], states[rows, t] = o, S
        cache.u[slots, :, n + t] = u.to(torch.float32)
        cache.kg[slots, :, n + t, :x.K] = token.k[rows].repeat_interleave(group, dim=1)
        cache.kg[slots, :, n + t, x.K:] = token.a[rows]
    if T == 1:
        n = n + 1
        full = n == L
        x.state[slots[full]] = S[full].to(x.state.dtype)
        n = torch.where(full, 0, n)
    cache.length[slots] = n.to(torch.int32)
    return out, states


def _rows(token: DecodeInputs, rows: torch.Tensor) -> DecodeInputs:
    """A one-token step's rows ``rows`` (its activations indexed; the gate parameters shared)."""
    return replace(token, q=token.q[rows], k=token.k[rows], v=token.v[rows], a=token.a[rows], b=token.b[rows])
