"""Our Triton KDA decode kernel: one fused launch per step, the pool updated in place.

Each program owns one batch row, a group of ``heads`` consecutive value heads and one V-tile of
``BV`` rows of each head's ``[V, K]`` state; K is one tile (K <= 256), so every reduction is
within the program. It reads its state tile once, decays it, applies the delta rule, writes it
back through ``slots`` and writes the output tile: the state crosses memory exactly twice, which
is the floor for a memory-bound step. A row whose slot is -1 writes zeros to its output, every
state access masked off. Three other forms of the one-token step are tile config fields, chosen
per shape by the tuning table: ``subtiles`` (a program walks several ``BV``-row tiles of a head,
the gate computed once, the next tile's load in flight), ``programs_per_sm`` (a persistent
grid walking every tile, with a one-tile register look-ahead or, ``lookahead=0``, only the
coming tiles' slots loaded ahead) and ``tma`` (the state read by TMA into shared memory, one
program per tile or persistent, pipelined ``num_stages`` deep); ``const_heads`` says
whether the head counts are compiled into the one-token kernel (a shorter path to the first load)
or passed at run time (fewer registers for some tiles), ``state_first`` where a one-tile
program issues its state load (before the small inputs' loads, between them and the gate, or after
the gate), ``rewiden`` whether the stored tile is widened to fp32 once or twice (the second time
for the update, so the fp32 tile need not stay live across the reductions), ``maxnreg`` a cap
on ptxas's registers, and ``fast_gate`` whether the gate is computed in base 2 on MUFU's log2 (fewer
instructions on a B = 1 step's chain) or with libdevice's log. docs/triton-kernel.md has what each
was measured to do on the H200, and what the forms tried and dropped did (each tile read twice).

Multi-token decode (T > 1 tokens per row, speculative verify) has its own kernel with the same
program mapping: the state tile is read once, from the row's start slot
``slots[row, num_accepted[row] - 1]``, kept in registers through the T tokens (a loop, not
unrolled: registers do not grow with T, and one compiled kernel serves every T) and stored after
token t only where ``slots[row, t] >= 0``; each token's inputs are loaded while the previous token
computes. It moves one state read per live row and one write per stored slot, the floor of that
step. A T = 1 step, in either spelling, runs the one-token kernel (the math is shared through
inlined helpers). Frozen verify (``update_state=False``, any T) runs the multi-token kernel with its
stores compiled out (``STORES=0``): each tile read once from ``slots[row]``, the T tokens chained
in registers, every token's output written and no state: one state read per live row. Replay
(a ``ReplayCache``: decode, a verify and its commit) has its own kernels in ``triton_replay.py``.

The tile config (:class:`TileConfig`) comes from the committed table
in :mod:`kda_impls.impls.triton_tuning`, keyed by shape, state dtype and batch size; the environment
variable ``KDA_TRITON_CONFIG`` (e.g. ``"BV=32,num_warps=4"``) overrides any of its fields for
every shape. Both are resolved when the launcher is bound, never inside it. The table is keyed by
tokens per row too: a multi-token step takes the entry tuned nearest its T and B (the grid is laid
out as at T = 1, each program carrying T tokens), and the one-token entries where its shape has
no multi-token ones (the one-token forms dropped).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..contract import Capabilities, Implementation
from ..inputs import DecodeInputs
from ..reference import L2_EPS
from .triton.frozen import frozen_arguments, frozen_tile
from .triton_tuning import TABLE

CONFIG_ENV = "KDA_TRITON_CONFIG"
HEAD_DIMS = (16, 32, 64, 128, 256)
# Softplus is linear past this (torch's threshold too): exp would overflow long before it matters.
SOFTPLUS_LINEAR_ABOVE = 20.0
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
def _program_tile(HV, HEADS: tl.constexpr, V_TILES: tl.constexpr):
    """This program's ``(row, first value head, V-tile)``: the V-tile fastest, then the head group,
    then the row, so neighbouring programs stream neighbouring memory. The row is int64: row * HV * V
    overflows int32 for very large batches. ``HV`` a constexpr or a runtime value (a constexpr: no
    runtime division on the way to the first load)."""
    pid = tl.program_id(0)
    head_groups = HV // HEADS
    return (pid // V_TILES // head_groups).to(tl.int64), (pid // V_TILES) % head_groups * HEADS, pid % V_TILES


@triton.jit
def _kda_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    slot_stride, scale, value_heads, group, HV_CONST: tl.constexpr, GROUP_CONST: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HEADS: tl.constexpr, NUM_STAGES: tl.constexpr,
    SUBTILES: tl.constexpr, STATE_FIRST: tl.constexpr, REWIDEN: tl.constexpr, LOAD_HINT: tl.constexpr,
    STORE_HINT: tl.constexpr, L2_EPS: tl.constexpr, SOFTPLUS_LINEAR_ABOVE: tl.constexpr, FAST_GATE: tl.constexpr,
    TILED_INPUTS: tl.constexpr,
):
    CHUNK: tl.constexpr = BV * SUBTILES  # state rows of each head one program updates
    # The head counts: compile-time constants where HV_CONST > 0 (no division on the way to the first
    # load), else the runtime arguments (Triton's launcher still makes a group of 1 a constant).
    # Which is faster depends on the tile: the constants cost the bf16 K=V=64 32-row tile 29 registers.
    if HV_CONST > 0:
        HV = HV_CONST
        GROUP = GROUP_CONST
    else:
        HV = value_heads
        GROUP = group
    row, first_head, v_tile = _program_tile(HV, HEADS, V // CHUNK)
    H = HV // GROUP
    offs_k = tl.arange(0, K)
    first_v = v_tile * CHUNK + tl.arange(0, BV)
    # TILED_INPUTS loads q, k, a and dt_bias as [BV, K] tiles of copies, in the state tile's layout,
    # and computes the gate once per row, not once per head: a [K] vector changes layout to meet the
    # tile, for some bf16 tiles (Triton 3.6) through shared memory, and ptxas moved no load above
    # that, so the warp waited on q before it issued the other inputs and the state
    # (docs/triton-kernel.md, "The small inputs' layout").
    if TILED_INPUTS:
        offs_in = offs_k[None, :] + tl.zeros([BV, 1], dtype=tl.int32)
    else:
        offs_in = offs_k

    slot = tl.load(slots_ptr + row)
    # A -1 row masks every state access (no read, no write) and stores zeros. Straight-line code
    # rather than a branch on the slot: the small inputs load while the slot is still in flight,
    # and their math overlaps the state load, which is the only thing that waits for the slot.
    # The mask is a [BV, K] splat, which the compiler sees as uniform along K (16-byte accesses
    # stay), and which Triton's interpreter accepts where it rejects a scalar mask.
    live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0
    slot_state = state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride

    # With NUM_STAGES > 1 the compiler prefetches the next heads' tiles while this one computes.
    for j in tl.range(0, HEADS, num_stages=NUM_STAGES):
        hv = first_head + j
        h = hv // GROUP
        row_hv = row * HV + hv
        head_state = slot_state + hv * (V * K) + offs_k[None, :]  # [BV, K] tiles: K contiguous, 16-byte accesses
        # STATE_FIRST: 1 issues the first tile's load before the small inputs' (sub-tiles keep it in
        # flight while the gate is computed; TileConfig.fitted sets it for them); 2 after the small
        # inputs' loads and before the gate (their loads need not wait for the slot, and the gate is
        # computed while the state is in flight); 0 loads each tile after the gate. Which is faster
        # depends on the tile: issued first, the bf16 32-row tile ran 7-11% slower with the same
        # registers (docs/triton-kernel.md).
        if STATE_FIRST == 1:
            ahead = tl.load(head_state + first_v[:, None] * K, mask=live, other=0.0, eviction_policy=LOAD_HINT)
        q, k, a, dt_bias, A_log, beta_logit = _load_head_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
                                                                row * H + h, hv, row_hv, offs_in, K)
        if STATE_FIRST == 2:
            ahead = tl.load(head_state + first_v[:, None] * K, mask=live, other=0.0, eviction_policy=LOAD_HINT)
        q, k, decay, beta = _token_gate(q, k, a, dt_bias, A_log, beta_logit, scale, L2_EPS, SOFTPLUS_LINEAR_ABOVE,
                                        FAST_GATE)

        # The gate and norms above serve SUBTILES tiles of BV rows, walked in order (unrolled), the
        # next tile's load issued before this one computes: one tile in flight behind the one in use.
        for s in tl.static_range(SUBTILES):
            offs_v = first_v + s * BV
            if STATE_FIRST:
                stored = ahead
                if s + 1 < SUBTILES:
                    ahead = tl.load(head_state + (offs_v + BV)[:, None] * K, mask=live, other=0.0,
                                    eviction_policy=LOAD_HINT)
                v = tl.load(v_ptr + row_hv * V + offs_v).to(tl.float32)
            else:
                v = tl.load(v_ptr + row_hv * V + offs_v).to(tl.float32)
                stored = tl.load(head_state + offs_v[:, None] * K, mask=live, other=0.0, eviction_policy=LOAD_HINT)
            if REWIDEN:
                S, o = _delta_rule_rewidened(stored, q, k, v, decay, beta)
            else:
                S, o = _delta_rule(stored.to(tl.float32), q, k, v, decay, beta)
            tl.store(head_state + offs_v[:, None] * K, S.to(state_ptr.dtype.element_ty), mask=live,
                     eviction_policy=STORE_HINT)
            tl.store(out_ptr + row_hv * V + offs_v, tl.where(slot >= 0, o, 0.0).to(out_ptr.dtype.element_ty))


@triton.jit
def _load_tile(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, tile, slot, n_tiles,
               slot_stride, HV, GROUP, offs_k, offs_bv,
               K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, LOAD_HINT: tl.constexpr):
    """Issue every load of work tile ``tile`` (``(row, head, V-tile)``, the V-tile fastest) whose slot
    is ``slot``: the state tile as stored (widened only where it is used) and the head's inputs.
    A tile past ``n_tiles`` (the last programs' look-ahead; :func:`_tile_slot` gives it slot -1)
    loads no state and the last tile's inputs (in bounds, unused): only the state load is masked."""
    V_TILES: tl.constexpr = V // BV
    live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0
    tile = tl.minimum(tile, n_tiles - 1)
    row_hv = (tile // V_TILES).to(tl.int64)  # row * HV + hv; int64: row * HV * V overflows int32
    row = row_hv // HV
    hv = row_hv % HV
    h = hv // GROUP
    offs_v = tile % V_TILES * BV + offs_bv
    head_state = (state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K)
                  + offs_v[:, None] * K + offs_k[None, :])
    S = tl.load(head_state, mask=live, other=0.0, eviction_policy=LOAD_HINT)
    H = HV // GROUP
    q = tl.load(q_ptr + (row * H + h) * K + offs_k)
    k = tl.load(k_ptr + (row * H + h) * K + offs_k)
    a = tl.load(a_ptr + row_hv * K + offs_k)
    dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
    A_log = tl.load(A_log_ptr + hv)
    beta_logit = tl.load(b_ptr + row_hv)
    v = tl.load(v_ptr + row_hv * V + offs_v)
    return S, q, k, a, dt_bias, A_log, beta_logit, v


@triton.jit
def _tile_slot(slots_ptr, tile, n_tiles, HV, V_TILES: tl.constexpr):
    """The slot of work tile ``tile``; -1 (no state access) past the last tile."""
    slot = tl.load(slots_ptr + tl.minimum(tile, n_tiles - 1) // (HV * V_TILES))
    return tl.where(tile < n_tiles, slot, -1)


@triton.jit
def _store_tile(state_ptr, out_ptr, S, o, slot, slot_stride, hv, row_hv, offs_v, offs_k,
                K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, STORE_HINT: tl.constexpr):
    """A work tile's new state stored in place through its slot, and its output rows; a -1 slot
    stores no state (the mask is a [BV, K] splat: see :func:`_kda_decode_kernel`) and zeros."""
    live = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0
    tile_state = (state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K)
                  + offs_v[:, None] * K + offs_k[None, :])
    tl.store(tile_state, S.to(state_ptr.dtype.element_ty), mask=live, eviction_policy=STORE_HINT)
    tl.store(out_ptr + row_hv * V + offs_v, tl.where(slot >= 0, o, 0.0).to(out_ptr.dtype.element_ty))


@triton.jit
def _kda_decode_persistent_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    slot_stride, scale, n_tiles, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, LOOKAHEAD: tl.constexpr, LOAD_HINT: tl.constexpr,
    STORE_HINT: tl.constexpr, L2_EPS: tl.constexpr, SOFTPLUS_LINEAR_ABOVE: tl.constexpr, FAST_GATE: tl.constexpr,
):
    """The one-token step on a persistent grid: program p takes work tiles p, p + G, p + 2G, ...
    (G programs), and the slots of the tiles ahead are loaded before they are needed, so no tile's
    state load waits on its slot. With ``LOOKAHEAD`` the next tile's loads are in flight too while
    one computes, held in registers in the state's own dtype (bf16 costs half the registers of its
    fp32 widening): one tile of state in flight behind the one in use, without shared memory or
    cp.async. Without it each tile's loads are issued when its turn comes, as in the
    one-program-per-tile kernel, but with the slot already in hand (the dependent load behind part
    of the 1.3-6.9 points of copy the memory ceiling found the slots cost at B = 256; it beat the
    table past 2% at 1 of 36 tuned points: docs/triton-kernel.md, "The slots looked ahead")."""
    V_TILES: tl.constexpr = V // BV
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    offs_k = tl.arange(0, K)
    offs_bv = tl.arange(0, BV)
    slot = _tile_slot(slots_ptr, pid, n_tiles, HV, V_TILES)
    if LOOKAHEAD:
        ahead = _load_tile(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, pid, slot, n_tiles,
                           slot_stride, HV, GROUP, offs_k, offs_bv, K, V, BV, LOAD_HINT)
    next_slot = _tile_slot(slots_ptr, pid + step, n_tiles, HV, V_TILES)
    for tile in range(pid, n_tiles, step):
        if LOOKAHEAD:
            S, q, k, a, dt_bias, A_log, beta_logit, v = ahead
            # Issued before this tile's stores, which the compiler may not move loads past.
            ahead = _load_tile(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, tile + step,
                               next_slot, n_tiles, slot_stride, HV, GROUP, offs_k, offs_bv, K, V, BV, LOAD_HINT)
        else:
            S, q, k, a, dt_bias, A_log, beta_logit, v = _load_tile(
                q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, tile, slot, n_tiles,
                slot_stride, HV, GROUP, offs_k, offs_bv, K, V, BV, LOAD_HINT)
        tile_slot = slot
        slot = next_slot
        next_slot = _tile_slot(slots_ptr, tile + 2 * step, n_tiles, HV, V_TILES)
        row_hv = tl.cast(tile // V_TILES, tl.int64)  # a Python int under the interpreter: no .to()
        offs_v = tile % V_TILES * BV + offs_bv
        q, k, decay, beta = _token_gate(q.to(tl.float32), k.to(tl.float32), a.to(tl.float32), dt_bias, A_log,
                                        beta_logit.to(tl.float32), scale, L2_EPS, SOFTPLUS_LINEAR_ABOVE, FAST_GATE)
        S, o = _delta_rule(S.to(tl.float32), q, k, v.to(tl.float32), decay, beta)
        _store_tile(state_ptr, out_ptr, S, o, tile_slot, slot_stride, row_hv % HV, row_hv, offs_v, offs_k, K, V, BV,
                    STORE_HINT)


@triton.jit
def _kda_decode_tma_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, state_desc, slots_ptr, out_ptr,
    slot_stride, scale, n_tiles, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, NUM_STAGES: tl.constexpr, STORE_HINT: tl.constexpr,
    L2_EPS: tl.constexpr, SOFTPLUS_LINEAR_ABOVE: tl.constexpr, FAST_GATE: tl.constexpr,
):
    """The one-token step with the state read by TMA: program p takes work tiles p, p + G, ...
    (G programs; one tile each when G is the tile count), and the compiler's software pipeline
    (``NUM_STAGES`` deep) keeps the coming tiles' slots and state tiles in flight while one
    computes: the state lands in shared memory, so the bytes in flight cost no registers, unlike
    the persistent form's register look-ahead. ``state_desc`` views the pool as ``[N, HV * V, K]``
    with the pool's slot stride, so a tile is one box at ``(slot, hv * V + v0, 0)``; a -1 row's box
    lies outside the pool, which TMA reads as zeros without touching memory. The new tile is
    stored through pointers, masked on -1 rows: the first form stored it by TMA too, which was as
    far behind the table and faulted (an illegal instruction under memcheck) at a -1 row's box
    (docs/triton-kernel.md, "The state read by TMA")."""
    V_TILES: tl.constexpr = V // BV
    H: tl.constexpr = HV // GROUP
    offs_k = tl.arange(0, K)
    offs_bv = tl.arange(0, BV)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        row_hv = tl.cast(tile // V_TILES, tl.int64)  # row * HV + hv; a Python int under the interpreter
        row = row_hv // HV
        hv = row_hv % HV
        h = hv // GROUP
        first_v = tile % V_TILES * BV
        offs_v = first_v + offs_bv
        slot = tl.load(slots_ptr + row)
        box = [slot.to(tl.int32), tl.cast(hv * V + first_v, tl.int32), 0]
        stored = state_desc.load(box).reshape(BV, K)
        q, k, a, dt_bias, A_log, beta_logit = _load_head_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
                                                                row * H + h, hv, row_hv, offs_k, K)
        v = tl.load(v_ptr + row_hv * V + offs_v).to(tl.float32)
        q, k, decay, beta = _token_gate(q, k, a, dt_bias, A_log, beta_logit, scale, L2_EPS, SOFTPLUS_LINEAR_ABOVE,
                                        FAST_GATE)
        S, o = _delta_rule(stored.to(tl.float32), q, k, v, decay, beta)
        _store_tile(state_ptr, out_ptr, S, o, slot, slot_stride, hv, row_hv, offs_v, offs_k, K, V, BV, STORE_HINT)


