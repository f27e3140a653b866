"""Our Triton kernel's frozen verify (``update_state=False``, any T): every token's output, no state stored.

Each program owns one row, one value head and one V-tile of ``BV`` rows of the row's start state
``S_0`` (slot ``slots[row]``), read once. The T tokens are not applied one by one to the tile (four
passes over it a token); with ``G_t`` the cumulative log decay along K through token t, the chained
states are ``S_t = S_0 diag(exp G_t) + sum_{j<=t} u_j (k^_j exp(G_t - G_j))^T``, so

    u_t = beta_t (v_t - S_0 (exp(G_t) k^_t) - sum_{j<t} u_j Mkk[j, t])
    o_t = S_0 (exp(G_t) q^_t) + sum_{j<=t} u_j Mkq[j, t]

with ``Mkk[j, t] = k^_j . (exp(G_t - G_j) k^_t)`` and ``Mkq[j, t]`` the same with ``q^_t``. The
state's part is two matrix products over the tile (``[BV, K] x [K, TP]``, the T tokens padded to
``TP`` columns), the rest ``[TP, K]`` and ``[BV, TP]`` register tiles; every exponent is <= 0 (a
strong decay underflows to 0, never overflows). The state's products run on the tensor cores with
fp32 accumulation: a bf16/fp16 state in its own dtype (as FlashInfer's WY kernel does), the other
operand split into two roundings (``split``: the error of the in-place kernel's fp32 math, not twice
it); an fp32 state as three TF32 products (``tf32x3``: one TF32 product's error would show). The
interpreter checks the same roundings in fp32 (it multiplies bf16 wrongly). A row whose slot is -1
outputs zeros and reads no state. ``KDA_TRITON_FROZEN_CONFIG`` sets the tile (:func:`frozen_config`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..inputs import DecodeInputs
from ..reference import L2_EPS
from .triton_kda import INTERPRETED
from .triton_replay import _log_decay

FROZEN_CONFIG_ENV = "KDA_TRITON_FROZEN_CONFIG"
DOT_MIN = 16  # tl.dot's smallest dimension: the tokens are padded to at least this many columns


@triton.jit
def _row(x, offs_t, t):
    """Row ``t`` of a ``[TP, N]`` tile as an ``[N]`` vector (a masked sum: registers cannot be indexed)."""
    return tl.sum(tl.where(offs_t[:, None] == t, x, 0.0), axis=0)


@triton.jit
def _col(x, offs_t, t):
    """Column ``t`` of an ``[N, TP]`` tile as an ``[N]`` vector."""
    return tl.sum(tl.where(offs_t[None, :] == t, x, 0.0), axis=1)


@triton.jit
def _dot(S0, x, PRECISION: tl.constexpr):
    # The interpreter multiplies bf16 operands wrongly (Triton 3.9): there they are widened first (the
    # same products, exact in fp32).
    if INTERPRETED:
        return tl.dot(S0.to(tl.float32), x.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(S0, x, input_precision=PRECISION)


@triton.jit
def _state_dot(S0, x, SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """``S0 @ x``, accumulated in fp32. A bf16/fp16 state multiplies ``x`` rounded to its dtype, and
    with ``SPLIT`` the rounding's remainder too (a second product: ``x`` then carries about 16 bits, as
    the in-place kernel's fp32 math does, not 8). An fp32 state multiplies at ``PRECISION``: ``tf32x3``
    (three TF32 products, about fp32's accuracy, on the tensor cores) or ``ieee`` (FMA: more registers)."""
    hi = x.to(S0.dtype)
    if SPLIT:
        return _dot(S0, hi, PRECISION) + _dot(S0, (x - hi.to(tl.float32)).to(S0.dtype), PRECISION)
    else:
        return _dot(S0, hi, PRECISION)


@triton.jit
def _kda_frozen_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr, slot_stride, scale,
    T: tl.constexpr, TP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, STATE_FIRST: tl.constexpr, L2_EPS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // (V // BV) // HV).to(tl.int64)
    hv = (pid // (V // BV)) % HV
    offs_k = tl.arange(0, K)
    offs_v = (pid % (V // BV)) * BV + tl.arange(0, BV)
    offs_t = tl.arange(0, TP)
    tokens = row * T + offs_t
    real = offs_t < T
    # out[row, t, hv, v-tile] for every t at once: a [BV, TP] tile, the padding columns masked off
    out_tile = out_ptr + (tokens[None, :] * HV + hv) * V + offs_v[:, None]
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        tl.store(out_tile, tl.zeros([BV, TP], dtype=tl.float32).to(out_ptr.dtype.element_ty), mask=real[None, :])
    else:
        tile = state_ptr + slot.to(tl.int64) * slot_stride + hv * (V * K) + offs_v[:, None] * K + offs_k[None, :]
        if STATE_FIRST:  # the DRAM read in flight while the small inputs load and the [T, T] products compute
            S0 = tl.load(tile)
        in_k = real[:, None] & (offs_k[None, :] < K)
        heads = (tokens * (HV // GROUP) + hv // GROUP)[:, None] * K + offs_k[None, :]
        k = tl.load(k_ptr + heads, mask=in_k, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + heads, mask=in_k, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + (tokens * HV + hv)[:, None] * K + offs_k[None, :], mask=in_k, other=0.0).to(tl.float32)
        beta = tl.sigmoid(tl.load(b_ptr + tokens * HV + hv, mask=real, other=0.0).to(tl.float32))
        v = tl.load(v_ptr + (tokens * HV + hv)[None, :] * V + offs_v[:, None], mask=real[None, :],
                    other=0.0).to(tl.float32)  # [BV, TP]
        k = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]
        q = q / tl.sqrt(tl.sum(q * q, axis=1) + L2_EPS)[:, None] * scale
        g = _log_decay(a, tl.load(dt_bias_ptr + hv * K + offs_k)[None, :], tl.exp(tl.load(A_log_ptr + hv)))
        G = tl.cumsum(tl.where(in_k, g, 0.0), axis=0)  # [TP, K]; the padding rows repeat the last token's

        # Mkk[j, t] (j < t) and Mkq[j, t] (j <= t), row j of each built from token j's key and decay
        Mkk = tl.zeros([TP, TP], dtype=tl.float32)
        Mkq = tl.zeros([TP, TP], dtype=tl.float32)
        for j in tl.static_range(T):
            kj = _row(k, offs_t, j)
            decay = tl.exp(tl.where(offs_t[:, None] >= j, G - _row(G, offs_t, j)[None, :], float("-inf")))
            wk = decay * kj[None, :]  # row t: k^_j exp(G_t - G_j), zero for t < j
            Mkk = tl.where(offs_t[:, None] == j, tl.where(offs_t > j, tl.sum(wk * k, axis=1), 0.0)[None, :], Mkk)
            Mkq = tl.where(offs_t[:, None] == j, tl.sum(wk * q, axis=1)[None, :], Mkq)

        if not STATE_FIRST:
            S0 = tl.load(tile)
        decay = tl.exp(G)
        Ak = _state_dot(S0, tl.trans(decay * k), SPLIT, PRECISION)  # [BV, TP]: column t is S_0 (exp(G_t) k^_t)
        Bq = _state_dot(S0, tl.trans(decay * q), SPLIT, PRECISION)

        U = tl.zeros([BV, TP], dtype=tl.float32)
        for t in tl.static_range(T):
            carried = tl.sum(U * _col(Mkk, offs_t, t)[None, :], axis=1)  # sum_{j<t} u_j Mkk[j, t]
            u = tl.sum(tl.where(offs_t == t, beta, 0.0), axis=0) * (_col(v, offs_t, t) - _col(Ak, offs_t, t) - carried)
            U = tl.where(offs_t[None, :] == t, u[:, None], U)
        o = Bq + tl.dot(U, Mkq, input_precision="ieee")
        tl.store(out_tile, o.to(out_ptr.dtype.element_ty), mask=real[None, :])


def frozen_config(V: int) -> dict[str, int]:
    """``{BV, num_warps, split, tf32x3}``: the environment's ``KDA_TRITON_FROZEN_CONFIG`` (e.g.
    ``"BV=32,num_warps=8,split=0"``) over the default: 64 rows (at most V), 4 warps, ``split=1`` (a
    bf16/fp16 state's products carry the operand's rounding remainder) and ``tf32x3=1`` (an fp32
    state's products in three TF32 ones, else IEEE FMA): :func:`_state_dot`; ``state_first=1`` issues the
    state's load before the small inputs' (0: just before its products). Untimed; compiled for sm_90 at
    K=V=128, T=4 it takes 128 registers a thread (bf16 state) and 221 (fp32), no spills: four and two
    programs an SM, 64 KiB of state in flight either way."""
    config = {"BV": min(V, 64), "num_warps": 4, "split": 1, "tf32x3": 1, "state_first": 1}
    text = os.environ.get(FROZEN_CONFIG_ENV, "")
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = (s.strip() for s in item.partition("="))
        if name not in config or not value.isdigit():
            raise ValueError(f"{FROZEN_CONFIG_ENV} items must be NAME=<int> with NAME one of {', '.join(config)}; "
                             f"got {item!r}")
        config[name] = int(value)
    BV, warps = config["BV"], config["num_warps"]
    if BV < DOT_MIN or BV & (BV - 1) or V % BV or warps not in (1, 2, 4, 8, 16) or \
            any(config[flag] not in (0, 1) for flag in ("split", "tf32x3", "state_first")):
        raise ValueError(f"{FROZEN_CONFIG_ENV}: BV must be a power of two >= {DOT_MIN} dividing V={V}, num_warps "
                         f"one of 1/2/4/8/16, split, tf32x3 and state_first 0 or 1; got {config}")
    return config


def frozen_arguments(inputs: DecodeInputs, out: torch.Tensor):
    """``(kernel, grid, args, meta)`` of a frozen verify launch: everything but the launch itself."""
    config = frozen_config(inputs.V)
    grid = (inputs.B * inputs.HV * (inputs.V // config["BV"]),)
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state,
            inputs.slots, out, inputs.slot_stride, inputs.effective_scale)
    meta = dict(T=inputs.T, TP=max(DOT_MIN, triton.next_power_of_2(inputs.T)), HV=inputs.HV,
                GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=config["BV"],
                SPLIT=config["split"] if inputs.state.dtype != torch.float32 else 0,
                PRECISION="tf32x3" if config["tf32x3"] else "ieee", STATE_FIRST=config["state_first"], L2_EPS=L2_EPS,
                num_warps=config["num_warps"])
    return _kda_frozen_kernel, grid, args, meta


def frozen_launcher(inputs: DecodeInputs, out: torch.Tensor):
    """The zero-argument launch of a frozen verify step (compiled and loaded here on CUDA, so that
    neither the first timed launch nor a CUDA-graph capture compiles)."""
    kernel, grid, args, meta = frozen_arguments(inputs, out)
    if inputs.device.type == "cuda":
        with torch.cuda.device(inputs.device):
            kernel.warmup(*args, grid=grid, **meta)._init_handles()
    launch_kernel = kernel[grid]

    def launch() -> torch.Tensor:
        launch_kernel(*args, **meta)
        return out

    return launch
