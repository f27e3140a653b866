"""Our Triton replay's one-token step (decode): one launch from the checkpoint and pre-decayed records.

With ``G_j`` the cumulative log decay along K from the checkpoint through record j, ``G'`` that through
this token's gate (``G_{n-1}`` plus its log gate, the gate alone at ``n = 0``) and the record's
pre-decayed key ``kt_j = k^_j * exp(-G_j)``, the state before the token, decayed by its gate, applied
to ``x`` (the token's ``k^`` or ``q^``) is

    E_dec x = S_0 (exp(G') * x) + sum_j u_j (w_j . x),    w_j = kt_j * exp(G') = k^_j * exp(G' - G_j)

so a step reads each record's ``kt_j`` and ``u_j`` once and recomputes no gate or norm of the records.
Every record keeps, beside the cache's ``u`` and raw ``kg``, its ``kt_j`` and ``G_j`` in fp32
(:func:`decayed_records`, ``[N, HV, L, 2K]``: ``[..., :K]`` the key, ``[..., K:]`` the decay), built
from the cache where a launcher is bound and written by every step that appends a record.

One program per row, head and ``BV``-row tile of the state reads its checkpoint tile once, the head's
``[LP, K]`` pre-decayed keys (``LP`` the ring padded to a power of two, at least 16) and its ``[LP, BV]``
deltas, forms ``w`` and the terms itself, stores the output and the token's ``u`` record; the head's
first tile also its raw key and gate record, ``kt_n`` and ``G_n = G'``. Where the record fills the ring
the program forms the new state's tile ``S_0 exp(G') + sum_j u_j w_j^T + u k^T`` and stores it into the
pool, which is not written otherwise: the checkpoint tile read again (from L2) and one record a loop
step, ``w_j`` taken from the register tile: compiled for sm_90 at ``BV = 32``, 4 warps, the kernel takes
115 registers a thread (76 without the flush), where with the flush's sum as an fp32 ``tl.dot``
``[BV, LP] x [LP, K]`` it takes 255 and spills (157 with ``tf32x3``).

``kt_j`` is finite in fp32 only while ``-G_j`` stays under :data:`.replay_math.DECAY_BOUND`; ``G`` only
falls along the ring, so a head whose ``max_K(-G')`` is past the bound forms ``w`` from the raw records
instead, newest first (the decay from each record to the token a running sum of the gates after it),
exact at any decay; that head's later steps do the same until its ring flushes.

The lengths advance in the same launch: each program of a row counts itself on the row's ticket (an
atomic add, acquire-release, after its read of the length), and the last to count writes the row's
next length and resets the ticket for the next launch.
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from ...inputs import DecodeInputs
from ...reference import l2_normalize, log_decay
from .replay_math import _DECAY_BOUND, DECAY_BOUND, _committed_deltas, _log_decay, _normalised, _pre_decayed

# A cache's pre-decayed records, by the memory of its ``kg``: every launcher bound on one cache (a decode's and
# a verify's) reads and appends the same ones. Held by the launchers; gone with the last of them.
_DECAYED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def decayed_records(inputs: DecodeInputs) -> torch.Tensor:
    """The pre-decayed records of ``inputs.cache``, fp32 ``[N, HV, L, 2K]`` (module docstring), filled from
    the cache's records now (in float64, then rounded): every record, those past a slot's length too (a
    verify's, which a commit makes part of the state), a non-finite value as 0 (a record never written)."""
    cache, K = inputs.cache, inputs.K
    kg = cache.kg
    key = (str(kg.device), kg.data_ptr(), tuple(kg.shape))
    decayed = _DECAYED.get(key)
    if decayed is None:
        decayed = _DECAYED[key] = torch.empty(kg.shape, dtype=torch.float32, device=kg.device)
    G = log_decay(inputs, kg[..., K:], torch.float64).cumsum(dim=2)
    decayed[..., :K] = torch.nan_to_num(l2_normalize(kg[..., :K].double()) * torch.exp((-G).clamp(max=DECAY_BOUND)),
                                        nan=0.0, posinf=0.0, neginf=0.0)
    decayed[..., K:] = torch.nan_to_num(G, nan=0.0, posinf=0.0, neginf=0.0)
    return decayed


@triton.jit
def _decayed_from_raw(kg_ptr, records, n, g, dt_bias, A, offs_l, offs_k, K: tl.constexpr, LP: tl.constexpr,
                      L2_EPS: tl.constexpr):
    """``w_j = k^_j exp(G' - G_j)`` of the first ``n`` records, ``[LP, K]``, from the raw records newest
    first: the decay to the token (log gate ``g``) a running sum of the gates after each."""
    W = tl.zeros([LP, K], dtype=tl.float32)
    after = g
    for back in range(0, n):
        j = n - 1 - back
        kg_row = kg_ptr + (records + j) * 2 * K
        w = _normalised(tl.load(kg_row + offs_k).to(tl.float32), L2_EPS) * tl.exp(after)
        W = tl.where(offs_l[:, None] == j, w[None, :], W)
        after += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
    return W


@triton.jit
def _flushed(tile, decay, u, k, W, u_ptr, records, n, offs_l, offs_v, V: tl.constexpr):
    """The new state's tile ``S_0 exp(G') + sum_{j<n} u_j w_j^T + u k^T``: the checkpoint tile read again,
    one record a loop step (``w_j`` from the register tile ``W``, ``u_j`` from memory)."""
    E = tl.load(tile).to(tl.float32) * decay[None, :] + u[:, None] * k[None, :]
    for j in range(0, n):
        w_j = tl.sum(tl.where(offs_l[:, None] == j, W, 0.0), axis=0)
        E += tl.load(u_ptr + (records + j) * V + offs_v)[:, None] * w_j[None, :]
    return E


@triton.jit
def _token_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr,
    kg_ptr, length_ptr, decayed_ptr, ticket_ptr, slot_stride, scale, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    head = pid // (V // BV)  # row * HV + hv
    row = (head // HV).to(tl.int64)
    hv = head % HV
    v_tile = pid % (V // BV)
    offs_v = v_tile * BV + tl.arange(0, BV)
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        tl.store(out_ptr + head * V + offs_v, tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
    else:
        s = slot.to(tl.int64)
        offs_k = tl.arange(0, K)
        tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        S0 = tl.load(tile).to(tl.float32)  # first: the step's one large read
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)  # the commit
        n = tl.where(n + 1 > L, 0, n)  # flushed first by _flush_first_kernel: the state is the pool's
        records = (s * HV + hv) * L  # record j of this slot and head: index records + j
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        tok_h = row * (HV // GROUP) + hv // GROUP
        k_raw = tl.load(k_ptr + tok_h * K + offs_k)
        a_raw = tl.load(a_ptr + head * K + offs_k)
        q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
        k = _normalised(k_raw.to(tl.float32), L2_EPS)
        g = _log_decay(a_raw.to(tl.float32), dt_bias, A)
        last = decayed_ptr + (records + tl.maximum(n, 1) - 1) * 2 * K  # record n - 1's (read where n > 0)
        G = g + tl.where(n > 0, tl.load(last + K + offs_k), 0.0)  # G'
        offs_l = tl.arange(0, LP)
        if tl.max(-G, axis=0) <= _DECAY_BOUND:
            kept = (offs_l[:, None] < n) & (offs_k[None, :] < K)
            kt = tl.load(decayed_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :], mask=kept, other=0.0)
            W = kt * tl.exp(G)[None, :]
        else:
            W = _decayed_from_raw(kg_ptr, records, n, g, dt_bias, A, offs_l, offs_k, K, LP, L2_EPS)
        U = _committed_deltas(u_ptr, records, n, offs_l, offs_v, V)
        decay = tl.exp(G)
        acc_k = tl.sum(U * tl.sum(W * k[None, :], axis=1)[:, None], axis=0)  # sum_j u_j (w_j . k^)
        acc_q = tl.sum(U * tl.sum(W * q[None, :], axis=1)[:, None], axis=0)
        u = tl.sigmoid(tl.load(b_ptr + head).to(tl.float32)) * (
            tl.load(v_ptr + head * V + offs_v).to(tl.float32) - tl.sum(S0 * (decay * k)[None, :], axis=1) - acc_k)
        o = tl.sum(S0 * (decay * q)[None, :], axis=1) + acc_q + u * tl.sum(k * q, axis=0)
        tl.store(out_ptr + head * V + offs_v, o.to(out_ptr.dtype.element_ty))
        at = records + n
        tl.store(u_ptr + at * V + offs_v, u)
        if v_tile == 0:
            tl.store(kg_ptr + at * 2 * K + offs_k, k_raw)
            tl.store(kg_ptr + at * 2 * K + K + offs_k, a_raw)
            tl.store(decayed_ptr + at * 2 * K + offs_k, _pre_decayed(k, G))
            tl.store(decayed_ptr + at * 2 * K + K + offs_k, G)
        if n + 1 == L:  # the record fills the ring: the flush forms the new effective state's tile
            tl.store(tile, _flushed(tile, decay, u, k, W, u_ptr, records, n, offs_l, offs_v, V).to(
                state_ptr.dtype.element_ty))
        # every program of the row has read its length before it counts itself: the last to count writes it
        if tl.atomic_add(ticket_ptr + row, 1) == HV * (V // BV) - 1:
            tl.store(length_ptr + s, tl.where(n + 1 == L, 0, n + 1))
            tl.store(ticket_ptr + row, 0)
