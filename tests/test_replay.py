"""Replay (``DecodeInputs(cache=ReplayCache)``): a slot's state is its checkpoint plus cached per-token records.

Judged against in-place decode, an independent path: the float64 in-place reference carried from the
slots' effective states. The effective state is checked against the recurrence applied record by
record; one replay step against one in-place step; 3L one-token steps from random ring lengths (each
slot flushing at its own step) against 3L in-place steps, outputs every step, the pool bit for bit
except at a flush, the effective state at the end; a speculative verify and its commit, every edge of
the ring. Planted implementations prove the checks: one that drifts 0.5% per step, one that loses the
state at a flush, one that writes the pool every step (right outputs, wrong writes).
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import assert_launch_allocates_nothing
from kda_impls import effective_state, get, make_inputs, reference, rel_err
from kda_impls.impls.naive import NaiveTorch
from kda_impls.impls.triton import replay as triton_replay
from kda_impls.reference import l2_normalize, log_decay, replay_step
from replay_checks import bits, fresh, in_place, poison_unused_records, run_steps, slot_rows, step_problems, tolerance

CASES = {
    "gva-padded-pool-pad-row-bf16": dict(B=4, H=1, HV=2, K=16, V=16, slot_pad=7, pad_rows=1),
    "k>v-fp32": dict(B=3, H=2, HV=2, K=16, V=8, state_dtype=torch.float32, dtype=torch.float32),
    "k<v-gva-fp32": dict(B=3, H=1, HV=4, K=8, V=16, state_dtype=torch.float32, dtype=torch.float32, pad_rows=1),
}


# ---- the effective state ------------------------------------------------------------------------
def test_effective_state_is_the_recurrence_applied_record_by_record():
    x = make_inputs(3, 1, 2, 16, 8, ring=5, slot_pad=3, seed=1)
    x.cache.length[0] = 0  # a slot whose state is its checkpoint
    poison_unused_records(x)
    want = x.state.double().clone()
    K = x.K
    for s in range(x.N):
        for j in range(int(x.cache.length[s])):
            k = l2_normalize(x.cache.kg[s, :, j, :K].double())  # [HV, K]
            g = log_decay(x, x.cache.kg[s:s + 1, :, j, K:], torch.float64)[0]
            want[s] = want[s] * torch.exp(g)[:, None, :] + x.cache.u[s, :, j].double()[:, :, None] * k[:, None, :]
    got = effective_state(x)
    assert got.dtype == torch.float64 and got.shape == (x.N, x.HV, x.V, x.K)
    assert (x.cache.length == 0).any() and (x.cache.length > 1).any()  # both kinds of slot
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


# ---- one step -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_one_replay_step_is_one_in_place_step_from_the_effective_state(case):
    """The float64 reference: outputs and new states as in-place decode's from the effective state;
    naive within tolerance of them, its new effective state too; -1 rows output zeros."""
    x = make_inputs(**CASES[case], ring=4, seed=2)
    poison_unused_records(x)
    E = effective_state(x)
    want_out, want_state = reference(in_place(x, E.clone()))
    out, states = reference(x)
    live = x.live_rows()
    assert torch.allclose(out, want_out, rtol=1e-12, atol=1e-12)
    assert torch.allclose(states, want_state, rtol=1e-12, atol=1e-12)
    y = x.clone()
    got = get("naive").decode(y, torch.full(x.out_shape, float("nan"), dtype=x.v.dtype, device=x.device))
    assert rel_err(got[live], want_out[live]) <= tolerance(x) and (got[~live] == 0).all()
    slots = x.slots.long()[live]
    assert rel_err(effective_state(y)[slots], want_state[live]) <= tolerance(x)


# ---- 3L steps -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_3L_replay_steps_are_3L_in_place_steps(case):
    x = make_inputs(**CASES[case], ring=4, seed=3)
    live = x.slots.long()[x.live_rows()]
    x.cache.length[live] = torch.arange(len(live), dtype=torch.int32) % x.cache.L  # each flushes at its own step
    poison_unused_records(x)
    assert run_steps(get("naive"), x, 3 * x.cache.L) == []


TRITON_CASES = {
    "gva-padded-pool-pad-row-bf16": CASES["gva-padded-pool-pad-row-bf16"],
    "two-v-tiles-gva-fp32": dict(B=2, H=1, HV=2, K=16, V=64, state_dtype=torch.float32, dtype=torch.float32,
                                 slot_pad=4, pad_rows=1),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", TRITON_CASES, ids=list(TRITON_CASES))
def test_3L_triton_replay_steps_are_3L_in_place_steps(case):
    """Our kernel's replay path (interpreted on the CPU): the output from the checkpoint and the
    records, the pool written only at a flush; V = 64 in four tiles of the default 16 rows."""
    x = make_inputs(**TRITON_CASES[case], ring=4, seed=3)
    live = x.slots.long()[x.live_rows()]
    x.cache.length[live] = torch.arange(len(live), dtype=torch.int32) % x.cache.L
    poison_unused_records(x)
    assert get("triton").unsupported(x) is None
    assert run_steps(get("triton"), x, 3 * x.cache.L) == []


@pytest.mark.parametrize("T, kernels", [(1, ["_token_terms_kernel", "_token_step_kernel", "_advance_lengths"]),
                                         (4, ["_flush_first_kernel", "_verify_kernel", "_advance_lengths"])])
def test_the_replay_launches_compile_for_sm90(T, kernels):
    """A replay step's launches as the launcher binds them (replay_launches), compiled for sm_90a at a
    serving shape and the default tiles by ``scripts.tuning.triton_registers --replay`` (Triton's own
    ptxas, no GPU needed): the interpreter accepts what the compiler refuses (a plain global read inside
    a kernel, a loop variable changing shape). A one-token step's launches spill nothing, and its terms
    walk is pipelined (its records' loads issued ahead as asynchronous copies; a plain loop has none), the
    step launch's flush walk not (pipelined, it costs the launch registers)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", triton_replay.REPLAY_CONFIG_ENV)}
    done = subprocess.run([sys.executable, "-m", "scripts.tuning.triton_registers", "--replay", "default", "--T",
                           str(T), "--B", "16", "--state-dtypes", "bfloat16"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    if done.returncode == 2 and "no ptxas here" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("bfloat16")]
    assert [row[2] for row in rows] == kernels, done.stdout
    assert all(int(row[3]) > 0 for row in rows), done.stdout
    assert T > 1 or all(int(row[4]) == 0 for row in rows), done.stdout
    if T == 1 and rows[0][-1] != "None":  # cuobjdump is there: column 17 counts LDGSTS
        assert int(rows[0][17]) > 0 and int(rows[1][17]) == 0, done.stdout


@pytest.mark.interpreter
def test_triton_replay_tile_from_the_environment(monkeypatch):
    from kda_impls.impls.triton.replay import REPLAY_CONFIG_ENV, replay_tile

    assert replay_tile(128, 1) == dict(BV=16, num_warps=1, terms_warps=1)
    assert replay_tile(128, 4) == dict(BV=64, num_warps=2, terms_warps=1)
    monkeypatch.setenv(REPLAY_CONFIG_ENV, "BV=32, num_warps=4,terms_warps=2")
    assert replay_tile(64, 1) == replay_tile(64, 3) == dict(BV=32, num_warps=4, terms_warps=2)
    x = make_inputs(**TRITON_CASES["two-v-tiles-gva-fp32"], ring=2, seed=5)
    assert run_steps(get("triton"), x, 2) == []
    for bad in ("BV=24", "BV=128", "warps=4", "num_warps=3", "terms_warps=32"):
        monkeypatch.setenv(REPLAY_CONFIG_ENV, bad)
        with pytest.raises(ValueError, match=REPLAY_CONFIG_ENV):
            get("triton").bind(x)


def verify_commit_steps(x, gen):
    """A verify from the ring's edges (L = 4, T = 3: slot 3 has 0 records, slot 0 2 so its records flush
    first, slot 5 1 so they fit exactly, a -1 row), then a verify committing the first one's accepted records
    (slots 3 and 5 flush first, slot 0 fits), then a one-token step committing the second's (slot 3 fills
    the ring and flushes after, slot 0 flushes first, slot 5 neither): each step and which slots flush."""
    x.slots = torch.tensor([3, 0, 5, -1], dtype=torch.int32)
    x.cache.length.copy_(torch.tensor([2, 3, 1, 0, 3, 1, 0, 2], dtype=torch.int32))
    poison_unused_records(x)
    yield x, [0]
    yield dataclasses.replace(fresh(x, gen), num_accepted=torch.tensor([3, 1, 2, 0], dtype=torch.int32)), [3, 5]
    yield dataclasses.replace(fresh(x.token(0), gen), num_accepted=torch.tensor([3, 3, 1, 0], dtype=torch.int32)), \
        [0, 3]


def commit_sequence_problems(impl, x):
    """:func:`verify_commit_steps` run by ``impl``, each step against the reference from the same state, and
    the effective states at the end against the sequence carried by the reference in float64."""
    tol, gen = tolerance(x), torch.Generator().manual_seed(7)
    carried = dataclasses.replace(x.clone(), state=x.state.double())
    problems = []
    for i, (step, flushes) in enumerate(verify_commit_steps(x, gen)):
        if i == 0:
            carried.slots, carried.cache = x.slots.clone(), x.cache.clone()
        assert impl.unsupported(step) is None, impl.unsupported(step)
        found, flushed = step_problems(impl, step, tol)
        problems += [f"step {i}: {p}" for p in found]
        assert flushed == flushes, (i, flushed)  # the sequence meets the edges it is meant to
        replay_step(dataclasses.replace(step, state=carried.state, cache=carried.cache), torch.float64)
    live = x.slots.long()[x.live_rows()]
    err = rel_err(effective_state(x)[live], effective_state(carried)[live])
    if not err <= tol:
        problems.append(f"effective state error {err:.1e} after the sequence")
    return problems


COMMIT_CASES = {
    "gva-padded-pool-bf16": dict(H=1, HV=2, K=32, V=16, slot_pad=5),
    "k<v-two-v-tiles-gva-fp32": dict(H=1, HV=2, K=16, V=32, state_dtype=torch.float32, dtype=torch.float32),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", COMMIT_CASES, ids=list(COMMIT_CASES))
def test_triton_verify_and_commit_sequence_is_the_reference(case, monkeypatch):
    """Our kernels (interpreted on the CPU) through a verify, a verify with a commit and a one-token step
    with a commit, at every edge of the ring: equal to the reference step by step, nothing else written.
    Two V-tiles: a step that wrote the new key/gate records before every V-tile of the row had read the
    committed ones (a flush first in one launch) would be caught, as the interpreter runs them in order."""
    monkeypatch.setenv(triton_replay.REPLAY_CONFIG_ENV, "BV=16")  # V = 32 in two tiles (a verify's default takes one)
    x = make_inputs(4, T=3, ring=4, seed=4, **COMMIT_CASES[case])
    assert commit_sequence_problems(get("triton"), x) == []


class IgnoresTheCommit(NaiveTorch):
    """Planted: num_accepted dropped (the verify's records never become part of the state)."""

    name = "ignores-the-commit"

    def _replay_launcher(self, inputs, out):
        return super()._replay_launcher(dataclasses.replace(inputs, num_accepted=None), out)


class RoundsTheDeltas(NaiveTorch):
    """Planted: the delta records it writes rounded to bf16 (the error each later read of the state repeats)."""

    name = "rounds-the-deltas"

    def _replay_launcher(self, inputs, out):
        launch = super()._replay_launcher(inputs, out)
        u = inputs.cache.u

        def rounding():
            before = u.clone()
            launch()
            written = bits(u) != bits(before)
            u[written] = u[written].to(torch.bfloat16).float()
            return out
        return rounding


@pytest.mark.parametrize("plant, found", [(IgnoresTheCommit, "step 1: output error"),
                                          (RoundsTheDeltas, "step 0: delta records error")], ids=["commit", "rounds"])
def test_the_commit_sequence_check_catches(plant, found):
    x = make_inputs(4, T=3, ring=4, seed=4, **COMMIT_CASES["k<v-two-v-tiles-gva-fp32"])
    problems = commit_sequence_problems(plant(), x)
    assert any(found in p for p in problems), problems


class Drifts(NaiveTorch):
    """Planted: each record's delta 0.5% too large."""

    name = "drifts"

    def _replay_launcher(self, inputs, out):
        launch = super()._replay_launcher(inputs, out)
        cache, L = inputs.cache, inputs.cache.L

        def drifting():
            before = cache.length.clone()
            launch()
            rows = inputs.slots.long()[inputs.slots >= 0]
            cache.u[rows, :, (before[rows].long()) % L] *= 1.005
            return out
        return drifting


class LosesTheStateAtAFlush(NaiveTorch):
    """Planted: a full ring is emptied without the checkpoint written."""

    name = "loses-the-state"

    def _replay_launcher(self, inputs, out):
        launch = super()._replay_launcher(inputs, out)

        def losing():
            before = inputs.pool_span().clone()
            launch()
            inputs.pool_span().copy_(before)
            return out
        return losing


class FlushesEveryStep(NaiveTorch):
    """Planted: the effective state written into the pool after every step, the ring emptied: the same
    outputs and states, but the pool written at every step."""

    name = "flushes-every-step"

    def _replay_launcher(self, inputs, out):
        launch = super()._replay_launcher(inputs, out)
        rows = inputs.slots.long()[inputs.slots >= 0]

        def flushing():
            launch()
            inputs.state[rows] = effective_state(inputs)[rows].to(inputs.state.dtype)
            inputs.cache.length[rows] = 0
            return out
        return flushing


@pytest.mark.parametrize("plant, found", [(Drifts, "output error"), (LosesTheStateAtAFlush, "flushed slot holds error"),
                                          (FlushesEveryStep, "pool was written")], ids=["drift", "loses", "writes"])
def test_the_3L_steps_check_catches(plant, found):
    x = make_inputs(**CASES["k>v-fp32"], ring=4, seed=3)
    problems = run_steps(plant(), x, 3 * x.cache.L)
    assert any(found in p for p in problems), problems


# ---- speculative verify and its commit ----------------------------------------------------------
def test_verify_then_commit_across_every_edge_of_the_ring():
    """L = 4, T = 3, one row per edge: records fit (0 cached); a flush first (2 cached: 2 + 3 > 4); they
    fit exactly (1 cached) and the commit then fills the ring, so the next step flushes first; and a
    padding row. The verify outputs the in-place tokens from the effective state and commits nothing;
    after the next step's commit of ``num_accepted`` and one token, every slot's effective state is the
    in-place state after its accepted tokens and that token."""
    x = make_inputs(4, 1, 2, 16, 8, T=3, ring=4, state_dtype=torch.float32, dtype=torch.float32, slot_pad=5,
                    seed=4)
    x.slots = torch.tensor([3, 0, 5, -1], dtype=torch.int32)
    x.cache.length.copy_(torch.tensor([2, 3, 1, 0, 3, 1, 0, 2], dtype=torch.int32))
    poison_unused_records(x)
    E = effective_state(x)
    assert reference(x)[0].shape == x.out_shape  # the verify's T outputs, in its own spelling
    pool_before, records_before = x.pool_span().clone(), x.cache.clone()
    want, chain = reference(dataclasses.replace(in_place(x, E.clone()), update_state=False))  # frozen from E
    out = get("naive").decode(x, torch.full(x.out_shape, float("nan")))
    live = x.live_rows()
    assert rel_err(out[live], want[live]) <= 1e-5 and (out[~live] == 0).all()
    # only slot 0 flushed (2 + 3 > 4): its checkpoint is its effective state, its ring restarted
    assert torch.equal(x.cache.length, torch.tensor([0, 3, 1, 0, 3, 1, 0, 2], dtype=torch.int32))
    untouched = torch.tensor([s != 0 for s in range(x.N)])
    assert torch.equal(bits(slot_rows(x, x.pool_span())[untouched]), bits(slot_rows(x, pool_before)[untouched]))
    assert rel_err(x.state[0], E[0]) <= 1e-6
    starts = {3: 0, 0: 0, 5: 1}
    for s in range(x.N):
        kept = [j for j in range(4) if not (s in starts and starts[s] <= j < starts[s] + 3)]
        assert torch.equal(bits(x.cache.u[s, :, kept]), bits(records_before.u[s, :, kept])), s
        assert torch.equal(bits(x.cache.kg[s, :, kept]), bits(records_before.kg[s, :, kept])), s
    for i, s in enumerate(x.slots.tolist()[:3]):
        k = x.k[i].repeat_interleave(2, dim=1).transpose(0, 1)  # [HV, T, K]
        assert torch.equal(x.cache.kg[s, :, starts[s]:starts[s] + 3, :16], k)
        assert torch.equal(x.cache.kg[s, :, starts[s]:starts[s] + 3, 16:], x.a[i].transpose(0, 1))

    accepted = torch.tensor([3, 1, 3, 2], dtype=torch.int32)
    gen = torch.Generator().manual_seed(5)
    step = dataclasses.replace(fresh(x.token(0), gen), num_accepted=accepted)
    get("naive").check(step)
    start = torch.stack([chain[i, int(accepted[i]) - 1] for i in range(x.B)])
    # in place from each row's state after its accepted tokens, one row per slot
    want1, after = reference(dataclasses.replace(in_place(step, start), slots=torch.arange(4, dtype=torch.int32)))
    out1 = get("naive").decode(step, torch.full(step.out_shape, float("nan")))
    assert rel_err(out1[live], want1[live]) <= 1e-5 and (out1[~live] == 0).all()
    # slot 3: 0 + 3 + 1 = 4 fills the ring (flush after); slot 0: 0 + 1 + 1; slot 5: 1 + 3 = 4 flushes first
    assert x.cache.length[[3, 0, 5]].tolist() == [0, 2, 1]
    E1 = effective_state(x)
    for i, s in enumerate(x.slots.tolist()[:3]):
        assert rel_err(E1[s], after[i]) <= 1e-5, s


# ---- on the GPU (the H200 grid) -------------------------------------------------------------------
gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("HV", [32, 64])
def test_triton_replay_on_gpu(HV, state_dtype):
    """Serving shapes (GVA, padded pool, -1 rows, L = 16): 2L steps against in-place decode."""
    x = make_inputs(32, 16, HV, 128, 128, ring=16, state_dtype=state_dtype, slot_pad=64, pad_rows=4, device="cuda",
                    seed=31)
    poison_unused_records(x)
    assert run_steps(get("triton"), x, 2 * x.cache.L) == []


@gpu
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_triton_verify_and_commit_on_gpu(state_dtype):
    """Serving shapes (GVA, padded pool, -1 rows, L = 16, T = 4): a verify, two verifies committing a random
    0..T of the last one's records, a one-token step committing them, each against the reference."""
    x = make_inputs(32, 16, 32, 128, 128, T=4, ring=16, state_dtype=state_dtype, slot_pad=64, pad_rows=4,
                    device="cuda", seed=33)
    poison_unused_records(x)
    gen = torch.Generator().manual_seed(34)
    steps = [x] + [fresh(x, gen) for _ in range(2)] + [fresh(x.token(0), gen)]
    problems, flushed = [], set()
    for i, step in enumerate(steps):
        if i:
            accepted = torch.randint(0, x.T + 1, (x.B,), generator=gen, dtype=torch.int32)
            step = dataclasses.replace(step, num_accepted=accepted.to(x.device))
        found, slots = step_problems(get("triton"), step, tolerance(x))
        problems += [f"step {i}: {p}" for p in found]
        flushed |= set(slots)
    assert problems == [] and flushed


@gpu
def test_triton_replay_graph_replay_and_no_allocation():
    """Captured in a CUDA graph (as the harness times it) the replay launcher takes the eager step: its
    output, every byte of the pool span and the whole cache; a launch allocates nothing."""
    x = make_inputs(64, 32, 32, 128, 128, ring=16, slot_pad=16, pad_rows=8, device="cuda", seed=32)
    y = x.clone()
    eager = get("triton").decode(x)
    launch = get("triton").bind(y)
    pool, records = y.pool_span().clone(), y.cache.clone()

    def restore():
        y.pool_span().copy_(pool)
        for name, t in y.cache.tensors().items():
            t.copy_(records.tensors()[name])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()
    torch.cuda.current_stream().wait_stream(stream)
    restore()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = launch()
    restore()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.equal(bits(y.pool_span()), bits(x.pool_span()))
    for name, t in y.cache.tensors().items():
        assert torch.equal(t, x.cache.tensors()[name]), name
    assert_launch_allocates_nothing("triton", y)
