"""Our Triton kernels' replay step (any T <= L, with a commit): outputs from the checkpoint and the records.

No kernel forms the effective state ``E`` (``kda_impls/replay.py``) except at a flush: a token needs
only ``E_dec k^`` and ``E_dec q^`` (``E_dec`` the state before the token, decayed by its gate), and
with ``G'`` the log decay from the checkpoint through this token's gate and ``w_j = k^_j *
exp(G' - G_j)`` over every record j before the token those are

    E_dec x = S_0 (exp(G') * x) + sum_j u_j (w_j . x)        (x = k^ or q^)

a pass over the checkpoint (two reductions) and one over the records. The record terms ``w_j . x``
depend on the keys and gates only, not on the value rows; the deltas ``u_j`` on the rows only.

**A one-token step** (decode) is one program per row and head. It walks the committed key/gate
records newest first (the records past the commit are never read), forming the record terms ``w_j .
k^`` and ``w_j . q^`` in registers, and writes the token's key/gate record at ``n``; then it streams
the checkpoint's ``BV``-row tiles through shared memory, ``stages - 1`` tiles' loads in flight
(bytes in flight that hold no registers: the step reads the state and writes none of it, so a
program must keep more of it in flight than the in-place kernel's to move bytes as fast), and per
tile adds ``sum_j u_j (w_j . x)`` from the deltas' ``[LP, BV]`` tile, stores the output and the
token's delta record. Where the record fills the ring, the program then forms the new effective
state ``S_0 exp(G') + sum_j u_j w_j^T`` (the token's record among the j) in 4-row pieces, re-reading
the checkpoint (a loop over the records, on the flush only: holding the streamed tiles for it would
cost the stream its registers), and stores it into the pool; else the pool is not written. The
record work is done once a head, not once a V-tile.

**A verify** (T > 1) is one fused launch: each program of a row, head and V-tile holds the records'
tiles, then appends each token of the step to them as the record the next token reads (its delta
depends on the previous tokens' deltas, so the tokens chain through the value rows); each token's
record (``u`` fp32, the raw key and gate input) is written at ``n + t``.

A flush first (``n + T > L`` after the commit) is a launch of its own before either form: every
V-tile program of a row reads the row's committed key/gate records while the step writes the new ones
over them from position 0, and a program cannot wait for the others of its row, but the next launch
can; it runs only where a commit or T > 1 can make one (a one-token step without a commit never
does). Then the step, which finds a flushed row's state in the pool and its ring empty. The lengths
advance last (one program per row), as every program of a row reads its length.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...inputs import DecodeInputs
from ...reference import L2_EPS, SOFTPLUS_LINEAR_ABOVE

_LINEAR_ABOVE = tl.constexpr(SOFTPLUS_LINEAR_ABOVE)  # a global a kernel reads must be a constexpr
REPLAY_CONFIG_ENV = "KDA_TRITON_REPLAY_CONFIG"


@triton.jit
def _log_decay(a, dt_bias, A):
    x = a + dt_bias
    return -A * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))


@triton.jit
def _normalised(x, L2_EPS: tl.constexpr):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + L2_EPS)


@triton.jit
def _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K: tl.constexpr, L2_EPS: tl.constexpr):
    """The first ``n`` key/gate records of a slot's head as register tiles: ``(k^ [LP, K], G_j [LP, K],
    G_n [K])``, rows at and past ``n`` zero (never loaded)."""
    kept = offs_l[:, None] < n
    kg_rows = kg_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :]
    in_k = kept & (offs_k[None, :] < K)
    g = tl.where(in_k, _log_decay(tl.load(kg_rows + K, mask=in_k, other=0.0).to(tl.float32), dt_bias[None, :], A), 0.0)
    k = tl.load(kg_rows, mask=in_k, other=0.0).to(tl.float32)
    k_hat = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]
    return k_hat, tl.cumsum(g, axis=0), tl.sum(g, axis=0)


@triton.jit
def _committed_deltas(u_ptr, records, n, offs_l, offs_v, V: tl.constexpr):
    """The first ``n`` delta records of a slot's head, this program's value rows: ``[LP, BV]``, rows at
    and past ``n`` zero (never loaded)."""
    in_v = (offs_l[:, None] < n) & (offs_v[None, :] < V)
    return tl.load(u_ptr + (records + offs_l)[:, None] * V + offs_v[None, :], mask=in_v, other=0.0)


@triton.jit
def _carried(S0, G, u_ptr, kg_ptr, records, count, dt_bias, A, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr,
             L2_EPS: tl.constexpr):
    """``S_0 exp(G) + sum_{j<count} u_j (k^_j exp(G - G_j))^T`` over the first ``count`` records in memory:
    the state they carry, decayed through ``G``, formed only for a flush (one record a loop step)."""
    E = S0 * tl.exp(G)[None, :]
    G_j = tl.zeros([K], dtype=tl.float32)
    for j in range(0, count):
        kg_row = kg_ptr + (records + j) * 2 * K
        G_j += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
        w_j = _normalised(tl.load(kg_row + offs_k).to(tl.float32), L2_EPS) * tl.exp(G - G_j)
        E += tl.load(u_ptr + (records + j) * V + offs_v)[:, None] * w_j[None, :]
    return E


@triton.jit
def _flush_first_kernel(
    A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, u_ptr, kg_ptr, length_ptr, slot_stride,
    T: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr,
    LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)
        if n + T > L:
            offs_k = tl.arange(0, K)
            offs_v = (pid % (V // BV)) * BV + tl.arange(0, BV)
            dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
            A = tl.exp(tl.load(A_log_ptr + hv))
            records = (s * HV + hv) * L
            G = _committed_keys(kg_ptr, records, n, dt_bias, A, tl.arange(0, LP), offs_k, K, L2_EPS)[2]
            tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
            E = _carried(tl.load(tile).to(tl.float32), G, u_ptr, kg_ptr, records, n, dt_bias, A, offs_k, offs_v, K, V,
                         L2_EPS)
            tl.store(tile, E.to(state_ptr.dtype.element_ty))


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr,
    kg_ptr, length_ptr, slot_stride, scale, T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    v_tile = pid % (V // BV)
    offs_k = tl.arange(0, K)
    offs_v = v_tile * BV + tl.arange(0, BV)
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        for t in range(T):
            tl.store(out_ptr + ((row * T + t) * HV + hv) * V + offs_v,
                     tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
    else:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)  # the commit
        n = tl.where(n + T > L, 0, n)  # flushed first by _flush_first_kernel: the state is the pool's
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        records = (s * HV + hv) * L  # record j of this slot and head: index records + j
        offs_l = tl.arange(0, LP)
        k_hat, G_j, G = _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K, L2_EPS)
        u_j = _committed_deltas(u_ptr, records, n, offs_l, offs_v, V)
        tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        S0 = tl.load(tile).to(tl.float32)
        for t in range(T):
            tok = row * T + t
            tok_h = tok * (HV // GROUP) + hv // GROUP
            tok_hv = tok * HV + hv
            k_raw = tl.load(k_ptr + tok_h * K + offs_k)
            a_raw = tl.load(a_ptr + tok_hv * K + offs_k)
            q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
            k = _normalised(k_raw.to(tl.float32), L2_EPS)
            G += _log_decay(a_raw.to(tl.float32), dt_bias, A)  # G': the records' decay and this token's
            w = tl.where(offs_l[:, None] < n + t, k_hat * tl.exp(G[None, :] - G_j), 0.0)
            acc_k = tl.sum(u_j * tl.sum(w * k[None, :], axis=1)[:, None], axis=0)  # sum_j u_j (w_j . k^)
            acc_q = tl.sum(u_j * tl.sum(w * q[None, :], axis=1)[:, None], axis=0)
            decay = tl.exp(G)
            u = tl.sigmoid(tl.load(b_ptr + tok_hv).to(tl.float32)) * (
                tl.load(v_ptr + tok_hv * V + offs_v).to(tl.float32) - tl.sum(S0 * (decay * k)[None, :], axis=1) - acc_k)
            o = tl.sum(S0 * (decay * q)[None, :], axis=1) + acc_q + u * tl.sum(k * q, axis=0)
            tl.store(out_ptr + tok_hv * V + offs_v, o.to(out_ptr.dtype.element_ty))
            at = records + n + t
            tl.store(u_ptr + at * V + offs_v, u)
            if v_tile == 0:
                tl.store(kg_ptr + at * 2 * K + offs_k, k_raw)
                tl.store(kg_ptr + at * 2 * K + K + offs_k, a_raw)
            # the token is a record the next tokens read, its G_j this token's G'
            new = offs_l[:, None] == n + t
            k_hat = tl.where(new, k[None, :], k_hat)
            G_j = tl.where(new, G[None, :], G_j)
            u_j = tl.where(new, u[None, :], u_j)


@triton.jit
def _token_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr,
    kg_ptr, length_ptr, slot_stride, scale, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, FLUSH_BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, STAGES: tl.constexpr,
    L2_EPS: tl.constexpr,
):
    """A one-token step of a row and head: the record terms, then the checkpoint's ``BV``-row tiles in a
    loop whose loads run ``STAGES - 1`` tiles ahead through shared memory (bytes in flight that hold no
    registers: the step only reads the state, so a program must keep more of it in flight than the
    in-place kernel's, which writes as much as it reads); each tile's outputs and delta record, and
    where the record fills the ring the tile of the new effective state ``S_0 exp(G') + sum_j u_j
    w_j^T + u k^T``, stored into the pool."""
    pid = tl.program_id(0)
    row = (pid // HV).to(tl.int64)
    hv = pid % HV
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        for v0 in range(0, V, BV):
            zeros = tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + pid * V + v0 + tl.arange(0, BV), zeros)
    else:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)  # the commit
        n = tl.where(n + 1 > L, 0, n)  # flushed first by _flush_first_kernel: the state is the pool's
        offs_k = tl.arange(0, K)
        offs_l = tl.arange(0, LP)
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        records = (s * HV + hv) * L
        tok_h = row * (HV // GROUP) + hv // GROUP
        k_raw = tl.load(k_ptr + tok_h * K + offs_k)
        a_raw = tl.load(a_ptr + pid * K + offs_k)
        q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
        k = _normalised(k_raw.to(tl.float32), L2_EPS)
        # newest record first, so that the decay from each to the token, G' - G_j, is a running sum
        G = _log_decay(a_raw.to(tl.float32), dt_bias, A)
        coef_k = tl.zeros([LP], dtype=tl.float32)  # w_j . k^
        coef_q = tl.zeros([LP], dtype=tl.float32)  # w_j . q^
        for back in range(0, n):
            j = n - 1 - back
            kg_row = kg_ptr + (records + j) * 2 * K
            k_j = tl.load(kg_row + offs_k).to(tl.float32)
            decayed = tl.exp(G) * tl.rsqrt(tl.sum(k_j * k_j, axis=0) + L2_EPS)
            coef_k = tl.where(offs_l == j, tl.sum(k_j * decayed * k, axis=0), coef_k)
            coef_q = tl.where(offs_l == j, tl.sum(k_j * decayed * q, axis=0), coef_q)
            G += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
        decay = tl.exp(G)  # G is now G': the records' decay and this token's
        decay_k = decay * k
        decay_q = decay * q
        kq = tl.sum(k * q, axis=0)
        beta = tl.sigmoid(tl.load(b_ptr + pid).to(tl.float32))
        at = records + n
        tl.store(kg_ptr + at * 2 * K + offs_k, k_raw)
        tl.store(kg_ptr + at * 2 * K + K + offs_k, a_raw)
        pool = state_ptr + s * slot_stride + hv * (V * K)
        for v0 in tl.range(0, V, BV, num_stages=STAGES):
            offs_v = v0 + tl.arange(0, BV)
            tile = pool + offs_v[:, None] * K + offs_k[None, :]
            S0 = tl.load(tile).to(tl.float32)
            u_j = _committed_deltas(u_ptr, records, n, offs_l, offs_v, V)
            acc_k = tl.sum(u_j * coef_k[:, None], axis=0)  # sum_j u_j (w_j . k^)
            acc_q = tl.sum(u_j * coef_q[:, None], axis=0)
            v = tl.load(v_ptr + pid * V + offs_v).to(tl.float32)
            u = beta * (v - tl.sum(S0 * decay_k[None, :], axis=1) - acc_k)
            o = tl.sum(S0 * decay_q[None, :], axis=1) + acc_q + u * kq
            tl.store(out_ptr + pid * V + offs_v, o.to(out_ptr.dtype.element_ty))
            tl.store(u_ptr + (records + n) * V + offs_v, u)
        if n + 1 == L:  # the record fills the ring: the flush forms the new effective state, a tile at a time
            tl.debug_barrier()  # the delta record just stored, by other threads of the program, is read back
            for v0 in range(0, V, FLUSH_BV):
                offs_v = v0 + tl.arange(0, FLUSH_BV)
                tile = pool + offs_v[:, None] * K + offs_k[None, :]
                E = _carried(tl.load(tile).to(tl.float32), G, u_ptr, kg_ptr, records, n + 1, dt_bias, A, offs_k,
                             offs_v, K, V, L2_EPS)
                tl.store(tile, E.to(state_ptr.dtype.element_ty))


@triton.jit
def _advance_lengths(slots_ptr, accepted_ptr, length_ptr, T: tl.constexpr, L: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        n = tl.load(length_ptr + slot) + tl.load(accepted_ptr + row)
        n = tl.where(n + T > L, 0, n)  # flushed first
        if T == 1:  # a decode step commits its record; a verify leaves its T for the next commit
            n = n + 1
            n = tl.where(n == L, 0, n)
        tl.store(length_ptr + slot, n)


def replay_tile(V: int, T: int) -> dict[str, int]:
    """``{BV, num_warps, stages}`` of a ``T``-token step: the environment's ``KDA_TRITON_REPLAY_CONFIG``
    (e.g. ``"BV=32,num_warps=4"``) over the default of its form. A one-token step's program walks a
    head's ``BV``-row tiles with ``stages - 1`` tiles' loads in flight; a verify's fused programs take
    64 rows on 2 warps (``results/h200/replay-verify-tiles/tiles.csv``; ``stages`` unused)."""
    tile = {"BV": min(V, 16), "num_warps": 1, "stages": 3} if T == 1 else \
        {"BV": min(V, 64), "num_warps": 2, "stages": 1}
    text = os.environ.get(REPLAY_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{REPLAY_CONFIG_ENV} items must be BV=, num_warps= or stages=<int>; got {item!r}")
        tile[name] = int(value)
    BV = tile["BV"]
    if BV < 1 or BV & (BV - 1) or V % BV or tile["num_warps"] not in {1, 2, 4, 8, 16} or not 1 <= tile["stages"] <= 8:
        raise ValueError(f"{REPLAY_CONFIG_ENV}: BV must be a power of two dividing V={V}, num_warps one of "
                         f"1/2/4/8/16 and stages 1-8; got {text!r}")
    return tile


def replay_launches(inputs: DecodeInputs, out: torch.Tensor) -> list:
    """A replay step's launches, each ``(kernel, grid, args, meta)``: the flush-first kernel (where a
    commit or T > 1 can make one), the step (a one-token step's program a row and head, or a verify's
    fused one a row, head and V-tile), the lengths."""
    cache, T = inputs.cache, inputs.T
    tile = replay_tile(inputs.V, T)
    BV, heads = tile["BV"], inputs.B * inputs.HV
    grid = (heads * (inputs.V // BV),)
    # None commits nothing; the zeros are allocated here (bind time), never in the launch
    accepted = inputs.num_accepted if inputs.num_accepted is not None else \
        torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
    ring = dict(L=cache.L, LP=triton.next_power_of_2(cache.L), L2_EPS=L2_EPS)
    shape = dict(HV=inputs.HV, K=inputs.K, V=inputs.V, BV=BV, num_warps=tile["num_warps"])
    flush_first = (_flush_first_kernel, grid,
                   (inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots, accepted, cache.u, cache.kg,
                    cache.length, inputs.slot_stride), dict(T=T, **shape, **ring))
    step_args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
                 inputs.slots, accepted, out, cache.u, cache.kg, cache.length, inputs.slot_stride,
                 inputs.effective_scale)
    group = inputs.HV // inputs.H
    if T == 1:
        step = (_token_kernel, (heads,), step_args,
                dict(**shape, GROUP=group, FLUSH_BV=min(BV, 4), STAGES=tile["stages"], **ring))
    else:
        step = (_verify_kernel, grid, step_args, dict(T=T, **shape, GROUP=group, **ring))
    advance = (_advance_lengths, (inputs.B,), (inputs.slots, accepted, cache.length),
               dict(T=T, L=cache.L, num_warps=1))
    may_flush_first = T > 1 or inputs.num_accepted is not None  # else n + 1 <= L: the contract holds n < L
    return [flush_first, step, advance] if may_flush_first else [step, advance]
