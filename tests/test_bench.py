"""The benchmark harness on the CPU: timers, rows, atomic files, and the sweep CLI end to end (with a
worker that segfaults and an implementation that is wrong or unsupported)."""

import itertools
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import REPO
from kda_impls.bench import timing
from kda_impls.bench.config import Config
from kda_impls.bench.measure import COLUMNS, measure
from kda_impls.bench.presets import PRESETS
from kda_impls.bench.results import atomic_write
from kda_impls.bench.timing import Budget, Timing, call_time, kernel_time, rotation_inputs, working_set_bytes

TESTS = Path(__file__).resolve().parent
SWEEP_IMPLS = "naive,misbehaves"
SMOKE_CONFIGS = len(PRESETS["smoke"].configs(["x"]))


def sweep(out: Path) -> subprocess.CompletedProcess:
    env = os.environ | {
        "KDA_EXTRA_IMPLS": "misbehaves=bench_impls:Misbehaves",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run([sys.executable, "scripts/sweep.py", "--preset", "smoke", "--device", "cpu",
                           "--impls", SWEEP_IMPLS, "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "smoke"
    done = sweep(out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done


def test_sweep_writes_results_meta_samples_and_charts(swept):
    out, done = swept
    table = pd.read_csv(out / "results.csv")
    assert list(table.columns) == COLUMNS
    assert len(table) == 2 * SMOKE_CONFIGS and table.key.is_unique
    naive = table[table.impl == "naive"]
    assert (naive.status == "ok").all(), naive[["key", "status", "reason"]]
    assert (naive.kernel_us_median > 0).all() and (naive.n_samples >= 1).all()
    assert (naive.kernel_us_p25 <= naive.kernel_us_median).all() and (naive.kernel_us_median <= naive.kernel_us_p75).all()
    assert (naive.err_out < 1e-2).all() and naive.first_call_ms.notna().all() and naive.call_us_median.notna().all()

    row = naive.iloc[0]
    cfg = Config(**{f: row[f] for f in ("impl", "B", "H", "HV", "K", "V", "slot_pad", "state_dtype", "pad_rows")})
    assert row.bytes == cfg.make_inputs("cpu").nbytes()
    assert math.isclose(row.gbps, row.bytes / (row.kernel_us_median * 1e-6) / 1e9, rel_tol=1e-9)
    assert math.isclose(row.floor_us, row.bytes / (row.copy_gbps * 1e9) * 1e6, rel_tol=1e-9)

    samples = json.loads((out / "samples.json").read_text())
    assert set(samples) == set(table.key)
    assert all(len(samples[r.key]) == r.n_samples for r in naive.itertuples())
    assert set(json.loads((out / "call_samples.json").read_text())) == set(table.key)

    meta = json.loads((out / "meta.json").read_text())
    assert meta["device"]["type"] == "cpu" and meta["copy_bandwidth_Bps"] > 0
    assert meta["settings"]["l2_cold"] is True and meta["versions"]["torch"] == torch.__version__
    assert set(meta["impls"]) == set(SWEEP_IMPLS.split(",")) and "sha" in meta["git"]
    assert "--preset smoke" in meta["command"] and len(meta["runs"]) >= 1

    for chart in ("latency", "bandwidth", "slot_padding"):  # speedup: no ok implementation beside naive
        for fmt in ("png", "svg"):
            assert (out / f"{chart}.{fmt}").stat().st_size > 1000, chart
    assert "wall time" in done.stdout and "naive" in done.stdout


def test_statuses_crashed_wrong_unsupported(swept):
    """The smoke preset measures misbehaves' rows in this order: bf16 unpadded pools (wrong), the
    padded pool (SIGSEGV), then fp32 state (unsupported), which only a fresh worker can answer."""
    table = pd.read_csv(swept[0] / "results.csv")
    rows = table[table.impl == "misbehaves"]
    crashed = rows[rows.slot_pad > 0]
    assert len(crashed) == 1 and crashed.status.iloc[0] == "crashed"
    assert "SIGSEGV" in crashed.reason.iloc[0] and crashed.kernel_us_median.isna().all()

    wrong = rows[(rows.slot_pad == 0) & (rows.state_dtype == "bfloat16")]
    assert len(wrong) == SMOKE_CONFIGS - 2 and (wrong.status == "wrong").all()
    assert wrong.reason.str.contains("output error").all() and (wrong.kernel_us_median > 0).all()

    unsupported = rows[rows.state_dtype == "float32"]
    assert len(unsupported) == 1 and unsupported.status.iloc[0] == "unsupported"
    assert "float32 not supported" in unsupported.reason.iloc[0] and unsupported.kernel_us_median.isna().all()
    assert (table[table.impl == "naive"].status == "ok").all()


def test_rerun_skips_finished_rows_and_measures_missing_ones(swept):
    out, _ = swept
    before = pd.read_csv(out / "results.csv")
    dropped = before[before.impl == "naive"].key.iloc[0]
    (out / "rows" / f"{dropped}.json").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "rows").glob("*.json")}

    done = sweep(out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(before) - 1} already in" in done.stdout and "1 to measure" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (out / "rows").glob("*.json") if p.name in kept} == kept
    after = pd.read_csv(out / "results.csv")
    assert set(after.key) == set(before.key)
    assert after.set_index("key").loc[dropped, "status"] == "ok"
    assert len(json.loads((out / "meta.json").read_text())["runs"]) == 2


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "results.csv"
    atomic_write(path, "old\n")

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, "new\n" * 1000)
    assert path.read_text() == "old\n"
    assert list(tmp_path.iterdir()) == [path]


def _rewrite_forever(path: Path, versions: list[str]) -> None:
    for text in itertools.cycle(versions):
        atomic_write(path, text)


def test_atomic_write_survives_sigkill(tmp_path):
    """A writer killed at random instants never leaves a partial file: each read is a whole version."""
    path = tmp_path / "table.csv"
    versions = ["a" * 4_000_000, "b" * 6_000_000]
    rng = np.random.default_rng(0)
    for _ in range(8):
        writer = mp.get_context("fork").Process(target=_rewrite_forever, args=(path, versions))
        writer.start()
        time.sleep(rng.uniform(0.01, 0.1))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        assert path.read_text() in versions


def test_timing_statistics():
    # skewed samples, shuffled, in which mean, median and each quartile differ; expected values are
    # worked out by hand (quartiles by linear interpolation between order statistics)
    t = Timing([10.0, 1.0, 2.0, 4.0, 7.0, 3.0, 100.0, 5.0], "perf_counter")  # mean 16.5
    assert (t.n, t.median, t.p25, t.p75) == (8, 4.5, 2.75, 7.75)
    assert t.median_ci() == (1.0, 100.0)  # n=8: only [x(1), x(8)] covers >= 95% (1 - 2/2^8)
    assert all(math.isnan(x) for x in Timing([5.0, 1.0, 3.0, 2.0, 4.0], "perf_counter").median_ci())  # 1 - 2/2^5 < 95%
    # the squares 1..400 (mean 143.5): median 110.5, p25 25 + .75*11, p75 225 + .25*31; 95% interval of
    # the median [x(6), x(15)] (P(Bin(20, 1/2) <= 5) = 0.021 <= 0.025 < P(<= 6)), whose farther end
    # lies 114.5 above the median: converged within 1.04, not within 1.03
    squares = Timing([float(k * k) for k in (7, 1, 20, 12, 3, 16, 9, 5, 18, 2, 14, 10, 6, 19, 4, 11, 15, 8, 13, 17)],
                     "perf_counter")
    assert (squares.median, squares.p25, squares.p75, squares.median_ci()) == (110.5, 33.25, 232.75, (36.0, 225.0))
    assert squares.converged(1.04) and not squares.converged(1.03)
    tight = Timing(list(1.0 + np.linspace(-1e-4, 1e-4, 50)), "perf_counter")
    lo, hi = tight.median_ci()
    assert lo <= tight.median <= hi and tight.converged(0.01)
    assert not Timing(list(np.linspace(0.5, 1.5, 50)), "perf_counter").converged(0.01)


def test_kernel_time_excludes_the_first_call():
    calls = []

    def launcher():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.001)  # the first call "compiles"

    t = kernel_time([launcher], "cpu", Budget(min_samples=3, max_samples=8, max_seconds=5, rel_ci=0.0))
    assert t.method == "perf_counter" and t.n == 8  # rel_ci=0 never converges: stops at max_samples
    assert len(calls) > t.n and 0.001 <= t.median < 0.02 and max(t.samples) < 0.05


