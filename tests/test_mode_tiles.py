"""scripts.tuning.mode_tiles: one sweep per replay or frozen-verify tile, every row in one table with its tile."""

import json

import pandas as pd
import pytest

from kda_impls.impls.triton.replay import REPLAY_CONFIG_ENV
from scripts.tuning import mode_tiles


def test_the_table_holds_every_row_with_its_tile_fastest_first_per_point(cpu_sweep, cpu_shards):
    table, metas = mode_tiles.tile_table({"BV=16": cpu_sweep, "BV=32": cpu_shards[0]})
    rows = [pd.read_csv(d / "results.csv") for d in (cpu_sweep, cpu_shards[0])]
    assert len(table) == sum(map(len, rows)) and table.columns[0] == "tile"
    assert (table.tile == "BV=16").sum() == len(rows[0])
    point = [c for c in mode_tiles.POINT if c in table]
    for _, group in table.groupby(point, sort=False):
        assert group.kernel_us_mean.is_monotonic_increasing
    assert table[point].apply(tuple, axis=1).is_monotonic_increasing  # points in order, each once
    assert set(metas) == {"BV=16", "BV=32"} and "git" in metas["BV=16"]


def test_each_tile_is_swept_in_its_own_process_with_the_tile_in_its_environment(tmp_path):
    out = tmp_path / "tiles"
    assert mode_tiles.main(["--mode", "replay", "--out", str(out), "--tiles", "BV=8,num_warps=1", "--",
                            "--impls", "naive", "--B", "1", "--HV", "1", "--K", "16", "--no-charts"]) == 0
    table = pd.read_csv(out / "tiles.csv")
    assert list(table.tile) == ["BV=8,num_warps=1"] and (table.status == "ok").all()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["runs"]["BV=8,num_warps=1"]["environment"][REPLAY_CONFIG_ENV] == "BV=8,num_warps=1"


def refusal(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        mode_tiles.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_a_directory_with_a_table_is_refused_and_kept(tmp_path, capsys):
    (tmp_path / "tiles.csv").write_text("kept\n")
    assert "tiles.csv exists" in refusal(["--mode", "frozen", "--out", str(tmp_path), "--tiles", "BV=16"], capsys)
    assert (tmp_path / "tiles.csv").read_text() == "kept\n" and not (tmp_path / "meta.json").exists()


def test_the_sweeps_out_is_refused(tmp_path, capsys):
    argv = ["--mode", "replay", "--out", str(tmp_path), "--tiles", "BV=16", "--", "--out", "x"]
    assert "--out is this tool's" in refusal(argv, capsys)
    assert list(tmp_path.iterdir()) == []
