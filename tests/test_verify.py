"""Each check of kda_impls.verify against an implementation with exactly that bug planted.

A planted bug runs the correct (naive) decode, then breaks one thing: each test fails if the check
that should catch it is removed, inverted or made NaN-blind. Writes to untouched slots and padding,
a forgotten output row and a gate per q/k head are planted in tests/test_naive.py.
"""

import math
import re

import pytest
import torch

from kda_impls import make_inputs, rel_err, verify
from kda_impls.impls.naive import NaiveTorch
from kda_impls.verify import TOLERANCE


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
    assert str(verdict) == f"err_out={verdict.err_out:.2e} (tol 1e-02) err_state={verdict.err_state:.2e} (tol 1e-02)"


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
    assert rel_err(torch.tensor([0.3, 0.5]), torch.tensor([0.3, 0.4])) == pytest.approx(0.2)  # ||ref|| < 1: still relative
    assert rel_err(torch.tensor([0.0, 2.0]), torch.zeros(2)) == 2.0  # an all-zero reference: absolute
    assert math.isnan(rel_err(torch.tensor([float("nan"), 4.0]), ref))
