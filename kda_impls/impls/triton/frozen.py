"""Frozen verify in closed form: T tokens' outputs from one read of the start state, on the tensor cores.

With ``G_t`` the cumulative log decay through token t (a ``[K]`` vector), ``khat_t = k_t e^{G_t}``,
``qhat_t = q_t e^{G_t}``, ``ktil_j = k_j e^{-G_j}``, ``M = strict_lower(khat ktil^T)`` and
``P = tril(qhat ktil^T)``, the chained delta rule's T outputs are

    Tm = (I + diag(beta) M)^{-1} diag(beta),   QT = P Tm,   O = (qhat - QT khat) S0^T + QT V

One launch, one program per row, value head and ``BV`` rows of V. A program issues its ``[BV, K]``
start tile's load first (the one large read, in the pool's dtype), forms the token terms while it is
in flight, and multiplies: every product is a ``tl.dot`` with the tokens padded to the dot's 16 rows,
so its cost does not grow with T. The inverse is ``(I - A)(I + A^2)(I + A^4)(I + A^8)`` for the strictly
lower ``A = diag(beta) M`` (``A^16 = 0``): four squarings on the tensor cores instead of a T-step
substitution. ``W = qhat - QT khat`` meets a 16-bit tile as two parts in its dtype (high part and
remainder), so the product keeps fp32's accuracy at the tile's width.

``M`` and ``P`` need ``e^{G_t - G_j}`` (t >= j, never above 1), formed as ``e^{G_t - R} e^{R - G_j}``
with ``R`` the window's mid decay per channel: each factor stays within ``e^{+-span/2}``, ``span``
the window's log decay from its first token to its last. Where a channel's span passes
:data:`SPAN_LIMIT` a factor would leave fp32's range, and that program takes the exact differences
instead (T passes of ``[16, K]`` exponentials).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...reference import L2_EPS, SOFTPLUS_LINEAR_ABOVE

SPAN_LIMIT = 160.0  # each factor within e^+-80, inside fp32's e^+-88
TOKEN_ROWS = 16  # the dot's minimum M: T <= 16 tokens padded to it; more run the recurrence
FROZEN_CONFIG_ENV = "KDA_TRITON_FROZEN_CONFIG"
RECURRENCE_HEADS = 2048  # B * HV up to which a step of T <= 2 runs the recurrence (measured faster there)
_LINEAR_ABOVE = tl.constexpr(SOFTPLUS_LINEAR_ABOVE)  # a global a kernel reads must be a constexpr
_SPAN_LIMIT = tl.constexpr(SPAN_LIMIT)
INTERPRETED = tl.constexpr(triton.knobs.runtime.interpret)


@triton.jit
def _row(x, offs_t, t):
    """Row ``t`` of a ``[TP, N]`` tile as an ``[N]`` vector."""
    return tl.sum(tl.where(offs_t[:, None] == t, x, 0.0), axis=0)


@triton.jit
def _dot32(a, b):
    """``a @ b`` of fp32 tiles on the tensor cores at fp32's accuracy (three tf32 products)."""
    return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def _token_terms(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, scale, T, row, hv,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, SQUARINGS: tl.constexpr,
    L2_EPS: tl.constexpr,
):
    """``(W, QT)`` of one row and value head: ``[TP, K]`` and ``[TP, TP]`` fp32, rows past T zero."""
    offs_k = tl.arange(0, K)
    offs_t = tl.arange(0, TP)
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
    if tl.max(first - last, axis=0) <= _SPAN_LIMIT:
        mid = 0.5 * (first + last)
        ktil_t = tl.trans(k * tl.exp(mid[None, :] - G))
        ahead = tl.exp(G - mid[None, :])
        M = _dot32(k * ahead, ktil_t)
        P = _dot32(q * ahead, ktil_t)
    else:
        M = tl.zeros([TP, TP], dtype=tl.float32)
        P = tl.zeros([TP, TP], dtype=tl.float32)
        for j in range(T):  # column j from the exact decays e^{G_t - G_j} (t >= j: never above 1)
            decayed = _row(k, offs_t, j)[None, :] * tl.exp(tl.minimum(G - _row(G, offs_t, j)[None, :], 0.0))
            M = tl.where(offs_t[None, :] == j, tl.sum(k * decayed, axis=1)[:, None], M)
            P = tl.where(offs_t[None, :] == j, tl.sum(q * decayed, axis=1)[:, None], P)
    power = -tl.where(offs_t[:, None] > offs_t[None, :], beta[:, None] * M, 0.0)  # -A, strictly lower
    inverse = tl.where(offs_t[:, None] == offs_t[None, :], 1.0, 0.0) + power
    for _ in tl.static_range(SQUARINGS):  # (I + A)^{-1} = (I - A)(I + A^2)(I + A^4)(I + A^8): A^TP = 0
        power = _dot32(power, power)
        inverse += _dot32(inverse, power)
    QT = _dot32(tl.where(offs_t[:, None] >= offs_t[None, :], P, 0.0), inverse * beta[None, :])
    decay = tl.exp(G)
    return q * decay - _dot32(QT, k * decay), QT


