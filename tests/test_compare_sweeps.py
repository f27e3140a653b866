"""scripts.reports.compare_sweeps: two sweep directories row by row."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from helpers import write_sweep_dir
from kda_impls.bench.config import Config
from scripts.reports import compare_sweeps

ROWS = [Config(impl, B, 32, 32, 128, 128) for impl in ("triton", "fla") for B in (1, 64, 256)]


def sweep(path, scale: dict, first_call_ms: float, device: str):
    """A directory of ROWS: kernel time 10 us times ``scale`` of the row (1 unless named)."""
    out = write_sweep_dir(path, {c: list(10.0 * scale.get(c, 1.0) * np.ones(5)) for c in ROWS}, {"gpu": "H200"})
    table = pd.read_csv(out / "results.csv").assign(first_call_ms=first_call_ms, device=device)
    table.to_csv(out / "results.csv", index=False)
    return out


def test_rows_paired_summarised_and_listed(tmp_path):
    a = sweep(tmp_path / "a", {}, 1000.0, "cuda:0")
    b = sweep(tmp_path / "b", {ROWS[2]: 1.10, ROWS[4]: 0.99}, 500.0, "cuda:1")
    text = compare_sweeps.report(*(compare_sweeps.load(d) for d in (a, b)), "one", "two", min_b=16, flag=0.03)
    both = compare_sweeps.paired(compare_sweeps.load(a).table, compare_sweeps.load(b).table)
    assert len(both) == 6 and both.set_index("impl").ratio.max() == 1.10
    # four rows at B >= 16: median of 1, 1, 1.10, 0.99; only the 10% one beyond 3%
    assert "the 4 rows at B >= 16" in text and "|   1.0000 |" in text
    moved = text.split("moved by more than 3%")[1].split("## First calls")[0]
    assert "triton" in moved and "1.100" in moved and "fla" not in moved
    # first calls: three rows a library of 1 s on one side, 0.5 s on the other, per library and in all
    assert compare_sweeps.library_first_calls(compare_sweeps.load(a).table).to_dict() == \
        {"fla": 3.0, "triton": 3.0, "all": 6.0}
    assert compare_sweeps.library_first_calls(compare_sweeps.load(b).table)["all"] == 3.0
    assert "one, cuda:0" in text and "two, cuda:1" in text


def test_a_missing_directory_is_one_line_and_status_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        compare_sweeps.main([str(tmp_path / "none"), str(tmp_path)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "no such directory" in err


def test_moves_are_set_beside_another_runs(tmp_path):
    """--run-to-run: each implementation's B / A range beside C / A's, C another run like A."""
    a = sweep(tmp_path / "a", {}, 1000.0, "cuda:0")
    b = sweep(tmp_path / "b", {ROWS[2]: 1.04, ROWS[5]: 0.97}, 500.0, "cuda:0")
    c = sweep(tmp_path / "c", {ROWS[1]: 1.06, ROWS[4]: 0.99}, 1000.0, "cuda:0")
    sides = [compare_sweeps.load(d) for d in (a, b, c)]
    ranges = compare_sweeps.against_run_to_run(*sides, min_b=16)
    assert ranges.loc["triton"].round(4).tolist() == [1.0, 1.04, 1.0, 1.06]
    assert ranges.loc["fla"].round(4).tolist() == [0.97, 1.0, 0.99, 1.0]
    text = compare_sweeps.report(sides[0], sides[1], "one", "two", 16, 0.03, sides[2], "three")
    assert "another run like A (`three`)" in text and re.search(r"\|\s+C / A, max\s+\|", text)


def test_what_the_rows_took_less_their_first_calls(tmp_path):
    """Row seconds per implementation, less the first calls: what the timers and placements cost."""
    a = sweep(tmp_path / "a", {}, 1000.0, "cuda:0")
    table = pd.read_csv(a / "results.csv")
    table.assign(row_s=2.5, placements_timed=np.where(table.impl == "fla", 9, 3)).to_csv(a / "results.csv", index=False)
    costs = compare_sweeps.row_time(compare_sweeps.load(a).table)
    # three rows each: 7.5 s, less three first calls of 1 s
    assert costs.loc["fla"].tolist() == [7.5, 4.5, 9.0] and costs.loc["triton"].tolist() == [7.5, 4.5, 3.0]
    text = compare_sweeps.report(*(compare_sweeps.load(d) for d in (a, a)), "one", "two", min_b=16, flag=0.03)
    assert re.search(r"\| fla\s+\|\s+7\.5 \|\s+4\.5 \|\s+9\.0 \|", text)
    finer = compare_sweeps.report(*(compare_sweeps.load(d) for d in (a, a)), "one", "two", min_b=16, flag=0.005)
    assert "Rows that moved by more than 0.5%" in finer  # not rounded to 0% or 1%
    older = compare_sweeps.row_time(compare_sweeps.load(a).table.drop(columns="placements_timed"))
    assert older.loc["fla", "rows s"] == 7.5 and np.isnan(older.loc["fla", "placements"])  # before method 3
    oldest = compare_sweeps.row_time(compare_sweeps.load(a).table.drop(columns=["placements_timed", "row_s"]))
    assert np.isnan(oldest.loc["fla", "rows s"]) and np.isnan(oldest.loc["fla", "less first calls"])  # no row_s
