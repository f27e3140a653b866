"""The naive torch implementation against the reference, and verify() against planted bugs."""

import pytest
import torch

from kda_impls import get, make_inputs, reference, rel_err, verify
from kda_impls.impls.naive import NaiveTorch

CASES = [
    dict(B=4, H=2, HV=2, K=32, V=32),
    dict(B=5, H=2, HV=8, K=16, V=64, slot_pad=16, pad_rows=2),  # GVA, K != V, padded
    dict(B=3, H=4, HV=4, K=64, V=16, slot_pad=7, pad_rows=1, n_slots=11),  # odd padding
    dict(B=2, H=1, HV=1, K=16, V=16, pad_rows=2),  # nothing live
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_naive_matches_reference(case, state_dtype):
    x = make_inputs(**case, state_dtype=state_dtype, seed=11)
    verdict = verify(get("naive"), x)
    assert verdict.ok, verdict
    if state_dtype == torch.float32:
        assert verdict.err_state <= 1e-5


def test_naive_fp32_everything_is_fp32_accurate():
    x = make_inputs(4, 2, 4, 32, 32, state_dtype=torch.float32, dtype=torch.float32, slot_pad=16, seed=2)
    verdict = verify(get("naive"), x)
    assert verdict.ok and verdict.err_out <= 1e-5 and verdict.err_state <= 1e-5, verdict


def test_naive_writes_in_place_and_returns_out_buffer():
    x = make_inputs(3, 1, 2, 16, 16, slot_pad=4, seed=3)
    ref_out, ref_rows = reference(x)
    out = torch.empty(3, 2, 16, dtype=x.v.dtype)
    assert get("naive").decode(x, out=out) is out
    assert rel_err(out, ref_out) <= 1e-2
    assert rel_err(x.state[x.slots.long()], ref_rows) <= 1e-2


class WritesUntouchedSlot(NaiveTorch):
    name = "bug-writes-an-untouched-slot"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)

        def run():
            live = set(inputs.slots.tolist())
            victim = next(s for s in range(inputs.N) if s not in live)
            inputs.state[victim].add_(1.0)
            return launch()

        return run


class WritesPadding(NaiveTorch):
    name = "bug-writes-padding"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        per_slot = inputs.HV * inputs.V * inputs.K

        def run():
            inputs.pool_span()[per_slot] = 0.0
            return launch()

        return run


class ForgetsOutputRow(NaiveTorch):
    name = "bug-forgets-a-row"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)

        def run():
            launch()
            out[0].fill_(float("nan"))
            return out

        return run


class WrongGate(NaiveTorch):
    name = "bug-gate-per-qk-head"

    def _launcher(self, inputs, out):
        # the GVA mistake libraries make: gate parameters indexed by the q/k head
        group = inputs.HV // inputs.H
        wrong = type(inputs)(**{**inputs.tensors(), "A_log": inputs.A_log[::group].repeat_interleave(group)},
                             scale=inputs.scale)
        return super()._launcher(wrong, out)


@pytest.mark.parametrize("bug, expect", [
    (WritesUntouchedSlot, "not in `slots` were written"),
    (WritesPadding, "padding between slots was written"),
    (ForgetsOutputRow, "NaN"),
    (WrongGate, "error"),
])
def test_verify_catches_planted_bugs(bug, expect):
    x = make_inputs(4, 2, 8, 16, 16, slot_pad=8, pad_rows=1, seed=21)
    verdict = verify(bug(), x)
    assert not verdict.ok
    assert any(expect in p for p in verdict.problems), verdict.problems
