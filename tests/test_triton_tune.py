"""The tuner (scripts.tuning.triton_tune and scripts.tuning.tuning_table) and the tuning table it
writes (kda_impls/impls/triton/tuning.json): the table the kernel reads is the committed JSON, the JSON is
what its recorded command writes from the committed tune runs, and the tuner's rules for choosing
an entry (best per shape, the state order from two sweeps, over-table runs past a margin)."""

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

from helpers import REPO, write_sweep_dir
from kda_impls.bench.config import Config
from kda_impls.impls.triton import tiles
from kda_impls.impls.triton import tuning as triton_tuning
from kda_impls.impls.triton.tiles import TileConfig, choose_config
from kda_impls.impls.triton.tuning import TABLE
from scripts.tuning import triton_tune, tuning_table


def test_the_kernel_reads_the_committed_json():
    """The kernel's table is the JSON shipped in the package, every entry a full config of its shape."""
    provenance, table = triton_tuning.parse(tuning_table.TABLE_PATH.read_text())
    assert tiles.TABLE is TABLE and TABLE == table and len(table) > 0
    assert triton_tuning.PROVENANCE == "; ".join(provenance)
    key = next(iter(table))
    assert choose_config(getattr(torch, key[0]), *key[1:]) == TileConfig.parse(table[key], TileConfig(BV=key[3]))


def test_the_json_round_trips_one_entry_a_line():
    entries = {("float32", 32, 128, 128, 1, 1): ("BV=4", "2.98 us"), ("bfloat16", 32, 128, 128, 64, 2): ("BV=8", "")}
    text = triton_tuning.dumps(["measured once"], entries, ["--write-table", "a.csv"])
    assert triton_tuning.parse(text) == (["measured once"], {k: c for k, (c, _) in entries.items()})
    assert sum('"config"' in line for line in text.splitlines()) == 2  # one entry a line: diffs name the entry


def test_tune_script_regenerates_a_loadable_table(tmp_path):
    rows = [dict(state_dtype="bfloat16", HV=32, K=128, V=128, B=B, slot_pad=0, config=config, status="ok",
                 us=us, pct_copy=90.0, best=str(best))
            for B, config, us, best in [(64, "BV=32,heads=1,num_warps=4,num_stages=1", 30.0, True),
                                        (64, "BV=16,heads=1,num_warps=2,num_stages=1", 33.0, False),
                                        (1, "BV=16,heads=1,num_warps=2,num_stages=1", 2.0, True),
                                        (1, "BV=16,heads=2,num_warps=2,num_stages=2", 1.0, True)]]
    csv_path, table_path = tmp_path / "triton_tune.csv", tmp_path / "triton_tuning.json"
    pd.DataFrame(rows[1:2]).to_csv(csv_path, index=False)
    assert tuning_table.write_table([csv_path], table_path) == 1 and not table_path.exists()  # no best row
    pd.DataFrame(rows).to_csv(csv_path, index=False)  # a run from before the T column: one-token rows
    multi_path = tmp_path / "multitoken.csv"
    pd.DataFrame([{**rows[0], "T": 4, "config": "BV=8,heads=1,num_warps=1,num_stages=1,programs_per_sm=0"}]).to_csv(
        multi_path, index=False)
    assert tuning_table.write_table([csv_path, multi_path], table_path) == 0
    provenance, table = triton_tuning.parse(table_path.read_text())
    # every field named, as the kernel runs the entry: a run from before const_heads measured the head
    # counts at run time (the default), and the multi-token kernel compiles them in
    # (the fields of dropped forms, heads and num_stages here, are read at the value the kernels run; a row
    # naming another value timed a dropped form, and is left out: B = 1 takes its other best row)
    tail = "programs_per_sm=0,subtiles=1"
    end = "rewiden=0,lookahead=1,load_evict_first=1,store_evict_first=1,fast_gate=0,tiled_inputs=0"
    assert table == {
        ("bfloat16", 32, 128, 128, 64, 1): f"BV=32,num_warps=4,{tail},const_heads=0,state_first=0,{end}",
        ("bfloat16", 32, 128, 128, 1, 1): f"BV=16,num_warps=2,{tail},const_heads=0,state_first=0,{end}",
        ("bfloat16", 32, 128, 128, 64, 4): f"BV=8,num_warps=1,{tail},const_heads=1,state_first=1,{end}"}
    assert all("measured" in line for line in provenance)
    # a run on a kernel that loaded the state first, before the field existed: its path says so
    assert tuning_table.write_table([f"{csv_path}:state_first=1", multi_path], table_path) == 0
    provenance, table = triton_tuning.parse(table_path.read_text())
    for key, heads in (((32, 128, 128, 64, 1), 0), ((32, 128, 128, 64, 4), 1)):
        assert table[("bfloat16", *key)].endswith(f"const_heads={heads},state_first=1,{end}")
    with pytest.raises(ValueError, match="--write-table"):
        tuning_table.write_table([f"{csv_path}:state_first=3"], table_path)


