"""The log gate and sigmoid(beta) of a step, computed ahead of a library kernel that takes them so.

FlashInfer's and fla's kernels can either compute the gate ``-exp(A_log[hv]) * softplus(a + dt_bias[hv])``
and ``sigmoid(b)`` themselves or read them precomputed. The variants that read them precomputed
must still start from our inputs (the raw gate input ``a`` and the beta logit ``b``), so they run
this kernel inside their launcher: what they are timed on stays the whole step. It is one Triton
launch for both, the least a caller can spend on them short of fusing them into an earlier kernel
of its own (vLLM's ``fused_kda_gate`` is one launch too).

The gate is computed per VALUE head in float32 and rounded once to the buffer's dtype: exact in
float32; in bfloat16 (FlashInfer takes nothing else) each element is off by up to 2**-8 relative
(round to nearest; Triton's interpreter truncates, up to 2**-7), which puts the decay exp(g) off by
up to ``|g| * 2**-8`` relative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..inputs import DecodeInputs
from ..reference import SOFTPLUS_LINEAR_ABOVE

# Elements of the [rows, K] gate one program handles: small rows are grouped so that a program
# moves a few KiB (a program per row would spend more on scheduling than on the row).
GATE_ELEMENTS_PER_PROGRAM = 4096
BETA_ROWS_PER_PROGRAM = 1024


@triton.jit
def _gate_beta_kernel(
    a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, log_gate_ptr, beta_ptr, n_rows, HV,
    K: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr, LOG_GATE: tl.constexpr, BETA: tl.constexpr,
    SOFTPLUS_LINEAR_ABOVE: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # row = (batch row [* T + token]) * HV + value head
    in_range = rows < n_rows
    if LOG_GATE:
        hv = rows % HV
        offs_k = tl.arange(0, BK)
        mask = in_range[:, None] & (offs_k < K)[None, :]
        x = tl.load(a_ptr + rows[:, None] * K + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        x += tl.load(dt_bias_ptr + hv[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
        # log1p(exp(x)) without a log1p: log(1 + y) loses the digits of a small y (a decay rate of
        # 1e-5, common with trained dt_bias, would be off by 1e-3 relative); log(u) * y / (u - 1)
        # with u = 1 + y cancels that rounding (Goldberg, 1991) and is exact to a few ulp.
        # (Both sides of a tl.where are evaluated: the clamp and the safe divisor keep the unused
        # one finite.)
        y = tl.exp(tl.minimum(x, SOFTPLUS_LINEAR_ABOVE))
        u = 1.0 + y
        log1p_y = tl.where(u == 1.0, y, tl.log(u) * (y / tl.where(u == 1.0, 1.0, u - 1.0)))
        softplus = tl.where(x > SOFTPLUS_LINEAR_ABOVE, x, log1p_y)
        decay_rate = tl.exp(tl.load(A_log_ptr + hv, mask=in_range, other=0.0))
        log_gate = -decay_rate[:, None] * softplus
        tl.store(log_gate_ptr + rows[:, None] * K + offs_k[None, :], log_gate.to(log_gate_ptr.dtype.element_ty),
                 mask=mask)
    if BETA:
        beta = tl.sigmoid(tl.load(b_ptr + rows, mask=in_range, other=0.0).to(tl.float32))
        tl.store(beta_ptr + rows, beta.to(beta_ptr.dtype.element_ty), mask=in_range)


@dataclass
class Precomputed:
    """Buffers allocated at bind time and the launch that fills them from the inputs' current
    ``a`` and ``b`` (None: that one is left to the library's kernel)."""

    log_gate: torch.Tensor | None  # shaped as a: [B, HV, K] (or [B, T, HV, K])
    beta: torch.Tensor | None  # shaped as b: [B, HV] (or [B, T, HV])
    launch: Callable[[], None]


def unavailable_reason(device: torch.device) -> str | None:
    """Why the precompute kernel cannot run on ``device`` as this process imported it, or None."""
    interpreted = isinstance(_gate_beta_kernel, InterpretedFunction)
    if device.type == "cpu" and not interpreted:
        return ("the gate/beta precompute kernel (Triton) runs on the CPU only under TRITON_INTERPRET=1, set "
                "before kda_impls.impls.precompute is imported")
    if device.type == "cuda" and interpreted:
        return ("TRITON_INTERPRET=1 was set when kda_impls.impls.precompute was imported: the gate/beta "
                "precompute kernel would be interpreted on the CPU, not compiled for the GPU")
    return None


def precompute(inputs: DecodeInputs, *, log_gate: bool, beta: bool, dtype: torch.dtype) -> Precomputed:
    """Allocate ``dtype`` buffers for the per-value-head log gate and/or sigmoid(b) of ``inputs``
    (in either spelling: the buffers take the shapes of ``a`` and ``b``) and return them with their
    launch (compiled here on a GPU, so that neither the first timed launch nor a CUDA-graph capture
    compiles)."""
    if not (log_gate or beta):
        raise ValueError("precompute nothing: ask for the log gate, beta or both")
    HV, K = inputs.HV, inputs.K
    n_rows = inputs.b.numel()  # one per (batch row, token, value head): value head fastest
    gate_buffer = torch.empty(inputs.a.shape, dtype=dtype, device=inputs.device) if log_gate else None
    beta_buffer = torch.empty(inputs.b.shape, dtype=dtype, device=inputs.device) if beta else None
    BK = triton.next_power_of_2(K)
    rows = max(1, GATE_ELEMENTS_PER_PROGRAM // BK) if log_gate else BETA_ROWS_PER_PROGRAM
    grid = (triton.cdiv(n_rows, rows),)
    args = (inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, gate_buffer, beta_buffer, n_rows, HV)
    meta = dict(K=K, BK=BK, ROWS=rows, LOG_GATE=log_gate, BETA=beta, SOFTPLUS_LINEAR_ABOVE=SOFTPLUS_LINEAR_ABOVE,
                num_warps=4)
    if inputs.device.type == "cuda" and n_rows:
        with torch.cuda.device(inputs.device):
            _gate_beta_kernel.warmup(*args, grid=grid, **meta)._init_handles()
    kernel = _gate_beta_kernel[grid]

    def launch() -> None:
        kernel(*args, **meta)

    return Precomputed(gate_buffer, beta_buffer, launch if n_rows else (lambda: None))
