"""Our Triton kernels' one-token step, the pool updated in place: one fused launch per step.

Each program owns one batch row, one value head and one V-tile of ``BV`` rows of the head's ``[V, K]``
state (or ``subtiles`` such tiles); K is one tile (K <= 256), so every reduction is within the
program. It reads its state tile once, decays it, applies the delta rule, writes it back through
``slots`` and writes the output tile: the state crosses memory exactly twice, the floor of a
memory-bound step. A row whose slot is -1 writes zeros to its output, every state access masked off.
The persistent form (:func:`_kda_decode_persistent_kernel`) walks the tiles from a fixed grid. Which
form and tile a shape runs is the tuning table's choice (``tiles.TileConfig``; docs/triton-kernel.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .gate import _delta_rule, _delta_rule_rewidened, _load_head_inputs, _program_tile, _token_gate


@triton.jit
def _kda_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    slot_stride, scale, value_heads, group, HV_CONST: tl.constexpr, GROUP_CONST: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
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
    row_hv, v_tile = _program_tile(V // CHUNK)
    row = row_hv // HV
    hv = row_hv % HV
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

    h = hv // GROUP
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