@triton.jit
def _product(S0, W, QT, vals):
    """``O = W S0^T + QT V`` of a ``[BV, K]`` start tile on the tensor cores, fp32 accumulation; ``W`` meets
    a 16-bit tile as two parts in its dtype (high part and remainder), keeping fp32's accuracy."""
    out = _dot32(QT, vals)
    St = tl.trans(S0)
    if INTERPRETED:  # the interpreter's 16-bit dot multiplies the bits: the same products in fp32
        St = St.to(tl.float32)
    if S0.dtype == tl.float32:
        out += _dot32(W, St)
    else:
        high = W.to(S0.dtype)
        low = (W - high.to(tl.float32)).to(S0.dtype)
        if INTERPRETED:
            high, low = high.to(tl.float32), low.to(tl.float32)
        out = tl.dot(low, St, tl.dot(high, St, out))
    return out


@triton.jit
def _token_terms_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, w_ptr, qt_ptr, scale, T,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, SQUARINGS: tl.constexpr,
    L2_EPS: tl.constexpr,
):
    """Per row and value head: ``W`` and ``QT`` into the scratch (rows past T untouched)."""
    head = tl.program_id(0).to(tl.int64)  # row * HV + hv
    W, QT = _token_terms(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, scale, T, head // HV, head % HV,
                         HV, GROUP, K, TP, SQUARINGS, L2_EPS)
    offs_t = tl.arange(0, TP)
    in_t = offs_t < T
    rows = head * TP + offs_t
    tl.store(qt_ptr + rows[:, None] * TP + offs_t[None, :], QT, mask=in_t[:, None] & in_t[None, :])
    offs_k = tl.arange(0, K)
    tl.store(w_ptr + rows[:, None] * K + offs_k[None, :], W, mask=in_t[:, None] & (offs_k[None, :] < K))


@triton.jit
def _state_tile(state_ptr, slots_ptr, slot_stride, head, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BV: tl.constexpr, v_tile):
    """The ``[BV, K]`` start tile ``v_tile`` of ``head`` (row * HV + hv), zeros for a -1 row; and the slot."""
    row = head // HV
    offs_v = v_tile * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    slot = tl.load(slots_ptr + row)
    live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0  # a [BV, K] splat: 16-byte accesses stay
    S0 = tl.load(state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + (head % HV) * (V * K)
                 + offs_v[:, None] * K + offs_k[None, :], mask=live, other=0.0)  # the one large read
    return S0, slot


