"""Our Triton kernel's frozen verify (``update_state=False``, any T): every token's output from the start state.

Each program owns one row, one value head and one V-tile of ``BV`` rows of the ``[V, K]`` state, read
once and never written. The tokens are not applied to the tile: with ``G_t`` the cumulative log decay
of tokens ``0..t`` along K and ``u_s`` token s's beta-scaled delta, the state token t sees is
``E_t = S_0 exp(G_t) + sum_{s<t} u_s (k^_s exp(G_t - G_s))^T``, so its two products are

    E_t x = S_0 (exp(G_t) x) + sum_{s<t} u_s (k^_s exp(G_t - G_s) . x)        (x = k^_t or q^_t)

The first terms of every token are one matrix product ``S_0 [BV, K] @ X [K, NP]`` (X's columns the
decayed keys, then the decayed queries, zero past ``2T``) on the tensor cores in ``tf32x3`` (three tf32
products: an fp32 tile's error stays that of fp32; a bf16 tile is exact in tf32); the sums over
earlier tokens are ``[TP, K]`` and ``[TP, BV]`` register tiles, one row a token. The output is
``E_t q^_t + u_t (k^_t . q^_t)``, ``u_t = beta_t (v_t - E_t k^_t)``. The state tile is touched once
(one product), not once a token: the step moves one state read per live row, at the cost of its
bytes alone.
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
FROZEN_CONFIG_ENV = "KDA_TRITON_FROZEN_CONFIG"


@triton.jit
def _log_decay(a, dt_bias, A):
    x = a + dt_bias
    return -A * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))


@triton.jit
def _normalised(x, L2_EPS: tl.constexpr):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + L2_EPS)


@triton.jit
def _column(Y, cols, c):
    """Column ``c`` of a ``[BV, NP]`` tile, as ``[BV]``."""
    return tl.sum(tl.where(cols[None, :] == c, Y, 0.0), axis=1)


@triton.jit
def _token_row(x, offs_t, t):
    """Row ``t`` of a ``[TP, K]`` tile, as ``[K]``."""
    return tl.sum(tl.where(offs_t[:, None] == t, x, 0.0), axis=0)


@triton.jit
def _kda_frozen_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr, slot_stride, scale,
    T: tl.constexpr, TP: tl.constexpr, NP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BV: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    offs_k = tl.arange(0, K)
    offs_v = (pid % (V // BV)) * BV + tl.arange(0, BV)
    offs_t = tl.arange(0, TP)
    cols = tl.arange(0, NP)
    slot = tl.load(slots_ptr + row)
    live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0  # a padding row reads no state, outputs zeros
    tile = state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K) + offs_v[:, None] * K + \
        offs_k[None, :]
    S0 = tl.load(tile, mask=live, other=0.0).to(tl.float32)  # issued first: the gate computes while it arrives
    dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
    A = tl.exp(tl.load(A_log_ptr + hv))
    # Every token's normalised key and query and cumulative decay, one row a token, and X's columns
    keys = tl.zeros([TP, K], dtype=tl.float32)
    queries = tl.zeros([TP, K], dtype=tl.float32)
    decays = tl.zeros([TP, K], dtype=tl.float32)
    X = tl.zeros([K, NP], dtype=tl.float32)
    G = tl.zeros([K], dtype=tl.float32)
    for t in tl.static_range(T):
        tok = row * T + t
        tok_h = tok * (HV // GROUP) + hv // GROUP
        k = _normalised(tl.load(k_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS)
        q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
        G += _log_decay(tl.load(a_ptr + (tok * HV + hv) * K + offs_k).to(tl.float32), dt_bias, A)
        keys = tl.where(offs_t[:, None] == t, k[None, :], keys)
        queries = tl.where(offs_t[:, None] == t, q[None, :], queries)
        decays = tl.where(offs_t[:, None] == t, G[None, :], decays)
        X = tl.where(cols[None, :] == t, (tl.exp(G) * k)[:, None], X)
        X = tl.where(cols[None, :] == T + t, (tl.exp(G) * q)[:, None], X)
    Y = tl.dot(S0, X, input_precision="tf32x3")  # [BV, NP]: S_0 exp(G_t) k^_t, then S_0 exp(G_t) q^_t
    deltas = tl.zeros([TP, BV], dtype=tl.float32)
    for t in tl.static_range(T):
        tok_hv = (row * T + t) * HV + hv
        k = _token_row(keys, offs_t, t)
        q = _token_row(queries, offs_t, t)
        G_t = _token_row(decays, offs_t, t)
        w = tl.where(offs_t[:, None] < t, keys * tl.exp(G_t[None, :] - decays), 0.0)  # the earlier tokens'
        Ek = _column(Y, cols, t) + tl.sum(deltas * tl.sum(w * k[None, :], axis=1)[:, None], axis=0)
        Eq = _column(Y, cols, T + t) + tl.sum(deltas * tl.sum(w * q[None, :], axis=1)[:, None], axis=0)
        u = tl.sigmoid(tl.load(b_ptr + tok_hv).to(tl.float32)) * (tl.load(v_ptr + tok_hv * V + offs_v).to(tl.float32)
                                                                  - Ek)
        o = Eq + u * tl.sum(k * q, axis=0)
        tl.store(out_ptr + tok_hv * V + offs_v, tl.where(slot >= 0, o, 0.0).to(out_ptr.dtype.element_ty))
        deltas = tl.where(offs_t[:, None] == t, u[None, :], deltas)


def env_tile(env: str, V: int, BV: int, num_warps: int, min_BV: int = 1) -> tuple[int, int]:
    """``(BV, num_warps)``: the environment variable ``env`` (e.g. ``"BV=32,num_warps=4"``) over the
    default ``BV`` (capped at V) and ``num_warps``; BV a power of two dividing V, at least ``min_BV``
    (a tile that is a tensor-core product's operand has at least 16 rows)."""
    tile = {"BV": min(V, BV), "num_warps": num_warps}
    text = os.environ.get(env, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{env} items must be BV=<int> or num_warps=<int>; got {item!r}")
        tile[name] = int(value)
    BV, warps = tile["BV"], tile["num_warps"]
    if BV < min(min_BV, V) or BV & (BV - 1) or V % BV or warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"{env}: BV must be a power of two dividing V={V}, at least {min(min_BV, V)}, and "
                         f"num_warps one of 1/2/4/8/16; got BV={BV}, num_warps={warps}")
    return BV, warps


def frozen_tile(V: int) -> tuple[int, int]:
    """``(BV, num_warps)`` of the frozen kernel: ``KDA_TRITON_FROZEN_CONFIG`` over the default, 32 rows
    and 4 warps (at least 16 rows: the product's operand)."""
    return env_tile(FROZEN_CONFIG_ENV, V, 32, 4, min_BV=16)


def frozen_launcher(inputs: DecodeInputs, out: torch.Tensor):
    """The zero-argument launch of a frozen verify (one-token spelling or per-token, any T)."""
    BV, warps = frozen_tile(inputs.V)
    T = inputs.T
    grid = (inputs.B * inputs.HV * (inputs.V // BV),)
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, out, inputs.slot_stride, inputs.effective_scale)
    meta = dict(T=T, TP=triton.next_power_of_2(T), NP=max(16, triton.next_power_of_2(2 * T)), HV=inputs.HV,
                GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=BV, L2_EPS=L2_EPS, num_warps=warps)
    kernel = _kda_frozen_kernel[grid]

    def launch() -> torch.Tensor:
        kernel(*args, **meta)
        return out

    return launch
