"""Frozen verify in closed form: T tokens' outputs from one read of the start state, on the tensor cores.

With ``G_t`` the cumulative log decay through token t (a ``[K]`` vector), ``khat_t = k_t e^{G_t}``,
``qhat_t = q_t e^{G_t}``, ``ktil_j = k_j e^{-G_j}``, ``M = strict_lower(khat ktil^T)`` and
``P = tril(qhat ktil^T)``, the chained delta rule's T outputs are

    Tm = (I + diag(beta) M)^{-1} diag(beta),   QT = P Tm,   O = qhat S0^T + QT (V - khat S0^T)

One launch, one program per row, value head and ``BV`` rows of V, the tokens padded to the dot's 16.
Its first loop reads the ``[BV, K]`` start tile once in the pool's dtype, ``BK`` columns a pass,
software-pipelined into shared memory, and forms ``Y1 = S0 qhat^T`` and ``Y2 = S0 khat^T`` by ``tl.dot``
with fp32 accumulation (a 16-bit pool's right operands as a high part and its remainder); a second
loop over the token tiles forms ``M`` and ``P`` on the tensor cores (tf32x3), the T x T solve is a
forward substitution in registers, and ``O^T = Y1 + (V^T - Y2) QT^T`` the last dot. Its cost is the
tile's read, whatever T; the token arithmetic of one program overlaps the reads of the others on its
SM (the programs of one head, ``V / BV``, each do it).

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
def _token_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr, qk_rows, gate_rows, in_t, offs_k, rate, K: tl.constexpr):
    """The window's queries, keys (not yet normalized) and cumulative log decays ``G`` on ``BK`` channels,
    each ``[TP, BK]`` fp32; padding tokens load zeros and decay nothing (``G`` stays ``G_{T-1}``)."""
    in_tk = in_t[:, None] & (offs_k[None, :] < K)
    q = tl.load(q_ptr + qk_rows[:, None] * K + offs_k[None, :], mask=in_tk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + qk_rows[:, None] * K + offs_k[None, :], mask=in_tk, other=0.0).to(tl.float32)
    x = tl.load(a_ptr + gate_rows[:, None] * K + offs_k[None, :], mask=in_tk, other=0.0).to(tl.float32)
    x += tl.load(dt_bias_ptr + offs_k)[None, :]
    g = rate * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))
    return q, k, tl.cumsum(tl.where(in_tk, g, 0.0), axis=0)


@triton.jit
def _frozen_step_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    scale, slot_stride, T,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    BK: tl.constexpr, TP: tl.constexpr, STAGES: tl.constexpr, L2_EPS: tl.constexpr,
):
    """Per row, value head and ``BV`` rows of V: the T outputs from one read of the ``[BV, K]`` start tile,
    ``BK`` columns a pass. A pass adds ``Y1 = S0 (q e^G)^T`` and ``Y2 = S0 (k e^G)^T`` (the tile the dots'
    left operand: the software pipeline copies it into shared memory ``STAGES`` passes ahead, and it
    never passes through registers); ``M``, ``P``, the norms, the solve and ``O^T = Y1 + (V^T - Y2) QT^T``
    follow the loop, their arithmetic overlapping other programs' reads."""
    V_TILES: tl.constexpr = V // BV
    PAIR_K: tl.constexpr = 16
    pid = tl.program_id(0)
    head = (pid // V_TILES).to(tl.int64)  # row * HV + hv; int64: row * HV * V overflows int32
    row = head // HV
    hv = head % HV
    offs_t = tl.arange(0, TP)
    offs_v = pid % V_TILES * BV + tl.arange(0, BV)
    in_t = offs_t < T
    token = row * T + offs_t
    qk_rows = token * (HV // GROUP) + hv // GROUP
    gate_rows = token * HV + hv
    rate = -tl.exp(tl.load(A_log_ptr + hv))
    slot = tl.load(slots_ptr + row)
    live = (tl.zeros([BV, BK], dtype=tl.int32) + slot) >= 0  # a splat, not a scalar: 16-byte accesses stay
    tile = state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K) + offs_v[:, None] * K
    Y1 = tl.zeros([BV, TP], dtype=tl.float32)
    Y2 = tl.zeros([BV, TP], dtype=tl.float32)
    M = tl.zeros([TP, TP], dtype=tl.float32)
    P = tl.zeros([TP, TP], dtype=tl.float32)
    qq = tl.zeros([TP], dtype=tl.float32)
    kk = tl.zeros([TP], dtype=tl.float32)
    span = tl.zeros([], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BK)
        q, k, G = _token_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr + hv * K, qk_rows, gate_rows, in_t, offs_k, rate, K)
        qq += tl.sum(q * q, axis=1)
        kk += tl.sum(k * k, axis=1)
        span = tl.maximum(span, tl.max(_row(G, offs_t, 0) - _row(G, offs_t, T - 1), axis=0))
        decay = tl.exp(G)
        qe = tl.trans(q * decay)  # [BK, TP]
        ke = tl.trans(k * decay)
        S0 = tl.load(tile + offs_k[None, :], mask=live, other=0.0)  # the one large read
        if state_ptr.dtype.element_ty == tl.float32:
            Y1 = tl.dot(S0, qe, Y1, input_precision="tf32x3")
            Y2 = tl.dot(S0, ke, Y2, input_precision="tf32x3")
        else:  # a 16-bit right operand as a high part and its remainder: fp32's precision from two dots
            qh = qe.to(S0.dtype)
            kh = ke.to(S0.dtype)
            ql = (qe - qh.to(tl.float32)).to(S0.dtype)
            kl = (ke - kh.to(tl.float32)).to(S0.dtype)
            if INTERPRETED:  # the interpreter's 16-bit dot multiplies the bits: the same products in fp32
                S0, qh, kh, ql, kl = (S0.to(tl.float32), qh.to(tl.float32), kh.to(tl.float32),
                                      ql.to(tl.float32), kl.to(tl.float32))
            Y1 = tl.dot(S0, ql, tl.dot(S0, qh, Y1))
            Y2 = tl.dot(S0, kl, tl.dot(S0, kh, Y2))
    # M and P from a second pass over the token tiles (cache hits), PAIR_K channels at a time, unpipelined:
    # their tf32x3 products inside the first loop, or a wider pass, hold up to 255 registers a thread
    if span <= _SPAN_LIMIT:  # e^{G_t - G_j} = e^{G_t - R} e^{R - G_j}, R the mid decay: within e^{+-span/2}
        for k0 in tl.range(0, K, PAIR_K, num_stages=1):
            offs_k = k0 + tl.arange(0, PAIR_K)
            q, k, G = _token_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr + hv * K, qk_rows, gate_rows, in_t, offs_k,
                                   rate, K)
            mid = 0.5 * (_row(G, offs_t, 0) + _row(G, offs_t, T - 1))
            ahead = tl.exp(G - mid[None, :])
            ktil = tl.trans(k * tl.exp(mid[None, :] - G))
            M = tl.dot(k * ahead, ktil, M, input_precision="tf32x3")
            P = tl.dot(q * ahead, ktil, P, input_precision="tf32x3")
    else:  # a factor would leave fp32's range: the exact decays, a column a pass
        for k0 in tl.range(0, K, PAIR_K, num_stages=1):
            offs_k = k0 + tl.arange(0, PAIR_K)
            q, k, G = _token_chunk(q_ptr, k_ptr, a_ptr, dt_bias_ptr + hv * K, qk_rows, gate_rows, in_t, offs_k,
                                   rate, K)
            for j in range(T):  # column j: e^{G_t - G_j}, t >= j, never above 1
                decayed = _row(k, offs_t, j)[None, :] * tl.exp(tl.minimum(G - _row(G, offs_t, j)[None, :], 0.0))
                M += tl.where(offs_t[None, :] == j, tl.sum(k * decayed, axis=1)[:, None], 0.0)
                P += tl.where(offs_t[None, :] == j, tl.sum(q * decayed, axis=1)[:, None], 0.0)
    rq = scale / tl.sqrt(qq + L2_EPS)
    rk = 1.0 / tl.sqrt(kk + L2_EPS)
    M = tl.where(offs_t[:, None] > offs_t[None, :], M * rk[:, None] * rk[None, :], 0.0)
    P = tl.where(offs_t[:, None] >= offs_t[None, :], P * rq[:, None] * rk[None, :], 0.0)

    # (I + diag(beta) M)^{-1} diag(beta) by forward substitution: row t needs only the rows above it
    beta = tl.where(in_t, tl.sigmoid(tl.load(b_ptr + gate_rows, mask=in_t, other=0.0).to(tl.float32)), 0.0)
    A = beta[:, None] * M
    X = tl.zeros([TP, TP], dtype=tl.float32)
    for t in range(T):
        beta_t = tl.sum(tl.where(offs_t == t, beta, 0.0), axis=0)
        x_t = tl.where(offs_t == t, beta_t, 0.0) - tl.sum(_row(A, offs_t, t)[:, None] * X, axis=0)
        X = tl.where(offs_t[:, None] == t, x_t[None, :], X)
    QT = tl.dot(P, X, input_precision="tf32x3")

    in_vt = (offs_v[:, None] < V) & in_t[None, :]
    vals = tl.load(v_ptr + gate_rows[None, :] * V + offs_v[:, None], mask=in_vt, other=0.0).to(tl.float32)
    out = tl.dot(vals - Y2 * rk[None, :], tl.trans(QT), Y1 * rq[None, :], input_precision="tf32x3")
    tl.store(out_ptr + gate_rows[None, :] * V + offs_v[:, None],
             tl.where(slot >= 0, out, 0.0).to(out_ptr.dtype.element_ty), mask=in_vt)


