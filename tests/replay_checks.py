"""What the replay tests share: judging a replay implementation step by step against in-place decode
carried in float64 from the effective states (:func:`run_steps`) and one step against the reference's
``replay_step`` (:func:`step_problems`), and the records an implementation must not read poisoned."""

import dataclasses

import torch

from kda_impls import effective_state, reference, rel_err
from kda_impls.reference import replay_step
from kda_impls.verify import TOLERANCE


def bits(t):
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def tolerance(x):
    return max(TOLERANCE[x.v.dtype], TOLERANCE[x.state.dtype])


def poison_unused_records(x):
    """NaN in every record at or past its slot's length: an implementation that reads one is caught."""
    unused = torch.arange(x.cache.L, device=x.device)[None, :] >= x.cache.length[:, None]
    x.cache.u[unused[:, None, :].expand(-1, x.HV, -1)] = float("nan")
    x.cache.kg[unused[:, None, :].expand(-1, x.HV, -1)] = float("nan")


def in_place(x, pool):
    """The step as in-place decode on a float64 pool holding the effective states (one slot per row)."""
    return dataclasses.replace(x, state=pool, cache=None, num_accepted=None)


def fresh(x, gen):
    def draw(t):
        return torch.randn(t.shape, generator=gen).to(device=t.device, dtype=t.dtype)

    return dataclasses.replace(x, q=draw(x.q), k=draw(x.k), v=draw(x.v), a=draw(x.a), b=draw(x.b))


def slot_rows(x, span):
    return span.as_strided((x.N, x.slot_elements), (x.slot_stride, 1), span.storage_offset())


def run_steps(impl, x, steps, seed=0):
    """``steps`` one-token replay steps of ``impl`` on ``x`` (modified) against in-place decode carried
    in float64 from the effective states; the problems found (empty: it runs replay right)."""
    tol, L = tolerance(x), x.cache.L
    live = x.live_rows()
    slots = x.slots.long()[live]
    pool = effective_state(x)
    gen = torch.Generator().manual_seed(seed)
    problems = []
    for step in range(steps):
        y = x if step == 0 else fresh(x, gen)
        before, lengths = y.pool_span().clone(), y.cache.length.clone()
        flushing = slots[lengths[slots] + 1 == L]
        out = impl.decode(y, torch.full(y.out_shape, float("nan"), dtype=y.v.dtype, device=y.device))
        want, states = reference(in_place(y, pool))
        pool[slots] = states[live]
        if not rel_err(out[live], want[live]) <= tol or (out[~live] != 0).any():
            problems.append(f"step {step}: output error {rel_err(out[live], want[live]):.1e}")
        # every slot but the flushing ones, and the padding between slots
        kept = torch.ones(before.numel(), dtype=torch.bool, device=x.device)
        for s in flushing.tolist():
            kept[s * x.slot_stride:s * x.slot_stride + x.slot_elements] = False
        if not torch.equal(bits(before[kept]), bits(y.pool_span()[kept])):
            problems.append(f"step {step}: the pool was written where no ring filled")
        if len(flushing) and not rel_err(x.state[flushing], pool[flushing]) <= tol:
            problems.append(f"step {step}: a flushed slot holds error {rel_err(x.state[flushing], pool[flushing]):.1e}")
        expected = lengths.clone()
        expected[slots] = (lengths[slots] + 1) % L
        if not torch.equal(y.cache.length, expected):
            problems.append(f"step {step}: lengths {y.cache.length.tolist()}, expected {expected.tolist()}")
    err = rel_err(effective_state(x)[slots], pool[slots])
    if not err <= tol:
        problems.append(f"effective state error {err:.1e} after {steps} steps")
    return problems


def step_problems(impl, x, tol):
    """One replay step of ``impl`` on ``x`` (modified) against the reference's ``replay_step`` from the same
    state, in float64: the outputs, every record it writes (the key/gate copies and the lengths exactly, the
    deltas within ``tol``), every other record, length and pool byte unchanged, a flushed slot within tol."""
    want = x.clone()
    before = x.clone()
    want_out, _ = replay_step(want, torch.float64)
    poisoned = torch.full(x.out_shape, float("nan"), dtype=x.v.dtype, device=x.device)
    out = impl.decode(x, poisoned).reshape(want_out.shape)
    live, problems = x.live_rows(), []
    if not rel_err(out[live], want_out[live]) <= tol or (out[~live] != 0).any():
        problems.append(f"output error {rel_err(out[live], want_out[live]):.1e}")
    if not torch.equal(x.cache.length, want.cache.length):
        problems.append(f"lengths {x.cache.length.tolist()}, expected {want.cache.length.tolist()}")
    if not torch.equal(bits(x.cache.kg), bits(want.cache.kg)):
        problems.append("key/gate records differ from the step's k and a where written, or were written elsewhere")
    written = bits(want.cache.u) != bits(before.cache.u)
    if not torch.equal(bits(x.cache.u)[~written], bits(before.cache.u)[~written]):
        problems.append("a delta record was written where the step writes none")
    if not rel_err(x.cache.u[written], want.cache.u[written]) <= tol:
        problems.append(f"delta records error {rel_err(x.cache.u[written], want.cache.u[written]):.1e}")
    flushed = [s for s in range(x.N) if not torch.equal(bits(want.state[s]), bits(before.state[s]))]
    kept = torch.ones(x.N, dtype=torch.bool, device=x.device)
    kept[flushed] = False
    if not torch.equal(bits(slot_rows(x, x.pool_span())[kept]), bits(slot_rows(x, before.pool_span())[kept])):
        problems.append("the pool was written where no slot flushes")
    if flushed and not rel_err(x.state[flushed], want.state[flushed]) <= tol:
        problems.append(f"a flushed slot holds error {rel_err(x.state[flushed], want.state[flushed]):.1e}")
    return problems, flushed
