"""The checks both verify modes share: tolerances, the number of steps, the verdict, and the
comparisons of an output, a stored state, the untouched slots and the padding between slots
(:mod:`kda_impls.verify` for in-place and frozen steps, :mod:`kda_impls.verify_replay` for replay).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import torch

from .inputs import DecodeInputs

# One step, ||x - ref|| / ||ref|| a correct implementation stays under, by the coarsest dtype it
# stores: rounding to bf16 leaves ~2e-3 relative, fp16 ~3e-4, fp32 math on fp32 state ~1e-7.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
# Over n steps, against the reference that stores each state rounded as the pool does, the relative L2
# error of the stored states must stay under u * sqrt(n), u the unit roundoff of the state's dtype
# (fp32: its one-step bound): rounding errors, random in sign, add up like a random walk, an error of
# one sign with the steps themselves. bf16-rounded gates (FlashInfer's precompute variants, emulated)
# reach 4e-3 after 16 steps (bound 1.6e-2); a state 0.5% too large per step is over it from the first.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 1e-5}
MAX_STEPS = 16
# Interpreted (on the CPU) a step costs seconds at the tests' shapes, about in proportion to its state
# elements: as many steps as fit this many state elements (4 at the smoke preset's), at least
# MIN_CPU_STEPS; on a GPU at least MIN_GPU_STEPS (8 at the correctness grid's largest shape).
CPU_STEP_ELEMENTS = 2**13
MIN_CPU_STEPS = 2
GPU_STEP_ELEMENTS = 2**31
MIN_GPU_STEPS = 8

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (absolute norm if ref is all zero); NaN stays NaN."""
    x, ref = x.detach().double(), ref.detach().double().to(x.device)
    denom = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(x - ref).item()
    return num / denom if denom > 0 else num


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


def steps_tolerance(state_dtype: torch.dtype, steps: int) -> float:
    """The bound on the stored states' error after ``steps`` steps against the rounding reference."""
    return UNIT_ROUNDOFF[state_dtype] * math.sqrt(steps)


def _truncated(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to bf16 toward zero (fp32 bits cut), as Triton's interpreter converts fp32 to bf16."""
    return (x.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def default_steps(inputs: DecodeInputs) -> int:
    """How many consecutive steps :func:`verify` runs on ``inputs``: :data:`MAX_STEPS`, fewer where
    a step's state elements (B*T*HV*V*K) would make them slow (on the CPU, where kernels are
    interpreted, down to :data:`MIN_CPU_STEPS`); a replay step L + 1, so that every ring flushes."""
    if inputs.replay:
        # a one-token step on a ring of n records flushes at step L - n <= L: every live row flushes once,
        # and its step after that reads the new checkpoint
        return inputs.cache.L + 1
    if not inputs.update_state:
        return 1  # frozen verify stores nothing: no error carries over to a next step
    on_cpu = inputs.device.type == "cpu"
    budget, floor = (CPU_STEP_ELEMENTS, MIN_CPU_STEPS) if on_cpu else (GPU_STEP_ELEMENTS, MIN_GPU_STEPS)
    elements = max(inputs.B * inputs.T * inputs.slot_elements, 1)
    return max(floor, min(MAX_STEPS, budget // elements))


@dataclass
class Verdict:
    err_out: float
    err_state: float
    tol_out: float
    tol_state: float
    problems: list[str] = field(default_factory=list)
    # the stored states' error after the last of ``steps`` steps against the rounding reference, and its bound
    err_steps: float = 0.0
    tol_steps: float = 0.0
    steps: int = 1

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"err_out={self.err_out:.2e} (tol {self.tol_out:.0e}) err_state={self.err_state:.2e} " \
               f"(tol {self.tol_state:.0e}) err_steps={self.err_steps:.2e} (tol {self.tol_steps:.1e}, " \
               f"{self.steps} steps)"
        return head + ("" if self.ok else ": " + "; ".join(self.problems))


def padding(inputs: DecodeInputs, pool_span: torch.Tensor) -> torch.Tensor:
    """The elements between consecutive slots, as an [N-1, slot_pad] view of ``pool_span``."""
    pad = inputs.slot_stride - inputs.slot_elements
    if inputs.N < 2 or pad == 0:
        return pool_span[:0]
    return pool_span.as_strided((inputs.N - 1, pad), (inputs.slot_stride, 1),
                                pool_span.storage_offset() + inputs.slot_elements)


def fresh_activations(inputs: DecodeInputs, gen: torch.Generator) -> DecodeInputs:
    """The step with new standard-normal q, k, v, a, b (as make_inputs draws them); pool, slots, gate
    parameters shared."""
    def draw(t):
        return torch.empty(t.shape, dtype=torch.float32, device=t.device).normal_(generator=gen).to(t.dtype)

    return replace(inputs, q=draw(inputs.q), k=draw(inputs.k), v=draw(inputs.v), a=draw(inputs.a), b=draw(inputs.b))


def stores(inputs: DecodeInputs) -> list:
    """How a kernel may round a state it stores, each judged against a reference of its own (the nearer
    counts): to the pool's dtype rounded to nearest, as GPUs and torch convert; where Triton kernels are
    interpreted, bf16 also truncated, as the interpreter converts (a compiled kernel rounds to nearest)."""
    dtype = inputs.state.dtype
    found = [lambda s: s.to(dtype)]
    if dtype == torch.bfloat16 and inputs.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        found.append(_truncated)
    return found


def nearest(errors: list[float]) -> float:
    """The smallest error, NaN if any is (the kernel's values are then NaN)."""
    return math.nan if any(math.isnan(e) for e in errors) else min(errors)


def output_problems(x: DecodeInputs, out: torch.Tensor, refs: list[torch.Tensor], live: torch.Tensor,
                    tol: float) -> tuple[float, list[str]]:
    """``(error, problems)`` of one launch's output against the references' outputs (the nearer):
    NaN anywhere (the output was poisoned), padding rows not zero, live rows over ``tol``."""
    found = []
    if torch.isnan(out).any():
        found.append(f"{int(torch.isnan(out).sum())} output elements NaN (unwritten or invalid)")
    rows = (x.B, x.T, x.HV, x.V)
    out_rows = out.view(rows)
    if (out_rows[~live] != 0).any():
        found.append("rows with slot -1 must output zeros (padding rows: the slot they start from is -1)")
    err = nearest([rel_err(out_rows[live], ref.view(rows)[live]) for ref in refs])
    if not err <= tol:
        found.append(f"output error {err:.2e} > {tol:.0e}")
    return err, found


def slot_rows(inputs: DecodeInputs, span: torch.Tensor) -> torch.Tensor:
    """Every slot of ``span`` (a copy of the pool's span, or the span itself) as an ``[N, HV*V*K]`` view."""
    return span.as_strided((inputs.N, inputs.slot_elements), (inputs.slot_stride, 1))  # at span's offset