@triton.jit
def _store_out(out_ptr, out, slot, head, T, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               TP: tl.constexpr, v_tile):
    offs_t = tl.arange(0, TP)
    offs_v = v_tile * BV + tl.arange(0, BV)
    token_hv = ((head // HV) * T + offs_t) * HV + head % HV
    in_tv = (offs_t < T)[:, None] & (offs_v[None, :] < V)
    tl.store(out_ptr + token_hv[:, None] * V + offs_v[None, :],
             tl.where(slot >= 0, out, 0.0).to(out_ptr.dtype.element_ty), mask=in_tv)


@triton.jit
def _values(v_ptr, head, T, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, TP: tl.constexpr, v_tile):
    """The window's ``[TP, BV]`` values of the tile, fp32, rows past T zero."""
    offs_t = tl.arange(0, TP)
    offs_v = v_tile * BV + tl.arange(0, BV)
    token_hv = ((head // HV) * T + offs_t) * HV + head % HV
    in_tv = (offs_t < T)[:, None] & (offs_v[None, :] < V)
    return tl.load(v_ptr + token_hv[:, None] * V + offs_v[None, :], mask=in_tv, other=0.0).to(tl.float32)


@triton.jit
def _state_product_kernel(
    v_ptr, state_ptr, slots_ptr, w_ptr, qt_ptr, out_ptr, slot_stride, T,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, TP: tl.constexpr,
):
    """Per row, value head and ``BV`` rows of V: the product from the scratch's terms."""
    V_TILES: tl.constexpr = V // BV
    pid = tl.program_id(0)
    head = (pid // V_TILES).to(tl.int64)  # row * HV + hv; int64: row * HV * V overflows int32
    S0, slot = _state_tile(state_ptr, slots_ptr, slot_stride, head, HV, K, V, BV, pid % V_TILES)
    offs_t = tl.arange(0, TP)
    offs_k = tl.arange(0, K)
    in_t = offs_t < T
    rows = head * TP + offs_t
    W = tl.load(w_ptr + rows[:, None] * K + offs_k[None, :], mask=in_t[:, None] & (offs_k[None, :] < K), other=0.0)
    QT = tl.load(qt_ptr + rows[:, None] * TP + offs_t[None, :], mask=in_t[:, None] & in_t[None, :], other=0.0)
    out = _product(S0, W, QT, _values(v_ptr, head, T, HV, V, BV, TP, pid % V_TILES))
    _store_out(out_ptr, out, slot, head, T, HV, V, BV, TP, pid % V_TILES)


@triton.jit
def _frozen_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr, slot_stride, scale, T,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    TP: tl.constexpr, SQUARINGS: tl.constexpr, L2_EPS: tl.constexpr,
):
    """Per row, value head and ``BV`` rows of V: the terms, then the product, in one program."""
    V_TILES: tl.constexpr = V // BV
    pid = tl.program_id(0)
    head = (pid // V_TILES).to(tl.int64)
    W, QT = _token_terms(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, scale, T, head // HV, head % HV,
                         HV, GROUP, K, TP, SQUARINGS, L2_EPS)
    S0, slot = _state_tile(state_ptr, slots_ptr, slot_stride, head, HV, K, V, BV, pid % V_TILES)
    out = _product(S0, W, QT, _values(v_ptr, head, T, HV, V, BV, TP, pid % V_TILES))
    _store_out(out_ptr, out, slot, head, T, HV, V, BV, TP, pid % V_TILES)


def frozen_tile(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int) -> dict | None:
    """The closed form's ``{"BV", "num_warps", "fused"}`` for a frozen step, or None where the recurrence
    runs it: more than :data:`TOKEN_ROWS` tokens, a head dimension under the dot's 16, or two tokens or fewer
    on at most :data:`RECURRENCE_HEADS` (row, head) pairs, where the recurrence's one launch is the faster
    (results/h100-80gb-hbm3/frozen-closed-form/summary.md). ``fused=1``: one launch, every program forming
    its head's terms. ``KDA_TRITON_FROZEN_CONFIG`` (``"BV=64,num_warps=4"``, ``"recurrence=1"``,
    ``"fused=1"``) replaces the fields it names for every shape."""
    if T > TOKEN_ROWS or min(K, V) < 16:
        return None
    # 16 KiB of a 16-bit tile; 16 KiB of fp32 (its three tf32 products hold more registers)
    tile = {"BV": min(V, 64 if state_dtype.itemsize <= 2 else 32), "num_warps": 4, "fused": 0,
            "recurrence": int(T <= 2 and B * HV <= RECURRENCE_HEADS)}
    text = os.environ.get(FROZEN_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{FROZEN_CONFIG_ENV} items must be BV=, num_warps=, fused= or recurrence=<int>; "
                             f"got {item!r}")
        tile[name] = int(value)
    BV = tile["BV"]
    if BV < 16 or BV & (BV - 1) or V % BV or tile["num_warps"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"{FROZEN_CONFIG_ENV}: BV must be a power of two >= 16 dividing V={V} and num_warps one of "
                         f"1/2/4/8/16; got {text!r}")
    return None if tile.pop("recurrence") else tile


def frozen_launches(inputs, out, tile: dict) -> list:
    """The launches of a closed-form frozen step, each ``(kernel, grid, args, meta)``; the scratch the
    two-launch form shares is allocated here (bind time)."""
    heads = inputs.B * inputs.HV
    programs = (heads * (inputs.V // tile["BV"]),)
    terms_args = (inputs.q, inputs.k, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias)
    terms_meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, TP=TOKEN_ROWS,
                      SQUARINGS=max(0, (inputs.T - 1).bit_length() - 1), L2_EPS=L2_EPS)
    if tile["fused"]:
        return [(_frozen_kernel, programs,
                 (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
                  inputs.slots, out, inputs.slot_stride, inputs.effective_scale, inputs.T),
                 terms_meta | dict(V=inputs.V, BV=tile["BV"], num_warps=tile["num_warps"]))]
    w = torch.empty(heads * TOKEN_ROWS * inputs.K, dtype=torch.float32, device=inputs.device)
    qt = torch.empty(heads * TOKEN_ROWS * TOKEN_ROWS, dtype=torch.float32, device=inputs.device)
    return [(_token_terms_kernel, (heads,), (*terms_args, w, qt, inputs.effective_scale, inputs.T),
             terms_meta | dict(num_warps=4)),
            (_state_product_kernel, programs,
             (inputs.v, inputs.state, inputs.slots, w, qt, out, inputs.slot_stride, inputs.T),
             dict(HV=inputs.HV, K=inputs.K, V=inputs.V, BV=tile["BV"], TP=TOKEN_ROWS, num_warps=tile["num_warps"]))]
