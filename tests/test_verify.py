"""Each check of kda_impls.verify against an implementation with exactly that bug planted.

A planted bug runs the correct (naive) decode, then breaks one thing: each test fails if the check
that should catch it is removed, inverted or made NaN-blind. The bugs that only consecutive steps
show are the implementations of tests/planted/, registered as a user's are.
"""

import importlib
import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from planted import extra_impls

from kda_impls import effective_state, get, make_inputs, reference, rel_err, verify
from kda_impls.bench.case import run_case
from kda_impls.bench.config import Config
from kda_impls.impls.naive import NaiveTorch
from kda_impls.verify_checks import (
    CPU_STEP_ELEMENTS,
    GPU_STEP_ELEMENTS,
    MIN_CPU_STEPS,
    MIN_GPU_STEPS,
    TOLERANCE,
    default_steps,
    nearest,
    output_problems,
    steps_tolerance,
    stores,
)


class Planted(NaiveTorch):
    """The naive decode followed by ``after(inputs, out, live)``, which plants one bug."""

    name = "planted"

    def __init__(self, after):
        self.after = after

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        live = inputs.slots >= 0

        def run():
            launch()
            self.after(inputs, out, live)
            return out

        return run


def first_live_slot(inputs, live):
    return int(inputs.slots[live][0])


def nan_in_state(inputs, out, live):
    inputs.state[first_live_slot(inputs, live), 0, 0, 0] = float("nan")


def state_off(inputs, out, live):
    inputs.state[first_live_slot(inputs, live)] *= 1.5


def output_off(inputs, out, live):
    out[live] *= 1.5


def nonzero_padding_rows(inputs, out, live):
    out[~live] = 1.0


def padding_rows_unwritten(inputs, out, live):
    out[~live] = float("nan")  # as verify's poison left them: the rows a kernel never stored


def case(**kw):
    return make_inputs(**{**dict(B=4, H=2, HV=4, K=16, V=16, slot_pad=8, pad_rows=1, seed=31), **kw})


@pytest.mark.parametrize("bug, problem", [
    (nan_in_state, r"^state error nan > 1e-02$"),  # NaN state is not <= tol: `err > tol` lets it pass
    (state_off, r"^state error .* > 1e-02$"),
    (output_off, r"^output error .* > 1e-02$"),
    (nonzero_padding_rows, r"^rows with slot -1 must output zeros \(padding rows: the slot they start from is -1\)$"),
    (padding_rows_unwritten, r"^\d+ output elements NaN \(unwritten or invalid\)$"),
])
def test_each_check_catches_its_bug(bug, problem):
    verdict = verify(Planted(bug), case())
    assert not verdict.ok, verdict
    assert any(re.search(problem, p) for p in verdict.problems), verdict.problems
    assert str(verdict).endswith(": " + "; ".join(verdict.problems))


def test_nan_in_a_live_output_row_is_an_output_error_too():
    """Each check stands on its own: the output error is NaN-safe even without the NaN count."""
    def nan_in_output(inputs, out, live):
        out[torch.nonzero(live)[0, 0], 0, 0] = float("nan")

    verdict = verify(Planted(nan_in_output), case())
    assert verdict.problems[0] == "1 output elements NaN (unwritten or invalid)", verdict.problems
    assert "output error nan > 1e-02" in verdict.problems, verdict.problems


def test_a_bug_in_the_state_alone_is_not_reported_as_an_output_error():
    """State and output are judged separately: a state written wrong after the output was computed."""
    verdict = verify(Planted(state_off), case())
    assert not any(p.startswith("output error") for p in verdict.problems), verdict.problems
    assert verdict.err_state > verdict.tol_state and verdict.err_out <= verdict.tol_out


def test_the_output_is_poisoned_before_the_run():
    """A kernel that never stores the -1 rows is caught only because verify fills the output with
    NaN first: in a zero-filled buffer those rows would look right."""
    class WritesLiveRowsOnly(NaiveTorch):
        name = "live-rows-only"

        def _launcher(self, inputs, out):
            scratch = torch.empty_like(out)
            launch = super()._launcher(inputs, scratch)
            live = inputs.slots >= 0

            def run():
                launch()
                out[live] = scratch[live]
                return out

            return run

    verdict = verify(WritesLiveRowsOnly(), case(pad_rows=2))
    assert any("output elements NaN" in p for p in verdict.problems), verdict.problems


