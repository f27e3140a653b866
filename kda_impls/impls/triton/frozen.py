"""Frozen verify in closed form: T tokens' outputs from one read of the start state, on the tensor cores.

With ``G_t`` the cumulative log decay through token t (a ``[K]`` vector), ``khat_t = k_t e^{G_t}``,
``qhat_t = q_t e^{G_t}``, ``ktil_j = k_j e^{-G_j}``, ``M = strict_lower(khat ktil^T)`` and
``P = tril(qhat ktil^T)``, the chained delta rule's T outputs are

    Tm = (I + diag(beta) M)^{-1} diag(beta),   QT = P Tm,   O = (qhat - QT khat) S0^T + QT V

One launch, no scratch. A program takes ``16 // TS`` (row, value head) pairs (``TS``: T padded to a
power of two) and ``BV`` rows of V: the pairs' tokens stacked in the dot's 16 rows, so every product
is one ``tl.dot`` whatever T, the pairs' products with each other falling off its block diagonal. It
forms the token terms in registers (``M``, ``P`` and the norms over passes of ``BK`` channels, the
T x T solve by forward substitution, ``W = qhat - QT khat``), then reads each pair's ``[BV, K]`` start
tile once in the pool's dtype, software-pipelined into shared memory a pair ahead, and forms
``O^T = S0 W^T + V^T QT^T`` with fp32 accumulation (``W`` as a high part and its remainder in the
pool's dtype; tf32x3 for an fp32 pool): its cost is the tiles' read, whatever T.

``M`` and ``P`` need ``e^{G_t - G_j}`` (t >= j, never above 1), formed as ``e^{G_t - R} e^{R - G_j}``
with ``R`` the window's mid decay per channel: each factor stays within ``e^{+-span/2}``, ``span``
the window's log decay from its first token to its last. Where a channel's span passes
:data:`SPAN_LIMIT` a factor would leave fp32's range, and that pass of channels takes the exact
differences instead (16 passes of ``[16, BK]`` exponentials).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...reference import L2_EPS, SOFTPLUS_LINEAR_ABOVE
from .gate import INTERPRETED

SPAN_LIMIT = 160.0  # each factor within e^+-80, inside fp32's e^+-88
TOKEN_ROWS = 16  # the dot's minimum M: T <= 16 tokens padded to it; more run the recurrence
FROZEN_CONFIG_ENV = "KDA_TRITON_FROZEN_CONFIG"
RECURRENCE_HEADS = 2048  # B * HV up to which a step of T <= 2 runs the recurrence (measured faster there)
_LINEAR_ABOVE = tl.constexpr(SOFTPLUS_LINEAR_ABOVE)  # a global a kernel reads must be a constexpr
_SPAN_LIMIT = tl.constexpr(SPAN_LIMIT)


@triton.jit
def _row(x, offs, r):
    """Row ``r`` of a ``[R, N]`` tile as an ``[N]`` vector."""
    return tl.sum(tl.where(offs[:, None] == r, x, 0.0), axis=0)


@triton.jit
def _decayed_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr, neg_A, qk_rows, a_rows, hv, in_t, offs_c,
                   K: tl.constexpr, HS: tl.constexpr, TS: tl.constexpr):
    """One chunk of channels of the stacked heads: ``q`` and ``k`` as loaded (fp32, ``[TP, BC]``) and each
    head's cumulative log decay ``G`` (``[HS, TS, BC]``); padding tokens decay nothing: G stays G_{T-1}."""
    in_tc = in_t[:, None] & (offs_c[None, :] < K)
    q = tl.load(q_ptr + qk_rows[:, None] + offs_c[None, :], mask=in_tc, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + qk_rows[:, None] + offs_c[None, :], mask=in_tc, other=0.0).to(tl.float32)
    x = tl.load(a_ptr + a_rows[:, None] + offs_c[None, :], mask=in_tc, other=0.0).to(tl.float32)
    x += tl.load(dt_bias_ptr + hv[:, None] * K + offs_c[None, :])
    g = tl.where(in_tc, neg_A[:, None] * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x))), 0.0)
    return q, k, tl.cumsum(tl.reshape(g, (HS, TS, offs_c.shape[0])), axis=1)