def test_timers_stop_at_max_seconds():
    start = time.perf_counter()
    t = call_time(lambda: time.sleep(0.002), "cpu", Budget(min_samples=3, max_samples=10_000, max_seconds=0.1, rel_ci=0.0))
    assert time.perf_counter() - start < 1.0 and 3 <= t.n < 100 and t.method == "perf_counter"


def test_measure_records_contract_errors():
    row = measure(Config("naive", B=2, H=3, HV=4, K=8, V=8), "cpu", kernel_budget=Budget(1, 2, 0.01),
                  call_budget=Budget(1, 2, 0.01))
    assert row["status"] == "error" and "HV must be a multiple of H" in row["reason"]
    assert row["kernel_us_median"] is None and row["key"] == Config("naive", 2, 3, 4, 8, 8).key()


def test_rotation_covers_three_times_the_l2(monkeypatch):
    cfg = Config("naive", B=2, H=1, HV=2, K=16, V=16, slot_pad=4)
    assert len(rotation_inputs(cfg, "cpu")) == 1  # the CPU: one set
    monkeypatch.setattr(timing, "l2_bytes", lambda device: 100_000)
    sets = rotation_inputs(cfg, "cpu")
    per_set = working_set_bytes(sets[0])
    assert len(sets) == math.ceil(3 * 100_000 / per_set) and len(sets) * per_set >= 300_000
    assert len({x.state.data_ptr() for x in sets}) == len(sets)  # independent pools
    assert all(x.N == cfg.B and x.slot_stride == 2 * 16 * 16 + 4 for x in sets)
    assert len(rotation_inputs(cfg, "cpu", l2_cold=False)) == 1
    monkeypatch.setattr(timing, "l2_bytes", lambda device: 1)  # one set would cover it: still two pools
    assert len(rotation_inputs(cfg, "cpu")) == 2


