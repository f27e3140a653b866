"""A checked run of an implementation against the float64 reference: one step, then several.

Before every launch the output is poisoned with NaN. The first step is judged against the exact
float64 reference (:data:`~kda_impls.verify_checks.TOLERANCE`). The same pool then takes more steps:
fresh random q, k, v, a, b each, the state carried forward. These are judged against a reference that
stores each state rounded to the pool's dtype, as kernels do (tight bound
:func:`~kda_impls.verify_checks.steps_tolerance`). So an error that compounds from step to step is
caught, which one step under a bf16 tolerance hides. Over all steps, every slot the steps do not
store and the padding between slots must stay unchanged bit for bit. A replay step
(``inputs.cache``) is judged across its rings' flushes by :mod:`kda_impls.verify_replay`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .contract import Implementation
from .inputs import DecodeInputs
from .reference import reference
from .verify_checks import (
    TOLERANCE,
    Verdict,
    bits,
    default_steps,
    fresh_activations,
    nearest,
    output_problems,
    padding,
    rel_err,
    slot_rows,
    steps_tolerance,
    stores,
)
from .verify_replay import verify_replay


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
