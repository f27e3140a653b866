"""One checked run of an implementation against the float64 reference.

The output is poisoned with NaN before the run; the stored states and the output are compared with
the reference by relative L2 error; every slot the step does not store and the padding between
slots must be unchanged bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .contract import Implementation
from .inputs import DecodeInputs
from .reference import reference

# ||x - ref|| / ||ref|| a correct implementation stays under, by the coarsest dtype it stores:
# rounding to bf16 leaves ~2e-3 relative, fp16 ~3e-4, fp32 math on fp32 state ~1e-7.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (absolute norm if ref is all zero); NaN stays NaN."""
    x, ref = x.detach().double(), ref.detach().double().to(x.device)
    denom = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(x - ref).item()
    return num / denom if denom > 0 else num


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


@dataclass
class Verdict:
    err_out: float
    err_state: float
    tol_out: float
    tol_state: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"err_out={self.err_out:.2e} (tol {self.tol_out:.0e}) err_state={self.err_state:.2e} " \
               f"(tol {self.tol_state:.0e})"
        return head + ("" if self.ok else ": " + "; ".join(self.problems))


def _padding(inputs: DecodeInputs, pool_span: torch.Tensor) -> torch.Tensor:
    """The elements between consecutive slots, as an [N-1, slot_pad] view of ``pool_span``."""
    pad = inputs.slot_stride - inputs.slot_elements
    if inputs.N < 2 or pad == 0:
        return pool_span[:0]
    return pool_span.as_strided((inputs.N - 1, pad), (inputs.slot_stride, 1),
                                pool_span.storage_offset() + inputs.slot_elements)


def verify(impl: Implementation, inputs: DecodeInputs) -> Verdict:
    """Run ``impl`` once on ``inputs`` (their pool is updated) and judge the result.

    Every slot the step stores must hold its token's state; every other slot (not named, or named
    only by a padding row) and the padding between slots must be unchanged bit for bit; padding
    rows must output zeros. Raises what ``bind`` raises (ContractError, Unsupported) before
    anything runs.
    """
    launch = impl.bind(inputs, torch.full(inputs.out_shape, float("nan"), dtype=inputs.v.dtype,
                                          device=inputs.device))
    ref_out, ref_states = reference(inputs)
    before = inputs.pool_span().clone()
    B, T = inputs.B, inputs.T
    live = inputs.live_rows()
    stored = inputs.stored()
    stored_slots = inputs.token_slots().long()[stored]
    out = launch()
    if out.is_cuda:
        torch.cuda.synchronize(out.device)

    tol_state = TOLERANCE[inputs.state.dtype]
    tol_out = max(TOLERANCE[inputs.v.dtype], tol_state)
    problems = []
    if torch.isnan(out).any():
        problems.append(f"{int(torch.isnan(out).sum())} output elements NaN (unwritten or invalid)")
    out_rows, ref_rows = out.view(B, T, inputs.HV, inputs.V), ref_out.view(B, T, inputs.HV, inputs.V)
    if (out_rows[~live] != 0).any():
        problems.append("rows with slot -1 must output zeros (padding rows: the slot they start from is -1)")
    err_out = rel_err(out_rows[live], ref_rows[live])
    err_state = rel_err(inputs.state[stored_slots], ref_states.view(B, T, *inputs.state.shape[1:])[stored])
    if not err_out <= tol_out:
        problems.append(f"output error {err_out:.2e} > {tol_out:.0e}")
    if not err_state <= tol_state:
        problems.append(f"state error {err_state:.2e} > {tol_state:.0e}")

    after = inputs.pool_span()
    untouched = torch.ones(inputs.N, dtype=torch.bool, device=inputs.device)
    untouched[stored_slots] = False
    idx = torch.nonzero(untouched).flatten()

    def slot_rows(span):
        return span.as_strided((inputs.N, inputs.slot_elements), (inputs.slot_stride, 1), span.storage_offset())

    changed = (_bits(slot_rows(before)[idx]) != _bits(slot_rows(after)[idx])).any(dim=1)
    if changed.any():
        problems.append(f"{int(changed.sum())} slots not in `slots` were written (or named only by padding "
                        f"rows, which store nothing; e.g. slot {int(idx[changed][0])})")
    if not torch.equal(_bits(_padding(inputs, before)), _bits(_padding(inputs, after))):
        problems.append("padding between slots was written")
    return Verdict(err_out, err_state, tol_out, tol_state, problems)
