"""Frozen verify in closed form: T tokens' outputs from one read of the start state, on the tensor cores.

With ``G_t`` the cumulative log decay through token t (a ``[K]`` vector), ``khat_t = k_t e^{G_t}``,
``qhat_t = q_t e^{G_t}``, ``ktil_j = k_j e^{-G_j}``, ``M = strict_lower(khat ktil^T)`` and
``P = tril(qhat ktil^T)``, the chained delta rule's T outputs are

    Tm = (I + diag(beta) M)^{-1} diag(beta),   QT = P Tm,   O = (qhat - QT khat) S0^T + QT V

One program per (row, value head, ``BV`` rows of V): the ``[BV, K]`` start tile is read once in the
pool's dtype and used as a ``tl.dot`` operand with fp32 accumulation; the tokens are padded to the
dot's minimum of 16 rows; the T x T solve is a forward substitution in registers.

``M`` and ``P`` need ``e^{G_t - G_j}`` (t >= j, never above 1), which the products form as
``e^{G_t - R} e^{R - G_j}`` with ``R`` the window's mid decay per channel: each factor stays within
``e^{+-span/2}``, ``span`` the window's log decay from its first token to its last. Where a channel's
span passes :data:`SPAN_LIMIT` a factor would leave fp32's range, and that program forms ``M`` and
``P`` one column at a time from the exact differences instead (T passes of ``[16, K]`` exponentials).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from ...reference import L2_EPS, SOFTPLUS_LINEAR_ABOVE

# Each factor within e^+-80, inside fp32's e^+-88.
SPAN_LIMIT = 160.0
TOKEN_ROWS = 16  # the dot's minimum M: T <= 16 tokens padded to it
FROZEN_CONFIG_ENV = "KDA_TRITON_FROZEN_CONFIG"
_LINEAR_ABOVE = tl.constexpr(SOFTPLUS_LINEAR_ABOVE)  # a global a kernel reads must be a constexpr
_SPAN_LIMIT = tl.constexpr(SPAN_LIMIT)
INTERPRETED = tl.constexpr(triton.knobs.runtime.interpret)


@triton.jit
def _row(x, offs_t, t):
    """Row ``t`` of a ``[TP, N]`` tile as an ``[N]`` vector."""
    return tl.sum(tl.where(offs_t[:, None] == t, x, 0.0), axis=0)


@triton.jit
def _exact_pair_terms(q, k, G, offs_t, T, TP: tl.constexpr):
    """``(M, P)`` before masking, from the exact decays ``e^{min(G_t - G_j, 0)}``, one column j a pass."""
    M = tl.zeros([TP, TP], dtype=tl.float32)
    P = tl.zeros([TP, TP], dtype=tl.float32)
    for j in range(T):
        decayed = _row(k, offs_t, j)[None, :] * tl.exp(tl.minimum(G - _row(G, offs_t, j)[None, :], 0.0))
        M = tl.where(offs_t[None, :] == j, tl.sum(k * decayed, axis=1)[:, None], M)
        P = tl.where(offs_t[None, :] == j, tl.sum(q * decayed, axis=1)[:, None], P)
    return M, P


@triton.jit
def _solve(M, beta, offs_t, T, TP: tl.constexpr):
    """``(I + diag(beta) M)^{-1} diag(beta)`` for a strictly lower ``M``: forward substitution, a row a pass."""
    A = beta[:, None] * M
    X = tl.zeros([TP, TP], dtype=tl.float32)
    for t in range(T):
        beta_t = tl.sum(tl.where(offs_t == t, beta, 0.0), axis=0)
        x_t = tl.where(offs_t == t, beta_t, 0.0) - tl.sum(_row(A, offs_t, t)[:, None] * X, axis=0)
        X = tl.where(offs_t[:, None] == t, x_t[None, :], X)
    return X


@triton.jit
def _times_state(W, S0):
    """``W S0^T`` (``[TP, K]`` by a ``[BV, K]`` tile as stored), fp32 accumulation. A 16-bit tile meets
    ``W`` split in two of its dtype (high part and remainder: the product keeps fp32's digits of W);
    an fp32 tile takes three tf32 products."""
    St = tl.trans(S0)
    if S0.dtype == tl.float32:
        return tl.dot(W, St, input_precision="tf32x3")
    high = W.to(S0.dtype)
    low = (W - high.to(tl.float32)).to(S0.dtype)
    if INTERPRETED:  # the interpreter's 16-bit dot multiplies the bits; the same products in fp32
        high, low, St = high.to(tl.float32), low.to(tl.float32), St.to(tl.float32)
    return tl.dot(low, St, tl.dot(high, St))


@triton.jit
def _kda_frozen_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    slot_stride, scale, T, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, TP: tl.constexpr, L2_EPS: tl.constexpr,
):
    V_TILES: tl.constexpr = V // BV
    pid = tl.program_id(0)
    head = (pid // V_TILES).to(tl.int64)  # row * HV + hv; int64: row * HV * V overflows int32
    row = head // HV
    hv = head % HV
    h = hv // GROUP
    offs_k = tl.arange(0, K)
    offs_t = tl.arange(0, TP)
    offs_v = pid % V_TILES * BV + tl.arange(0, BV)

    slot = tl.load(slots_ptr + row)
    live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0  # a [BV, K] splat: 16-byte accesses stay
    S0 = tl.load(state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K)
                 + offs_v[:, None] * K + offs_k[None, :], mask=live, other=0.0)  # the one large read

    token = row * T + offs_t
    in_t = offs_t < T
    in_tk = in_t[:, None] & (offs_k[None, :] < K)
    qk_rows = (token * (HV // GROUP) + h)[:, None] * K + offs_k[None, :]
    q = tl.load(q_ptr + qk_rows, mask=in_tk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + qk_rows, mask=in_tk, other=0.0).to(tl.float32)
    x = tl.load(a_ptr + (token * HV + hv)[:, None] * K + offs_k[None, :], mask=in_tk, other=0.0).to(tl.float32)
    beta = tl.where(in_t, tl.sigmoid(tl.load(b_ptr + token * HV + hv, mask=in_t, other=0.0).to(tl.float32)), 0.0)
    vals = tl.load(v_ptr + (token * HV + hv)[:, None] * V + offs_v[None, :], mask=in_t[:, None] & (offs_v < V)[None, :],
                   other=0.0).to(tl.float32)
    x += tl.load(dt_bias_ptr + hv * K + offs_k)[None, :]
    g = -tl.exp(tl.load(A_log_ptr + hv)) * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))
    G = tl.cumsum(tl.where(in_tk, g, 0.0), axis=0)  # padding tokens decay nothing: G stays G_{T-1}
    q = q * (scale / tl.sqrt(tl.sum(q * q, axis=1) + L2_EPS))[:, None]
    k = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]

    first = _row(G, offs_t, 0)
    last = _row(G, offs_t, T - 1)
    if tl.max(first - last, axis=0) <= _SPAN_LIMIT:
        mid = 0.5 * (first + last)
        ktil = k * tl.exp(mid[None, :] - G)
        ahead = tl.exp(G - mid[None, :])
        M = tl.dot(k * ahead, tl.trans(ktil), input_precision="ieee")
        P = tl.dot(q * ahead, tl.trans(ktil), input_precision="ieee")
    else:
        M, P = _exact_pair_terms(q, k, G, offs_t, T, TP)
    M = tl.where(offs_t[:, None] > offs_t[None, :], M, 0.0)
    P = tl.where(offs_t[:, None] >= offs_t[None, :], P, 0.0)
    QT = tl.dot(P, _solve(M, beta, offs_t, T, TP), input_precision="ieee")
    decay = tl.exp(G)
    W = q * decay - tl.dot(QT, k * decay, input_precision="ieee")
    O = _times_state(W, S0) + tl.dot(QT, vals, input_precision="ieee")
    tl.store(out_ptr + (token * HV + hv)[:, None] * V + offs_v[None, :],
             tl.where(slot >= 0, O, 0.0).to(out_ptr.dtype.element_ty), mask=in_t[:, None] & (offs_v < V)[None, :])


def frozen_tile(HV: int, K: int, V: int, B: int, T: int) -> dict | None:
    """The closed form's ``{"BV", "num_warps"}`` for a frozen step, or None where the recurrence runs it:
    more than :data:`TOKEN_ROWS` tokens, or a head dimension under the dot's 16.
    ``KDA_TRITON_FROZEN_CONFIG`` (``"BV=64,num_warps=4"``; ``"recurrence=1"`` for the recurrence)
    replaces the choice for every shape."""
    if T > TOKEN_ROWS or min(K, V) < 16:
        return None
    tile = {"BV": min(V, 64), "num_warps": 4, "recurrence": 0}
    text = os.environ.get(FROZEN_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{FROZEN_CONFIG_ENV} items must be BV=, num_warps= or recurrence=<int>; got {item!r}")
        tile[name] = int(value)
    BV = tile["BV"]
    if BV < 16 or BV & (BV - 1) or V % BV or tile["num_warps"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"{FROZEN_CONFIG_ENV}: BV must be a power of two >= 16 dividing V={V} and num_warps one of "
                         f"1/2/4/8/16; got {text!r}")
    return None if tile.pop("recurrence") else tile


def frozen_arguments(inputs, out, tile: dict):
    """``(kernel, grid, args, meta)`` of a closed-form frozen step."""
    grid = (inputs.B * inputs.HV * (inputs.V // tile["BV"]),)
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, out, inputs.slot_stride, inputs.effective_scale, inputs.T)
    meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=tile["BV"],
                TP=TOKEN_ROWS, L2_EPS=L2_EPS, num_warps=tile["num_warps"])
    return _kda_frozen_kernel, grid, args, meta
