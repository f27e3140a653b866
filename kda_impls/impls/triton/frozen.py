"""Frozen verify in closed form: T tokens' outputs from one read of the start state, on the tensor cores.

With ``G_t`` the cumulative log decay through token t (a ``[K]`` vector), ``khat_t = k_t e^{G_t}``,
``qhat_t = q_t e^{G_t}``, ``ktil_j = k_j e^{-G_j}``, ``M = strict_lower(khat ktil^T)`` and
``P = tril(qhat ktil^T)``, the chained delta rule's T outputs are

    Tm = (I + diag(beta) M)^{-1} diag(beta),   QT = P Tm,   O = (qhat - QT khat) S0^T + QT V

Two launches. The *token terms* (no state) form ``W = qhat - QT khat`` and ``QT`` into a scratch the
launcher allocates (``W`` in the pool's dtype as a high part and its remainder; fp32 for an fp32
pool): a program stacks ``16 // T'`` (row, value head) pairs in the dot's 16 rows (``T'``: T padded to
a power of two), so every product is one ``tl.dot`` whatever T, summed over passes of 32 channels,
the T x T solve by forward substitution on all pairs at once. The *state product* (one program per
row, value head and ``BV`` rows of V) reads its ``[BV, K]`` start tile once in the pool's dtype, ``BK``
columns a pass, software-pipelined into shared memory, and forms ``O^T = S0 W^T + V^T QT^T`` by
``tl.dot`` with fp32 accumulation, the tokens padded to the dot's 16 columns: its cost is the tile's
read, whatever T.

``M`` and ``P`` need ``e^{G_t - G_j}`` (t >= j, never above 1), formed as ``e^{G_t - R} e^{R - G_j}``
with ``R`` the window's mid decay per channel: each factor stays within ``e^{+-span/2}``, ``span``
the window's log decay from its first token to its last. Where a channel's span passes
:data:`SPAN_LIMIT` a factor would leave fp32's range, and that pass of channels takes the exact
differences instead (16 passes of ``[16, 32]`` exponentials).
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
def _token_terms_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, w_ptr, qt_ptr, scale, T, heads,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, TS: tl.constexpr,
    TP: tl.constexpr, L2_EPS: tl.constexpr,
):
    """``TP // TS`` (row, value head) pairs stacked in the dot's ``TP`` rows, each on ``TS`` rows (T
    padded to a power of two), so each product is one dot whatever T: ``W`` (``[TP, K]`` a head, rows
    past T untouched) as two parts in ``w_ptr``'s dtype (high part, then remainder; one fp32 part for an
    fp32 pool) and ``QT`` (``[TP, TP]`` fp32 a head); the heads' products with each other fall off the
    dots' block diagonals. Two passes of ``BC`` channels (the channels are independent but for the
    products' sums), so no ``[TP, K]`` tile is ever live: the first sums ``M``, ``P`` and the norms, the
    second, after the solve, forms ``W`` (the gate computed again: cheaper than holding it). The norms
    scale the sums afterwards: ``k^ = k / |k|`` is a row scale of ``M``'s and ``P``'s factors."""
    HS: tl.constexpr = TP // TS
    offs_r = tl.arange(0, TP)
    head = tl.program_id(0).to(tl.int64) * HS + offs_r // TS  # each row's row * HV + hv
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
    for c0 in range(0, K, BC):
        offs_c = c0 + tl.arange(0, BC)
        q, k, G3 = _decayed_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr, neg_A, qk_rows, a_rows, hv, in_t, offs_c,
                                  K, HS, TS)
        qq += tl.sum(q * q, axis=1)
        kk += tl.sum(k * k, axis=1)
        G = tl.reshape(G3, (TP, BC))
        first = tl.sum(tl.where(offs_ts == 0, G3, 0.0), axis=1)  # [HS, BC]
        last = tl.sum(tl.where(offs_ts == T - 1, G3, 0.0), axis=1)
        if tl.max(tl.max(first - last, axis=1), axis=0) <= _SPAN_LIMIT:
            mid = tl.reshape(tl.broadcast_to((0.5 * (first + last))[:, None, :], (HS, TS, BC)), (TP, BC))
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
    same = offs_r[:, None] // TS == offs_r[None, :] // TS
    M = tl.where(same & (offs_r[:, None] > offs_r[None, :]), M * k_scale[:, None] * k_scale[None, :], 0.0)
    P = tl.where(same & (offs_r[:, None] >= offs_r[None, :]), P * q_scale[:, None] * k_scale[None, :], 0.0)

    # (I + diag(beta) M)^{-1} diag(beta) by forward substitution, every head's token s at once: its
    # row needs only the rows above it in its head
    A = beta[:, None] * M
    diagonal = tl.where(offs_r[:, None] == offs_r[None, :], beta[:, None], 0.0)
    X = tl.zeros([TP, TP], dtype=tl.float32)
    for s in range(T):
        X = tl.where((t == s)[:, None], diagonal - tl.dot(A, X, input_precision="tf32x3"), X)
    QT = tl.dot(P, X, input_precision="tf32x3")

    rows = head * TP + t
    tl.store(qt_ptr + rows[:, None] * TP + (offs_r % TS)[None, :], QT, mask=in_t[:, None] & same & (t < T)[None, :],
             eviction_policy="evict_last")
    QTk = QT * k_scale[None, :]
    for c0 in range(0, K, BC):
        offs_c = c0 + tl.arange(0, BC)
        q, k, G3 = _decayed_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr, neg_A, qk_rows, a_rows, hv, in_t, offs_c,
                                  K, HS, TS)
        decay = tl.exp(tl.reshape(G3, (TP, BC)))
        W = q_scale[:, None] * q * decay - tl.dot(QTk, k * decay, input_precision="tf32x3")
        part = w_ptr + rows[:, None] * K + offs_c[None, :]
        high = W.to(w_ptr.dtype.element_ty)
        in_tc = in_t[:, None] & (offs_c[None, :] < K)
        tl.store(part, high, mask=in_tc, eviction_policy="evict_last")
        if w_ptr.dtype.element_ty != tl.float32:
            tl.store(part + heads * TP * K, (W - high.to(tl.float32)).to(high.dtype), mask=in_tc,
                     eviction_policy="evict_last")


@triton.jit
def _state_product_kernel(
    v_ptr, state_ptr, slots_ptr, w_ptr, qt_ptr, out_ptr, slot_stride, T, heads,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Per row, value head and ``BV`` rows of V (a *unit*): ``O^T = S0 W^T + V^T QT^T`` from one read of
    the start tile, ``BK`` columns a pass. A program walks units ``pid, pid + programs, ...`` in one
    loop of passes, so the software pipeline copies the next unit's first tiles into shared memory
    while this unit's epilogue runs; the tile is the dot's left operand and never passes through
    registers."""
    V_TILES: tl.constexpr = V // BV
    PASSES: tl.constexpr = K // BK
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    units = heads * V_TILES
    offs_t = tl.arange(0, TP)
    in_t = offs_t < T
    acc = tl.zeros([BV, TP], dtype=tl.float32)
    for i in tl.range(0, tl.cdiv(units - pid, programs) * PASSES, num_stages=STAGES):
        unit = pid + (i // PASSES) * programs
        head = (unit // V_TILES).to(tl.int64)  # row * HV + hv; int64: row * HV * V overflows int32
        row = head // HV
        hv = head % HV
        offs_v = unit % V_TILES * BV + tl.arange(0, BV)
        offs_k = i % PASSES * BK + tl.arange(0, BK)
        slot = tl.load(slots_ptr + row)
        live = (tl.zeros([BV, BK], dtype=tl.int32) + slot) >= 0  # a splat: 16-byte accesses stay
        tile = state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K) + offs_v[:, None] * K
        S0 = tl.load(tile + offs_k[None, :], mask=live, other=0.0)  # the one large read
        rows = head * TP + offs_t
        in_kt = (offs_k[:, None] < K) & in_t[None, :]
        part = w_ptr + rows[None, :] * K + offs_k[:, None]  # W^T: [BK, TP]
        high = tl.load(part, mask=in_kt, other=0.0)
        if INTERPRETED:  # the interpreter's 16-bit dot multiplies the bits: the same products in fp32
            S0, high = S0.to(tl.float32), high.to(tl.float32)
        if state_ptr.dtype.element_ty == tl.float32:
            acc = tl.dot(S0, high, acc, input_precision="tf32x3")
        else:
            low = tl.load(part + heads * TP * K, mask=in_kt, other=0.0)
            if INTERPRETED:
                low = low.to(tl.float32)
            acc = tl.dot(S0, low, tl.dot(S0, high, acc))
        if i % PASSES == PASSES - 1:  # the unit's last pass: V^T QT^T, then its outputs
            token_hv = (row * T + offs_t) * HV + hv
            in_vt = (offs_v[:, None] < V) & in_t[None, :]
            vals = tl.load(v_ptr + token_hv[None, :] * V + offs_v[:, None], mask=in_vt, other=0.0).to(tl.float32)
            QT = tl.load(qt_ptr + rows[None, :] * TP + offs_t[:, None], mask=in_t[:, None] & in_t[None, :],
                         other=0.0)
            acc = tl.dot(vals, QT, acc, input_precision="tf32x3")  # V^T QT^T: QT loaded transposed
            tl.store(out_ptr + token_hv[None, :] * V + offs_v[:, None],
                     tl.where(slot >= 0, acc, 0.0).to(out_ptr.dtype.element_ty), mask=in_vt)
            acc = tl.zeros([BV, TP], dtype=tl.float32)


def frozen_tile(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int) -> dict | None:
    """The closed form's ``{"BV", "BK", "stages", "num_warps", "terms_warps"}`` (the product's tile, its
    columns a pass, passes in flight and warps; the terms launch's warps) for a frozen step, or None where
    the recurrence runs it: more than :data:`TOKEN_ROWS` tokens, a head dimension under the dot's 16, or
    two tokens or fewer on at most :data:`RECURRENCE_HEADS` (row, head) pairs, where the recurrence's one
    launch is the faster (results/h100-80gb-hbm3/frozen-closed-form/summary.md). The bf16 product tile (64
    rows, 64 columns a pass, 2 in flight) is the fastest of the four at every point the closed form runs in
    results/h100-80gb-hbm3/frozen-product-tiles/tiles.csv; the terms launch's 4 warps: not yet timed.
    ``KDA_TRITON_FROZEN_CONFIG`` (``"BV=64,BK=32,stages=3"``, ``"terms_warps=1"``, ``"recurrence=1"``,
    ``"recurrence=0"``) replaces the fields it names for every shape."""
    if T > TOKEN_ROWS or min(K, V) < 16:
        return None
    # 16 KiB of a 16-bit tile; 16 KiB of fp32 (its three tf32 products hold more registers)
    tile = {"BV": min(V, 64 if state_dtype.itemsize <= 2 else 32), "BK": min(K, 64), "stages": 2, "num_warps": 4,
            "terms_warps": 4, "programs_per_sm": 0,
            "recurrence": int(T <= 2 and B * HV <= RECURRENCE_HEADS)}
    text = os.environ.get(FROZEN_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{FROZEN_CONFIG_ENV} items must be one of {', '.join(tile)} as name=<int>; got {item!r}")
        tile[name] = int(value)
    BV, BK = tile["BV"], tile["BK"]
    if (min(BV, BK) < 16 or BV & (BV - 1) or BK & (BK - 1) or V % BV or K % BK or tile["stages"] < 1
            or {tile["num_warps"], tile["terms_warps"]} - {1, 2, 4, 8, 16}):
        raise ValueError(f"{FROZEN_CONFIG_ENV}: BV and BK must be powers of two >= 16 dividing V={V} and K={K}, "
                         f"stages >= 1, num_warps and terms_warps one of 1/2/4/8/16; got {text!r}")
    return None if tile.pop("recurrence") else tile


def frozen_launches(inputs, out, tile: dict, multiprocessors: int) -> list:
    """The two launches of a closed-form frozen step, each ``(kernel, grid, args, meta)``; the scratch
    they share is allocated here (bind time)."""
    heads = inputs.B * inputs.HV
    parts = 1 if inputs.state.dtype == torch.float32 else 2
    w = torch.empty(parts * heads * TOKEN_ROWS * inputs.K, dtype=inputs.state.dtype, device=inputs.device)
    qt = torch.empty(heads * TOKEN_ROWS * TOKEN_ROWS, dtype=torch.float32, device=inputs.device)
    group = inputs.HV // inputs.H
    rows = triton.next_power_of_2(inputs.T)  # a head's token rows in the terms launch's dots
    terms = (_token_terms_kernel, (triton.cdiv(heads, TOKEN_ROWS // rows),),
             (inputs.q, inputs.k, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, w, qt, inputs.effective_scale,
              inputs.T, heads),
             dict(HV=inputs.HV, GROUP=group, K=inputs.K, BC=min(inputs.K, 32), TS=rows, TP=TOKEN_ROWS,
                  L2_EPS=L2_EPS, num_warps=tile["terms_warps"]))
    units = heads * (inputs.V // tile["BV"])
    persistent = tile["programs_per_sm"] * multiprocessors
    product = (_state_product_kernel, (min(units, persistent) if persistent else units,),
               (inputs.v, inputs.state, inputs.slots, w, qt, out, inputs.slot_stride, inputs.T, heads),
               dict(HV=inputs.HV, K=inputs.K, V=inputs.V, BV=tile["BV"], BK=tile["BK"], TP=TOKEN_ROWS,
                    STAGES=tile["stages"], num_warps=tile["num_warps"]))
    return [terms, product]
