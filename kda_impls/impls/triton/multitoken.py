"""Our Triton kernels' multi-token step (T > 1 tokens per row, a speculative verify), and frozen verify's
recurrence form.

The program mapping of the one-token kernel: the state tile is read once, from the row's start slot
``slots[row, num_accepted[row] - 1]``, kept in registers through the T tokens (a loop, not unrolled:
registers do not grow with T, and one compiled kernel serves every T) and stored after token t only
where ``slots[row, t] >= 0``; each token's inputs are loaded while the previous token computes. It
moves one state read per live row and one write per stored slot, the floor of that step. Without
``STORES`` (frozen verify where the tuning rule picks the recurrence: ``frozen.frozen_tile``) each
tile is read once from ``slots[row]``, the tokens chained in registers and only the outputs written.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .gate import _delta_rule, _program_tile, _token_gate


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
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    LOAD_HINT: tl.constexpr, STORE_HINT: tl.constexpr, L2_EPS: tl.constexpr, SOFTPLUS_LINEAR_ABOVE: tl.constexpr,
    FAST_GATE: tl.constexpr, STORES: tl.constexpr,
):
    """T tokens per row (T > 1): the program mapping of :func:`_kda_decode_kernel`; each state tile
    is read once, from the row's start slot, carried through the T tokens in registers and
    stored after token t where ``slots[row, t] >= 0``. Without ``STORES`` (frozen verify, any T) the
    row starts from ``slots[row]`` and no state is stored."""
    row_hv, v_tile = _program_tile(V // BV)
    row = row_hv // HV
    hv = row_hv % HV
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

