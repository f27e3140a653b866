"""A checked run of a replay step (inputs with a :class:`~kda_impls.ReplayCache`), over enough steps to
cross every ring's flush.

One pool and one cache take the steps, the first on the inputs as given, each later one on fresh
random q, k, v, a, b (a speculative verify's, T > 1, also committing a random 0..T of the records the
step before it left, where the implementation takes a commit). Alongside, the reference's
``replay_step`` runs in float64 on a copy of the pool and of the cache, so that it holds what a correct
kernel's pool holds: each flush rounded to the pool's dtype (where Triton is interpreted, also a copy
whose flushes are truncated, as the interpreter converts; the nearer counts).
After every step and its launcher's :func:`~kda_impls.replay.sync_records`: the output (poisoned with
NaN before the launch) within :data:`~kda_impls.verify_checks.TOLERANCE` of the reference's and zero at
padding rows; the lengths and the raw key and gate records equal to the reference's, the pool written
at the slots the reference flushed only, no ``u`` record written but those the reference wrote, the
padding between slots unchanged (all bit for bit); the ``u`` records written within the output's
tolerance of the reference's (a verify's before any commit reads them); the live slots' effective
states (:func:`kda_impls.effective_state`) within ``u * sqrt(n)`` of the reference's after n steps, as
in-place decode's stored states are.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from . import verify_checks as checks
from .contract import Implementation
from .inputs import DecodeInputs
from .reference import effective_state, replay_step
from .replay import sync_records


class _ReplayReference:
    """``replay_step`` in float64 carried over the steps on a copy of the pool and of the cache. With no
    ``store``, the copy is in the pool's dtype, which every flush rounds to nearest as the semantics do
    (a verify's tokens after a flush first read the rounded state); with one, it is in float64 and each
    slot a step flushes goes through ``store`` after the step."""

    def __init__(self, inputs: DecodeInputs, store=None):
        self.store = store
        self.state = inputs.state.clone() if store is None else inputs.state.double()
        self.cache = inputs.cache.clone()

    def of(self, x: DecodeInputs) -> DecodeInputs:
        """The step ``x`` on this reference's pool and cache."""
        return replace(x, state=self.state, cache=self.cache)

    def step(self, x: DecodeInputs, live_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [B, T, HV, V], the slots flushed)`` of the step ``x``."""
        before = self.state[live_slots]
        out, _ = replay_step(self.of(x), torch.float64)
        # a flush writes a new state: its bits differ
        flushed = live_slots[(checks.bits(self.state[live_slots]) != checks.bits(before)).flatten(1).any(dim=1)]
        if self.store is not None:
            self.state[flushed] = self.store(self.state[flushed]).double()
        return out, flushed


def _next_step(impl: Implementation, inputs: DecodeInputs, gen: torch.Generator) -> DecodeInputs:
    """Fresh activations; a verify (T > 1) commits a random 0..T of the T records the step before left,
    unless ``impl`` refuses a commit (a verify from the checkpoint only): then it commits none."""
    x = replace(checks.fresh_activations(inputs, gen), num_accepted=None)
    if inputs.T == 1:
        return x
    accepted = torch.randint(0, inputs.T + 1, (inputs.B,), generator=gen, device=inputs.device, dtype=torch.int32)
    commit = replace(x, num_accepted=accepted)
    return commit if impl.unsupported(commit) is None else x


def _first(mask: torch.Tensor) -> str:
    """The index of the first True of ``mask``, as the message's example."""
    return ", ".join(map(str, torch.nonzero(mask)[0].tolist()))


def _record_problems(x: DecodeInputs, u_before: torch.Tensor, refs: list[_ReplayReference],
                     ref_u_before: torch.Tensor, tol: float) -> list[str]:
    """The ``u`` records the step writes (those the reference wrote) against the reference's, within
    ``tol`` (a verify's records are judged here before any commit reads them); no other written."""
    found = []
    ref_writes = (checks.bits(refs[0].cache.u) != checks.bits(ref_u_before)).any(dim=-1).any(dim=1)  # [N, L]
    stray = (checks.bits(x.cache.u) != checks.bits(u_before)).any(dim=-1).any(dim=1) & ~ref_writes
    if stray.any():
        found.append(f"{int(stray.sum())} cache.u records written that the step does not write (another slot's, "
                     f"or not the step's own; e.g. slot, record {_first(stray)})")

    judged = ref_writes.clone()  # a decode step's record at L - 1 is folded into the pool by its flush: never read
    judged[:, -1] &= x.T > 1

    def records(u):  # [N, HV, L, V] -> the judged written ones, [records, HV, V]
        return u.transpose(1, 2)[judged]

    err = checks.nearest([checks.rel_err(records(x.cache.u), records(ref.cache.u)) for ref in refs])
    if not err <= tol:
        found.append(f"cache.u record error {err:.2e} > {tol:.0e} (the records the step writes)")
    return found


def _write_problems(x: DecodeInputs, before: torch.Tensor, ref: _ReplayReference, flushed: torch.Tensor) -> list[str]:
    """What the step wrote to the pool, the lengths and the key and gate records, bit for bit, against the
    pool before it and the reference's writes."""
    found = []
    after, cache = x.pool_span(), x.cache
    flushes = torch.zeros(x.N, dtype=torch.bool, device=x.device)
    flushes[flushed] = True
    rows_before, rows_after = checks.slot_rows(x, before), checks.slot_rows(x, after)
    written = (checks.bits(rows_before) != checks.bits(rows_after)).any(dim=1) & ~flushes
    if written.any():
        found.append(f"{int(written.sum())} pool slots written whose ring did not fill (the pool is written only "
                     f"at a flush; e.g. slot {_first(written)})")
    if not torch.equal(checks.bits(checks.padding(x, before)), checks.bits(checks.padding(x, after))):
        found.append("padding between slots was written")
    lengths = cache.length != ref.cache.length
    if lengths.any():
        s = int(torch.nonzero(lengths)[0])
        found.append(f"cache.length differs from the reference's at {int(lengths.sum())} slots (e.g. slot {s}: "
                     f"{int(cache.length[s])}, the reference {int(ref.cache.length[s])})")
    kg = (checks.bits(cache.kg) != checks.bits(ref.cache.kg)).any(dim=-1).any(dim=1)  # [N, L]
    if kg.any():
        found.append(f"{int(kg.sum())} cache.kg records differ from the reference's (the step's raw k and a, copied "
                     f"at the records it writes, nothing elsewhere; e.g. slot, record {_first(kg)})")
    return found


def verify_replay(impl: Implementation, inputs: DecodeInputs, steps: int | None = None) -> checks.Verdict:
    """Run ``impl`` on the replay step ``inputs`` for ``steps`` consecutive steps (default
    :func:`~kda_impls.verify_checks.default_steps`: L + 1, every live ring flushing once) on its pool and
    cache, and judge each as the module says. ``err_out`` is the first step's output error,
    ``err_state`` its live slots' effective-state error (within the state dtype's
    :data:`~kda_impls.verify_checks.TOLERANCE`), ``err_steps`` the effective-state error after the last step
    run (within :func:`~kda_impls.verify.steps_tolerance` after every step). The steps stop at the
    first that has a problem. Raises what ``bind`` raises before anything runs."""
    steps = checks.default_steps(inputs) if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    live = inputs.live_rows()
    live_slots = inputs.slots.long()[live]
    tol_state = checks.TOLERANCE[inputs.state.dtype]
    tol_out = max(checks.TOLERANCE[inputs.v.dtype], tol_state)
    gen = torch.Generator(device=inputs.device).manual_seed(int(inputs.slots.numel()) + 12345)
    # the pool's own rounding to nearest, then any other a kernel may store with (the nearer counts)
    refs = [_ReplayReference(inputs)] + [_ReplayReference(inputs, store) for store in checks.stores(inputs)[1:]]
    problems: list[str] = []
    err_out = err_state = err_steps = tol_steps = 0.0
    for step in range(steps):
        x = inputs if step == 0 else _next_step(impl, inputs, gen)
        out = torch.full(x.out_shape, float("nan"), dtype=x.v.dtype, device=x.device)
        launch = impl.bind(x, out)
        before, u_before, ref_u_before = x.pool_span().clone(), x.cache.u.clone(), refs[0].cache.u.clone()
        results = [ref.step(x, live_slots) for ref in refs]
        out = launch()
        sync_records(launch)
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        step_err_out, found = checks.output_problems(x, out, [ref_out for ref_out, _ in results], live, tol_out)
        found += _write_problems(x, before, refs[0], results[0][1])
        found += _record_problems(x, u_before, refs, ref_u_before, tol_out)
        kernel = effective_state(x)[live_slots]
        err_steps = checks.nearest([checks.rel_err(kernel, effective_state(ref.of(x))[live_slots]) for ref in refs])
        tol_steps = checks.steps_tolerance(inputs.state.dtype, step + 1)
        if step == 0:
            err_out, err_state = step_err_out, err_steps
            if not err_state <= tol_state:
                found.append(f"effective state error {err_state:.2e} > {tol_state:.0e}")
        if not err_steps <= tol_steps and not (step == 0 and not err_state <= tol_state):  # said once
            found.append(f"effective state error {err_steps:.2e} > {tol_steps:.1e} after {step + 1} steps, against "
                         f"the reference carried over them and stored as the pool stores")
        if found:
            problems += found if step == 0 else [f"step {step + 1} of {steps}: {p}" for p in found]
            steps = step + 1
            break
    return checks.Verdict(err_out, err_state, tol_out, tol_state, problems, err_steps, tol_steps, steps)
