"""scripts.profiling.memory_ceiling: its tile round-trip kernel touches exactly the tiles our kernel does
(under the interpreter on the CPU, real shapes on the H200 through the script), its summary and
its report written again from a run's files."""

import json
import sys

import pandas as pd
import pytest
import torch

from kda_impls import make_inputs
from scripts.profiling import memory_ceiling

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.interpreter
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("through_slots", [True, False], ids=["slots", "rows"])
@pytest.mark.parametrize("subtiles", [1, 2, 4], ids=["tile", "two-tiles", "head"])
def test_tile_roundtrip_flips_exactly_the_live_rows_state(state_dtype, through_slots, subtiles):
    inputs = make_inputs(3, 2, 4, 16, 32, state_dtype=state_dtype, slot_pad=16, n_slots=7, device=DEVICE, seed=5)
    width = {2: torch.int16, 4: torch.int32}[inputs.state.element_size()]
    before = inputs.pool_span().view(width).clone()
    memory_ceiling.tile_roundtrip(inputs, BV=8, num_warps=1, through_slots=through_slots, subtiles=subtiles, flip=1)()
    after = inputs.pool_span().view(width)
    rows = inputs.slots.long() if through_slots else torch.arange(inputs.B)
    expected = before.clone()
    for slot in rows.tolist():  # every element of the slot's [HV, V, K] state, none of its padding
        start = slot * inputs.slot_stride
        expected[start:start + inputs.HV * inputs.V * inputs.K] ^= 1
    assert torch.equal(after, expected)
    memory_ceiling.tile_roundtrip(inputs, BV=8, num_warps=1, through_slots=through_slots, subtiles=subtiles, flip=0)()
    assert torch.equal(inputs.pool_span().view(width), expected)  # flip 0: every bit as it was


def test_summary_is_per_batch_and_variant_against_the_same_placements_copy():
    rows = [dict(B=64, placement=p, variant=v, GBps=gbps, us=us)
            for p, scale in ((0, 1.0), (1, 0.5))
            for v, gbps, us in (("copy-1GiB", 4000.0 * scale, 10.0), ("kda", 3600.0 * scale, 20.0 + 2 * p))]
    table = memory_ceiling.summary(pd.DataFrame(rows)).set_index("variant")
    assert table.loc["kda", "pct_copy"] == pytest.approx(90.0)  # each placement against its own copy
    assert table.loc["kda", "spread"] == pytest.approx(22.0 / 20.0)
    assert table.loc["copy-1GiB", "placements"] == 2


def report_again(out, monkeypatch, rows: list[dict], options: str) -> str:
    """ceiling.md as ``--report-only`` writes it again from a run's ``rows`` made with ``options``."""
    pd.DataFrame(rows).to_csv(out / "ceiling.csv", index=False)
    command = f"scripts.profiling.memory_ceiling --out {out} {options}"
    (out / "meta.json").write_text(json.dumps({"gpu": "NVIDIA H200", "command": command}))
    monkeypatch.setattr(sys, "argv", ["memory_ceiling.py", "--out", str(out), "--report-only"])
    assert memory_ceiling.main() == 0
    return (out / "ceiling.md").read_text()


def test_report_only_writes_the_report_again_with_the_runs_own_settings(tmp_path, monkeypatch):
    variants = memory_ceiling.OWN_VARIANTS
    rows = [dict(B=256, placement=p, variant=v, GBps=4000.0, us=10.0 + p) for p in range(2) for v in variants]
    text = report_again(tmp_path, monkeypatch, rows, "--HV 64 --placements 2 --calls 9")
    assert "HV=64 K=V=128 bfloat16 state" in text and "graph of 9 back-to-back calls" in text
    assert "median over 2 placements" in text and "| kda " in text and "## What each step costs" in text


