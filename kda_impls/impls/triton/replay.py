"""Our Triton kernels' replay step (any T <= L, with a commit): outputs from the checkpoint and the records.

No kernel forms the effective state ``E`` (``kda_impls/replay.py``) except at a flush: a token needs
only ``E_dec k^`` and ``E_dec q^`` (``E_dec`` the state before the token, decayed by its gate), and
with ``G'`` the log decay from the checkpoint through this token's gate and ``w_j = k^_j *
exp(G' - G_j)`` over every record j before the token those are

    E_dec x = S_0 (exp(G') * x) + sum_j u_j (w_j . x)        (x = k^ or q^)

a pass over the checkpoint (two reductions) and one over the records.

**A one-token step** (decode) is one launch (:mod:`.replay_token`): the records' ``w_j`` from their
pre-decayed keys, kept in fp32 beside the cache, the flush fused, the lengths advanced by the row's last
program.

**A verify** (T > 1) is one fused launch: each program of a row, head and V-tile holds the records'
tiles (keys and gates from the raw records), then appends each token of the step to them as the record
the next token reads (its delta depends on the previous tokens' deltas, so the tokens chain through the
value rows); each token's record (``u`` fp32, the raw key and gate input, and its pre-decayed key and
cumulative decay) is written at ``n + t``. The lengths advance in a launch after it (one program per
row), as every program of a row reads its length.

A flush first (``n + T > L`` after the commit) is a launch of its own before either form: every
V-tile program of a row reads the row's committed key/gate records while the step writes the new ones
over them from position 0, and a program cannot wait for the others of its row, but the next launch
can; it runs only where a commit or T > 1 can make one (a one-token step without a commit never
does). Then the step, which finds a flushed row's state in the pool and its ring empty.

The pre-decayed records are filled from the cache where a launcher is bound, and every launcher bound
on the same cache reads and appends the same ones; records that anything else writes into the cache
(another library's verify, an edit by hand) are read right by a launcher bound after they are written.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ...inputs import DecodeInputs
from ...reference import L2_EPS
from .replay_math import _carried, _committed_deltas, _committed_keys, _log_decay, _normalised, _pre_decayed
from .replay_token import _token_kernel, decayed_records

REPLAY_CONFIG_ENV = "KDA_TRITON_REPLAY_CONFIG"


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
    kg_ptr, length_ptr, decayed_ptr, slot_stride, scale, T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
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
                tl.store(decayed_ptr + at * 2 * K + offs_k, _pre_decayed(k, G))
                tl.store(decayed_ptr + at * 2 * K + K + offs_k, G)
            # the token is a record the next tokens read, its G_j this token's G'
            new = offs_l[:, None] == n + t
            k_hat = tl.where(new, k[None, :], k_hat)
            G_j = tl.where(new, G[None, :], G_j)
            u_j = tl.where(new, u[None, :], u_j)


@triton.jit
def _advance_lengths(slots_ptr, accepted_ptr, length_ptr, T: tl.constexpr, L: tl.constexpr):
    """A verify's lengths: the commit, and 0 where the step flushed first (its T records stay uncommitted)."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        n = tl.load(length_ptr + slot) + tl.load(accepted_ptr + row)
        tl.store(length_ptr + slot, tl.where(n + T > L, 0, n))


def replay_tile(V: int, T: int) -> dict[str, int]:
    """``{BV, num_warps, maxnreg}`` of a ``T``-token step: the environment's ``KDA_TRITON_REPLAY_CONFIG``
    (e.g. ``"BV=32,num_warps=4,maxnreg=96"``) over the default of its form: a one-token step's programs 32
    rows and 4 warps; a verify's 64 rows and 2 warps, the fastest of the tiles timed on the H200 at
    B = 256 (``results/h200/replay-verify-tiles/tiles.csv``). ``maxnreg`` caps the registers a thread
    (ptxas spills past it; 0: no cap)."""
    tile = {"BV": min(V, 32), "num_warps": 4, "maxnreg": 0} if T == 1 else \
        {"BV": min(V, 64), "num_warps": 2, "maxnreg": 0}
    text = os.environ.get(REPLAY_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in tile or not value.isdigit():
            raise ValueError(f"{REPLAY_CONFIG_ENV} items must be BV=, num_warps= or maxnreg=<int>; got {item!r}")
        tile[name] = int(value)
    BV = tile["BV"]
    if BV < 1 or BV & (BV - 1) or V % BV or tile["num_warps"] not in (1, 2, 4, 8, 16) or \
            not (tile["maxnreg"] == 0 or 24 <= tile["maxnreg"] <= 255):
        raise ValueError(f"{REPLAY_CONFIG_ENV}: BV must be a power of two dividing V={V}, num_warps one of "
                         f"1/2/4/8/16 and maxnreg 0 or 24..255; got {text!r}")
    return tile


def replay_launcher(inputs: DecodeInputs, out: torch.Tensor):
    """The zero-argument launch of a replay step: the flush-first kernel (where a commit or T > 1 can make
    one), then a one-token step's one launch, or a verify's and its lengths'. The cache's pre-decayed
    records (:func:`.replay_token.decayed_records`) are filled from the cache here."""
    cache, T = inputs.cache, inputs.T
    tile = replay_tile(inputs.V, T)
    BV, heads = tile["BV"], inputs.B * inputs.HV
    grid = (heads * (inputs.V // BV),)
    # None commits nothing; the zeros and the one-token step's tickets are allocated here, never in the launch
    accepted = inputs.num_accepted if inputs.num_accepted is not None else \
        torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
    decayed = decayed_records(inputs)
    ring = dict(L=cache.L, LP=max(16, triton.next_power_of_2(cache.L)), L2_EPS=L2_EPS)
    shape = dict(HV=inputs.HV, K=inputs.K, V=inputs.V, BV=BV, num_warps=tile["num_warps"],
                 **({"maxnreg": tile["maxnreg"]} if tile["maxnreg"] else {}))
    flush_first = functools.partial(
        _flush_first_kernel[grid], inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots, accepted, cache.u,
        cache.kg, cache.length, inputs.slot_stride, T=T, **shape, **ring)
    activations = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
                   inputs.slots, accepted, out, cache.u, cache.kg, cache.length, decayed)
    group = dict(GROUP=inputs.HV // inputs.H)
    if T == 1:
        tickets = torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
        steps = [functools.partial(_token_kernel[grid], *activations, tickets, inputs.slot_stride,
                                   inputs.effective_scale, **shape, **group, **ring)]
    else:
        steps = [functools.partial(_verify_kernel[grid], *activations, inputs.slot_stride, inputs.effective_scale,
                                   T=T, **shape, **group, **ring),
                 functools.partial(_advance_lengths[(inputs.B,)], inputs.slots, accepted, cache.length, T=T, L=cache.L)]
    if T > 1 or inputs.num_accepted is not None:  # else n + 1 <= L: the contract holds n < L
        steps.insert(0, flush_first)

    def launch() -> torch.Tensor:
        for step in steps:
            step()
        return out

    return launch
