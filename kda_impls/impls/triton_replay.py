"""Our Triton kernel's replay step (T = 1, no commit): the output from the checkpoint and the records.

Each program owns one row, one value head and one V-tile of ``BV`` rows of the ``[V, K]`` state, as
the in-place kernel does. It never forms the effective state ``E`` (``kda_impls/replay.py``): the
step needs only ``E_dec k^`` and ``E_dec q^`` (``E_dec`` the decayed state), and with ``G'`` the log
decay from the checkpoint through this token's gate and ``w_j = k^_j * exp(G' - G_j)`` those are

    E_dec x = S_0 (exp(G') * x) + sum_j u_j (w_j . x)        (x = k^ or q^)

one pass over the checkpoint tile (two reductions) and one over the cached records, loaded as
``[L, K]`` and ``[L, BV]`` tiles (the rows past ``length`` masked off): two K-long dot products and
a BV-long update per record, all in parallel. The output is ``E_dec q^ + u (k^ . q^)``. The
record (``u`` fp32, the raw key and gate input) is written at ``length``; where that fills the ring
the tile ``S_0 exp(G') + sum_j u_j w_j^T + u k^T`` is formed (a loop over the records, on the flush
only) and stored into the pool, else the pool is not written.
The lengths advance in a second launch (one program per row): the first launch's programs of a row
all read its length, and no program can know when the others have.
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
def _kda_replay_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr, u_ptr, kg_ptr,
    length_ptr, slot_stride, scale, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    v_tile = pid % (V // BV)
    offs_k = tl.arange(0, K)
    offs_v = v_tile * BV + tl.arange(0, BV)
    row_hv = row * HV + hv
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        tl.store(out_ptr + row_hv * V + offs_v, tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
    else:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s)
        row_h = row * (HV // GROUP) + hv // GROUP
        k_raw = tl.load(k_ptr + row_h * K + offs_k)
        a_raw = tl.load(a_ptr + row_hv * K + offs_k)
        q = _normalised(tl.load(q_ptr + row_h * K + offs_k).to(tl.float32), L2_EPS) * scale
        k = _normalised(k_raw.to(tl.float32), L2_EPS)
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        records = (s * HV + hv) * L  # record j of this slot and head: index records + j
        # every cached record at once, as [LP, K] and [LP, BV] tiles (the rows past n masked off, never read)
        offs_l = tl.arange(0, LP)
        cached = offs_l[:, None] < n
        kg_rows = kg_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :]
        in_k = cached & (offs_k[None, :] < K)
        a_j = tl.load(kg_rows + K, mask=in_k, other=0.0).to(tl.float32)
        g_j = tl.where(in_k, _log_decay(a_j, dt_bias[None, :], A), 0.0)
        G = _log_decay(a_raw.to(tl.float32), dt_bias, A) + tl.sum(g_j, axis=0)  # G': the records' and this token's
        k_j = tl.load(kg_rows, mask=in_k, other=0.0).to(tl.float32)
        w = k_j / tl.sqrt(tl.sum(k_j * k_j, axis=1) + L2_EPS)[:, None] * tl.exp(G[None, :] - tl.cumsum(g_j, axis=0))
        in_v = cached & (offs_v[None, :] < V)
        u_j = tl.load(u_ptr + (records + offs_l)[:, None] * V + offs_v[None, :], mask=in_v, other=0.0)
        acc_k = tl.sum(u_j * tl.sum(w * k[None, :], axis=1)[:, None], axis=0)  # sum_j u_j (w_j . k^)
        acc_q = tl.sum(u_j * tl.sum(w * q[None, :], axis=1)[:, None], axis=0)
        tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        S0 = tl.load(tile).to(tl.float32)
        decay = tl.exp(G)
        u = tl.sigmoid(tl.load(b_ptr + row_hv).to(tl.float32)) * (
            tl.load(v_ptr + row_hv * V + offs_v).to(tl.float32) - tl.sum(S0 * (decay * k)[None, :], axis=1) - acc_k)
        o = tl.sum(S0 * (decay * q)[None, :], axis=1) + acc_q + u * tl.sum(k * q, axis=0)
        tl.store(out_ptr + row_hv * V + offs_v, o.to(out_ptr.dtype.element_ty))
        tl.store(u_ptr + (records + n) * V + offs_v, u)
        if v_tile == 0:
            tl.store(kg_ptr + (records + n) * 2 * K + offs_k, k_raw)
            tl.store(kg_ptr + (records + n) * 2 * K + K + offs_k, a_raw)
        if n + 1 == L:  # the ring is full: the flush forms the new effective state's tile
            E = S0 * decay[None, :] + u[:, None] * k[None, :]
            G_j = tl.zeros([K], dtype=tl.float32)
            for j in range(0, n):
                kg_row = kg_ptr + (records + j) * 2 * K
                G_j += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
                w_j = _normalised(tl.load(kg_row + offs_k).to(tl.float32), L2_EPS) * tl.exp(G - G_j)
                E += tl.load(u_ptr + (records + j) * V + offs_v)[:, None] * w_j[None, :]
            tl.store(tile, E.to(state_ptr.dtype.element_ty))


@triton.jit
def _advance_lengths(slots_ptr, length_ptr, L: tl.constexpr):
    slot = tl.load(slots_ptr + tl.program_id(0))
    if slot >= 0:
        n = tl.load(length_ptr + slot) + 1
        tl.store(length_ptr + slot, tl.where(n == L, 0, n))


def replay_tile(V: int) -> tuple[int, int]:
    """``(BV, num_warps)``: the environment's ``KDA_TRITON_REPLAY_CONFIG`` (e.g. ``"BV=32,num_warps=4"``)
    over the default, 16 rows and 8 warps (compiled for sm_90 at K = V = 128 and L = 16, no spills and
    101 registers a thread, the fewest of BV 16/32 and 4/8 warps; untimed)."""
    tile = {"BV": min(V, 16), "num_warps": 8}
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
    """The zero-argument launch of a one-token replay step (two kernels: the step, then the lengths)."""
    cache = inputs.cache
    BV, warps = replay_tile(inputs.V)
    grid = (inputs.B * inputs.HV * (inputs.V // BV),)
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, out, cache.u, cache.kg, cache.length, inputs.slot_stride, inputs.effective_scale)
    meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=BV, L=cache.L,
                LP=triton.next_power_of_2(cache.L), L2_EPS=L2_EPS, num_warps=warps)
    step, advance = _kda_replay_kernel[grid], _advance_lengths[(inputs.B,)]

    def launch() -> torch.Tensor:
        step(*args, **meta)
        advance(inputs.slots, cache.length, L=cache.L)
        return out

    return launch
