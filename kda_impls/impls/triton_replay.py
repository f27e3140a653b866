"""Our Triton kernels' replay step (any T <= L, with a commit): outputs from the checkpoint and the records.

Each program owns one row, one value head and one V-tile of ``BV`` rows of the ``[V, K]`` state, as
the in-place kernel does. It never forms the effective state ``E`` (``kda_impls/replay.py``): a token
needs only ``E_dec k^`` and ``E_dec q^`` (``E_dec`` the state before the token, decayed by its gate),
and with ``G'`` the log decay from the checkpoint through this token's gate and ``w_j = k^_j *
exp(G' - G_j)`` over every record j before the token those are

    E_dec x = S_0 (exp(G') * x) + sum_j u_j (w_j . x)        (x = k^ or q^)

one pass over the checkpoint tile (two reductions) and one over the records, held as ``[LP, K]``
(normalised keys, cumulative decays) and ``[LP, BV]`` (deltas) register tiles: the committed ones
loaded once (the rows past the commit masked off, never read), then each token of the step appended
to them as the record the next token reads. The output is ``E_dec q^ + u (k^ . q^)``; each token's
record (``u`` fp32, the raw key and gate input) is written at ``n + t``. A one-token step commits its
record, and where that fills the ring the tile ``S_0 exp(G') + sum_j u_j w_j^T + u k^T`` is formed (a
loop over the cached records in memory, on the flush only) and stored into the pool; else the pool is
not written.

Three launches, in this order. A flush first (``n + T > L`` after the commit) is a launch of its own:
every V-tile program of a row reads the row's committed key/gate records while the step writes the
new ones over them from position 0, and a program cannot wait for the others of its row, but the next
launch can; it runs only where a commit or T > 1 can make one (a one-token step without a commit never
does). Then the step, which finds a flushed row's state in the pool and its ring empty. The lengths
advance last (one program per row), as every program of a row reads its length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..inputs import DecodeInputs
from ..reference import L2_EPS
from .triton_frozen import _log_decay, _normalised, env_tile

REPLAY_CONFIG_ENV = "KDA_TRITON_REPLAY_CONFIG"


@triton.jit
def _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K: tl.constexpr, L2_EPS: tl.constexpr):
    """The keys and decays of a slot's head's first ``n`` records as register tiles: ``(k^ [LP, K],
    G_j [LP, K], G_n [K])``, G_j the cumulative log decay through record j; rows at and past ``n`` zero
    (never loaded)."""
    kept = offs_l[:, None] < n
    kg_rows = kg_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :]
    in_k = kept & (offs_k[None, :] < K)
    g = tl.where(in_k, _log_decay(tl.load(kg_rows + K, mask=in_k, other=0.0).to(tl.float32), dt_bias[None, :], A), 0.0)
    k = tl.load(kg_rows, mask=in_k, other=0.0).to(tl.float32)
    k_hat = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]
    return k_hat, tl.cumsum(g, axis=0), tl.sum(g, axis=0)


@triton.jit
def _carried(S0, G, u_ptr, kg_ptr, records, count, dt_bias, A, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr,
             L2_EPS: tl.constexpr):
    """``S_0 exp(G) + sum_{j<count} u_j (k^_j exp(G - G_j))^T`` over the first ``count`` records in memory:
    the state they carry, decayed through ``G``, formed only for a flush first (one record a loop step)."""
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
def _kda_replay_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr,
    kg_ptr, length_ptr, slot_stride, scale, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    """A one-token step: one program a row and value head, its record terms computed once, then a
    loop over the checkpoint's V-tiles."""
    pid = tl.program_id(0)
    row = (pid // HV).to(tl.int64)
    hv = pid % HV
    offs_k = tl.arange(0, K)
    offs_l = tl.arange(0, LP)
    offs_b = tl.arange(0, BV)
    out_head = out_ptr + (row * HV + hv) * V
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        for i in range(0, V // BV):
            tl.store(out_head + i * BV + offs_b, tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
    else:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)  # the commit
        n = tl.where(n + 1 > L, 0, n)  # flushed first by _flush_first_kernel: the state is the pool's
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        records = (s * HV + hv) * L  # record j of this slot and head: index records + j
        k_hat, G_j, G = _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K, L2_EPS)
        tok_h = row * (HV // GROUP) + hv // GROUP
        tok_hv = row * HV + hv
        k_raw = tl.load(k_ptr + tok_h * K + offs_k)
        a_raw = tl.load(a_ptr + tok_hv * K + offs_k)
        q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
        k = _normalised(k_raw.to(tl.float32), L2_EPS)
        G += _log_decay(a_raw.to(tl.float32), dt_bias, A)  # G': the records' decay and this token's
        w = tl.where(offs_l[:, None] < n, k_hat * tl.exp(G[None, :] - G_j), 0.0)  # [LP, K]
        w_k = tl.sum(w * k[None, :], axis=1)  # w_j . k^, one a record: V-independent, so once a head
        w_q = tl.sum(w * q[None, :], axis=1)
        decay = tl.exp(G)
        beta = tl.sigmoid(tl.load(b_ptr + tok_hv).to(tl.float32))
        k_q = tl.sum(k * q, axis=0)
        at = records + n
        tl.store(kg_ptr + at * 2 * K + offs_k, k_raw)
        tl.store(kg_ptr + at * 2 * K + K + offs_k, a_raw)
        flush = n + 1 == L  # the committed record fills the ring: the new effective state goes to the pool
        head = state_ptr + s * slot_stride + hv * (V * K)
        for i in range(0, V // BV):
            offs_v = i * BV + offs_b
            tile = head + offs_v[:, None] * K + offs_k[None, :]
            S0 = tl.load(tile).to(tl.float32)
            u_j = tl.load(u_ptr + (records + offs_l)[None, :] * V + offs_v[:, None], mask=offs_l[None, :] < n,
                          other=0.0)  # [BV, LP]
            u = beta * (tl.load(v_ptr + tok_hv * V + offs_v).to(tl.float32) - tl.sum(S0 * (decay * k)[None, :], axis=1)
                        - tl.sum(u_j * w_k[None, :], axis=1))
            o = tl.sum(S0 * (decay * q)[None, :], axis=1) + tl.sum(u_j * w_q[None, :], axis=1) + u * k_q
            tl.store(out_head + offs_v, o.to(out_ptr.dtype.element_ty))
            tl.store(u_ptr + at * V + offs_v, u)
            if flush:
                E = S0 * decay[None, :] + tl.dot(u_j, w, input_precision="tf32x3") + u[:, None] * k[None, :]
                tl.store(tile, E.to(state_ptr.dtype.element_ty))


@triton.jit
def _kda_replay_verify_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr,
    kg_ptr, length_ptr, slot_stride, scale, T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    """A verify of T > 1 tokens: one program a row, value head and V-tile; the tokens' records
    written, none committed."""
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
        u_j = tl.load(u_ptr + (records + offs_l)[:, None] * V + offs_v[None, :], mask=offs_l[:, None] < n, other=0.0)
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


def replay_tile(V: int, T: int = 1) -> tuple[int, int]:
    """``(BV, num_warps)``: the environment's ``KDA_TRITON_REPLAY_CONFIG`` (e.g. ``"BV=32,num_warps=4"``)
    over the default: a one-token step's program loops over V-tiles of 32 rows with 4 warps (at least
    16 rows: the flush's product's operand); a verify's programs own 64-row tiles, 4 warps each."""
    return env_tile(REPLAY_CONFIG_ENV, V, 32, 4, min_BV=16) if T == 1 else env_tile(REPLAY_CONFIG_ENV, V, 64, 4)


def replay_launcher(inputs: DecodeInputs, out: torch.Tensor):
    """The zero-argument launch of a replay step: the flush-first kernel (where a commit or T > 1 can
    make one), the step (the one-token kernel or the verify), the lengths."""
    cache, T = inputs.cache, inputs.T
    BV, warps = replay_tile(inputs.V, T)
    tiles = (inputs.B * inputs.HV * (inputs.V // BV),)
    # None commits nothing; the zeros are allocated here, never in the launch
    accepted = inputs.num_accepted if inputs.num_accepted is not None else \
        torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
    ring = dict(L=cache.L, LP=max(16, triton.next_power_of_2(cache.L)))  # the flush's product: 16 rows at least
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, accepted, out, cache.u, cache.kg, cache.length, inputs.slot_stride, inputs.effective_scale)
    meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=BV, **ring, L2_EPS=L2_EPS,
                num_warps=warps)
    flush_args = (inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots, accepted, cache.u, cache.kg, cache.length,
                  inputs.slot_stride)
    flush_meta = dict(T=T, HV=inputs.HV, K=inputs.K, V=inputs.V, BV=BV, **ring, L2_EPS=L2_EPS, num_warps=warps)
    may_flush_first = T > 1 or inputs.num_accepted is not None  # else n + 1 <= L: the contract holds n < L
    flush, advance = _flush_first_kernel[tiles], _advance_lengths[(inputs.B,)]
    if T == 1:
        step = _kda_replay_decode_kernel[(inputs.B * inputs.HV,)]
    else:
        step, meta = _kda_replay_verify_kernel[tiles], meta | dict(T=T)

    def launch() -> torch.Tensor:
        if may_flush_first:
            flush(*flush_args, **flush_meta)
        step(*args, **meta)
        advance(inputs.slots, accepted, cache.length, T=T, L=cache.L)
        return out

    return launch