@triton.jit
def _load_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, slots_ptr, token, h, hv, H, HV, offs_k, offs_v,
                K: tl.constexpr, V: tl.constexpr, STORES: tl.constexpr):
    """The inputs of one token (``row * T + t``) of one value head, and the slot its state goes to
    (-1 without ``STORES``: frozen verify's slots are one per row, and no token is stored)."""
    token_hv = token * HV + hv
    q = tl.load(q_ptr + (token * H + h) * K + offs_k).to(tl.float32)
    k = tl.load(k_ptr + (token * H + h) * K + offs_k).to(tl.float32)
    a = tl.load(a_ptr + token_hv * K + offs_k).to(tl.float32)
    beta_logit = tl.load(b_ptr + token_hv).to(tl.float32)
    v = tl.load(v_ptr + token_hv * V + offs_v).to(tl.float32)
    if STORES:
        slot = tl.load(slots_ptr + token)
    else:
        slot = -1
    return q, k, a, beta_logit, v, slot


@triton.jit
def _kda_multitoken_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr,
    slot_stride, scale, T, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HEADS: tl.constexpr, NUM_STAGES: tl.constexpr,
    LOAD_HINT: tl.constexpr, STORE_HINT: tl.constexpr, L2_EPS: tl.constexpr, SOFTPLUS_LINEAR_ABOVE: tl.constexpr,
    FAST_GATE: tl.constexpr, STORES: tl.constexpr,
):
    """T tokens per row (T > 1): the program mapping of :func:`_kda_decode_kernel`; each state tile
    is read once, from the row's start slot, carried through the T tokens in registers and
    stored after token t where ``slots[row, t] >= 0``. Without ``STORES`` (frozen verify, any T) the
    row starts from ``slots[row]`` and no state is stored."""
    row, first_head, v_tile = _program_tile(HV, HEADS, V // BV)
    H = HV // GROUP
    offs_k = tl.arange(0, K)
    offs_v = v_tile * BV + tl.arange(0, BV)
    tile = offs_v[:, None] * K + offs_k[None, :]
    no_slot = tl.zeros([BV, K], dtype=tl.int32)  # [BV, K] splats of slots: see _kda_decode_kernel

    first_token = row * T
    if STORES:
        start = tl.load(slots_ptr + first_token + tl.load(accepted_ptr + row) - 1)
    else:
        start = tl.load(slots_ptr + row)
    live = (no_slot + start) >= 0  # a padding row reads and writes no state and outputs zeros
    start_state = state_ptr + tl.maximum(start, 0).to(tl.int64) * slot_stride

    for j in tl.range(0, HEADS, num_stages=NUM_STAGES):
        hv = first_head + j
        h = hv // GROUP
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A_log = tl.load(A_log_ptr + hv)
        q, k, a, beta_logit, v, slot = _load_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, slots_ptr, first_token, h, hv,
                                                   H, HV, offs_k, offs_v, K, V, STORES)
        S = tl.load(start_state + hv * (V * K) + tile, mask=live, other=0.0,
                    eviction_policy=LOAD_HINT).to(tl.float32)
        for t in tl.range(0, T, num_stages=1):
            # The next token's inputs (the last token's again on the last pass: a harmless reload
            # rather than a branch) are issued before this token's stores, which the compiler may not
            # move loads past (it cannot tell the pointers apart): they arrive while this token computes.
            ahead = _load_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, slots_ptr, first_token + tl.minimum(t + 1, T - 1),
                                h, hv, H, HV, offs_k, offs_v, K, V, STORES)
            q, k, decay, beta = _token_gate(q, k, a, dt_bias, A_log, beta_logit, scale, L2_EPS,
                                            SOFTPLUS_LINEAR_ABOVE, FAST_GATE)
            S, o = _delta_rule(S, q, k, v, decay, beta)
            if STORES:
                stores = live & ((no_slot + slot) >= 0)
                tl.store(state_ptr + tl.maximum(slot, 0).to(tl.int64) * slot_stride + hv * (V * K) + tile,
                         S.to(state_ptr.dtype.element_ty), mask=stores, eviction_policy=STORE_HINT)
            tl.store(out_ptr + ((first_token + t) * HV + hv) * V + offs_v,
                     tl.where(start >= 0, o, 0.0).to(out_ptr.dtype.element_ty))
            q, k, a, beta_logit, v, slot = ahead


