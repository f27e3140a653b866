"""A checked run of an implementation against the float64 reference: one step, then several.

Before every launch the output is poisoned with NaN. The first step is judged against the exact
float64 reference (:data:`TOLERANCE`). The same pool then takes more steps, fresh random q, k, v,
a, b each, the state carried forward, against a reference that stores each state rounded to the
pool's dtype as kernels do (bound :func:`steps_tolerance`, tight): an error that compounds from step
to step, which one step under a bf16 tolerance hides, is caught. Over all steps, every slot the
steps do not store and the padding between slots must be unchanged bit for bit. A replay step
(``inputs.cache``) is judged across its rings' flushes by :mod:`kda_impls.verify_replay`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import torch

from .contract import Implementation
from .inputs import DecodeInputs
from .reference import reference

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


class _RoundingReference:
    """The float64 reference carried over steps: the stored slots' states in float64, each stored
    rounded by ``store`` (to the pool's dtype), in a compact pool of its own that the inputs' slots
    index through a remapping."""

    def __init__(self, inputs: DecodeInputs, stored_slots: torch.Tensor, store):
        self.store = store
        # the slots stored and those rows start from (frozen verify stores none); one slot at least:
        # padding rows read index 0 (their results are discarded)
        kept = torch.cat([stored_slots, inputs.start_slots()[inputs.live_rows()]]).unique()
        self.pool = inputs.state[kept].double() if len(kept) else \
            torch.zeros(1, *inputs.state.shape[1:], dtype=torch.float64, device=inputs.device)
        remap = torch.full((max(inputs.N, 1),), -1, dtype=torch.int32, device=inputs.device)
        remap[kept] = torch.arange(len(kept), dtype=torch.int32, device=inputs.device)
        slots = inputs.slots.long()
        self.slots = torch.where(slots >= 0, remap[slots.clamp(min=0)], -1).to(torch.int32)

    def step(self, inputs: DecodeInputs, stored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``reference`` on ``inputs`` from this pool: (out, exact states); the pool then holds the
        stored states rounded as the kernel's pool holds them."""
        out, states = reference(replace(inputs, state=self.pool, slots=self.slots))
        per_row = states.view(inputs.B, inputs.T, *states.shape[-3:])
        self.pool[self.stored_index(inputs, stored)] = self.store(per_row[stored]).double()
        return out, states

    def stored_index(self, inputs: DecodeInputs, stored: torch.Tensor) -> torch.Tensor:
        if not inputs.update_state:  # frozen verify: [B] start slots, nothing stored
            return self.slots[:0].long()
        return self.slots.view(inputs.B, inputs.T).long()[stored]


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


def verify(impl: Implementation, inputs: DecodeInputs, steps: int | None = None) -> Verdict:
    """Run ``impl`` on ``inputs`` for ``steps`` consecutive steps (default :func:`default_steps`; the
    pool is updated) and judge the result.

    Each step stores into the same slots, the first on ``inputs`` as given, the others on fresh
    random activations, each row starting from the state its previous step stored. Every slot a
    step stores must hold its token's state; every other slot (not named, or named only by a padding
    row) and the padding between slots must be unchanged bit for bit; padding rows must output
    zeros; each step's output must be within :data:`TOLERANCE` of the reference's. The first step's
    errors are against the exact reference (``err_out``, ``err_state``); ``err_steps`` is the stored
    states' error after the last step run against the rounding reference, within
    :func:`steps_tolerance` after every step. The steps stop at the first that has a problem.
    A replay step (``inputs.cache``) is judged by :func:`kda_impls.verify_replay.verify_replay`.
    Raises what ``bind`` raises (ContractError, Unsupported) before anything runs.
    """
    if inputs.replay:
        from .verify_replay import verify_replay  # it builds on this module's helpers

        return verify_replay(impl, inputs, steps)
    steps = default_steps(inputs) if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    B, T = inputs.B, inputs.T
    live = inputs.live_rows()
    stored = inputs.stored()
    stored_slots = inputs.token_slots().long()[stored]
    tol_state = TOLERANCE[inputs.state.dtype]
    tol_out = max(TOLERANCE[inputs.v.dtype], tol_state)
    gen = torch.Generator(device=inputs.device).manual_seed(int(inputs.slots.numel()) + 12345)
    before = inputs.pool_span().clone()
    chains = [_RoundingReference(inputs, stored_slots, store) for store in stores(inputs)]
    problems: list[str] = []
    err_out = err_state = err_steps = tol_steps = 0.0
    for step in range(steps):
        x = inputs if step == 0 else fresh_activations(inputs, gen)
        out = torch.full(x.out_shape, float("nan"), dtype=x.v.dtype, device=x.device)
        launch = impl.bind(x, out)
        # every chain's outputs and exact states; at the first step all start from the same pool
        results = [chain.step(x, stored) for chain in chains]
        out = launch()
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        step_err_out, found = output_problems(x, out, [ref for ref, _ in results], live, tol_out)
        kernel_states = inputs.state[stored_slots]
        if step == 0:
            err_out = step_err_out
            err_state = rel_err(kernel_states, results[0][1].view(B, T, *inputs.state.shape[1:])[stored])
            if not err_state <= tol_state:
                found.append(f"state error {err_state:.2e} > {tol_state:.0e}")
        errs = [rel_err(kernel_states, chain.pool[chain.stored_index(x, stored)]) for chain in chains]
        err_steps = nearest(errs)
        tol_steps = steps_tolerance(inputs.state.dtype, step + 1)
        if not err_steps <= tol_steps and not (step == 0 and not err_state <= tol_state):  # said once
            found.append(f"state error {err_steps:.2e} > {tol_steps:.1e} after {step + 1} steps, against the "
                         f"reference carried over them and stored as the pool stores")
        if found:
            problems += found if step == 0 else [f"step {step + 1} of {steps}: {p}" for p in found]
            steps = step + 1
            break

    after = inputs.pool_span()
    untouched = torch.ones(inputs.N, dtype=torch.bool, device=inputs.device)
    untouched[stored_slots] = False
    idx = torch.nonzero(untouched).flatten()
    changed = (bits(slot_rows(inputs, before)[idx]) != bits(slot_rows(inputs, after)[idx])).any(dim=1)
    if changed.any():
        problems.append(f"{int(changed.sum())} slots not in `slots` were written (or named only by padding "
                        f"rows, which store nothing; e.g. slot {int(idx[changed][0])})")
    if not torch.equal(bits(padding(inputs, before)), bits(padding(inputs, after))):
        problems.append("padding between slots was written")
    return Verdict(err_out, err_state, tol_out, tol_state, problems, err_steps, tol_steps, steps)