def test_committed_table_is_what_its_recorded_command_writes(tmp_path, monkeypatch):
    """The arguments the committed table records (its ``command``), parsed by the tuner's own command
    line and run on the committed measurements (the tune-data folder results/h200/tuning-table/), write
    that table: fails if the table was edited by hand, or written from data the command does not name."""
    args = triton_tune.arguments().parse_args(tuning_table.recorded_command())
    assert args.write_table, args
    monkeypatch.chdir(REPO)  # the command's paths are the repository's
    table_path = tmp_path / "triton_tuning.json"
    assert tuning_table.write_table(args.write_table, table_path, args.state_order, args.over_table_runs) == 0
    assert table_path.read_text() == tuning_table.TABLE_PATH.read_text()
    assert triton_tuning.parse(table_path.read_text())[1] == TABLE


def test_tune_script_takes_each_entrys_state_order_from_two_sweeps(tmp_path, capsys):
    """--state-order TABLED FIRST: an entry that loads its state after the small inputs takes the
    order its two sweep rows (unpadded, one token) time faster by more than 1%; closer, it stays;
    an entry already loading its state first is left alone (both sweeps ran its code)."""
    plain = "BV=32,heads=1,num_warps=4,num_stages=1"
    rows = [dict(state_dtype="bfloat16", HV=32, K=128, V=128, B=B, slot_pad=0, config=config, status="ok",
                 us=10.0, pct_copy=90.0, best="True")
            for B, config in [(1, plain), (16, plain), (64, plain), (256, plain + ",state_first=1")]]
    csv_path, table_path = tmp_path / "triton_tune.csv", tmp_path / "triton_tuning.json"
    pd.DataFrame(rows).to_csv(csv_path, index=False)
    # kernel time as tabled, then with the state first: faster first, faster as tabled, within 1%, and an
    # entry already state-first whose two sweeps ran the same code (their difference is noise: kept)
    times = {1: (3.7, 3.1), 16: (6.0, 6.6), 64: (20.0, 20.1), 256: (140.0, 150.0)}
    sweeps = []
    for name, side in (("tabled", 0), ("first", 1)):
        cfgs = {Config("triton", B, 32, 32, 128, 128): [us[side]] * 3 for B, us in times.items()}
        cfgs[Config("triton", 1, 32, 32, 128, 128, slot_pad=64)] = [1.0] * 3  # padded: not read
        sweeps.append(write_sweep_dir(tmp_path / name, cfgs, {}))
    assert tuning_table.write_table([csv_path], table_path, tuple(sweeps)) == 0
    provenance, table = triton_tuning.parse(table_path.read_text())
    order = {key[4]: TileConfig.parse(config, TileConfig(BV=128)).state_first for key, config in table.items()}
    assert order == {1: 1, 16: 0, 64: 0, 256: 1}
    assert "state order by sweeps: 3.10 us first, 3.70 us as tabled" in table_path.read_text()
    assert "1 entries load the state first, 1 after the small inputs" in capsys.readouterr().out


def test_tune_over_table_times_the_tabled_config_and_its_variants():
    tabled = choose_config(torch.bfloat16, 32, 128, 128, 64).fitted(128)
    configs = triton_tune.shape_configs(torch.bfloat16, 32, 128, 128, 64, 1, ("rewiden=1", "rewiden=1,BV=256"))
    assert configs == {replace(tabled, rewiden=1): "candidate", replace(tabled, BV=128, rewiden=1): "candidate",
                       tabled: "table"}
    full = triton_tune.shape_configs(torch.bfloat16, 32, 128, 128, 64, 1)
    assert any(c.rewiden for c in full) and tabled in full  # the full set has the form too
    assert any(c.programs_per_sm for c in full) and any(c.subtiles > 1 for c in full)
    # multi-token steps have no re-widened form
    assert not any(c.rewiden for c in triton_tune.shape_configs(torch.bfloat16, 32, 128, 128, 64, 4, ("rewiden=1",)))


