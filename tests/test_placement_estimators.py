"""scripts/placement_estimators.py: the first placement against the others, and the odds of the
run-to-run criterion per estimator, resampled from the placements."""

from __future__ import annotations

import numpy as np

from helpers import load_script, write_sweep_dir
from kda_impls.bench.config import Config

estimators = load_script("placement_estimators")
WIDE, FIRST_SLOW, STEADY = (Config(impl, 256, 32, 32, 128, 128) for impl in ("fla", "triton", "naive"))


def sweep(path, wide: list[float]):
    rows = {WIDE: [10.0] * 5, FIRST_SLOW: [10.0] * 5, STEADY: [10.0] * 5}
    return estimators.load(write_sweep_dir(path, rows, {}, {WIDE: wide, FIRST_SLOW: [11.0, 10.0, 10.0, 10.0],
                                                              STEADY: [10.0, 10.1, 10.0]}))


def test_first_placement_against_the_others(tmp_path):
    sweeps = [sweep(tmp_path / "a", [10.0, 10.0, 10.0])]
    table = estimators.first_placement(sweeps)
    assert table.loc[("triton", "B >= 64"), "median"] == 1.1 and table.loc[("triton", "B >= 64"), "share > 1.02"] == 1
    assert table.loc[("fla", "B >= 64"), "median"] == 1.0


def test_clustered_placements_hold_the_mean_steadier_than_the_median(tmp_path):
    """Half the placements at 10, half at 10.5: the median of a run jumps between the clusters (three
    runs all in one: 1 in 4), the mean moves by about the gap over the square root of the draws."""
    clustered = [10.0] * 10 + [10.5] * 10
    sweeps = [sweep(tmp_path / name, clustered) for name in "ab"]
    odds = estimators.resampled(sweeps, 16, [27], 0.02, skip_first=False, seed=0).set_index("row")
    (row,) = [r for r in odds.index if r.startswith("fla_")]
    assert odds.loc[row, "median n=27"] > 0.6 and odds.loc[row, "mean n=27"] < 0.01
    assert odds.loc[row, "placements"] == 40
    assert not any(r.startswith("naive_") for r in odds.index)  # spread by 1%: not resampled
    skipped = estimators.resampled(sweeps, 16, [3], 0.02, skip_first=True, seed=0)
    assert not any(r.startswith("triton_") for r in skipped.row)  # only its first placement was slow


def test_report_names_the_runs(tmp_path, capsys):
    dirs = [write_sweep_dir(tmp_path / name, {WIDE: [10.0] * 5}, {}, {WIDE: list(np.linspace(10, 11, 6))})
            for name in "ab"]
    assert estimators.main([str(d) for d in dirs] + ["--sizes", "3", "--skip-first"]) == 0
    out = capsys.readouterr().out
    assert "each first left out" in out and "median n=3" in out and str(dirs[0]) in out


def test_rows_whose_first_placement_is_off_are_listed(tmp_path):
    sweeps = [sweep(tmp_path / "a", [10.0, 10.0, 10.0])]
    off = estimators.first_off(sweeps)
    assert off["row"].tolist() == [FIRST_SLOW.key().split("_spr")[0]] and off["first / others"].tolist() == [1.1]


def test_a_process_apart_as_a_whole_moves_runs_unless_several_share_a_run(tmp_path):
    """Three processes, the third's placements all 4% up: with one process a run, three runs differ
    by 4% whenever some draw it and some do not (1 - (2/3)^3 - (1/3)^3 = 2/3); pooling five a run,
    far less often by more than 2%. Alike processes never move them."""
    base = [10.0, 10.05, 10.1, 10.02, 10.08, 10.04]
    apart = [sweep(tmp_path / name, values) for name, values in (("a", base), ("b", base),
                                                                  ("c", [x * 1.04 for x in base]))]
    odds = estimators.resampled_by_process(apart, 16, 27, [1, 5], 0.02, seed=0).set_index("row")
    (row,) = [r for r in odds.index if r.startswith("fla_")]
    assert abs(odds.loc[row, "P=1"] - 2 / 3) < 0.02 and odds.loc[row, "P=5"] < 0.3
    assert odds.loc[row, "processes given"] == 3
    alike = [sweep(tmp_path / f"alike{i}", base + [10.3]) for i in range(3)]  # pooled spread 3%: resampled
    calm = estimators.resampled_by_process(alike, 16, 27, [1], 0.02, seed=0).set_index("row")
    (row,) = [r for r in calm.index if r.startswith("fla_")]
    assert calm.loc[row, "P=1"] < 0.01


def test_runs_that_pooled_several_processes_are_not_resampled_as_one_process_each(tmp_path, capsys):
    """A run timed with three placement processes a row is not one process: the table that keeps
    each run as a process says so instead of drawing from it; runs of one process are drawn."""
    values = {WIDE: list(np.linspace(10, 11, 6))}
    pooled = [write_sweep_dir(tmp_path / name, {WIDE: [10.0] * 5}, {"settings": {"method": {"placement_processes": 3}}},
                              values) for name in "ab"]
    assert estimators.main([str(d) for d in pooled] + ["--sizes", "3"]) == 0
    assert "Not drawn: these runs pooled 3/3 placement processes" in capsys.readouterr().out
    single = [write_sweep_dir(tmp_path / f"one{name}", {WIDE: [10.0] * 5}, {}, values) for name in "ab"]
    assert estimators.main([str(d) for d in single] + ["--sizes", "3"]) == 0
    out = capsys.readouterr().out
    assert "Not drawn" not in out and "P=3" in out