@triton.jit
def _frozen_step_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr, scale, T, heads,
    slot_stride,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    TS: tl.constexpr, TP: tl.constexpr, STAGES: tl.constexpr, L2_EPS: tl.constexpr,
):
    """Per ``TP // TS`` (row, value head) pairs and ``BV`` rows of V: the pairs' tokens stacked in the
    dot's ``TP`` rows, ``TS`` a pair (T padded to a power of two), so that each product is one dot
    whatever T and the pairs' products with each other fall off its block diagonal.

    The token terms first, in registers: ``M``, ``P`` and the norms summed over passes of ``BK``
    channels (the channels are independent but for these sums, so no ``[TP, K]`` tile is live; the
    norms scale the sums afterwards, ``k^ = k / |k|`` being a row scale of their factors), the solve,
    then ``W``. Then ``O^T = S0 W^T + V^T QT^T`` a pair at a time, each pair's ``[BV, K]`` start tile the
    dot's left operand: the software pipeline copies the next pairs' tiles from memory into shared
    memory ``STAGES`` pairs ahead and the tensor cores read them there, so a tile never passes through
    registers, and ``W`` (in the pool's dtype as a high part and its remainder; tf32x3 for an fp32
    pool) never leaves them."""
    HS: tl.constexpr = TP // TS
    V_TILES: tl.constexpr = V // BV
    pid = tl.program_id(0)
    group = (pid // V_TILES).to(tl.int64)  # int64: row * HV * V overflows int32
    offs_v = pid % V_TILES * BV + tl.arange(0, BV)
    offs_r = tl.arange(0, TP)
    pair = offs_r // TS
    head = group * HS + pair  # each row's row * HV + hv
    t = offs_r % TS
    hv = head % HV
    token = head // HV * T + t
    in_t = (t < T) & (head < heads)
    qk_rows = (token * (HV // GROUP) + hv // GROUP) * K
    a_rows = (token * HV + hv) * K
    neg_A = -tl.exp(tl.load(A_log_ptr + hv))
    beta = tl.where(in_t, tl.sigmoid(tl.load(b_ptr + token * HV + hv, mask=in_t, other=0.0).to(tl.float32)), 0.0)
    offs_ts = tl.arange(0, TS)[None, :, None]

    M = tl.zeros([TP, TP], dtype=tl.float32)
    P = tl.zeros([TP, TP], dtype=tl.float32)
    qq = tl.zeros([TP], dtype=tl.float32)
    kk = tl.zeros([TP], dtype=tl.float32)
    for c0 in range(0, K, BK):
        q, k, G3 = _decayed_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr, neg_A, qk_rows, a_rows, hv, in_t,
                                  c0 + tl.arange(0, BK), K, HS, TS)
        qq += tl.sum(q * q, axis=1)
        kk += tl.sum(k * k, axis=1)
        G = tl.reshape(G3, (TP, BK))
        first = tl.sum(tl.where(offs_ts == 0, G3, 0.0), axis=1)  # [HS, BK]
        last = tl.sum(tl.where(offs_ts == T - 1, G3, 0.0), axis=1)
        if tl.max(tl.max(first - last, axis=1), axis=0) <= _SPAN_LIMIT:
            mid = tl.reshape(tl.broadcast_to((0.5 * (first + last))[:, None, :], (HS, TS, BK)), (TP, BK))
            ahead = tl.exp(G - mid)
            ktil = tl.trans(k / ahead)  # k e^{R - G}
            M = tl.dot(k * ahead, ktil, M, input_precision="tf32x3")
            P = tl.dot(q * ahead, ktil, P, input_precision="tf32x3")
        else:
            for j in range(TP):  # column j from the exact decays e^{G_t - G_j} (t >= j: never above 1)
                decayed = _row(k, offs_r, j)[None, :] * tl.exp(tl.minimum(G - _row(G, offs_r, j)[None, :], 0.0))
                M += tl.where(offs_r[None, :] == j, tl.sum(k * decayed, axis=1)[:, None], 0.0)
                P += tl.where(offs_r[None, :] == j, tl.sum(q * decayed, axis=1)[:, None], 0.0)
    q_scale = scale / tl.sqrt(qq + L2_EPS)
    k_scale = 1.0 / tl.sqrt(kk + L2_EPS)
    same = pair[:, None] == pair[None, :]
    M = tl.where(same & (offs_r[:, None] > offs_r[None, :]), M * k_scale[:, None] * k_scale[None, :], 0.0)
    P = tl.where(same & (offs_r[:, None] >= offs_r[None, :]), P * q_scale[:, None] * k_scale[None, :], 0.0)

    # (I + diag(beta) M)^{-1} diag(beta) by forward substitution, every pair's token s at once: its row
    # needs only the rows above it in its pair
    A = beta[:, None] * M
    diagonal = tl.where(offs_r[:, None] == offs_r[None, :], beta[:, None], 0.0)
    X = tl.zeros([TP, TP], dtype=tl.float32)
    for s in range(T):
        X = tl.where((t == s)[:, None], diagonal - tl.dot(A, X, input_precision="tf32x3"), X)
    QT = tl.dot(P, X, input_precision="tf32x3")

    offs_k = tl.arange(0, K)
    q, k, G3 = _decayed_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr, neg_A, qk_rows, a_rows, hv, in_t, offs_k, K, HS, TS)
    decay = tl.exp(tl.reshape(G3, (TP, K)))
    W = q_scale[:, None] * q * decay - tl.dot(QT * k_scale[None, :], k * decay, input_precision="tf32x3")
    high = tl.trans(W.to(state_ptr.dtype.element_ty))  # W^T: [K, TP]
    low = tl.trans((W - W.to(state_ptr.dtype.element_ty).to(tl.float32)).to(state_ptr.dtype.element_ty))
    if INTERPRETED:  # the interpreter's 16-bit dot multiplies the bits: the same products in fp32
        high, low = high.to(tl.float32), low.to(tl.float32)

    acc = tl.zeros([BV, TP], dtype=tl.float32)
    for h in tl.range(0, HS, num_stages=STAGES):
        head_h = group * HS + h
        slot = tl.load(slots_ptr + head_h // HV, mask=head_h < heads, other=-1)
        live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0  # a splat, not a scalar: 16-byte accesses stay
        tile = state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + head_h % HV * (V * K)
        S0 = tl.load(tile + offs_v[:, None] * K + offs_k[None, :], mask=live, other=0.0)  # the one large read
        if INTERPRETED:
            S0 = S0.to(tl.float32)
        mine = (pair == h)[None, :]
        if state_ptr.dtype.element_ty == tl.float32:
            acc = tl.dot(S0, tl.where(mine, high, 0.0), acc, input_precision="tf32x3")
        else:
            acc = tl.dot(S0, tl.where(mine, low, 0.0), tl.dot(S0, tl.where(mine, high, 0.0), acc))
    token_hv = token * HV + hv
    in_vt = (offs_v[:, None] < V) & in_t[None, :]
    vals = tl.load(v_ptr + token_hv[None, :] * V + offs_v[:, None], mask=in_vt, other=0.0).to(tl.float32)
    acc = tl.dot(vals, tl.trans(QT), acc, input_precision="tf32x3")  # V^T QT^T
    slots = tl.load(slots_ptr + head // HV, mask=head < heads, other=-1)
    tl.store(out_ptr + token_hv[None, :] * V + offs_v[:, None],
             tl.where(slots[None, :] >= 0, acc, 0.0).to(out_ptr.dtype.element_ty), mask=in_vt)


def frozen_tile(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int) -> dict | None:
    """The closed form's ``{"BV", "BK", "stages", "num_warps"}`` (the rows of V a program outputs, the
    channels a pass of its token terms, the pairs' start tiles in flight, its warps) for a frozen step, or
    None where the recurrence runs it: more than :data:`TOKEN_ROWS` tokens, a head dimension under the
    dot's 16, or two tokens or fewer on at most :data:`RECURRENCE_HEADS` (row, head) pairs, where the
    recurrence's one launch is the faster (results/h100-80gb-hbm3/frozen-closed-form/summary.md).
    ``KDA_TRITON_FROZEN_CONFIG`` (``"BV=64,BK=64,stages=3"``, ``"recurrence=1"``, ``"recurrence=0"``)
    replaces the fields it names for every shape."""
    if T > TOKEN_ROWS or min(K, V) < 16:
        return None
    # a start tile of 32 KiB a stage
    tile = {"BV": min(V, 128 if state_dtype.itemsize <= 2 else 64), "BK": min(K, 32), "stages": 2, "num_warps": 4,
            "recurrence": int(T <= 2 and B * HV <= RECURRENCE_HEADS)}
    text = os.environ.get(FROZEN_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{FROZEN_CONFIG_ENV} items must be one of {', '.join(tile)} as name=<int>; got {item!r}")
        tile[name] = int(value)
    BV, BK = tile["BV"], tile["BK"]
    if (min(BV, BK) < 16 or BV & (BV - 1) or BK & (BK - 1) or V % BV or K % BK or tile["stages"] < 1
            or tile["num_warps"] not in (1, 2, 4, 8, 16)):
        raise ValueError(f"{FROZEN_CONFIG_ENV}: BV and BK must be powers of two >= 16 dividing V={V} and K={K}, "
                         f"stages >= 1, num_warps one of 1/2/4/8/16; got {text!r}")
    return None if tile.pop("recurrence") else tile


def frozen_launches(inputs, out, tile: dict) -> list:
    """The closed form's one launch, ``(kernel, grid, args, meta)``."""
    heads = inputs.B * inputs.HV
    rows = triton.next_power_of_2(inputs.T)  # a pair's token rows in the dots
    step = (_frozen_step_kernel, (triton.cdiv(heads, TOKEN_ROWS // rows) * (inputs.V // tile["BV"]),),
            (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots,
             out, inputs.effective_scale, inputs.T, heads, inputs.slot_stride),
            dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=tile["BV"], BK=tile["BK"],
                 TS=rows, TP=TOKEN_ROWS, STAGES=tile["stages"], L2_EPS=L2_EPS, num_warps=tile["num_warps"]))
    return [step]
