"""Our Triton kernels' replay step (any T <= L, with a commit): outputs from the checkpoint and the records.

No kernel forms the effective state ``E`` (``kda_impls/replay.py``) except at a flush: a token needs
only ``E_dec k^`` and ``E_dec q^`` (``E_dec`` the state before the token, decayed by its gate), and
with ``G'`` the log decay from the checkpoint through this token's gate and ``w_j = k^_j *
exp(G' - G_j)`` over every record j before the token those are

    E_dec x = S_0 (exp(G') * x) + sum_j u_j (w_j . x)        (x = k^ or q^)

a pass over the checkpoint (two reductions) and one over the records. The record terms ``w_j . x``
depend on the keys and gates only, not on the value rows; the deltas ``u_j`` on the rows only.

**A one-token step** (decode) splits the two: a *terms* launch, one program per row and head, walks
the committed key/gate records newest first (the records past the commit are never read), forms
``exp(G') k^``, ``exp(G') q^``, the record terms and ``k^ . q^`` into a small scratch, and writes the
token's key/gate record at ``n``; a *step* launch, one program per row, head
and ``BV``-row tile of the state, as the in-place kernel's, streams the checkpoint tile, adds
``sum_j u_j (w_j . x)`` from the deltas' ``[LP, BV]`` tile, stores the output and the token's delta
record, and where the record fills the ring forms the tile ``S_0 exp(G') + sum_j u_j w_j^T + u k^T``
(a loop over the records in memory, on the flush only) and stores it into the pool; else the pool is
not written. The record work is done once a head, not once a V-tile, and the step's programs are as
small as the in-place kernel's.

**A verify** (T > 1) is one fused launch: each program of a row, head and V-tile holds the records'
tiles, then appends each token of the step to them as the record the next token reads (its delta
depends on the previous tokens' deltas, so the tokens chain through the value rows); each token's
record (``u`` fp32, the raw key and gate input) is written at ``n + t``.

A flush first (``n + T > L`` after the commit) is a launch of its own before either form: every
V-tile program of a row reads the row's committed key/gate records while the step writes the new ones
over them from position 0, and a program cannot wait for the others of its row, but the next launch
can; it runs only where a commit or T > 1 can make one (a one-token step without a commit never
does). Then the step, which finds a flushed row's state in the pool and its ring empty. The lengths
advance last (one program per row), as every program of a row reads its length.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...inputs import DecodeInputs
from ...reference import L2_EPS, SOFTPLUS_LINEAR_ABOVE

_LINEAR_ABOVE = tl.constexpr(SOFTPLUS_LINEAR_ABOVE)  # a global a kernel reads must be a constexpr
REPLAY_CONFIG_ENV = "KDA_TRITON_REPLAY_CONFIG"


@triton.jit
def _log_decay(a, dt_bias, A):
    x = a + dt_bias
    return -A * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))


@triton.jit
def _normalised(x, L2_EPS: tl.constexpr):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + L2_EPS)


@triton.jit
def _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K: tl.constexpr, L2_EPS: tl.constexpr):
    """The first ``n`` key/gate records of a slot's head as register tiles: ``(k^ [LP, K], G_j [LP, K],
    G_n [K])``, rows at and past ``n`` zero (never loaded)."""
    kept = offs_l[:, None] < n
    kg_rows = kg_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :]
    in_k = kept & (offs_k[None, :] < K)
    g = tl.where(in_k, _log_decay(tl.load(kg_rows + K, mask=in_k, other=0.0).to(tl.float32), dt_bias[None, :], A), 0.0)
    k = tl.load(kg_rows, mask=in_k, other=0.0).to(tl.float32)
    k_hat = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]
    return k_hat, tl.cumsum(g, axis=0), tl.sum(g, axis=0)


@triton.jit
def _committed_deltas(u_ptr, records, n, offs_l, offs_v, V: tl.constexpr):
    """The first ``n`` delta records of a slot's head, this program's value rows: ``[LP, BV]``, rows at
    and past ``n`` zero (never loaded)."""
    in_v = (offs_l[:, None] < n) & (offs_v[None, :] < V)
    return tl.load(u_ptr + (records + offs_l)[:, None] * V + offs_v[None, :], mask=in_v, other=0.0)


@triton.jit
def _carried(S0, G, u_ptr, kg_ptr, records, count, dt_bias, A, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr,
             L2_EPS: tl.constexpr):
    """``S_0 exp(G) + sum_{j<count} u_j (k^_j exp(G - G_j))^T`` over the first ``count`` records in memory:
    the state they carry, decayed through ``G``, formed only for a flush (one record a loop step)."""
    E = S0 * tl.exp(G)[None, :]
    G_j = tl.zeros([K], dtype=tl.float32)
    for j in range(0, count):
        kg_row = kg_ptr + (records + j) * 2 * K
        G_j += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
        w_j = _normalised(tl.load(kg_row + offs_k).to(tl.float32), L2_EPS) * tl.exp(G - G_j)
        E += tl.load(u_ptr + (records + j) * V + offs_v)[:, None] * w_j[None, :]
    return E


@triton.jit
def _flush_first_kernel(
    A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, u_ptr, kg_ptr, length_ptr, slot_stride,
    T: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr,
    LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)
        if n + T > L:
            offs_k = tl.arange(0, K)
            offs_v = (pid % (V // BV)) * BV + tl.arange(0, BV)
            dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
            A = tl.exp(tl.load(A_log_ptr + hv))
            records = (s * HV + hv) * L
            G = _committed_keys(kg_ptr, records, n, dt_bias, A, tl.arange(0, LP), offs_k, K, L2_EPS)[2]
            tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
            E = _carried(tl.load(tile).to(tl.float32), G, u_ptr, kg_ptr, records, n, dt_bias, A, offs_k, offs_v, K, V,
                         L2_EPS)
            tl.store(tile, E.to(state_ptr.dtype.element_ty))


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr,
    kg_ptr, length_ptr, slot_stride, scale, T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    v_tile = pid % (V // BV)
    offs_k = tl.arange(0, K)
    offs_v = v_tile * BV + tl.arange(0, BV)
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        for t in range(T):
            tl.store(out_ptr + ((row * T + t) * HV + hv) * V + offs_v,
                     tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
    else:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)  # the commit
        n = tl.where(n + T > L, 0, n)  # flushed first by _flush_first_kernel: the state is the pool's
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        records = (s * HV + hv) * L  # record j of this slot and head: index records + j
        offs_l = tl.arange(0, LP)
        k_hat, G_j, G = _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K, L2_EPS)
        u_j = _committed_deltas(u_ptr, records, n, offs_l, offs_v, V)
        tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        S0 = tl.load(tile).to(tl.float32)
        for t in range(T):
            tok = row * T + t
            tok_h = tok * (HV // GROUP) + hv // GROUP
            tok_hv = tok * HV + hv
            k_raw = tl.load(k_ptr + tok_h * K + offs_k)
            a_raw = tl.load(a_ptr + tok_hv * K + offs_k)
            q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
            k = _normalised(k_raw.to(tl.float32), L2_EPS)
            G += _log_decay(a_raw.to(tl.float32), dt_bias, A)  # G': the records' decay and this token's
            w = tl.where(offs_l[:, None] < n + t, k_hat * tl.exp(G[None, :] - G_j), 0.0)
            acc_k = tl.sum(u_j * tl.sum(w * k[None, :], axis=1)[:, None], axis=0)  # sum_j u_j (w_j . k^)
            acc_q = tl.sum(u_j * tl.sum(w * q[None, :], axis=1)[:, None], axis=0)
            decay = tl.exp(G)
            u = tl.sigmoid(tl.load(b_ptr + tok_hv).to(tl.float32)) * (
                tl.load(v_ptr + tok_hv * V + offs_v).to(tl.float32) - tl.sum(S0 * (decay * k)[None, :], axis=1) - acc_k)
            o = tl.sum(S0 * (decay * q)[None, :], axis=1) + acc_q + u * tl.sum(k * q, axis=0)
            tl.store(out_ptr + tok_hv * V + offs_v, o.to(out_ptr.dtype.element_ty))
            at = records + n + t
            tl.store(u_ptr + at * V + offs_v, u)
            if v_tile == 0:
                tl.store(kg_ptr + at * 2 * K + offs_k, k_raw)
                tl.store(kg_ptr + at * 2 * K + K + offs_k, a_raw)
            # the token is a record the next tokens read, its G_j this token's G'
            new = offs_l[:, None] == n + t
            k_hat = tl.where(new, k[None, :], k_hat)
            G_j = tl.where(new, G[None, :], G_j)
            u_j = tl.where(new, u[None, :], u_j)


@triton.jit
def _token_terms_kernel(
    q_ptr, k_ptr, a_ptr, A_log_ptr, dt_bias_ptr, slots_ptr, accepted_ptr, kg_ptr, length_ptr, vec_ptr, coef_ptr,
    scale, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    L2_EPS: tl.constexpr,
):
    """A one-token step's per-head terms: ``vec`` ``[B * HV, 4, K]`` holds ``exp(G') k^``, ``exp(G') q^``,
    ``k^`` and ``G'``; ``coef`` ``[B * HV, 2 * LP + 1]`` the record terms ``w_j . k^``, ``w_j . q^`` and
    ``k^ . q^``. The records are walked newest first, so that the decay from each to the token,
    ``G' - G_j``, is a running sum of the gates after it: ``[K]`` vectors, each record's three
    reductions within the program (no ``[LP, K]`` tile, no scan across records). The token's key/gate
    record is written here, once a head."""
    pid = tl.program_id(0)
    row = (pid // HV).to(tl.int64)
    hv = pid % HV
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        s = slot.to(tl.int64)
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)  # the commit
        n = tl.where(n + 1 > L, 0, n)  # flushed first by _flush_first_kernel: the state is the pool's
        offs_k = tl.arange(0, K)
        dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
        A = tl.exp(tl.load(A_log_ptr + hv))
        records = (s * HV + hv) * L
        tok_h = row * (HV // GROUP) + hv // GROUP
        k_raw = tl.load(k_ptr + tok_h * K + offs_k)
        a_raw = tl.load(a_ptr + pid * K + offs_k)
        q = _normalised(tl.load(q_ptr + tok_h * K + offs_k).to(tl.float32), L2_EPS) * scale
        k = _normalised(k_raw.to(tl.float32), L2_EPS)
        G = _log_decay(a_raw.to(tl.float32), dt_bias, A)  # G' - G_j for the record before the token
        coef = coef_ptr + pid * (2 * LP + 1)
        # pipelined: the next records' loads are issued before this one's sums (the walk waits on DRAM, not math)
        for back in tl.range(0, n, num_stages=3):
            kg_row = kg_ptr + (records + n - 1 - back) * 2 * K
            k_j = tl.load(kg_row + offs_k).to(tl.float32)
            decayed = tl.exp(G)
            norm = tl.rsqrt(tl.sum(k_j * k_j, axis=0) + L2_EPS)
            tl.store(coef + n - 1 - back, tl.sum(k_j * decayed * k, axis=0) * norm)
            tl.store(coef + LP + n - 1 - back, tl.sum(k_j * decayed * q, axis=0) * norm)
            G += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
        decay = tl.exp(G)  # G is now G': the records' decay and this token's
        vec = vec_ptr + pid * (4 * K) + offs_k
        tl.store(vec, decay * k)
        tl.store(vec + K, decay * q)
        tl.store(vec + 2 * K, k)
        tl.store(vec + 3 * K, G)
        tl.store(coef + 2 * LP, tl.sum(k * q, axis=0))
        at = records + n
        tl.store(kg_ptr + at * 2 * K + offs_k, k_raw)
        tl.store(kg_ptr + at * 2 * K + K + offs_k, a_raw)


@triton.jit
def _token_step_kernel(
    v_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, out_ptr, u_ptr, kg_ptr, length_ptr,
    vec_ptr, coef_ptr, slot_stride, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    L: tl.constexpr, LP: tl.constexpr, L2_EPS: tl.constexpr,
):
    """A one-token step's outputs and delta records from the checkpoint tile and the per-head terms; the
    flush where the record fills the ring."""
    pid = tl.program_id(0)
    head = pid // (V // BV)  # row * HV + hv
    row = (head // HV).to(tl.int64)
    hv = head % HV
    offs_v = (pid % (V // BV)) * BV + tl.arange(0, BV)
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        tl.store(out_ptr + head * V + offs_v, tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
    else:
        s = slot.to(tl.int64)
        offs_k = tl.arange(0, K)
        tile = state_ptr + s * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        S0 = tl.load(tile).to(tl.float32)  # first: the step's one large read
        n = tl.load(length_ptr + s) + tl.load(accepted_ptr + row)
        n = tl.where(n + 1 > L, 0, n)
        records = (s * HV + hv) * L
        offs_l = tl.arange(0, LP)
        u_j = _committed_deltas(u_ptr, records, n, offs_l, offs_v, V)
        vec = vec_ptr + head * (4 * K) + offs_k
        coef = coef_ptr + head * (2 * LP + 1)
        kept = offs_l < n  # the terms of records past the commit are never written
        acc_k = tl.sum(u_j * tl.load(coef + offs_l, mask=kept, other=0.0)[:, None], axis=0)  # sum_j u_j (w_j . k^)
        acc_q = tl.sum(u_j * tl.load(coef + LP + offs_l, mask=kept, other=0.0)[:, None], axis=0)
        u = tl.sigmoid(tl.load(b_ptr + head).to(tl.float32)) * (
            tl.load(v_ptr + head * V + offs_v).to(tl.float32) - tl.sum(S0 * tl.load(vec)[None, :], axis=1) - acc_k)
        o = tl.sum(S0 * tl.load(vec + K)[None, :], axis=1) + acc_q + u * tl.load(coef + 2 * LP)
        tl.store(out_ptr + head * V + offs_v, o.to(out_ptr.dtype.element_ty))
        tl.store(u_ptr + (records + n) * V + offs_v, u)
        if n + 1 == L:  # the record fills the ring: the flush forms the new effective state's tile
            dt_bias = tl.load(dt_bias_ptr + hv * K + offs_k)
            A = tl.exp(tl.load(A_log_ptr + hv))
            E = _carried(S0, tl.load(vec + 3 * K), u_ptr, kg_ptr, records, n, dt_bias, A, offs_k, offs_v, K, V, L2_EPS)
            tl.store(tile, (E + u[:, None] * tl.load(vec + 2 * K)[None, :]).to(state_ptr.dtype.element_ty))


@triton.jit
def _advance_lengths(slots_ptr, accepted_ptr, length_ptr, T: tl.constexpr, L: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        n = tl.load(length_ptr + slot) + tl.load(accepted_ptr + row)
        n = tl.where(n + T > L, 0, n)  # flushed first
        if T == 1:  # a decode step commits its record; a verify leaves its T for the next commit
            n = n + 1
            n = tl.where(n == L, 0, n)
        tl.store(length_ptr + slot, n)


def replay_tile(V: int, T: int) -> dict[str, int]:
    """``{BV, num_warps, terms_warps}`` of a ``T``-token step: the environment's ``KDA_TRITON_REPLAY_CONFIG``
    (e.g. ``"BV=32,num_warps=4"``) over the default of its form, each the fastest of the tiles timed on
    the H200 at B = 256: a one-token step's step programs 16 rows and one warp, as the in-place
    kernel's at these shapes, and its terms programs (``terms_warps``) one warp
    (``results/h200/replay-tiles/tiles.csv``); a verify's fused programs 64 rows and 2 warps
    (``results/h200/replay-verify-tiles/tiles.csv``)."""
    tile = {"BV": min(V, 16), "num_warps": 1, "terms_warps": 1} if T == 1 else \
        {"BV": min(V, 64), "num_warps": 2, "terms_warps": 1}
    text = os.environ.get(REPLAY_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{REPLAY_CONFIG_ENV} items must be BV=, num_warps= or terms_warps=<int>; got {item!r}")
        tile[name] = int(value)
    BV = tile["BV"]
    if BV < 1 or BV & (BV - 1) or V % BV or not {tile["num_warps"], tile["terms_warps"]} <= {1, 2, 4, 8, 16}:
        raise ValueError(f"{REPLAY_CONFIG_ENV}: BV must be a power of two dividing V={V} and num_warps and "
                         f"terms_warps each one of 1/2/4/8/16; got {text!r}")
    return tile


def replay_launches(inputs: DecodeInputs, out: torch.Tensor) -> list:
    """A replay step's launches, each ``(kernel, grid, args, meta)``: the flush-first kernel (where a
    commit or T > 1 can make one), the step (a one-token step's terms and step launches, or a verify's
    fused one), the lengths. A one-token step's scratch is allocated here (bind time)."""
    cache, T = inputs.cache, inputs.T
    tile = replay_tile(inputs.V, T)
    BV, heads = tile["BV"], inputs.B * inputs.HV
    grid = (heads * (inputs.V // BV),)
    # None commits nothing; the zeros are allocated here, never in the launch
    accepted = inputs.num_accepted if inputs.num_accepted is not None else \
        torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
    ring = dict(L=cache.L, LP=triton.next_power_of_2(cache.L), L2_EPS=L2_EPS)
    shape = dict(HV=inputs.HV, K=inputs.K)
    tiles = dict(V=inputs.V, BV=BV, num_warps=tile["num_warps"])
    flush_first = (_flush_first_kernel, grid,
                   (inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots, accepted, cache.u, cache.kg,
                    cache.length, inputs.slot_stride), dict(T=T, **shape, **tiles, **ring))
    group = inputs.HV // inputs.H
    if T == 1:
        # NaN-filled once: a term read that no launch wrote would poison the output, not pass unseen
        vec = torch.full((heads, 4, inputs.K), float("nan"), device=inputs.device)
        coef = torch.full((heads, 2 * ring["LP"] + 1), float("nan"), device=inputs.device)
        terms = (_token_terms_kernel, (heads,),
                 (inputs.q, inputs.k, inputs.a, inputs.A_log, inputs.dt_bias, inputs.slots, accepted, cache.kg,
                  cache.length, vec, coef, inputs.effective_scale),
                 dict(**shape, GROUP=group, **ring, num_warps=tile["terms_warps"]))
        token = (_token_step_kernel, grid,
                 (inputs.v, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots, accepted, out,
                  cache.u, cache.kg, cache.length, vec, coef, inputs.slot_stride),
                 dict(**shape, **tiles, **ring))
        step = [terms, token]
    else:
        step = [(_verify_kernel, grid,
                 (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
                  inputs.slots, accepted, out, cache.u, cache.kg, cache.length, inputs.slot_stride,
                  inputs.effective_scale), dict(T=T, **shape, GROUP=group, **tiles, **ring))]
    advance = (_advance_lengths, (inputs.B,), (inputs.slots, accepted, cache.length),
               dict(T=T, L=cache.L, num_warps=4))
    may_flush_first = T > 1 or inputs.num_accepted is not None  # else n + 1 <= L: the contract holds n < L
    return [flush_first, *step, advance] if may_flush_first else [*step, advance]
