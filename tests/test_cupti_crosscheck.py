"""scripts.crosscheck.cupti_crosscheck's report, from a crosscheck table (what --report-only rewrites)."""

from __future__ import annotations

import dataclasses
import re

import pandas as pd

from kda_impls.bench.config import Config
from scripts.crosscheck import cupti_crosscheck as crosscheck


def table(replay: bool) -> pd.DataFrame:
    rows = pd.DataFrame({"impl": ["fla", "fla", "triton", "triton"], "state_dtype": ["float32"] * 4,
                         "HV": 32, "K": 128, "B": [16, 256, 16, 256], "slot_pad": 0, "l2_entry": "previous-step",
                         "kernel_us_mean": [10.6, 100.0, 5.1, 50.0], "cupti_busy_us": [10.0, 100.0, 5.0, 49.0],
                         "cupti_charged_us": [10.0, 100.0, 5.0, 49.0], "kernels": 1, "error": None, "sweep": "s"})
    rows["ratio"] = rows.kernel_us_mean / rows.cupti_busy_us
    rows["ratio_to_charged"] = rows.kernel_us_mean / rows.cupti_charged_us
    rows["agrees"] = (rows.ratio - 1).abs() <= crosscheck.AGREEMENT
    if replay:
        rows = rows.assign(replay_busy_us=rows.cupti_busy_us * 1.05, replay_period_us=rows.kernel_us_mean,
                           replay_over_eager=1.05, ratio_to_replay_period=1.0)
    return rows


def test_report_counts_agreement_by_batch_and_by_implementation():
    text = crosscheck.report(table(replay=False))
    assert "**3 of 4 rows agree.**" in text
    assert re.search(r"\|\s+16 \|\s+2 \|\s+1 \|\s+1\.02\s+\|\s+1\.06\s+\|", text), text  # whole counts by batch
    assert re.search(r"\| fla\s+\| float32\s+\|\s+16 \|\s+1 \|\s+0 \|\s+1\.060 \|", text)
    assert "Inside the harness's pass" not in text


def test_report_adds_the_replay_table_where_the_run_profiled_it():
    assert "## Inside the harness's pass (`--replay`)" in crosscheck.report(table(replay=True))


def test_a_replay_row_is_profiled_over_whole_ring_cycles_of_every_input_set():
    """The harness times a replay step over whole ring cycles (each slot's flush once in L steps): the eager
    steps CUPTI averages must be whole cycles of every rotated input set too, else the flush's share is off."""
    replay = Config(impl="triton", B=64, H=32, HV=32, K=128, V=128, mode="replay", ring=16)
    assert crosscheck.whole_cycle(replay, 1) == 16 and crosscheck.whole_cycle(replay, 3) == 48
    assert crosscheck.whole_cycle(dataclasses.replace(replay, mode="inplace", ring=0), 3) == 1
