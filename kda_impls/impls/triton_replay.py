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

import os

import torch
import triton
import triton.language as tl

from ..inputs import DecodeInputs
from ..reference import L2_EPS
from .triton_kda import SOFTPLUS_LINEAR_ABOVE

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
def _committed(u_ptr, kg_ptr, records, n, dt_bias, A, offs_l, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr,
               L2_EPS: tl.constexpr):
    """The first ``n`` records of a slot's head as register tiles: ``(k^ [LP, K], G_j [LP, K], u [LP, BV],
    G_n [K])``, rows at and past ``n`` zero (never loaded)."""
    kept = offs_l[:, None] < n
    kg_rows = kg_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :]
    in_k = kept & (offs_k[None, :] < K)
    g = tl.where(in_k, _log_decay(tl.load(kg_rows + K, mask=in_k, other=0.0).to(tl.float32), dt_bias[None, :], A), 0.0)
    k = tl.load(kg_rows, mask=in_k, other=0.0).to(tl.float32)
    k_hat = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]
    in_v = kept & (offs_v[None, :] < V)
    u = tl.load(u_ptr + (records + offs_l)[:, None] * V + offs_v[None, :], mask=in_v, other=0.0)
    return k_hat, tl.cumsum(g, axis=0), u, tl.sum(g, axis=0)


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
            G = _committed(u_ptr, kg_ptr, records, n, dt_bias, A, tl.arange(0, LP), offs_k, offs_v, K, V, L2_EPS)[3]
            tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
            E = _carried(tl.load(tile).to(tl.float32), G, u_ptr, kg_ptr, records, n, dt_bias, A, offs_k, offs_v, K, V,
                         L2_EPS)
            tl.store(tile, E.to(state_ptr.dtype.element_ty))


@triton.jit
def _kda_replay_kernel(
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
        k_hat, G_j, u_j, G = _committed(u_ptr, kg_ptr, records, n, dt_bias, A, offs_l, offs_k, offs_v, K, V, L2_EPS)
        tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        S0 = tl.load(tile).to(tl.float32)
        k = tl.zeros([K], dtype=tl.float32)  # the last token's k^ and u, for a one-token step's flush
        u = tl.zeros([BV], dtype=tl.float32)
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
        if T == 1:
            if n + 1 == L:  # the committed record fills the ring: the flush forms the new effective state's tile
                E = _carried(S0, G, u_ptr, kg_ptr, records, n, dt_bias, A, offs_k, offs_v, K, V, L2_EPS)
                tl.store(tile, (E + u[:, None] * k[None, :]).to(state_ptr.dtype.element_ty))


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


def replay_tile(V: int) -> tuple[int, int]:
    """``(BV, num_warps)``: the environment's ``KDA_TRITON_REPLAY_CONFIG`` (e.g. ``"BV=32,num_warps=4"``)
    over the default, 64 rows and 2 warps: the fastest of the tiles timed on the H200 at ring 16
    (``results/h200/replay-tiles/tiles.csv``; fewer, wider programs repeat each record's key and gate
    work across fewer V-tiles; of two warp counts at 64 rows, 2 were faster than 4)."""
    tile = {"BV": min(V, 64), "num_warps": 2}
    text = os.environ.get(REPLAY_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{REPLAY_CONFIG_ENV} items must be BV=<int> or num_warps=<int>; got {item!r}")
        tile[name] = int(value)
    BV, warps = tile["BV"], tile["num_warps"]
    if BV < 1 or BV & (BV - 1) or V % BV or warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"{REPLAY_CONFIG_ENV}: BV must be a power of two dividing V={V} and num_warps one of "
                         f"1/2/4/8/16; got BV={BV}, num_warps={warps}")
    return BV, warps


def replay_launcher(inputs: DecodeInputs, out: torch.Tensor):
    """The zero-argument launch of a replay step: the flush-first kernel (where a commit or T > 1 can
    make one), the step, the lengths."""
    cache, T = inputs.cache, inputs.T
    BV, warps = replay_tile(inputs.V)
    grid = (inputs.B * inputs.HV * (inputs.V // BV),)
    # None commits nothing; the zeros are allocated here, never in the launch
    accepted = inputs.num_accepted if inputs.num_accepted is not None else \
        torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
    ring = dict(L=cache.L, LP=triton.next_power_of_2(cache.L))
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, accepted, out, cache.u, cache.kg, cache.length, inputs.slot_stride, inputs.effective_scale)
    meta = dict(T=T, HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=BV, **ring, L2_EPS=L2_EPS,
                num_warps=warps)
    flush_args = (inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots, accepted, cache.u, cache.kg, cache.length,
                  inputs.slot_stride)
    flush_meta = dict(T=T, HV=inputs.HV, K=inputs.K, V=inputs.V, BV=BV, **ring, L2_EPS=L2_EPS, num_warps=warps)
    may_flush_first = T > 1 or inputs.num_accepted is not None  # else n + 1 <= L: the contract holds n < L
    flush, step, advance = _flush_first_kernel[grid], _kda_replay_kernel[grid], _advance_lengths[(inputs.B,)]

    def launch() -> torch.Tensor:
        if may_flush_first:
            flush(*flush_args, **flush_meta)
        step(*args, **meta)
        advance(inputs.slots, accepted, cache.length, T=T, L=cache.L)
        return out

    return launch