def test_a_correct_run_passes_with_its_errors_recorded():
    verdict = verify(Planted(lambda *_: None), case())
    assert verdict.ok and verdict.problems == [], verdict
    assert 0 < verdict.err_out <= verdict.tol_out and 0 < verdict.err_state <= verdict.tol_state
    assert verdict.steps == default_steps(case()) == 2 and 0 <= verdict.err_steps <= verdict.tol_steps
    assert str(verdict) == (f"err_out={verdict.err_out:.2e} (tol 1e-02) err_state={verdict.err_state:.2e} (tol 1e-02) "
                            f"err_steps={verdict.err_steps:.2e} (tol 5.5e-03, 2 steps)")


def test_the_launcher_gets_a_nan_filled_output_buffer():
    """verify hands bind its own NaN-filled buffer: an output row a kernel forgets stays NaN."""
    seen = []

    class RecordsOut(NaiveTorch):
        name = "records-out"

        def _launcher(self, inputs, out):
            seen.append(out.clone())
            return super()._launcher(inputs, out)

    x = case()
    assert verify(RecordsOut(), x).ok
    assert seen[0].shape == (x.B, x.HV, x.V) and seen[0].dtype == x.v.dtype and torch.isnan(seen[0]).all()


@pytest.mark.parametrize("n_slots, slot_pad, gap", [
    (2, 4, 0),  # the only gap of a two-slot pool
    (5, 1, 0),  # one element of padding
    (5, 3, 3),  # the last gap, between slots N-2 and N-1
])
def test_every_gap_between_slots_is_checked(n_slots, slot_pad, gap):
    def writes_padding(inputs, out, live):
        inputs.pool_span()[gap * inputs.slot_stride + inputs.slot_elements + slot_pad - 1] += 1.0

    x = case(B=2, n_slots=n_slots, slot_pad=slot_pad, pad_rows=0)
    verdict = verify(Planted(writes_padding), x)
    assert verdict.problems == ["padding between slots was written"], verdict


def test_an_empty_batch_on_an_empty_padded_pool():
    x = make_inputs(0, 1, 2, 16, 16, n_slots=0, slot_pad=4)
    verdict = verify(Planted(lambda *_: None), x)
    assert verdict.ok, verdict


@pytest.mark.parametrize("dtype, state_dtype, tol_out, tol_state", [
    (torch.bfloat16, torch.float32, 1e-2, 1e-5),  # the output is stored in bf16: its rounding governs
    (torch.float32, torch.bfloat16, 1e-2, 1e-2),  # the output comes from a bf16 state: the coarser
    (torch.float32, torch.float32, 1e-5, 1e-5),
    (torch.float16, torch.float32, 2e-3, 1e-5),
])
def test_tolerances(dtype, state_dtype, tol_out, tol_state):
    verdict = verify(Planted(lambda *_: None), case(dtype=dtype, state_dtype=state_dtype))
    assert (verdict.tol_out, verdict.tol_state) == (tol_out, tol_state)
    assert verdict.ok, verdict