def test_config_key_and_batch_scaling():
    cfg = Config("triton", B=64, H=16, HV=32, K=128, V=128, slot_pad=16, state_dtype="float32", pad_rows=8)
    assert cfg.key() == "triton_B64_H16_HV32_K128_V128_slotpad16_float32_padrows8"
    assert cfg.at_batch(8).pad_rows == 1 and cfg.at_batch(1).pad_rows == 0
    assert Config("naive", 4, 1, 1, 8, 8, pad_rows=4).at_batch(2).pad_rows == 2
    x = cfg.at_batch(4).make_inputs("cpu")
    assert x.state.dtype == torch.float32 and x.slot_stride == 32 * 128 * 128 + 16 and int((x.slots < 0).sum()) == 1


def test_presets():
    impls = ["naive", "triton"]
    for preset in PRESETS.values():
        configs = preset.configs(impls)
        assert configs and len({c.key() for c in configs}) == len(configs)
        assert all(c.pad_rows <= c.B for c in configs)
    kimi = PRESETS["kimi-linear-48b"].configs(["naive"])
    assert len(kimi) == 10 * 3 * 2 and {c.B for c in kimi} == {2**i for i in range(10)}
    assert {(c.H, c.HV, c.K, c.V) for c in kimi} == {(32, 32, 128, 128)}
    assert all(c.H < c.HV for c in PRESETS["gva"].configs(["naive"]))
    assert {c.HV for c in PRESETS["shapes"].configs(["naive"])} == {16, 32, 64}
    assert len(PRESETS["full"].configs(["naive"])) > len(kimi)


def test_rotation_pools_can_hold_more_slots_than_rows():
    cfg = Config("naive", B=3, H=1, HV=2, K=16, V=16)
    sets = rotation_inputs(cfg, "cpu", pool_slots_per_row=4)
    assert [x.N for x in sets] == [12]
    assert sets[0].slots.unique().numel() == 3 and int(sets[0].slots.max()) < 12


def test_rotation_pools_can_name_their_slots_in_order():
    cfg = Config("naive", B=5, H=1, HV=2, K=16, V=16)
    dense, sparse = (rotation_inputs(cfg, "cpu", pool_slots_per_row=n, sorted_slots=True)[0] for n in (1, 3))
    assert dense.slots.tolist() == list(range(5))
    assert sparse.slots.tolist() == sorted(sparse.slots.tolist()) and sparse.slots.unique().numel() == 5
    shuffled = rotation_inputs(cfg, "cpu")[0].slots.tolist()
    assert sorted(shuffled) == list(range(5)) and shuffled != list(range(5))


def test_the_stated_commit_wins_over_a_stale_checkout(monkeypatch, tmp_path):
    """On a lent GPU box the tree may come with an old .git: KDA_GIT_SHA, when set, is the record."""
    from kda_impls.bench.results import git_state

    monkeypatch.delenv("KDA_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # this checkout's own history
        assert git_state(tmp_path)["sha"] == head.stdout.strip()
    monkeypatch.setenv("KDA_GIT_SHA", "f" * 40)
    monkeypatch.setenv("KDA_GIT_DIRTY", "0")
    assert git_state(tmp_path) == {"sha": "f" * 40, "dirty": False, "source": "environment (KDA_GIT_SHA, KDA_GIT_DIRTY)"}
