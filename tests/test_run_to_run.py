"""scripts/run_to_run.py: several runs of the same configurations, between-run moves against
within-run placement spreads."""

from __future__ import annotations

import numpy as np
import pandas as pd

from helpers import load_script, write_sweep_dir
from kda_impls.bench.config import Config

run_to_run = load_script("run_to_run")
ROWS = [Config(impl, B, 32, 32, 128, 128) for impl in ("triton", "fla") for B in (1, 64, 256)]


def sweep(path, scale: dict, placements: dict | None = None):
    """ROWS at 10 us times ``scale`` of the row, each on placements 1.00 and 1.01 of that (the
    placement columns; ``placements``: per-placement medians of some rows for placements.json)."""
    times = {c: 10.0 * scale.get(c, 1.0) for c in ROWS}
    out = write_sweep_dir(path, {c: [t] * 5 for c, t in times.items()}, {"gpu": "H200"}, placements)
    table = pd.read_csv(out / "results.csv")
    table = table.assign(kernel_us_placement_min=table.kernel_us_mean, kernel_us_placement_max=table.kernel_us_mean * 1.01)
    table.to_csv(out / "results.csv", index=False)
    return out


def test_rows_move_between_runs_beyond_their_placement_spread(tmp_path):
    runs = [sweep(tmp_path / "a", {}), sweep(tmp_path / "b", {ROWS[5]: 1.05}), sweep(tmp_path / "c", {ROWS[5]: 0.99})]
    table = run_to_run.moves([run_to_run.load(r) for r in runs])
    fla = table.set_index(["impl", "B"]).loc[("fla", 256)]
    assert len(table) == 6 and round(fla["between"], 6) == round(1.05 / 0.99 - 1, 6) and round(fla["within"], 6) == 0.01
    text = run_to_run.report(table, ["a", "b", "c"], min_b=16, limit=0.02)
    assert "3 of 4 moved by <= 2%" in text  # fla B=256 moved 6% between runs, 1% within each
    per_impl = text.split("## Per implementation")[1].split("## Every")[0]
    assert "| fla    |      2 |              1 |" in per_impl and "| triton |      2 |              2 |" in per_impl


def test_one_run_is_refused_in_one_line(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stopped:
        run_to_run.main([str(sweep(tmp_path / "a", {}))])
    assert stopped.value.code == 2 and "two or more" in capsys.readouterr().err


def test_another_statistic_of_the_placements(tmp_path):
    """--statistic mean: each run's kernel time is the mean of its per-placement medians; rows
    without them are left out. Two placements 10 and 12 against 10 and 14: medians (the means of
    two) 11 and 12; three against three, 10, 10, 13 and 10, 10, 16: medians equal, means 11 and 12."""
    two, three = ROWS[4], ROWS[5]
    runs = [sweep(tmp_path / "a", {}, {two: [10.0, 12.0], three: [10.0, 10.0, 13.0]}),
            sweep(tmp_path / "b", {}, {two: [10.0, 14.0], three: [10.0, 10.0, 16.0]})]
    sweeps = [run_to_run.load(r) for r in runs]
    means = run_to_run.moves(sweeps, "mean").set_index("B")
    assert len(means) == 2 and round(means.loc[64, "between"], 6) == round(12 / 11 - 1, 6)
    assert round(means.loc[256, "between"], 6) == round(12 / 11 - 1, 6)
    assert len(run_to_run.moves(sweeps)) == 6  # what the runs reported: every row
    medians = run_to_run.moves(sweeps, "median").set_index("B")
    assert round(medians.loc[64, "between"], 6) == round(12 / 11 - 1, 6) and medians.loc[256, "between"] == 0
    best = run_to_run.moves(sweeps, "min").set_index("B")  # every row's best placement: 10 in each run
    assert (best.between == 0).all() and len(best) == 2
    assert "kernel time the mean over placements" in run_to_run.report(means.reset_index(), ["a", "b"], 16, 0.02, "mean")


def test_runs_whose_placements_differ_as_a_whole_get_a_small_p():
    """Six placements a run: the second run's all 5% up is a shift of the process (p < 0.01); the
    same values shuffled between runs are not; two placements a run are too few to test."""
    base = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    shifted = pd.Series([base, [x * 1.05 for x in base], base])
    assert run_to_run.runs_alike(shifted) < 0.01
    assert run_to_run.runs_alike(pd.Series([base, base[::-1], base])) > 0.9
    assert np.isnan(run_to_run.runs_alike(pd.Series([base[:2], base, base])))
