"""scripts.gate.validate_gate without a GPU: the planted slowdown comes from the committed tune, the
sweep form's checks pass an A/A triple and a caught slowdown and fail a missed one, and the asv
form's --max-runs stops before a run it may not start."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import numpy as np
import pandas as pd

from helpers import REPO, asv_env, in_process, write_sweep_dir
from kda_impls.bench.config import Config
from scripts.gate import validate_gate

TRITON = [Config("triton", B, 32, 32, 128, 128) for B in (64, 256)]
FLA = Config("fla", 64, 32, 32, 128, 128)
TUNE_ROWS = REPO / validate_gate.TUNE_ROWS  # the committed tune runs


def test_planted_slowdown_is_a_tuned_config_5_to_10_percent_slower():
    config, ratios = validate_gate.planted_config(TUNE_ROWS)
    assert config.startswith("BV=") and (ratios.B >= 64).all()
    # at least one point 5-10% slower (the committed tune runs give the table's bf16 B = 256 entry no
    # ratio: validate_gate.TUNE_CSVS), and the points called in range are those
    assert ratios.in_range.sum() >= 1 and ratios.ratio.between(1.05, 1.10).sum() == ratios.in_range.sum()
    assert (ratios.ratio > 1.0).all() and ratios.ratio.max() < 1.2  # small, not a 4x one


def test_planted_and_sweep_forms_run_without_asv(monkeypatch):
    """A bare GPU box has no asv (nor its json5): the planted config must still print there, or the
    planted run silently times the table."""
    monkeypatch.setitem(sys.modules, "json5", None)  # any import of it fails
    monkeypatch.delitem(sys.modules, "scripts.gate.validate_gate")
    bare = importlib.import_module("scripts.gate.validate_gate")
    assert bare.planted_config(TUNE_ROWS)[0] == validate_gate.planted_config(TUNE_ROWS)[0]


def run_dir(path, seed: int, triton_scale=(1.0, 1.0)):
    rng = np.random.default_rng(seed)
    rows = {}
    for cfg, scale in zip(TRITON, triton_scale, strict=True):
        rows[cfg] = list(scale * 40.0 * rng.lognormal(0, 0.005, 60))
    rows[FLA] = list(60.0 * rng.lognormal(0, 0.005, 60))
    out = write_sweep_dir(path, rows, {"gpu": "NVIDIA H200"})
    table = pd.read_csv(out / "results.csv")
    table["kernel_us_placement_min"] = table.kernel_us_mean * 0.995
    table["kernel_us_placement_max"] = table.kernel_us_mean * 1.005
    table.to_csv(out / "results.csv", index=False)
    return out


def evaluate(tmp_path, slow_scale, process: bool = False):
    """The sweep form on three A runs and a slow one (``process``: scripts.gate.validate_gate in its own
    process, else its main here): the command's result and its summary."""
    runs = [run_dir(tmp_path / f"a{i}", i) for i in (1, 2, 3)]
    slow = run_dir(tmp_path / "slow", 9, slow_scale)
    return gate_sweeps(tmp_path / "gate", runs, slow, process)