def frozen_tile(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int) -> dict | None:
    """The closed form's ``{"BV", "BK", "stages", "num_warps"}`` (its tile of V rows, columns a pass,
    passes in flight and warps) for a frozen step, or None where the recurrence runs it: more than
    :data:`TOKEN_ROWS` tokens, a head dimension under the dot's 16, or two tokens or fewer on at most
    :data:`RECURRENCE_HEADS` (row, head) pairs, where the recurrence's one launch is the faster
    (results/h100-80gb-hbm3/frozen-closed-form/summary.md). ``KDA_TRITON_FROZEN_CONFIG``
    (``"BV=64,BK=32,stages=3"``, ``"num_warps=8"``, ``"recurrence=1"``, ``"recurrence=0"``) replaces the
    fields it names for every shape."""
    if T > TOKEN_ROWS or min(K, V) < 16:
        return None
    # 16 KiB of a 16-bit tile; 16 KiB of fp32 (its three tf32 products hold more registers)
    tile = {"BV": min(V, 64 if state_dtype.itemsize <= 2 else 32), "BK": min(K, 64), "stages": 2, "num_warps": 4,
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
    """The closed-form frozen step's one launch, ``[(kernel, grid, args, meta)]``."""
    grid = (inputs.B * inputs.HV * (inputs.V // tile["BV"]),)
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, out, inputs.effective_scale, inputs.slot_stride, inputs.T)
    meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=tile["BV"], BK=tile["BK"],
                TP=TOKEN_ROWS, STAGES=tile["stages"], L2_EPS=L2_EPS, num_warps=tile["num_warps"])
    return [(_frozen_step_kernel, grid, args, meta)]
