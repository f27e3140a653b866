"""The step's math shared by our Triton kernels: the gate, the delta rule and the program-to-tile map.

Inlined into each kernel (``@triton.jit`` helpers); the constants here are the kernels' own. The
interpreter (``TRITON_INTERPRET=1``, read when this module is imported) runs the same code on the CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Triton's eviction_policy of a state access by the tile config's load/store_evict_first (0: no hint).
EVICTION_POLICY = ("", "evict_first")
LOG2E = tl.constexpr(1.4426950408889634)
# Whether @triton.jit built this module's kernels for the interpreter (the same knob, read at the same
# import): the interpreter runs no inline assembly, and no kernel on a CUDA tensor.
INTERPRETED = tl.constexpr(triton.knobs.runtime.interpret)

@triton.jit
def _log2_approx(x):
    """log2 by one ``lg2.approx.f32`` (MUFU.LG2, relative error about 2**-22), where ``tl.log2`` is
    libdevice's ~25-instruction polynomial on the critical path of a B = 1 step; the interpreter,
    which runs no PTX, uses ``tl.log2``."""
    if INTERPRETED:
        return tl.log2(x)
    else:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)


@triton.jit
def _sum_along_k(x):
    """The sum of a ``[K]`` vector; of a ``[BV, K]`` tile of copies of it (``tiled_inputs``), each row's."""
    if len(x.shape) == 2:
        return tl.sum(x, axis=1)
    else:
        return tl.sum(x)


@triton.jit
def _per_row(x):
    """A per-head scalar as it broadcasts against a ``[BV, K]`` tile: a scalar as it is, a ``[BV]`` of
    row sums (``tiled_inputs``) as a column."""
    if len(x.shape) == 1:
        return x[:, None]
    else:
        return x


@triton.jit
def _as_rows(x):
    """A head's ``[K]`` vector as a row against a ``[BV, K]`` state tile; a tile of its copies
    (``tiled_inputs``) as it is."""
    if len(x.shape) == 1:
        return x[None, :]
    else:
        return x


@triton.jit
def _token_gate(q, k, a, dt_bias, A_log, beta_logit, scale, L2_EPS: tl.constexpr,
                SOFTPLUS_LINEAR_ABOVE: tl.constexpr, FAST_GATE: tl.constexpr):
    """One token's normalised q (scaled) and k, its decay along K and its beta (all float32).

    ``FAST_GATE`` computes it in base 2, as FlashInfer's kernel does: ``exp(-exp(A_log) softplus(x))``
    is ``exp2(-exp(A_log) log2(1 + exp2(x log2 e)))``, one MUFU instruction for each exp and the
    log and no rescaling between them, and each norm takes one ``rsqrt``, not a square root and a
    division. The gate is the prologue every program computes before it can use its state tile:
    most of a B = 1 step's instructions (docs/triton-kernel.md, "The gate in base 2")."""
    if FAST_GATE:
        q = q * _per_row(scale * tl.math.rsqrt(_sum_along_k(q * q) + L2_EPS))
        k = k * _per_row(tl.math.rsqrt(_sum_along_k(k * k) + L2_EPS))
        x = (a + dt_bias) * LOG2E
        softplus2 = tl.where(x > SOFTPLUS_LINEAR_ABOVE * LOG2E, x, _log2_approx(1.0 + tl.exp2(x)))  # softplus / ln 2
        decay = tl.exp2(-tl.exp(A_log) * softplus2)  # [K] ([BV, K] copies): the state decays along K
    else:
        q = q * _per_row(scale / tl.sqrt(_sum_along_k(q * q) + L2_EPS))
        k = k / _per_row(tl.sqrt(_sum_along_k(k * k) + L2_EPS))
        x = a + dt_bias
        softplus = tl.where(x > SOFTPLUS_LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))
        decay = tl.exp(-tl.exp(A_log) * softplus)
    beta = tl.sigmoid(beta_logit)
    return q, k, decay, beta


@triton.jit
def _delta_rule(S, q, k, v, decay, beta):
    """One token applied to a ``[BV, K]`` state tile: ``(new tile, its [BV] output)``."""
    S = S * _as_rows(decay)
    u = beta * (v - tl.sum(S * _as_rows(k), axis=1))
    S = S + u[:, None] * _as_rows(k)
    o = tl.sum(S * _as_rows(q), axis=1)
    return S, o


@triton.jit
def _delta_rule_rewidened(stored, q, k, v, decay, beta):
    """:func:`_delta_rule` on a tile as stored, widened to fp32 twice: once for the two
    reductions (``S k`` and ``S q`` of the decayed tile, through ``decay * k`` and ``decay * q``;
    the output is ``S q + u (k . q)``), once more for the update. A bf16 tile's second widening
    goes through its bits (a different instruction from the first), so the compiler cannot merge
    the two and keep the fp32 tile live across the reductions: the tile then costs its own
    registers, not twice them. Other dtypes use the one widening for both."""
    S = stored.to(tl.float32)
    u = beta * (v - tl.sum(S * _as_rows(decay * k), axis=1))
    o = tl.sum(S * _as_rows(decay * q), axis=1) + u * _sum_along_k(k * q)
    if stored.dtype == tl.bfloat16:
        S = (stored.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return S * _as_rows(decay) + u[:, None] * _as_rows(k), o


@triton.jit
def _load_head_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, row_h, hv, row_hv, offs_k,
                      K: tl.constexpr):
    """One token's small inputs for value head ``hv`` of its row (``row_h``: the row's query-key
    head, ``row * H + h``; ``row_hv``: ``row * HV + hv``), in the order the kernels issue them: q, k
    and a widened to fp32, dt_bias, A_log and the beta logit (fp32)."""
    q = tl.load(q_ptr + row_h * K + offs_k).to(tl.float32)
    k = tl.load(k_ptr + row_h * K + offs_k).to(tl.float32)
    a = tl.load(a_ptr + row_hv * K + offs_k).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
    A_log = tl.load(A_log_ptr + hv)
    beta_logit = tl.load(b_ptr + row_hv).to(tl.float32)
    return q, k, a, dt_bias, A_log, beta_logit



@triton.jit
def _program_tile(V_TILES: tl.constexpr):
    """This program's ``(row * HV + value head, V-tile)``, the V-tile fastest, so neighbouring
    programs stream neighbouring memory; int64: row * HV * V overflows int32 for very large batches."""
    pid = tl.program_id(0)
    return (pid // V_TILES).to(tl.int64), pid % V_TILES