def gate_sweeps(out, runs, slow, process: bool = False):
    args = ["sweep", str(out), *map(str, runs), str(slow)]
    if process:
        done = subprocess.run([sys.executable, "-m", "scripts.gate.validate_gate", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    else:
        done = in_process(validate_gate.main, *args)
    return done, json.loads((out / "summary.json").read_text())


def test_sweep_form_passes_a_caught_slowdown(tmp_path):
    done, summary = evaluate(tmp_path, (1.07, 1.03), process=True)
    assert done.returncode == 0 and summary["ok"], done.stdout + done.stderr
    assert all(pair["exit"] == 0 and not pair["slower"] for pair in summary["aa"].values())
    assert summary["planted_must_flag"] == 1 and summary["slow"]["missed"] == []
    assert summary["slow"]["triton_ratios"][TRITON[1].key()][1] == "same"  # 3%: under the threshold
    # the runs' own spread, the criterion of three runs of one commit (B >= 16: every benchmark here)
    spread = pd.read_csv(tmp_path / "gate" / "spread.csv", index_col="benchmark").max_over_min - 1
    assert summary["run_to_run"]["benchmarks"] == 3 and summary["run_to_run"]["within"] == (spread <= 0.02).sum()
    assert summary["run_to_run"]["largest_per_impl"]["fla"] == round(spread[FLA.key()], 4)


def test_sweep_form_fails_when_the_gate_misses_a_slowdown(tmp_path):
    """A 7% slowdown whose placement spreads overlap by more than 5% is unsure, not slower: the
    validation must say the gate missed it."""
    done, summary = evaluate(tmp_path / "wide", (1.07, 1.0))
    assert summary["ok"]
    slow = tmp_path / "wide" / "slow"
    runs = [tmp_path / "wide" / f"a{i}" for i in (1, 2, 3)]
    for directory in (slow, runs[0]):  # both sides' placements now range over +-10%
        table = pd.read_csv(directory / "results.csv")
        table["kernel_us_placement_min"] = table.kernel_us_mean * 0.9
        table["kernel_us_placement_max"] = table.kernel_us_mean * 1.1
        table.to_csv(directory / "results.csv", index=False)
    done, summary = gate_sweeps(tmp_path / "g2", runs, slow)
    assert done.returncode == 1 and not summary["ok"] and summary["slow"]["missed"] == [TRITON[0].key()]


def test_asv_form_max_runs_stops_before_a_run_it_may_not_start(tmp_path, monkeypatch):
    for name, value in asv_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KDA_GIT_SHA", raising=False)
    done = in_process(validate_gate.main, "asv", str(tmp_path / "out"), "--machine", "cpu-ci", "--max-runs", "0",
                      "--profile", "cpu")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "--max-runs 0 reached before run a1" in done.stdout
    assert not (tmp_path / "out" / "a1.log").exists()


def test_planted_slowdown_reads_each_point_from_its_last_tune_run(tmp_path):
    """Two tune runs of the same points, as the committed table is written from: the config that
    was 7% slower in the first run and 30% in the second is not planted; the last run decides."""
    import torch

    from kda_impls.impls.triton.tiles import choose_config

    shape = validate_gate.PLANTED_SHAPE
    chosen = {B: str(choose_config(torch.bfloat16, B=B, **shape)) for B in (64, 256)}
    other, planted = "BV=2,num_warps=1", "BV=1,num_warps=1"

    def run(path, rows):
        pd.DataFrame([dict(state_dtype="bfloat16", B=B, config=c, us=us, status="ok", slot_pad=0,
                           source="candidate", **shape) for B, c, us in rows]).to_csv(path, index=False)
        return path

    first = run(tmp_path / "first.csv", [(B, c, us) for B in (64, 256)
                                         for c, us in ((chosen[B], 10.0), (other, 10.7))])
    last = run(tmp_path / "last.csv", [(B, c, us) for B, planted_us in ((64, 10.6), (256, 10.3))
                                       for c, us in ((chosen[B], 10.0), (other, 13.0), (planted, planted_us))])
    config, ratios = validate_gate.planted_config(tune_csvs=[first, last])
    assert config.startswith("BV=1,") and list(ratios.ratio.round(2)) == [1.06, 1.03]


def test_run_to_run_counts_kernel_times_at_b16_and_up():
    """Three runs' criterion: B = 1 (which may move more) and call time are left out; asv names and
    sweep keys alike."""
    one_row, big = Config("triton", 1, 32, 32, 128, 128).key(), Config("fla", 256, 32, 32, 128, 128).key()
    asv = "decode.KernelTime.track_kernel('fla', 64, 'HV32-K128-V128', 0, 'bfloat16', 1)"
    call = "decode.CallTime.track_call('fla', 64)"
    table = pd.DataFrame({"max_over_min": [1.06, 1.01, 1.03, 1.5]}, index=[one_row, big, asv, call])
    result = validate_gate.run_to_run(table)
    assert result["benchmarks"] == 2 and result["within"] == 1 and result["largest_per_impl"] == {"fla": 0.03}