@dataclass(frozen=True)
class TileConfig:
    """How the kernel tiles one step. ``BV``: state rows per tile (power of two); ``heads``:
    consecutive value heads one program walks through; ``num_stages``: how many of those heads'
    loads are in flight at once (1: none ahead); ``num_warps``: warps per program;
    ``programs_per_sm``: 0 launches one program per tile, n > 0 the persistent form
    (:func:`_kda_decode_persistent_kernel`: n programs per SM, each walking tiles with the next
    one's loads in flight; one-token steps only, single heads); ``subtiles``: consecutive
    ``BV``-row tiles of each head one program walks, the gate computed once for them and the next
    tile's load in flight (one-token steps, not the persistent form); ``const_heads``: 1 compiles the
    head counts into the one-token kernel (a shorter path to the first load), 0 passes them at run
    time (fewer registers for some tiles; the code every tabled one-token entry was tuned on);
    the persistent form and the multi-token kernel always compile
    them in (``fitted`` sets 1 there); ``state_first``: 0 issues a one-tile program's state load after
    the small inputs' loads and the gate (the order of the kernel most tabled one-token entries were
    tuned on), 1 before them (the order sub-tiles brought, which the sub-tile run tuned), 2 after the
    small inputs' loads and before the gate (their loads go out before the warp waits on the slot,
    the gate is computed while the state is in flight); sub-tiles load the state before the gate (1
    unless 2 is asked for), the persistent form and the multi-token kernel first (``fitted`` sets 1
    there); ``rewiden``: 1 widens the stored tile to fp32 twice (:func:`_delta_rule_rewidened`), 0
    once; ``maxnreg``: a cap on registers per thread for ptxas (0: none); ``tma``: 1 reads the state
    by TMA into shared memory, storing it through pointers (:func:`_kda_decode_tma_kernel`: one-token
    steps, single heads, the loop ``num_stages`` deep, one program per tile or ``programs_per_sm`` of them walking the
    tiles), on a pool whose base and slot stride TMA can address (16-byte multiples; another pool
    runs the same tile through pointers: :func:`tma_addressable`); ``lookahead``: the persistent
    form's, 1 the next tile's loads in flight in registers, 0 only the coming tiles' slots (each
    tile's loads issued in its turn, never waiting on its slot); ``load_evict_first`` and
    ``store_evict_first``: 1 marks the state's loads (the pointer forms'; TMA's carry no hint) or
    its stores ``evict_first`` (the default, as the kernel was first tuned: the state is touched
    once a step), 0 leaves them unhinted, as FlashInfer's kernel does. The hinted store is faster
    at B <= 64 and what makes the step sensitive to where the pool lands; unhinted wins at some
    B = 256 entries (docs/triton-kernel.md, "The eviction hints"); ``fast_gate``: 1 computes the gate
    and the norms in base 2 on MUFU's approximations (:func:`_token_gate`: fewer instructions before
    a program can use its tile, which a B = 1 step waits on), 0 with libdevice's log, square roots
    and divisions (the code the other entries were tuned on: the same tile can compile to another
    load order, docs/triton-kernel.md, "The gate in base 2"); ``tiled_inputs``: 1 loads a one-tile,
    one-token program's q, k, a and dt_bias as ``[BV, K]`` tiles of copies in the state tile's layout
    and computes the gate per row (:func:`_kda_decode_kernel`), 0 as ``[K]`` vectors, the gate once."""

    BV: int
    heads: int = 1
    num_warps: int = 4
    num_stages: int = 1
    programs_per_sm: int = 0
    subtiles: int = 1
    const_heads: int = 0
    state_first: int = 0
    rewiden: int = 0
    maxnreg: int = 0
    tma: int = 0
    lookahead: int = 1
    load_evict_first: int = 1
    store_evict_first: int = 1
    fast_gate: int = 0
    tiled_inputs: int = 0

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    @classmethod
    def parse(cls, text: str, base: "TileConfig", source: str = CONFIG_ENV) -> "TileConfig":
        """``base`` with the fields named in ``text`` (``"BV=32,num_warps=4"``) replaced."""
        allowed = {f.name for f in fields(cls)}
        changes = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = (s.strip() for s in item.partition("="))
            if not sep or name not in allowed:
                raise ValueError(f"{source}={text!r}: {item!r} is not NAME=VALUE with NAME one of "
                                 f"{', '.join(sorted(allowed))}")
            try:
                changes[name] = int(value)
            except ValueError:
                raise ValueError(f"{source}={text!r}: {name} must be an integer; got {value!r}") from None
        config = replace(base, **changes)
        config.validate(source=f"{source}={text!r}")
        return config

    def validate(self, source: str = "tile config") -> None:
        def power_of_two(n):
            return n >= 1 and n & (n - 1) == 0

        if not (power_of_two(self.BV) and self.BV <= 256):
            raise ValueError(f"{source}: BV must be a power of two in 1..256; got {self.BV}")
        if not (power_of_two(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"{source}: num_warps must be a power of two in 1..32; got {self.num_warps}")
        if not 1 <= self.heads <= 256:
            raise ValueError(f"{source}: heads must be in 1..256; got {self.heads}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"{source}: num_stages must be in 1..8; got {self.num_stages}")
        if not 0 <= self.programs_per_sm <= 64:
            raise ValueError(f"{source}: programs_per_sm must be in 0..64; got {self.programs_per_sm}")
        if not (power_of_two(self.subtiles) and self.subtiles <= 64):
            raise ValueError(f"{source}: subtiles must be a power of two in 1..64; got {self.subtiles}")
        if self.state_first not in (0, 1, 2):
            raise ValueError(f"{source}: state_first must be 0, 1 or 2; got {self.state_first}")
        for flag in ("const_heads", "rewiden", "tma", "lookahead", "load_evict_first", "store_evict_first",
                     "fast_gate", "tiled_inputs"):
            if getattr(self, flag) not in (0, 1):
                raise ValueError(f"{source}: {flag} must be 0 or 1; got {getattr(self, flag)}")
        if self.maxnreg and not (self.maxnreg % 8 == 0 and 24 <= self.maxnreg <= 255):
            raise ValueError(f"{source}: maxnreg must be 0 (no cap) or a multiple of 8 in 24..255; "
                             f"got {self.maxnreg}")

    def fitted(self, HV: int, V: int, T: int = 1) -> "TileConfig":
        """This config made legal for a shape: a tile no taller than V, a head group dividing HV, no
        more sub-tiles than V holds; the persistent form walks single heads whole tiles, and it,
        sub-tiles, runtime head counts and the state load's place exist for one-token steps only
        (T > 1 drops them; the persistent form compiles the head counts in; sub-tiles load the
        state first). The TMA form walks single heads whole tiles too, its loop ``num_stages`` deep.
        ``lookahead`` is the persistent pointer form's alone (the default elsewhere), and the TMA form's
        state loads take no hint (``load_evict_first`` the default there). ``tiled_inputs`` is the
        one-program-per-tile one-token kernel's alone (0 elsewhere)."""
        BV = min(self.BV, V)
        fitted = replace(self, BV=BV, heads=math.gcd(self.heads, HV), subtiles=min(self.subtiles, V // BV),
                         lookahead=self.lookahead if self.programs_per_sm and not self.tma and T == 1 else 1)
        if T > 1:
            return replace(fitted, programs_per_sm=0, subtiles=1, const_heads=1, state_first=1, rewiden=0, tma=0,
                           tiled_inputs=0)
        if fitted.tma:
            return replace(fitted, heads=1, subtiles=1, const_heads=1, state_first=1, rewiden=0, load_evict_first=1,
                           tiled_inputs=0)
        if fitted.programs_per_sm:
            return replace(fitted, heads=1, num_stages=1, subtiles=1, const_heads=1, state_first=1, rewiden=0,
                           tiled_inputs=0)
        return replace(fitted, state_first=fitted.state_first or 1) if fitted.subtiles > 1 else fitted


def table_key(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int = 1) -> tuple:
    # fp16 state moves the same bytes as bf16, so it shares bf16's entries.
    dtype = "float32" if state_dtype == torch.float32 else "bfloat16"
    return (dtype, HV, K, V, B, T)


def _nearest(tabled, wanted: int) -> int:
    """The tabled value nearest ``wanted`` in log2; a tie goes to the larger."""
    log = math.log2(max(wanted, 1))
    return min(tabled, key=lambda x: (abs(math.log2(x) - log), -x))


def tile_shape(K: int, V: int, element_size: int, tile_bytes: int, bytes_per_thread: int = 64) -> tuple[int, int]:
    """``(BV, num_warps)`` of a ``[BV, K]`` state tile of about ``tile_bytes``, each thread holding
    about ``bytes_per_thread`` of it (1 to 8 warps)."""
    BV = max(1, min(V, tile_bytes // (K * element_size)))
    return BV, max(1, min(8, BV * K * element_size // (bytes_per_thread * 32)))


def heuristic_config(K: int, V: int, element_size: int, B: int, HV: int) -> TileConfig:
    """The config for a shape the table lacks: 64 bytes of state per thread (four 16-byte loads in
    flight), 8 KiB tiles, halved below B=16 so that small batches still spread over the SMs; heads
    smaller than a tile are grouped, their loads pipelined two deep."""
    tile_bytes = 8192 if B >= 16 else 4096
    BV, num_warps = tile_shape(K, V, element_size, tile_bytes)
    heads = math.gcd(HV, max(1, tile_bytes // (V * K * element_size))) if BV == V else 1
    return TileConfig(BV=BV, heads=heads, num_warps=num_warps, num_stages=2 if heads > 1 else 1)


def choose_config(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int = 1) -> TileConfig:
    """The table's entry for this shape and state dtype at the tabled tokens per row nearest ``T``,
    then the tabled batch size nearest ``B`` (both in log2; ties go to the larger), else
    :func:`heuristic_config`. A multi-token step whose shape has only one-token entries takes those."""
    dtype = table_key(state_dtype, HV, K, V, B, T)[0]
    tabled = {key[4:]: text for key, text in TABLE.items() if key[:4] == (dtype, HV, K, V)}
    if not tabled:
        return heuristic_config(K, V, state_dtype.itemsize, B, HV)
    tokens = _nearest({t for _, t in tabled}, T)
    batch = _nearest({b for b, t in tabled if t == tokens}, B)
    source = f"triton_tuning.TABLE{(dtype, HV, K, V, batch, tokens)}"
    return TileConfig.parse(tabled[batch, tokens], TileConfig(BV=V), source=source)


class TritonKDA(Implementation):
    """``config``: force one tile config for every shape (tuning); None uses ``KDA_TRITON_CONFIG``
    over the tuning table."""

    name = "triton"
    library = "kda-impls"
    variant = ("one fused launch from the raw inputs (gate, sigmoid(beta) and q/k L2 norm in kernel), pool "
               "updated in place through slots; the kernel has no other calling convention")
    capabilities = Capabilities(devices=("cuda", "cpu"),
                                state_dtypes=(torch.bfloat16, torch.float16, torch.float32),
                                k_values=HEAD_DIMS, v_values=HEAD_DIMS, max_tokens=None, frozen=True, replay=True,
                                min_compute_capability=(8, 0), packages=("triton",))

    def __init__(self, config: TileConfig | None = None):
        if config is not None:
            config.validate()
        self.forced_config = config

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "triton": triton.__version__}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        interpreted = bool(INTERPRETED)
        if inputs.device.type == "cpu":
            if interpreted:
                return None
            reason = "Triton runs on CPU only under TRITON_INTERPRET=1"
            if os.environ.get("TRITON_INTERPRET"):
                return reason + ", set before kda_impls.impls.triton_kda is imported (here it was set later)"
            if not torch.cuda.is_available():
                return reason + " (no CUDA GPU is available here)"
            return reason
        if interpreted:
            return ("TRITON_INTERPRET=1 was set when kda_impls.impls.triton_kda was imported: the kernel would be "
                    "interpreted on the CPU, not compiled for the GPU (unset it to run on CUDA)")
        if torch.version.cuda is None:
            return "needs a CUDA build of torch (the kernel is built and tuned for NVIDIA GPUs only)"
        return None

    def config_for(self, inputs: DecodeInputs) -> TileConfig:
        """The tile config a launcher bound to ``inputs`` uses (forced, else env over table)."""
        if self.forced_config is not None:
            config = self.forced_config
        else:
            config = choose_config(inputs.state.dtype, inputs.HV, inputs.K, inputs.V, inputs.B, inputs.T)
            override = os.environ.get(CONFIG_ENV)
            if override:
                config = TileConfig.parse(override, config)
        if config.tma and not tma_addressable(inputs):
            config = replace(config, tma=0, programs_per_sm=0, num_stages=1)
        # frozen verify runs the multi-token kernel at any T, so a T = 1 one takes its forms too
        return config.fitted(inputs.HV, inputs.V, inputs.T if inputs.update_state else max(inputs.T, 2))

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        if inputs.B == 0:
            return lambda: out
        if inputs.replay:
            from .triton_replay import replay_launcher  # its kernels import this module's constants

            return replay_launcher(inputs, out)
        config = self.config_for(inputs)
        kernel, grid, args, meta = kernel_arguments(inputs, out, config)
        if inputs.device.type == "cuda":
            compile_kernel(inputs, out, config)
        launch_kernel = kernel[grid]

        def launch() -> torch.Tensor:
            launch_kernel(*args, **meta)
            return out

        return launch


def kernel_arguments(inputs: DecodeInputs, out: torch.Tensor, config: TileConfig):
    """``(kernel, grid, args, meta)`` of the launch: everything but the launch itself.

    A T = 1 step, in either spelling (the same memory), launches the one-token kernel (its persistent
    form where ``config.programs_per_sm`` > 0: that many programs per SM, at most one per tile);
    T > 1 the multi-token one, with num_accepted (all ones allocated here where None); frozen verify
    (any T) the multi-token one without its stores.
    """
    if not inputs.update_state:
        tile = frozen_tile(inputs.HV, inputs.K, inputs.V, inputs.B, inputs.T)
        if tile is not None:
            return frozen_arguments(inputs, out, tile)
    grid = (inputs.B * (inputs.HV // config.heads) * (inputs.V // config.BV),)  # one program per tile
    one_token = inputs.T == 1 and inputs.update_state  # the one-token kernels always store
    pool = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots)
    scalars = (inputs.slot_stride, inputs.effective_scale)
    # The head counts are compile-time constants (the one-token kernel's unless config.const_heads is
    # 0): the program-to-tile mapping divides by them, and a division by a runtime value is a long
    # instruction sequence on the path to the first load.
    meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=config.BV, L2_EPS=L2_EPS,
                SOFTPLUS_LINEAR_ABOVE=SOFTPLUS_LINEAR_ABOVE, FAST_GATE=config.fast_gate,
                STORE_HINT=EVICTION_POLICY[config.store_evict_first],
                num_warps=config.num_warps)
    load_hint = dict(LOAD_HINT=EVICTION_POLICY[config.load_evict_first])
    if config.maxnreg:
        meta["maxnreg"] = config.maxnreg
    if one_token and config.tma:
        n_tiles = grid[0]
        programs = min(n_tiles, config.programs_per_sm * multiprocessors(inputs.device)) or n_tiles
        boxes = TensorDescriptor(inputs.state, shape=[inputs.N, inputs.HV * inputs.V, inputs.K],
                                 strides=[inputs.slot_stride, inputs.K, 1], block_shape=[1, config.BV, inputs.K])
        return (_kda_decode_tma_kernel, (programs,), (*pool[:8], boxes, inputs.slots, out, *scalars, n_tiles),
                meta | dict(NUM_STAGES=config.num_stages))
    if one_token and config.programs_per_sm:
        n_tiles = grid[0]
        programs = min(n_tiles, config.programs_per_sm * multiprocessors(inputs.device))
        return _kda_decode_persistent_kernel, (programs,), (*pool, out, *scalars, n_tiles), meta | load_hint | dict(
            LOOKAHEAD=config.lookahead)
    meta |= load_hint | dict(HEADS=config.heads, NUM_STAGES=config.num_stages)
    if one_token:
        heads = (meta.pop("HV"), meta.pop("GROUP"))
        constants = heads if config.const_heads else (0, 0)
        return (_kda_decode_kernel, (grid[0] // config.subtiles,), (*pool, out, *scalars, *heads),
                meta | dict(HV_CONST=constants[0], GROUP_CONST=constants[1], SUBTILES=config.subtiles,
                            STATE_FIRST=config.state_first, REWIDEN=config.rewiden,
                            TILED_INPUTS=config.tiled_inputs))
    return (_kda_multitoken_kernel, grid, (*pool, inputs.accepted(), out, *scalars, inputs.T),
            meta | dict(STORES=int(inputs.update_state)))


def tma_addressable(inputs: DecodeInputs) -> bool:
    """Whether TMA can address the pool as :func:`_kda_decode_tma_kernel` views it: its base and its
    slot stride in bytes multiples of 16 (its row stride, K elements of 2 or 4 bytes with K a power of
    two >= 16, always is). The contract lets this kernel take any pool, so a tile config asking for
    TMA runs through pointers on one that is not."""
    return inputs.state.data_ptr() % 16 == 0 and inputs.slot_stride * inputs.state.element_size() % 16 == 0


def multiprocessors(device: torch.device) -> int:
    """SMs of a CUDA device; 1 on the CPU (the interpreter), where a persistent grid is then
    ``programs_per_sm`` programs walking every tile."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def compile_kernel(inputs: DecodeInputs, out: torch.Tensor, config: TileConfig):
    """Compile (or fetch from Triton's cache) and load the CUDA kernel for these inputs; returns
    Triton's compiled kernel (``n_regs``, ``n_spills``, ``metadata``). Done at bind time so that
    neither the first timed launch nor a CUDA-graph capture compiles or loads a module."""
    kernel, grid, args, meta = kernel_arguments(inputs, out, config)
    with torch.cuda.device(inputs.device):
        compiled = kernel.warmup(*args, grid=grid, **meta)
        compiled._init_handles()  # the module load Triton would otherwise do at the first launch
    return compiled
