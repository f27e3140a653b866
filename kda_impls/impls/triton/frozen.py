"""Frozen verify in closed form: T tokens' outputs from one read of the start state, on the tensor cores.

With ``G_t`` the cumulative log decay through token t (a ``[K]`` vector), ``khat_t = k_t e^{G_t}``,
``qhat_t = q_t e^{G_t}``, ``ktil_j = k_j e^{-G_j}``, ``M = strict_lower(khat ktil^T)`` and
``P = tril(qhat ktil^T)``, the chained delta rule's T outputs are

    Tm = (I + diag(beta) M)^{-1} diag(beta),   QT = P Tm,   O = (qhat - QT khat) S0^T + QT V

Two launches. The *token terms* (one program per row and value head, no state) form
``W = qhat - QT khat`` and ``QT`` into a scratch the launcher allocates: ``W`` rounded once to the
pool's dtype (fp32 for an fp32 pool; ``w_parts=2`` adds its remainder as a second part), the T x T
solve a forward substitution in registers, all in straight-line code with T compiled in. Up to 8 tokens
its products run on the CUDA cores, one column (or outer product) of ``[T, K]`` a pass; 9-16 tokens,
padded to 16, on the tensor cores. The *state product* (one program per
row, value head and ``BV`` rows of V) reads its ``[BV, K]`` start tile once in the pool's dtype, ``BK``
columns a pass, software-pipelined into shared memory, and forms ``O^T = S0 W^T + V^T QT^T`` by
``tl.dot`` with fp32 accumulation, the tokens padded to the dot's 16 columns: its cost is the tile's
read, whatever T.

``M`` and ``P`` need ``e^{G_t - G_j}`` (t >= j, never above 1), formed as ``e^{G_t - R} e^{R - G_j}``
with ``R`` the window's mid decay per channel: each factor stays within ``e^{+-span/2}``, ``span``
the window's log decay from its first token to its last. Where a channel's span passes
:data:`SPAN_LIMIT` a factor would leave fp32's range, and that program takes the exact differences
instead (T passes of ``[T, K]`` exponentials).
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
def _row(x, offs_t, t):
    """Row ``t`` of a ``[TS, N]`` tile as an ``[N]`` vector."""
    return tl.sum(tl.where(offs_t[:, None] == t, x, 0.0), axis=0)


@triton.jit
def _times_t(a, b):
    """``a [M, N] @ b [P, N]^T``: three tf32 products on the tensor cores from the dot's 16 rows, else on
    the CUDA cores one column a pass (a ``[T, T, K]`` broadcast spills at T = 8)."""
    if a.shape[0] >= 16 and b.shape[0] >= 16:
        return tl.dot(a, tl.trans(b), input_precision="tf32x3")
    else:
        offs_p = tl.arange(0, b.shape[0])
        c = tl.zeros([a.shape[0], b.shape[0]], dtype=tl.float32)
        for p in tl.static_range(b.shape[0]):
            c = tl.where(offs_p[None, :] == p, tl.sum(a * _row(b, offs_p, p)[None, :], axis=1)[:, None], c)
        return c


@triton.jit
def _times(a, b):
    """``a [M, N] @ b [N, P]``: as :func:`_times_t`, on the CUDA cores one outer product a pass."""
    if a.shape[0] >= 16 and b.shape[0] >= 16:
        return tl.dot(a, b, input_precision="tf32x3")
    else:
        offs_n = tl.arange(0, b.shape[0])
        c = tl.zeros([a.shape[0], b.shape[1]], dtype=tl.float32)
        for n in tl.static_range(b.shape[0]):
            c += tl.sum(tl.where(offs_n[None, :] == n, a, 0.0), axis=1)[:, None] * _row(b, offs_n, n)[None, :]
        return c


@triton.jit
def _token_terms_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, w_ptr, qt_ptr, scale, T: tl.constexpr,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, TS: tl.constexpr, TP: tl.constexpr,
    L2_EPS: tl.constexpr, W_PARTS: tl.constexpr,
):
    """Per row and value head (one warp for every four tokens): ``W`` (``[TP, K]``, rows past T untouched)
    in ``w_ptr``'s dtype, ``W_PARTS`` parts (high part, then remainder; one part for an fp32 pool) and
    ``QT`` (``[TP, TP]`` fp32); ``TS``: T padded to a power of two, or to 16 for the tensor cores."""
    head = tl.program_id(0).to(tl.int64)  # row * HV + hv
    row = head // HV
    hv = head % HV
    offs_k = tl.arange(0, K)
    offs_t = tl.arange(0, TS)
    token = row * T + offs_t
    in_t = offs_t < T
    in_tk = in_t[:, None] & (offs_k[None, :] < K)
    qk_rows = (token * (HV // GROUP) + hv // GROUP)[:, None] * K + offs_k[None, :]
    q = tl.load(q_ptr + qk_rows, mask=in_tk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + qk_rows, mask=in_tk, other=0.0).to(tl.float32)
    x = tl.load(a_ptr + (token * HV + hv)[:, None] * K + offs_k[None, :], mask=in_tk, other=0.0).to(tl.float32)
    beta = tl.where(in_t, tl.sigmoid(tl.load(b_ptr + token * HV + hv, mask=in_t, other=0.0).to(tl.float32)), 0.0)
    x += tl.load(dt_bias_ptr + hv * K + offs_k)[None, :]
    g = -tl.exp(tl.load(A_log_ptr + hv)) * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))
    G = tl.cumsum(tl.where(in_tk, g, 0.0), axis=0)  # padding tokens decay nothing: G stays G_{T-1}
    q = q * (scale / tl.sqrt(tl.sum(q * q, axis=1) + L2_EPS))[:, None]
    k = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]

    first = _row(G, offs_t, 0)
    last = _row(G, offs_t, T - 1)
    # outside any branch: the compiler cannot prove a branch uniform, and wraps each shuffle in one
    mid = 0.5 * (first + last)
    ktil = k * tl.exp(mid[None, :] - G)
    ahead = tl.exp(G - mid[None, :])
    M = _times_t(k * ahead, ktil)
    P = _times_t(q * ahead, ktil)
    if tl.max(first - last, axis=0) > _SPAN_LIMIT:  # the factors left fp32's range: replaced
        M = tl.zeros([TS, TS], dtype=tl.float32)
        P = tl.zeros([TS, TS], dtype=tl.float32)
        for j in range(T):  # column j from the exact decays e^{G_t - G_j} (t >= j: never above 1)
            decayed = _row(k, offs_t, j)[None, :] * tl.exp(tl.minimum(G - _row(G, offs_t, j)[None, :], 0.0))
            M = tl.where(offs_t[None, :] == j, tl.sum(k * decayed, axis=1)[:, None], M)
            P = tl.where(offs_t[None, :] == j, tl.sum(q * decayed, axis=1)[:, None], P)
    M = tl.where(offs_t[:, None] > offs_t[None, :], M, 0.0)
    P = tl.where(offs_t[:, None] >= offs_t[None, :], P, 0.0)

    # (I + diag(beta) M)^{-1} diag(beta) by forward substitution: row t needs only the rows above it
    A = beta[:, None] * M
    X = tl.zeros([TS, TS], dtype=tl.float32)
    for t in tl.static_range(T):
        beta_t = tl.sum(tl.where(offs_t == t, beta, 0.0), axis=0)
        x_t = tl.where(offs_t == t, beta_t, 0.0) - tl.sum(_row(A, offs_t, t)[:, None] * X, axis=0)
        X = tl.where(offs_t[:, None] == t, x_t[None, :], X)
    QT = _times(P, X)
    decay = tl.exp(G)
    W = q * decay - _times(QT, k * decay)

    rows = head * TP + offs_t
    tl.store(qt_ptr + rows[:, None] * TP + offs_t[None, :], QT, mask=in_t[:, None] & in_t[None, :])
    part = w_ptr + rows[:, None] * K + offs_k[None, :]
    high = W.to(w_ptr.dtype.element_ty)
    tl.store(part, high, mask=in_tk)
    if W_PARTS == 2:
        tl.store(part + tl.num_programs(0).to(tl.int64) * TP * K, (W - high.to(tl.float32)).to(high.dtype),
                 mask=in_tk)


@triton.jit
def _state_product_kernel(
    v_ptr, state_ptr, slots_ptr, w_ptr, qt_ptr, out_ptr, slot_stride, T, heads,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr,
    STAGES: tl.constexpr, W_PARTS: tl.constexpr,
):
    """Per row, value head and ``BV`` rows of V: ``O^T = S0 W^T + V^T QT^T`` from one read of the start
    tile, ``BK`` columns a pass. The tile is the dot's left operand (``[BV, BK]``, ``BV`` its M rows), so
    the software pipeline copies it from memory into shared memory ``STAGES`` passes ahead and the tensor
    cores read it there: it never passes through registers, and bytes stay in flight during the dots."""
    V_TILES: tl.constexpr = V // BV
    pid = tl.program_id(0)
    head = (pid // V_TILES).to(tl.int64)  # row * HV + hv; int64: row * HV * V overflows int32
    row = head // HV
    hv = head % HV
    offs_t = tl.arange(0, TP)
    offs_v = pid % V_TILES * BV + tl.arange(0, BV)
    in_t = offs_t < T
    rows = head * TP + offs_t
    # V and QT need no slot: issued first, their round trip overlaps the slot's and the tile's
    token_hv = (row * T + offs_t) * HV + hv
    in_vt = (offs_v[:, None] < V) & in_t[None, :]
    vals = tl.load(v_ptr + token_hv[None, :] * V + offs_v[:, None], mask=in_vt, other=0.0).to(tl.float32)
    QT = tl.load(qt_ptr + rows[None, :] * TP + offs_t[:, None], mask=in_t[:, None] & in_t[None, :], other=0.0)
    slot = tl.load(slots_ptr + row)
    live = (tl.zeros([BV, BK], dtype=tl.int32) + slot) >= 0  # a splat, not a scalar: 16-byte accesses stay
    tile = state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K) + offs_v[:, None] * K
    acc = tl.zeros([BV, TP], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BK)
        S0 = tl.load(tile + offs_k[None, :], mask=live, other=0.0)  # the one large read
        in_kt = (offs_k[:, None] < K) & in_t[None, :]
        part = w_ptr + rows[None, :] * K + offs_k[:, None]  # W^T: [BK, TP]
        high = tl.load(part, mask=in_kt, other=0.0)
        if INTERPRETED:  # the interpreter's 16-bit dot multiplies the bits: the same products in fp32
            S0, high = S0.to(tl.float32), high.to(tl.float32)
        if state_ptr.dtype.element_ty == tl.float32:
            acc = tl.dot(S0, high, acc, input_precision="tf32x3")
        elif W_PARTS == 1:
            acc = tl.dot(S0, high, acc)
        else:
            low = tl.load(part + heads * TP * K, mask=in_kt, other=0.0)
            if INTERPRETED:
                low = low.to(tl.float32)
            acc = tl.dot(S0, low, tl.dot(S0, high, acc))
    acc = tl.dot(vals, QT, acc, input_precision="tf32x3")  # V^T QT^T: QT loaded transposed
    tl.store(out_ptr + token_hv[None, :] * V + offs_v[:, None],
             tl.where(slot >= 0, acc, 0.0).to(out_ptr.dtype.element_ty), mask=in_vt)


def frozen_tile(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int) -> dict | None:
    """The closed form's ``{"BV", "BK", "stages", "num_warps", "terms_warps"}`` (the product's tile, its
    columns a pass, passes in flight and warps; the terms launch's warps) for a frozen step, or None where
    the recurrence runs it: more than :data:`TOKEN_ROWS` tokens, a head dimension under the dot's 16, or
    two tokens or fewer on at most :data:`RECURRENCE_HEADS` (row, head) pairs, where the recurrence's one
    launch is the faster (results/h100-80gb-hbm3/frozen-closed-form/summary.md). The bf16 product tile (64
    rows, 64 columns a pass, 2 in flight) is the fastest of the four at every point the closed form runs in
    results/h100-80gb-hbm3/frozen-product-tiles/tiles.csv; one terms warp up to 8 tokens: faster than two
    at every point timed at T = 4 and 8 (results/h100-80gb-hbm3/frozen-tiles/tiles.csv), and than four
    warps on the tensor cores (results/h100-80gb-hbm3/frozen-stacked-terms). ``W`` rounded once: one
    product dot and half the scratch, 4-7% faster than with its remainder as a second part (``w_parts=2``),
    a bf16 output's error against float64 2.3e-3 against 1.7e-3 (results/h100-80gb-hbm3/frozen-forms).
    ``KDA_TRITON_FROZEN_CONFIG`` (``"BV=64,BK=32,stages=3"``, ``"terms_warps=1"``, ``"terms_rows=16"``,
    ``"w_parts=2"``, ``"recurrence=1"``, ``"recurrence=0"``) replaces the fields it names for every shape;
    ``terms_rows=16`` pads the terms' tokens to the dot's 16 rows, their products on the tensor cores."""
    if T > TOKEN_ROWS or min(K, V) < 16:
        return None
    # 16 KiB of a 16-bit tile; 16 KiB of fp32 (its three tf32 products hold more registers)
    tile = {"BV": min(V, 64 if state_dtype.itemsize <= 2 else 32), "BK": min(K, 64), "stages": 2, "num_warps": 4,
            "terms_warps": 1 if T <= 8 else 4,  # more warps split the column passes' sums across warps
            "terms_rows": 0,  # 0: T padded to a power of two (CUDA cores up to 8); 16: to the dot's 16 rows
            "w_parts": 1,  # a 16-bit pool's W rounded once (1) or as a high part and its remainder (2)
            "recurrence": int(T <= 2 and B * HV <= RECURRENCE_HEADS)}
    text = os.environ.get(FROZEN_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{FROZEN_CONFIG_ENV} items must be one of {', '.join(tile)} as name=<int>; got {item!r}")
        tile[name] = int(value)
    BV, BK = tile["BV"], tile["BK"]
    if (min(BV, BK) < 16 or BV & (BV - 1) or BK & (BK - 1) or V % BV or K % BK or tile["stages"] < 1
            or {tile["num_warps"], tile["terms_warps"]} - {1, 2, 4, 8, 16} or tile["terms_rows"] not in (0, 16)
            or tile["w_parts"] not in (1, 2)):
        raise ValueError(f"{FROZEN_CONFIG_ENV}: BV and BK must be powers of two >= 16 dividing V={V} and K={K}, "
                         f"stages >= 1, num_warps and terms_warps one of 1/2/4/8/16, terms_rows 0 or 16, "
                         f"w_parts 1 or 2; got {text!r}")
    return None if tile.pop("recurrence") else tile


def frozen_launches(inputs, out, tile: dict) -> list:
    """The two launches of a closed-form frozen step, each ``(kernel, grid, args, meta)``; the scratch
    they share is allocated here (bind time)."""
    heads = inputs.B * inputs.HV
    parts = 1 if inputs.state.dtype == torch.float32 else tile["w_parts"]
    w = torch.empty(parts * heads * TOKEN_ROWS * inputs.K, dtype=inputs.state.dtype, device=inputs.device)
    qt = torch.empty(heads * TOKEN_ROWS * TOKEN_ROWS, dtype=torch.float32, device=inputs.device)
    group = inputs.HV // inputs.H
    terms = (_token_terms_kernel, (heads,),
             (inputs.q, inputs.k, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, w, qt, inputs.effective_scale,
              inputs.T),
             dict(HV=inputs.HV, GROUP=group, K=inputs.K, TS=max(triton.next_power_of_2(inputs.T), tile["terms_rows"]),
                  TP=TOKEN_ROWS, L2_EPS=L2_EPS, W_PARTS=parts, num_warps=tile["terms_warps"]))
    product = (_state_product_kernel, (heads * (inputs.V // tile["BV"]),),
               (inputs.v, inputs.state, inputs.slots, w, qt, out, inputs.slot_stride, inputs.T, heads),
               dict(HV=inputs.HV, K=inputs.K, V=inputs.V, BV=tile["BV"], BK=tile["BK"], TP=TOKEN_ROWS,
                    STAGES=tile["stages"], W_PARTS=parts, num_warps=tile["num_warps"]))
    return [terms, product]