def test_fp32_tolerance_is_tight():
    """An fp32 kernel 1e-4 off would pass a bf16 tolerance; on fp32 everything it must not."""
    def slightly_off(inputs, out, live):
        out[live] *= 1 + 1e-4
        inputs.state[inputs.slots[live].long()] *= 1 + 1e-4

    verdict = verify(Planted(slightly_off), case(dtype=torch.float32, state_dtype=torch.float32))
    assert verdict.err_out == pytest.approx(1e-4, rel=0.05) and verdict.err_state == pytest.approx(1e-4, rel=0.05)
    assert [p.split(" ")[0] for p in verdict.problems] == ["output", "state"], verdict.problems
    assert TOLERANCE == {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def test_rel_err():
    ref = torch.tensor([3.0, 4.0])
    assert rel_err(torch.tensor([3.0, 5.0]), ref) == pytest.approx(1 / 5)
    assert rel_err(torch.tensor([3.0, 4.0], dtype=torch.bfloat16), ref) == 0.0
    assert rel_err(torch.tensor([0.3, 0.5]), torch.tensor([0.3, 0.4])) == pytest.approx(0.2)  # ||ref|| < 1: relative
    assert rel_err(torch.tensor([0.0, 2.0]), torch.zeros(2)) == 2.0  # an all-zero reference: absolute
    assert math.isnan(rel_err(torch.tensor([float("nan"), 4.0]), ref))


# ---- consecutive steps: the planted implementations of tests/planted/ -----------------------------------

@pytest.fixture
def planted(monkeypatch):
    """get() of the planted implementations, registered through $KDA_EXTRA_IMPLS as a user's are."""
    monkeypatch.setenv("KDA_EXTRA_IMPLS", extra_impls())
    return get


def tiny(**kw):
    return make_inputs(**{**dict(B=4, H=2, HV=2, K=16, V=16, slot_pad=8, pad_rows=1, seed=5), **kw})


def test_a_state_half_a_percent_too_large_per_step_passes_one_step_and_fails_the_steps(planted):
    """The bug the one-step check let through: within its bf16 tolerance (1e-2) after one step, caught
    by the steps on the same pool against the reference that rounds the state as the pool does."""
    one = verify(planted("planted-drift"), tiny(), steps=1)
    assert one.err_state < 1e-2 and one.err_out < 1e-2  # what the one-step check judged alone: ok
    verdict = verify(planted("planted-drift"), tiny())
    assert not verdict.ok and verdict.steps <= default_steps(tiny())
    assert any(re.fullmatch(r"(step \d+ of \d+: )?state error .* > .* after \d+ steps, against the reference "
                            r"carried over them and stored as the pool stores", p) for p in verdict.problems), verdict
    assert verdict.steps == 1 and verdict.err_steps > 2.0**-8  # at once: 0.5% is over one bf16 unit roundoff


def test_an_error_too_small_for_one_step_is_caught_as_it_compounds():
    """0.2% per step is under the bound after one step; an error of one sign grows with the steps,
    rounding noise only with their square root, so the steps catch it."""
    from planted.drift import Drift

    class SmallDrift(Drift):
        factor = 1.002

    assert verify(SmallDrift(), tiny(), steps=1).ok
    verdict = verify(SmallDrift(), tiny(), steps=16)
    assert not verdict.ok and 1 < verdict.steps <= 16, verdict
    assert verdict.problems[0].startswith(f"step {verdict.steps} of 16: state error"), verdict
    assert f" after {verdict.steps} steps, " in verdict.problems[0], verdict


@pytest.mark.parametrize("kw", [dict(), dict(T=2), dict(B=8, HV=4, K=32, V=32)])
def test_the_drift_is_wrong_in_every_bf16_row_of_the_sweep_check(planted, kw):
    """Through the case runner, as a sweep checks a row: wrong, the reason naming the steps."""
    cfg = Config("planted-drift", **{**dict(B=4, H=2, HV=2, K=16, V=16), **kw}, pad_rows=1, slot_pad=8)
    row = run_case(cfg, "cpu")
    assert row["status"] == "wrong" and "against the reference carried over them" in row["reason"], row
    assert row["err_state"] < 1e-2  # the one-step column alone would have said ok


def test_a_decay_forgotten_on_one_channel_is_wrong(planted):
    verdict = verify(planted("planted-decay"), tiny())
    assert not verdict.ok and any("state error" in p for p in verdict.problems), verdict


@pytest.mark.parametrize("name, kw", [
    ("naive", dict()), ("planted-correct", dict()), ("planted-slower", dict()),
    ("planted-correct", dict(T=3, checkpoints="last")),
    ("planted-correct", dict(state_dtype=torch.float32)), ("planted-correct", dict(state_dtype=torch.float16)),
    ("triton", dict()), ("triton", dict(T=2)), ("triton", dict(state_dtype=torch.float32)),
    ("fla", dict()), ("fla", dict(T=2)),
])
def test_correct_implementations_pass_every_step(planted, name, kw):
    """Every implementation that runs on the CPU (the Triton ones interpreted), over its default steps."""
    x = tiny(**kw)
    impl = planted(name)
    if impl.unsupported(x):
        pytest.skip(impl.unsupported(x))
    verdict = verify(impl, x)
    assert verdict.ok and verdict.steps == default_steps(x) >= MIN_CPU_STEPS, verdict


def test_the_step_count_follows_the_shape_on_the_cpu():
    assert default_steps(tiny()) == CPU_STEP_ELEMENTS // (4 * 2 * 16 * 16) == 4
    assert default_steps(tiny(B=1, H=1, HV=1)) == 16  # at most 16
    assert default_steps(tiny(B=64, K=64, V=64)) == MIN_CPU_STEPS  # large: the fewest


def test_frozen_verify_runs_one_step_and_a_gpu_step_count_follows_the_gpu_budget():
    assert default_steps(tiny(T=3, update_state=False)) == 1  # nothing stored: no error carries over
    on_gpu = SimpleNamespace(replay=False, update_state=True, device=torch.device("cuda"), B=64, T=1,
                             slot_elements=GPU_STEP_ELEMENTS // (64 * 10))
    assert default_steps(on_gpu) == 10  # the GPU's budget: here between its floor (8) and MAX_STEPS
    on_gpu.B = 6400
    assert default_steps(on_gpu) == MIN_GPU_STEPS


def test_the_steps_tolerance_grows_as_rounding_noise_does():
    assert steps_tolerance(torch.bfloat16, 1) == 2.0**-8 and steps_tolerance(torch.bfloat16, 16) == 2.0**-6
    assert steps_tolerance(torch.float32, 4) == 2e-5


class EveryNthStep(NaiveTorch):
    """The naive decode, with ``bug(inputs, out)`` after its launch on the ``nth`` step only."""

    name = "nth-step"

    def __init__(self, nth, bug):
        self.nth, self.bug, self.calls = nth, bug, 0

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)

        def run():
            self.calls += 1
            if self.calls == self.nth:
                self.bug(inputs, out)
                return out
            return launch()

        return run


def test_the_output_is_poisoned_before_every_step():
    """A launch that leaves the output as it found it is caught on a later step too."""
    verdict = verify(EveryNthStep(3, lambda inputs, out: None), tiny(), steps=4)
    assert verdict.steps == 3 and verdict.problems[0].startswith("step 3 of 4: "), verdict
    assert "output elements NaN" in verdict.problems[0]


def test_a_write_to_an_untouched_slot_on_a_later_step_is_caught():
    def writes_unnamed_slot(inputs, out):
        unnamed = sorted(set(range(inputs.N)) - set(inputs.slots.tolist()))[0]
        inputs.state[unnamed] += 1
        out.zero_()

    verdict = verify(EveryNthStep(2, writes_unnamed_slot), tiny(), steps=4)
    assert any(re.match(r"1 slots not in `slots` were written", p) for p in verdict.problems), verdict


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps must be >= 1; got 0"):
        verify(NaiveTorch(), tiny(), steps=0)


# ---- replay: steps across every ring's flush --------------------------------------------------------------

def ring(**kw):
    """A replay step; seed 5 draws ring lengths 3, 3, 1 for its live rows: flushes at steps 1, 1 and 3."""
    return make_inputs(**{**dict(B=4, H=2, HV=2, K=16, V=16, ring=4, slot_pad=8, pad_rows=1, seed=5), **kw})


@pytest.mark.parametrize("name, kw", [
    ("naive", dict()), ("naive", dict(T=2)), ("naive", dict(T=3, ring=8)),
    ("naive", dict(H=1, HV=4, V=8, state_dtype=torch.float32, dtype=torch.float32)),
    ("planted-correct", dict(state_dtype=torch.float16)),
    ("triton", dict(B=2)), ("triton", dict(B=2, state_dtype=torch.float32)),
])
def test_correct_replay_implementations_pass_steps_across_every_flush(planted, name, kw):
    x = ring(**kw)
    verdict = verify(planted(name), x)
    assert verdict.ok and verdict.steps == default_steps(x) == x.cache.L + 1, verdict


@pytest.mark.parametrize("name, problem", [
    ("planted-noflush", "effective state error"),
    ("planted-record-decay", "output error"),
    ("planted-replay-drift", "effective state error"),
])
@pytest.mark.parametrize("kw", [dict(), dict(T=2), dict(B=2, ring=16, state_dtype=torch.float32)])
def test_each_planted_replay_bug_is_wrong(planted, name, problem, kw):
    verdict = verify(planted(name), ring(**kw))
    assert not verdict.ok and any(problem in p for p in verdict.problems), verdict


def test_a_replay_that_never_flushes_is_caught_at_the_latest_flush(planted):
    """Every ring empty: each fills at step L, the last flush the default steps must reach."""
    x = ring()
    x.cache.length.zero_()
    verdict = verify(planted("planted-noflush"), x)
    assert verdict.steps == x.cache.L and verdict.problems[0].startswith("step 4 of 5: effective state error"), verdict


def test_a_replay_drift_of_half_a_percent_per_step_passes_one_step_and_is_caught_as_it_compounds(planted):
    """From empty rings the drift's first step is within the one-step tolerances (0.5%); each record
    read adds 0.5% to the next step's error, caught within the ring."""
    x = ring()
    x.cache.length.zero_()
    assert verify(planted("planted-replay-drift"), x.clone(), steps=1).ok
    verdict = verify(planted("planted-replay-drift"), x)
    assert verdict.err_out < 1e-2 and verdict.err_state < 1e-2, verdict
    assert 1 < verdict.steps <= x.cache.L and not verdict.ok, verdict


def _live_slot(inputs, live, flushed):
    """A live row's slot whose ring the step just emptied (``flushed``) or did not."""
    lengths = inputs.cache.length[inputs.slots[live].long()]
    return int(inputs.slots[live][(lengths == 0) == flushed][0])


def _unnamed_slot(inputs):
    return sorted(set(range(inputs.N)) - set(inputs.slots.tolist()))[0]


def pool_written_without_flush(inputs, out, live):
    inputs.state[_live_slot(inputs, live, flushed=False), 0, 0, 0] += 1


def untouched_record_written(inputs, out, live):
    inputs.cache.u[_unnamed_slot(inputs), 0, 0, 0] += 1


def record_past_length_written(inputs, out, live):
    s = _live_slot(inputs, live, flushed=False)
    inputs.cache.u[s, 0, int(inputs.cache.length[s]), 0] += 1


def key_record_written(inputs, out, live):
    inputs.cache.kg[_unnamed_slot(inputs), 0, 0, 0] += 1


def ring_never_emptied(inputs, out, live):
    s = _live_slot(inputs, live, flushed=True)
    inputs.cache.length[s] = inputs.cache.L  # the contract refuses it at the next bind: judged before that


def replay_padding_written(inputs, out, live):
    inputs.pool_span()[inputs.slot_elements] += 1


@pytest.mark.parametrize("bug, problem", [
    (pool_written_without_flush, r"^1 pool slots written whose ring did not fill \(the pool is written only at a "
                                 r"flush; e.g. slot \d+\)$"),
    (untouched_record_written, r"^1 cache.u records written that the step does not write"),
    (record_past_length_written, r"^1 cache.u records written that the step does not write"),
    (key_record_written, r"^1 cache.kg records differ from the reference's"),
    (ring_never_emptied, r"^cache.length differs from the reference's at 1 slots \(e.g. slot \d+: 4, the reference "
                         r"0\)$"),
    (replay_padding_written, r"^padding between slots was written$"),
    (nonzero_padding_rows, r"^rows with slot -1 must output zeros"),
])
def test_each_replay_write_check_catches_its_bug(bug, problem):
    verdict = verify(Planted(bug), ring())
    assert not verdict.ok and verdict.steps == 1, verdict
    assert any(re.search(problem, p) for p in verdict.problems), verdict.problems


def test_a_replay_output_is_poisoned_before_every_step():
    verdict = verify(EveryNthStep(3, lambda inputs, out: None), ring())
    assert verdict.steps == 3 and verdict.problems[0].startswith("step 3 of 5: "), verdict
    assert "output elements NaN" in verdict.problems[0]


def test_a_replay_row_through_the_case_runner(planted):
    """As a sweep checks a replay row: the steps run, the drift is wrong, the naive step ok."""
    cfg = Config("planted-replay-drift", B=4, H=2, HV=2, K=16, V=16, mode="replay", ring=4, pad_rows=1, slot_pad=8)
    row = run_case(cfg, "cpu")
    assert row["status"] == "wrong" and "effective state error" in row["reason"], row
    row = run_case(replace(cfg, impl="naive"), "cpu")
    assert row["status"] == "ok" and row["steps"] == 5, row


def test_a_verify_that_commits_nothing_is_caught_on_its_commit_step():
    """At T > 1 the later steps commit a random 0..T of the records the step before left: an
    implementation that ignores num_accepted keeps a state short of the accepted tokens."""
    class CommitsNothing(NaiveTorch):
        name = "commits-nothing"

        def _replay_launcher(self, inputs, out):
            return super()._replay_launcher(replace(inputs, num_accepted=None), out)

    verdict = verify(CommitsNothing(), ring(T=2))
    assert not verdict.ok and verdict.steps > 1, verdict
    assert verdict.problems[0].startswith(f"step {verdict.steps} of 5: "), verdict


def test_a_verify_that_refuses_commits_is_judged_on_verifies_alone():
    """A verify from the checkpoint only (FlashInfer's RecoverSSM call) refuses num_accepted: the later
    steps commit nothing and still run, every one judged."""
    class RefusesCommits(NaiveTorch):
        name = "refuses-commits"
        accepted = []

        def _extra_unsupported(self, inputs):
            return "takes no num_accepted" if inputs.num_accepted is not None else None

        def _replay_launcher(self, inputs, out):
            self.accepted.append(inputs.num_accepted)
            return super()._replay_launcher(inputs, out)

    impl = RefusesCommits()
    x = ring(T=2)
    x.cache.length.zero_()
    verdict = verify(impl, x)
    assert verdict.ok and verdict.steps == 5 and impl.accepted == [None] * 5, verdict


def test_a_verifys_records_are_judged_before_any_commit_reads_them():
    """A verify-only implementation (no commit) whose deltas are 2% off: its outputs and every state are
    right, the records it leaves for a commit are not."""
    class OffRecords(NaiveTorch):
        name = "off-records"

        def _extra_unsupported(self, inputs):
            return "takes no num_accepted" if inputs.num_accepted is not None else None

        def _replay_launcher(self, inputs, out):
            launch = super()._replay_launcher(inputs, out)

            def run():
                launch()
                inputs.cache.u[inputs.slots[inputs.slots >= 0].long(), :, :inputs.T] *= 1.02
                return out

            return run

    x = ring(T=2)
    x.cache.length.zero_()
    verdict = verify(OffRecords(), x)
    assert verdict.steps == 1 and len(verdict.problems) == 1, verdict
    assert re.fullmatch(r"cache.u record error 2.00e-02 > 1e-02 \(the records the step writes\)", verdict.problems[0])


class StaleInput(NaiveTorch):
    """Planted: every step after the first computes with the first step's ``tensor`` (q, k, v, a or b), as
    a kernel reading a stale buffer would."""

    name = "stale-input"

    def __init__(self, tensor):
        self.tensor, self.first = tensor, None

    def _launcher(self, inputs, out):
        if self.first is None:
            self.first = getattr(inputs, self.tensor).clone()
        return super()._launcher(replace(inputs, **{self.tensor: self.first}), out)


@pytest.mark.parametrize("tensor", ["q", "k", "v", "a", "b"])
def test_each_step_draws_every_activation_afresh(tensor):
    """A stale q, k, v, a or b passes one step and fails the next: verify's later steps draw each afresh."""
    assert verify(StaleInput(tensor), case(), steps=1).ok
    verdict = verify(StaleInput(tensor), case(), steps=3)
    assert not verdict.ok and "output error" in str(verdict), verdict


def stored_at_bf16_precision(inputs, out, live):
    """Planted: an fp32 pool's stored states narrowed through bf16 (truncated), as a kernel narrowing its
    tile would: only a bf16 pool's kernel, interpreted, may round that way."""
    stored = inputs.slots[live].long()
    inputs.state[stored] = (inputs.state[stored].view(torch.int32) & -65536).view(torch.float32)


def test_an_fp32_state_stored_at_bf16_precision_is_wrong():
    verdict = verify(Planted(stored_at_bf16_precision), case(state_dtype=torch.float32, dtype=torch.float32), steps=1)
    assert not verdict.ok and re.search(r"state error [0-9.e+-]+ > 1e-05", str(verdict)), verdict
    assert "untouched" not in str(verdict)  # the stored slots alone were narrowed


def test_the_first_step_runs_on_the_inputs_as_given():
    """Planted: right on any draw but the caller's own inputs, whose outputs it zeroes."""
    x = case()
    verdict = verify(Planted(lambda inputs, out, live: out.zero_() if inputs.q is x.q else None), x, steps=1)
    assert not verdict.ok and "output error" in str(verdict), verdict


def test_a_stored_state_is_judged_rounded_to_nearest_and_interpreted_bf16_truncated_too(monkeypatch):
    """The rounding candidates of a stored state: to nearest always; bf16 truncated as well only where
    Triton kernels run interpreted (a CPU with TRITON_INTERPRET=1), as its interpreter converts."""
    def pool(dtype, device="cpu"):
        return SimpleNamespace(state=torch.empty(0, dtype=dtype), device=torch.device(device))

    x = torch.tensor([1 + 3.2 / 256], dtype=torch.float64)  # between bf16's 1 + 1/128 and 1 + 2/128
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    to_nearest, truncated = stores(pool(torch.bfloat16))
    assert to_nearest(x).dtype == truncated(x).dtype == torch.bfloat16
    assert to_nearest(x).item() == 1 + 2 / 128 and truncated(x).item() == 1 + 1 / 128
    assert len(stores(pool(torch.float32))) == len(stores(pool(torch.bfloat16, "cuda"))) == 1
    monkeypatch.delenv("TRITON_INTERPRET")
    assert len(stores(pool(torch.bfloat16))) == 1


def test_the_nearer_reference_is_nan_if_either_is():
    assert math.isnan(nearest([0.1, math.nan])) and math.isnan(nearest([math.nan, 0.1]))
    assert nearest([0.2, 0.1]) == 0.1


def test_an_output_error_equal_to_its_tolerance_is_within_it():
    x = case()
    live = (x.slots >= 0).repeat_interleave(x.T)
    ref = torch.randn(x.out_shape, dtype=torch.float64)
    out = (ref * 1.003).to(x.v.dtype)
    err, problems = output_problems(x, torch.where(live.view(-1, 1, 1), out, 0), [ref], live, 1e-2)
    assert problems == [] and 0 < err < 1e-2
    assert output_problems(x, torch.where(live.view(-1, 1, 1), out, 0), [ref], live, err) == (err, [])


def test_state_and_steps_errors_equal_to_their_tolerances_are_within_them(monkeypatch):
    """``<=``, not ``<``: the bounds are the largest errors allowed (the run is seeded, so a second
    verify of the same inputs sees the same errors)."""
    v = importlib.import_module("kda_impls.verify")  # the module: the package's `verify` is the function

    first = verify(Planted(state_off_slightly), case(), steps=1)
    assert first.ok and 0 < first.err_steps and first.err_out < first.err_state, first
    monkeypatch.setitem(v.TOLERANCE, torch.bfloat16, first.err_state)
    monkeypatch.setattr(v, "steps_tolerance", lambda dtype, steps: first.err_steps)
    again = verify(Planted(state_off_slightly), case(), steps=1)
    assert again.ok and (again.err_state, again.err_steps) == (first.err_state, first.err_steps), again


def state_off_slightly(inputs, out, live):
    inputs.state[first_live_slot(inputs, live)] *= 1.004


class RecordsActivations(NaiveTorch):
    """The naive decode, keeping the q of every step it is bound to."""

    def __init__(self):
        self.seen = []

    def _launcher(self, inputs, out):
        self.seen.append(inputs.q.clone())
        return super()._launcher(inputs, out)


def test_the_steps_draw_the_same_activations_from_the_same_inputs():
    """A verdict can be reproduced: the later steps' activations come from a generator seeded by the
    inputs, not from torch's global one."""
    runs = [RecordsActivations(), RecordsActivations()]
    for seed, impl in enumerate(runs):
        torch.manual_seed(seed)  # the global generator in another state for each
        assert verify(impl, tiny(), steps=3).ok
    first, second = (r.seen for r in runs)
    assert len(first) == len(second) == 3 and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not torch.equal(runs[0].seen[1], runs[0].seen[2])


@pytest.fixture
def foreign_defaults():
    """torch's default device ``meta`` and default dtype float64 (as a serving process may make a GPU and
    another dtype its defaults): a tensor the package makes without naming the inputs' device lands on
    the meta device and fails against the CPU's; one made without naming its dtype draws other values."""
    torch.set_default_device("meta")
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_device(None)
    torch.set_default_dtype(torch.float32)


def drawn(x):
    return {**x.tensors(), "span": x.pool_span(), **(vars(x.cache) if x.cache is not None else {})}


@pytest.mark.parametrize("kw", [
    dict(), dict(T=2), dict(T=2, checkpoints="last"), dict(T=3, update_state=False), dict(ring=3),
    dict(state_dtype=torch.float32, dtype=torch.float32), dict(B=1, pad_rows=1, n_slots=1, T=2, update_state=False),
], ids=["inplace", "T2-all", "T2-last", "frozen", "replay", "fp32", "frozen-all-padding"])
def test_everything_is_allocated_on_the_inputs_device_whatever_torchs_defaults(foreign_defaults, kw):
    """Drawing the inputs (the same values), binding, the reference and every step of verify keep to
    the inputs' device and their own dtypes."""
    x = tiny(**kw, device="cpu")
    torch.set_default_device(None)
    torch.set_default_dtype(torch.float32)
    expected = drawn(tiny(**kw, device="cpu"))
    torch.set_default_device("meta")
    torch.set_default_dtype(torch.float64)
    got = drawn(x)
    assert got.keys() == expected.keys()
    for name, t in got.items():
        if isinstance(t, torch.Tensor):
            assert t.device.type == "cpu" and t.dtype == expected[name].dtype and torch.equal(t, expected[name]), name
    assert NaiveTorch().bind(x.clone())().device.type == "cpu"  # the output bind allocates
    verdict = verify(NaiveTorch(), x)
    assert verdict.ok and verdict.steps == default_steps(x), verdict
    assert x.cache is None or effective_state(x).device.type == "cpu"
    out, states = reference(x)
    assert out.device.type == states.device.type == "cpu"


class GateReadPerQKHead(NaiveTorch):
    """The GVA mistake libraries make: the gate parameters indexed by the q/k head."""

    name = "bug-gate-per-qk-head"

    def _launcher(self, inputs, out):
        group = inputs.HV // inputs.H
        wrong = type(inputs)(**{**inputs.tensors(), "A_log": inputs.A_log[::group].repeat_interleave(group)},
                             scale=inputs.scale)
        return super()._launcher(wrong, out)


def test_a_gate_read_per_qk_head_under_gva_is_caught():
    verdict = verify(GateReadPerQKHead(), make_inputs(4, 2, 8, 16, 16, slot_pad=8, pad_rows=1, seed=21))
    assert any(re.match(r"^(output|state) error", p) for p in verdict.problems), verdict.problems