def test_over_table_report_sets_each_shapes_fastest_variant_against_the_tabled_config(tmp_path):
    """Per shape: the tabled config's time, the fastest variant's (never the padded-pool row nor a
    failed one), their ratio and the fields it changes; per dtype and head dims the ratios' range
    and how many beat the table by more than the margin."""
    tabled = "BV=16,heads=1,num_warps=1,num_stages=1,programs_per_sm=0,subtiles=1,const_heads=0,state_first=1"

    def row(B, config, source, us, status="ok"):
        return dict(state_dtype="bfloat16", HV=32, K=128, V=128, B=B, T=1, slot_pad=0, config=config, source=source,
                    status=status, us=us, pct_copy=80.0)

    rows = [row(64, tabled, "table", 10.0), row(64, tabled + ",fast_gate=1", "candidate", 9.7),
            row(64, tabled + ",tma=1", "candidate", 9.0),  # a dropped form: not the kernels', left out
            row(64, tabled + ",lookahead=0,programs_per_sm=8", "candidate", 11.0),
            row(64, tabled, tuning_table.PADDED_SOURCE, 1.0), row(64, tabled + ",BV=8", "candidate", "", "error: x"),
            row(256, tabled, "table+candidate", 40.0), row(256, tabled + ",rewiden=1", "candidate", 39.4)]
    path = tmp_path / "triton_tune.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    text = " ".join(tuning_table.write_over_table_report(path).read_text().split())
    assert "| bfloat16 | 128 | 128 | 2 | 0.970 | 0.985 | 2 |" in text, text  # the range; past 2%, and 1% at B = 256
    assert "| 64 | 1 | 10.000 | 9.700 | 0.970 | 80.000 | fast_gate=1 |" in text, text  # not the padded row's 1.0
    assert "| 256 | 1 | 40.000 | 39.400 | 0.985 | 80.000 | rewiden=1 |" in text, text


def test_over_table_runs_replace_an_entry_only_past_the_margin_and_skip_the_state_order(tmp_path):
    """--over-table-runs: a run that timed the tabled config against variants replaces the entry only
    where its best is faster by more than 2%, 1% from B = 256 (where same-box runs move by 0.24%); its
    entries keep the order they were timed in (the state-order sweeps measured the kernel before the run)."""
    tabled = "BV=32,heads=1,num_warps=4,num_stages=1"
    base = [dict(state_dtype="bfloat16", HV=32, K=128, V=128, B=B, slot_pad=0, config=tabled, source="candidate",
                 status="ok", us=10.0, pct_copy=90.0, best="True") for B in (1, 64, 128, 256)]
    over = [dict(state_dtype="bfloat16", HV=32, K=128, V=128, B=B, slot_pad=0, config=config, source=source,
                 status="ok", us=us, pct_copy=90.0, best=str(best))
            for B, config, source, us, best in [
                (1, tabled, "table", 3.0, False), (1, "BV=8,num_warps=1,rewiden=1", "candidate", 2.9, True),  # 3.3%
                (64, tabled, "table", 30.0, False), (64, "BV=8,num_warps=1,rewiden=1", "candidate", 29.7, True),  # 1%
                (256, tabled, "table", 100.0, False), (256, "BV=16,num_warps=1", "candidate", 98.5, True),  # 1.5%
                (128, tabled, "table", 100.0, False), (128, "BV=16,num_warps=1", "candidate", 98.5, True)]]
    paths = [tmp_path / "base.csv", tmp_path / "over.csv"]
    for rows, path in zip((base, over), paths, strict=True):
        pd.DataFrame(rows).to_csv(path, index=False)
    # the state-order sweeps say state-first is faster at every B: only the base run's entries follow them
    sweeps = []
    for name, us in (("tabled", 10.0), ("first", 5.0)):
        cfgs = {Config("triton", B, 32, 32, 128, 128): [us] * 3 for B in (1, 64, 128, 256)}
        sweeps.append(write_sweep_dir(tmp_path / name, cfgs, {}))
    table_path = tmp_path / "triton_tuning.json"
    assert tuning_table.write_table([paths[0]], table_path, tuple(sweeps), over_table_runs=[paths[1]]) == 0
    provenance, table = triton_tuning.parse(table_path.read_text())
    table = {key[4]: TileConfig.parse(text, TileConfig(BV=128)) for key, text in table.items()}
    assert table[1] == TileConfig(BV=8, num_warps=1, rewiden=1)  # faster by 3.3%: replaced, timed order kept
    assert table[64] == table[128] == TileConfig(BV=32, num_warps=4)  # 1% and 1.5% are noise below B = 256
    assert table[256] == TileConfig(BV=16, num_warps=1)  # 1.5% at B = 256 is not
    assert tuning_table.write_table([paths[0]], table_path, tuple(sweeps)) == 0  # without the run: the sweeps' order
    provenance, table = triton_tuning.parse(table_path.read_text())
    assert all(TileConfig.parse(text, TileConfig(BV=128)).state_first for text in table.values())
    # the same runs saved as one tune-data folder write the same table from it, and say what wrote them
    folder = tmp_path / "tune-data"
    assert tuning_table.write_table([paths[0]], table_path, tuple(sweeps), [paths[1]], save_to=folder) == 0
    from_runs = triton_tuning.parse(table_path.read_text())
    assert tuning_table.write_table([folder], table_path) == 0
    assert triton_tuning.parse(table_path.read_text()) == from_runs
    assert tuning_table.recorded_command(table_path) == ["--write-table", str(folder)]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["command"].endswith(f"--over-table-runs {paths[1]} --save-tune-data {folder}") and "git" in meta
    with pytest.raises(ValueError, match="the folder holds the state order"):
        tuning_table.write_table([folder], table_path, tuple(sweeps))