def test_step_costs_are_the_points_between_variants_and_our_kernel_against_the_others():
    pct = {"copy-1GiB": 100.0, "tiles": 97.0, "tiles-slots": 93.5, "tiles-sorted-slots": 95.0,
           "tiles-slots-x4": 91.0, "head-slots": 92.0, "kda": 91.5, "flashinfer": 90.0}
    us = {"tiles-slots": 100.0, "kda": 102.0, "flashinfer": 120.0}
    table = pd.DataFrame([dict(B=256, variant=v, pct_copy=p, us=us.get(v, 1.0)) for v, p in pct.items()])
    costs = memory_ceiling.step_costs(table).set_index("B").loc[256]
    assert costs["slots (points)"] == pytest.approx(3.5) and costs["order (points)"] == pytest.approx(1.5)
    assert costs["math (points)"] == pytest.approx(2.0) and costs["x4 (points)"] == pytest.approx(2.5)
    assert costs["head (points)"] == pytest.approx(1.5) and costs["kda - tiles-slots (us)"] == pytest.approx(2.0)
    assert costs["kda / flashinfer"] == pytest.approx(102.0 / 120.0)
    assert "kda / copy-1GiB" not in costs  # the suite's own variants are not implementations


@pytest.mark.interpreter
def test_every_variant_runs_and_the_sorted_one_walks_the_same_slots_in_order():
    from kda_impls.impls.triton.kernel import TritonKDA
    inputs = make_inputs(4, 2, 2, 16, 16, state_dtype=torch.bfloat16, n_slots=9, device=DEVICE, seed=2)
    ordered = memory_ceiling.in_slot_order(inputs)
    assert ordered.state is inputs.state and torch.equal(ordered.slots, inputs.slots.sort().values)
    assert not torch.equal(inputs.slots, ordered.slots)  # the drawn slots were not already in order
    launchers = memory_ceiling.variant_launchers(inputs, TritonKDA().config_for(inputs), ("naive",))
    assert set(launchers) == set(memory_ceiling.OWN_VARIANTS) - {"copy-1GiB"} | {"naive"}
    for launch, nbytes in launchers.values():
        launch()
        assert nbytes >= 2 * inputs.B * inputs.HV * inputs.V * inputs.K * inputs.state.element_size()


def test_calls_take_each_input_set_in_turn_and_whole_turns():
    visited = []
    launch = memory_ceiling.in_turn([lambda n=n: visited.append(n) for n in range(3)])
    for _ in range(7):
        launch()
    assert visited == [0, 1, 2, 0, 1, 2, 0]
    assert memory_ceiling.calls_per_turn(20, 1) == 20
    assert memory_ceiling.calls_per_turn(20, 18) == 36  # a call never finds its own set still in the L2
    assert memory_ceiling.calls_per_turn(20, 2) == 20 and memory_ceiling.calls_per_turn(21, 2) == 22


def test_input_sets_are_the_sweeps_rotation_and_a_step_too_small_to_rotate_is_refused(monkeypatch):
    inputs = make_inputs(2, 2, 2, 16, 16, state_dtype=torch.bfloat16, device="cpu", seed=1)
    assert memory_ceiling.input_sets(inputs, "back-to-back", "cpu") == [inputs]
    copies = [inputs, inputs.clone(), inputs.clone()]
    monkeypatch.setattr(memory_ceiling, "rotation_inputs", lambda entry, first, device: (entry, copies))
    assert memory_ceiling.input_sets(inputs, "previous-step", "cuda") is copies
    monkeypatch.setattr(memory_ceiling, "rotation_inputs", lambda entry, first, device: ("dirty", [first]))
    with pytest.raises(SystemExit, match="previous-step needs a rotation.*'dirty'"):
        memory_ceiling.input_sets(inputs, "previous-step", "cuda")


def test_report_says_the_calls_turned_over_the_input_sets(tmp_path, monkeypatch):
    variants = memory_ceiling.OWN_VARIANTS
    rows = [dict(B=B, placement=p, variant=v, input_sets=sets, GBps=4000.0, us=10.0 + p)
            for B, sets in ((64, 18), (256, 5)) for p in range(2) for v in variants]
    text = report_again(tmp_path, monkeypatch, rows, "--HV 16 --D 64 --entry previous-step")
    assert "HV=16 K=V=64 bfloat16 state" in text and "`previous-step` L2 entry state" in text
    assert "18 at B = 64, 5 at B = 256" in text and "back-to-back" not in text
