"""The benchmark harness on the CPU: configurations and pool layouts, the case runner, timers
(placements, L2 entry states, budgets), clocks, atomic files, and a sweep end to end (with a worker
that segfaults and an implementation that is wrong or unsupported)."""

import contextlib
import itertools
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import REPO, SWEEP, in_process, once
from kda_impls import make_inputs, registry
from kda_impls.bench import case, clocks, driver, l2, timing
from kda_impls.bench import sweep as sweep_module
from kda_impls.bench.case import COLUMNS, Method, run_case
from kda_impls.bench.config import Config, PoolLayout
from kda_impls.bench.l2 import rotation_plan, working_set_bytes
from kda_impls.bench.presets import PRESETS, adhoc_configs
from kda_impls.bench.results import PROVENANCE, atomic_write
from kda_impls.bench.spec import SettingError, SweepSpec
from kda_impls.bench.timing import Budget, Timing, call_time, kernel_time

TESTS = Path(__file__).resolve().parent
SWEEP_IMPLS = "naive,misbehaves"
SMOKE_CONFIGS = len(PRESETS["smoke"].configs(["x"]))
QUICK = Method(kernel=Budget(1, 4, 0.05), call=Budget(1, 2, 0.01))


SWEEP_ARGS = ["--preset", "smoke", "--devices", "cpu", "--impls", SWEEP_IMPLS]
SWEEP_ENV = {"KDA_EXTRA_IMPLS": "misbehaves=bench_impls:Misbehaves",
             "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}


def sweep(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SWEEP, *SWEEP_ARGS, "--out", str(out), *extra],
                          cwd=REPO, env=os.environ | SWEEP_ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def swept(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The smoke preset swept once (helpers.once) for naive and misbehaves: its directory (to read, or
    to copy and change) and its process."""
    def make(directory: Path) -> dict:
        done = sweep(directory / "smoke")
        return {"args": done.args, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    made = once(tmp_path_factory, "smoke-sweep", make)
    done = subprocess.CompletedProcess(made["args"], made["returncode"], made["stdout"], made["stderr"])
    assert done.returncode == 1, done.stdout + done.stderr  # misbehaves' wrong and crashed rows fail it
    return Path(made["args"][made["args"].index("--out") + 1]), done


def test_sweep_writes_results_meta_samples_and_charts(swept):
    out, done = swept
    table = pd.read_csv(out / "results.csv")
    assert list(table.columns) == [*COLUMNS, *PROVENANCE]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert (table.commit == head).all() and table.dirty.isin([True, False]).all()
    ran = table[table.fingerprint.notna()]  # a row whose worker died records nothing of its code
    assert set(ran.impl) == {"naive", "misbehaves"} and ran.fingerprint.str.fullmatch("[0-9a-f]{12}").all()
    row = json.loads((out / "rows" / f"{ran.key.iloc[0]}.json").read_text())
    files = set(row["measured_by"]["files"])  # the package's modules the worker loaded, and their data files
    assert {"kda_impls/contract.py", "kda_impls/impls/naive.py"} <= files
    assert "kda_impls/impls/triton/tuning.json" not in files  # our kernel's table decides no naive row
    assert len(table) == 2 * SMOKE_CONFIGS and table.key.is_unique
    naive = table[table.impl == "naive"]
    assert (naive.status == "ok").all(), naive[["key", "status", "reason"]]
    assert (naive.kernel_us_mean > 0).all() and (naive.n_samples >= 1).all()
    assert (naive.kernel_us_placement_min <= naive.kernel_us_mean).all()
    assert (naive.kernel_us_mean <= naive.kernel_us_placement_max).all()
    assert (naive.placements == 1).all() and (naive.l2_entry == "none").all()
    assert (naive.device == "cpu").all() and naive.host.notna().all()
    assert (naive.row_s > 0).all() and pd.to_datetime(naive.started_utc).notna().all()
    assert (naive.err_out < 1e-2).all() and naive.first_call_ms.notna().all() and naive.call_us_median.notna().all()

    row = naive.iloc[0]
    cfg = Config.from_columns(row.to_dict())
    assert cfg.key() == row.key
    assert row.bytes == cfg.make_inputs("cpu").nbytes()
    assert math.isclose(row.gbps, row.bytes / (row.kernel_us_mean * 1e-6) / 1e9, rel_tol=1e-9)
    assert math.isclose(row.floor_us, row.bytes / (row.copy_gbps * 1e9) * 1e6, rel_tol=1e-9)

    samples = json.loads((out / "samples.json").read_text())
    assert set(samples) == set(table.key)
    assert all(x == round(x, 4) for values in samples.values() for x in values)  # 0.1 ns: a repo-sized file
    assert all(len(samples[r.key]) == r.n_samples for r in naive.itertuples())
    assert set(json.loads((out / "call_samples.json").read_text())) == set(table.key)
    placements = json.loads((out / "placements.json").read_text())  # what the gate's placement test reads
    assert all(len(placements[r.key]) == r.placements_timed for r in naive.itertuples())

    meta = json.loads((out / "meta.json").read_text())
    assert meta["device"]["type"] == "cpu" and meta["copy_bandwidth_Bps"] > 0
    assert meta["settings"]["method"]["entry"] == l2.DEFAULT_ENTRY
    assert meta["settings"]["method"]["version"] == timing.METHOD_VERSION  # what the gate compares
    assert meta["settings"]["device_type"] == "cpu" and meta["versions"]["torch"] == torch.__version__
    assert set(meta["impls"]) == set(SWEEP_IMPLS.split(",")) and "sha" in meta["git"]
    assert "--preset smoke" in meta["command"] and len(meta["runs"]) >= 1
    # the KDA_* variables the run saw (KDA_TRITON_CONFIG would change every Triton row unseen)
    assert meta["environment"]["KDA_EXTRA_IMPLS"] == "misbehaves=bench_impls:Misbehaves"
    assert meta["runs"][-1]["environment"] == meta["environment"]

    for chart in ("latency", "bandwidth", "slot_padding"):  # speedup: no ok implementation beside naive
        for fmt in ("png", "svg"):
            assert (out / f"{chart}.{fmt}").stat().st_size > 1000, chart
    assert "wall time" in done.stdout and "naive" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines() if str(out) not in line) <= 120
    summary = done.stderr.strip().splitlines()[-1]  # the verdict: one line of counts
    assert summary == (f"kda-sweep: 3 of {2 * SMOKE_CONFIGS} rows failed ({SMOKE_CONFIGS} ok, 2 wrong, "
                       "4 unsupported, 1 crashed); their reasons are above"), summary


def test_frozen_verify_rows_store_nothing_and_move_one_state_read(swept):
    """The smoke preset's frozen-verify row: its own key and mode, measured on frozen inputs, whose
    bytes are each live row's state read once (no write) beside the in-place row of the same T."""
    table = pd.read_csv(swept[0] / "results.csv")
    naive = table[(table.impl == "naive") & (table["T"] == 2) & (table.checkpoints == "all")]
    frozen, inplace = (naive[naive["mode"] == mode].iloc[0] for mode in ("frozen", "inplace"))
    assert frozen.status == "ok" and "_T2frozen_" in frozen.key and "_T2all_" in inplace.key
    cfg = Config.from_columns(frozen.to_dict())
    assert cfg.mode == "frozen" and not cfg.make_inputs("cpu").update_state
    state = cfg.B * cfg.HV * cfg.V * cfg.K * 2  # bf16: one state per row
    assert frozen.bytes == cfg.make_inputs("cpu").nbytes() < inplace.bytes - cfg.T * state
    misbehaves = table[(table.impl == "misbehaves") & (table["mode"] == "frozen")]
    assert misbehaves.status.tolist() == ["unsupported"] and "update_state=False" in misbehaves.reason.iloc[0]


def test_result_files_get_the_permissions_of_plain_files(swept):
    out, _ = swept
    mode = 0o666 & ~_umask()
    for name in ("results.csv", "meta.json", "samples.json", "latency.png"):
        assert (out / name).stat().st_mode & 0o777 == mode, name


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_statuses_crashed_wrong_unsupported(swept):
    """The smoke preset measures misbehaves' rows in this order: bf16 unpadded pools (wrong), the
    padded pool (SIGSEGV), then fp32 state and multi-token steps (unsupported), which only a fresh
    worker can answer."""
    table = pd.read_csv(swept[0] / "results.csv")
    rows = table[table.impl == "misbehaves"]
    crashed = rows[rows.slot_pad > 0]
    assert len(crashed) == 1 and crashed.status.iloc[0] == "crashed"
    assert "SIGSEGV" in crashed.reason.iloc[0] and crashed.kernel_us_mean.isna().all()

    wrong = rows[(rows.slot_pad == 0) & (rows.state_dtype == "bfloat16") & (rows["T"] == 1)]
    assert len(wrong) == SMOKE_CONFIGS - 5 and (wrong.status == "wrong").all()
    assert wrong.reason.str.contains("output error").all() and (wrong.kernel_us_mean > 0).all()

    unsupported = rows[(rows.state_dtype == "float32") | (rows["T"] > 1)]
    assert len(unsupported) == 4 and (unsupported.status == "unsupported").all()
    assert unsupported.kernel_us_mean.isna().all()
    assert "float32 not supported" in unsupported[unsupported.state_dtype == "float32"].reason.iloc[0]
    multi_token = unsupported[(unsupported["T"] > 1) & (unsupported["mode"] == "inplace")]
    assert len(multi_token) == 2 and multi_token.reason.str.contains("multi-token decode").all()
    assert (table[table.impl == "naive"].status == "ok").all()


def test_rerun_keeps_ok_rows_of_this_code_and_measures_the_rest(swept, tmp_path):
    """A resumed run keeps the ok rows that the code of now measures the same way, and measures again
    the missing ones, those that were not ok and those another version of the code measured, naming
    the file that differs (of naive's rows in a copy of the smoke sweep, one deleted, one marked wrong,
    one recorded as measured by another contract.py; misbehaves' rows are outside the rerun's grid and
    stay as they are)."""
    out = shutil.copytree(swept[0], tmp_path / "smoke")
    before = pd.read_csv(out / "results.csv")
    naive = before[before.impl == "naive"].key
    dropped, failed, stale = naive.iloc[0], naive.iloc[1], naive.iloc[2]
    (out / "rows" / f"{dropped}.json").unlink()
    for key in (failed, stale):
        row = json.loads((out / "rows" / f"{key}.json").read_text())
        row["measured_by"]["files"]["kda_impls/contract.py"] = "0" * 16
        change = {"status": "wrong"} if key == failed else {"measured_by": row["measured_by"]}
        (out / "rows" / f"{key}.json").write_text(json.dumps(row | change))
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "rows").glob("*.json") if p.stem not in (failed, stale)}

    rerun = ["--preset", "smoke", "--devices", "cpu", "--impls", "naive", "--no-charts", "--out", str(out)]
    dry = in_process(sweep_module.main, *rerun, "--dry-run", "--fresh")  # measures nothing, writes nothing
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"0 kept, {SMOKE_CONFIGS} to measure (1 new, {SMOKE_CONFIGS - 1} fresh)" in dry.stdout, dry.stdout
    assert "about" in dry.stdout and len(list((out / "rows").glob("*.json"))) == len(before) - 1
    done = subprocess.run([*SWEEP, *rerun], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{SMOKE_CONFIGS - 3} kept, 3 to measure (1 new, 1 not ok, 1 other code)" in done.stdout, done.stdout
    assert f"measured again, other code: contract.py changed: {stale}" in done.stdout, done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (out / "rows").glob("*.json") if p.name in kept} == kept
    after = pd.read_csv(out / "results.csv").set_index("key")
    assert set(after.index) == set(before.key) and after.loc[[dropped, failed, stale], "status"].eq("ok").all()
    remeasured = json.loads((out / "rows" / f"{stale}.json").read_text())["measured_by"]["files"]
    assert remeasured["kda_impls/contract.py"] != "0" * 16  # what measured it now: the contract.py that is here
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


def test_the_median_interval_is_scipys_quantile_test_at_every_sample_count():
    """stats.median_ci sums the binomial CDF itself (scipy.stats costs every timing process a second to
    import): the same order statistics as scipy's quantile_test, NaN where it has none."""
    from scipy import stats as scipy_stats

    from kda_impls.bench.stats import median_ci

    rng = np.random.default_rng(3)
    for n in [*range(1, 130), 599, 600, 1000]:
        samples = rng.lognormal(size=n)
        for confidence in (0.9, 0.95, 0.99):
            ci = scipy_stats.quantile_test(samples, p=0.5).confidence_interval(confidence)
            np.testing.assert_array_equal(median_ci(samples, confidence), (ci.low, ci.high), err_msg=f"n={n}")


def test_timing_statistics():
    # skewed samples, shuffled, in which mean, median and each quartile differ; expected values are
    # worked out by hand (quartiles by linear interpolation between order statistics)
    t = Timing([10.0, 1.0, 2.0, 4.0, 7.0, 3.0, 100.0, 5.0], "perf_counter")  # mean 16.5
    assert (t.n, t.time, t.p25, t.p75) == (8, 4.5, 2.75, 7.75)
    assert t.median_ci() == (1.0, 100.0)  # n=8: only [x(1), x(8)] covers >= 95% (1 - 2/2^8)
    assert all(math.isnan(x) for x in Timing([5.0, 1.0, 3.0, 2.0, 4.0], "perf_counter").median_ci())  # 1 - 2/2^5 < 95%
    # the squares 1..400 (mean 143.5): median 110.5, p25 25 + .75*11, p75 225 + .25*31; 95% interval of
    # the median [x(6), x(15)] (P(Bin(20, 1/2) <= 5) = 0.021 <= 0.025 < P(<= 6)), whose farther end
    # lies 114.5 above the median: converged within 1.04, not within 1.03
    squares = Timing([float(k * k) for k in (7, 1, 20, 12, 3, 16, 9, 5, 18, 2, 14, 10, 6, 19, 4, 11, 15, 8, 13, 17)],
                     "perf_counter")
    assert (squares.time, squares.p25, squares.p75, squares.median_ci()) == (110.5, 33.25, 232.75, (36.0, 225.0))
    assert squares.converged(1.04) and not squares.converged(1.03)
    tight = Timing(list(1.0 + np.linspace(-1e-4, 1e-4, 50)), "perf_counter")
    lo, hi = tight.median_ci()
    assert lo <= tight.time <= hi and tight.converged(0.01)
    assert not Timing(list(np.linspace(0.5, 1.5, 50)), "perf_counter").converged(0.01)


def _sleeper(calls: list, first_s: float = 0.05, then_s: float = 0.001):
    def launcher():
        calls.append(1)
        time.sleep(first_s if len(calls) == 1 else then_s)  # the first call "compiles"
    return launcher


def test_kernel_time_excludes_the_first_call():
    calls = []
    launcher = _sleeper(calls)
    t = kernel_time(lambda p: None, lambda x: launcher, "cpu",
                    Budget(min_samples=3, max_samples=8, max_seconds=5, rel_ci=0.0))
    assert t.method == "perf_counter" and t.n == 8  # rel_ci=0 never converges: stops at max_samples
    assert len(calls) > t.n and 0.001 <= t.time < 0.02 and max(t.samples) < 0.05
    assert t.entry == "none" and t.input_sets == 1


def test_placements_each_get_fresh_inputs_and_a_share_of_the_budget():
    """Placement p draws its inputs with make(p); the kernel time is the median of the placements'
    medians, not of the pooled samples; each placement stops at its share of max_samples."""
    drawn, speeds = [], {0: 0.002, 1: 0.020, 2: 0.008}  # 4x apart: a loaded machine oversleeps by ms

    def make(p):
        drawn.append(p)
        return p

    def bind(p):
        return lambda: time.sleep(speeds[p])

    t = kernel_time(make, bind, "cpu", Budget(min_samples=3, max_samples=12, max_seconds=5, rel_ci=0.0),
                    placements=3)
    assert drawn == [0, 1, 2] and len(t.placement_medians) == 3 and t.n == 12
    order = np.argsort(t.placement_medians).tolist()
    assert order == [0, 2, 1]  # the placements' own speeds, each timed on its own inputs
    assert t.time == pytest.approx(float(np.mean(t.placement_medians)))
    assert t.placement_min == min(t.placement_medians) and t.placement_max == max(t.placement_medians)
    # the mean over placements of each one's median: not the pooled samples' median, nor the
    # placements' median (which jumps between clusters of placements)
    mixed = Timing([1.0, 1.0, 1.0, 2.0, 9.0, 9.5], "perf_counter", placement_medians=[1.0, 1.1, 9.2])
    assert mixed.time == pytest.approx(11.3 / 3) and float(np.median(mixed.samples)) == 1.5
    assert Timing([3.0, 1.0, 2.0], "perf_counter").time == 2.0  # one placement: its samples' median


def test_budget_share_and_validation():
    share = Budget(min_samples=10, max_samples=100, max_seconds=0.3).share(3)
    assert (share.min_samples, share.max_samples) == (4, 34) and math.isclose(share.max_seconds, 0.1)
    with pytest.raises(ValueError, match="min_samples <= max_samples"):
        Budget(min_samples=5, max_samples=2)
    with pytest.raises(ValueError, match="max_seconds"):
        Budget(max_seconds=0)


def test_timers_stop_at_max_seconds():
    start = time.perf_counter()
    t = call_time(lambda: time.sleep(0.002), "cpu",
                  Budget(min_samples=3, max_samples=10_000, max_seconds=0.1, rel_ci=0.0))
    assert time.perf_counter() - start < 1.0 and 3 <= t.n < 100 and t.method == "perf_counter"


def test_rotation_plan_by_entry_state(monkeypatch):
    x = Config("naive", B=2, H=1, HV=2, K=16, V=16, slot_pad=4).make_inputs("cpu")
    per_set = working_set_bytes(x)
    assert per_set == x.pool_span().nbytes + sum(t.nbytes for n, t in x.tensors().items() if n != "state")
    assert rotation_plan("previous-step", x, "cpu") == ("none", 1)  # the CPU's caches: not modelled
    monkeypatch.setattr(l2, "as_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(l2, "l2_bytes", lambda device: 100 * per_set)  # 3 L2s = 300 sets: over the cap
    assert rotation_plan("previous-step", x, "cuda") == ("dirty", 1)
    monkeypatch.setattr(l2, "l2_bytes", lambda device: 85 * per_set)  # 255 sets: under it
    assert rotation_plan("previous-step", x, "cuda") == ("previous-step", 255)
    monkeypatch.setattr(l2, "l2_bytes", lambda device: 2 * per_set)
    assert rotation_plan("previous-step", x, "cuda") == ("previous-step", 6)
    monkeypatch.setattr(l2, "l2_bytes", lambda device: per_set // 10)  # tiny L2: still two pools
    assert rotation_plan("previous-step", x, "cuda") == ("previous-step", l2.MIN_INPUT_SETS)
    for entry in ("clean", "dirty", "hot"):
        assert rotation_plan(entry, x, "cuda") == (entry, 1)


def test_entry_states_are_named():
    with pytest.raises(ValueError, match="unknown L2 entry state 'warm'"):
        l2.entry_op("warm", "cpu")
    with pytest.raises(ValueError, match="unknown L2 entry state"):
        Method(entry="warm")
    assert l2.entry_op("clean", "cpu") is None and l2.DEFAULT_ENTRY in l2.ENTRY_STATES


def test_run_case_records_contract_errors():
    cfg = Config("naive", B=2, H=3, HV=4, K=8, V=8)
    row = run_case(cfg, "cpu", QUICK)
    assert row["status"] == "error" and "HV must be a multiple of H" in row["reason"]
    assert row["kernel_us_mean"] is None and row["key"] == cfg.key()


def test_run_case_without_a_method_only_checks():
    row = run_case(Config("naive", B=3, H=1, HV=2, K=16, V=16, pad_rows=1), "cpu")
    assert row["status"] == "ok" and row["err_out"] < 1e-2 and row["first_call_ms"] > 0
    assert row["kernel_us_mean"] is None and row["call_us_median"] is None and row["kernel_samples_us"] == []


def test_run_case_hands_the_method_settle_time_to_the_kernel_timer(monkeypatch):
    seen = {}

    def kernel_time(*args, settle_s, **kwargs):
        seen["settle_s"] = settle_s
        return Timing([1e-6], "perf_counter", [1e-6])

    monkeypatch.setattr(case, "kernel_time", kernel_time)
    row = run_case(Config("naive", B=2, H=1, HV=1, K=16, V=16), "cpu", replace(QUICK, settle_s=0.25))
    assert row["status"] == "ok" and seen == {"settle_s": 0.25}


def test_run_case_times_over_the_layouts_placements():
    cfg = Config("naive", B=3, H=1, HV=2, K=16, V=16, layout=PoolLayout(placements=2))
    row = run_case(cfg, "cpu", QUICK)
    assert row["status"] == "ok" and len(row["kernel_placement_us"]) == 2 == row["placements_timed"]  # none added
    assert row["kernel_us_placement_min"] <= row["kernel_us_mean"] <= row["kernel_us_placement_max"]
    assert row["retimed"] is False and row["throttled"] is None and row["l2_entry"] == "none"
    assert row["bytes"] == cfg.make_inputs("cpu").nbytes()


class Throttled:
    """A clock monitor that reports a power cap during the first timing only."""

    timings = 0

    def __init__(self, device):
        pass

    def __enter__(self):
        Throttled.timings += 1
        return self

    def __exit__(self, *exc):
        return None

    def summary(self):
        first = Throttled.timings == 1
        return dict.fromkeys(clocks.COLUMNS) | {"throttled": first, "throttle_reasons": "sw-power-cap" if first else ""}


def test_a_row_timed_while_throttled_is_timed_again(monkeypatch):
    monkeypatch.setattr(case.clocks, "ClockMonitor", Throttled)
    Throttled.timings = 0
    row = run_case(Config("naive", B=2, H=1, HV=2, K=16, V=16), "cpu", QUICK)
    assert Throttled.timings == 2 and row["retimed"] is True and row["throttled"] is False
    Throttled.timings = 0
    row = run_case(Config("naive", B=2, H=1, HV=2, K=16, V=16), "cpu", replace(QUICK, retime_throttled=False))
    assert Throttled.timings == 1 and row["retimed"] is False and row["throttled"] is True


def test_clock_summary_flags_slowdown_reasons_only():
    monitor = clocks.ClockMonitor("cpu")
    assert monitor.handle is None and monitor.summary() == dict.fromkeys(clocks.COLUMNS)
    idle_and_app_clocks = 0x1 | 0x2
    monitor.readings = [(1980, 3201, 400.0, 50, idle_and_app_clocks), (1755, 3201, 690.0, 61, 0x0)]
    summary = monitor.summary()
    assert summary["throttled"] is False and summary["throttle_reasons"] == ""
    assert (summary["sm_mhz_min"], summary["power_w_max"], summary["temp_c_max"]) == (1755, 690.0, 61)
    monitor.readings.append((1335, 3201, 700.0, 62, 0x4 | 0x20))
    summary = monitor.summary()
    assert summary["throttled"] is True and summary["throttle_reasons"] == "sw-power-cap+sw-thermal"
    assert summary["sm_mhz_min"] == 1335 and summary["sm_mhz_median"] == 1755
    assert clocks.gpu_limits("cpu") == {}


def test_config_key_layout_and_inputs():
    layout = PoolLayout(slots_per_row=2, slot_order="sorted", placements=5)
    cfg = Config("triton", B=64, H=16, HV=32, K=128, V=128, state_dtype="float32", pad_rows=8, slot_pad=16,
                 layout=layout)
    assert cfg.key() == "triton_B64_H16_HV32_K128_V128_T1_float32_padrows8_slotpad16_spr2_sorted_pl5"
    assert replace(cfg, T=4, checkpoints="last").key().startswith("triton_B64_H16_HV32_K128_V128_T4last_float32")
    assert replace(cfg, checkpoints="last").checkpoints == "all"  # one token: one spelling
    assert Config.from_columns(cfg.columns() | {"status": "ok"}) == cfg
    x = replace(cfg, B=4, pad_rows=1).make_inputs("cpu")
    assert x.state.dtype == torch.float32 and x.slot_stride == 32 * 128 * 128 + 16 and int((x.slots < 0).sum()) == 1
    assert x.N == 8 and x.slots[x.slots >= 0].tolist() == sorted(x.slots[x.slots >= 0].tolist())
    for bad, match in ((dict(slots_per_row=0), "slots_per_row"), (dict(slot_order="shuffled"), "slot_order"),
                       (dict(placements=0), "placements")):
        with pytest.raises(ValueError, match=match):
            PoolLayout(**bad)
    with pytest.raises(ValueError, match="slot_pad"):
        replace(cfg, slot_pad=-1)


def test_timed_pools_follow_the_layout_and_the_check_gets_spare_slots():
    cfg = Config("naive", B=5, H=1, HV=2, K=16, V=16)
    dense = replace(cfg, layout=PoolLayout(slot_order="sorted")).make_inputs("cpu")
    assert dense.N == 5 and dense.slots.tolist() == list(range(5))
    sparse = replace(cfg, layout=PoolLayout(slots_per_row=3, slot_order="sorted")).make_inputs("cpu")
    assert sparse.N == 15 and sparse.slots.tolist() == sorted(sparse.slots.tolist())
    assert sparse.slots.unique().numel() == 5
    shuffled = cfg.make_inputs("cpu").slots.tolist()
    assert sorted(shuffled) == list(range(5)) and shuffled != list(range(5))
    assert cfg.make_inputs("cpu", timed=False).N == 10  # untouched slots for verify to check


def test_presets():
    impls = ["naive", "triton"]
    for preset in PRESETS.values():
        configs = preset.configs(impls)
        assert configs and len({c.key() for c in configs}) == len(configs)
        assert all(c.pad_rows <= c.B for c in configs)
    kimi = PRESETS["kimi-linear-48b"].configs(["naive"])
    assert len(kimi) == 10 * 3 * 2 and {c.B for c in kimi} == {2**i for i in range(10)}
    assert {(c.H, c.HV, c.K, c.V) for c in kimi} == {(32, 32, 128, 128)}
    assert {c.slot_pad for c in kimi} == {0, 16, 64}
    assert all(c.H < c.HV for c in PRESETS["gva"].configs(["naive"]))
    assert {c.HV for c in PRESETS["shapes"].configs(["naive"])} == {16, 32, 64}
    assert len(PRESETS["full"].configs(["naive"])) > len(kimi)


def test_frozen_verify_preset_sets_each_frozen_row_beside_its_in_place_one_and_fits_five_gpu_minutes():
    from kda_impls.bench.report import estimate_seconds

    preset = PRESETS["frozen-verify"]
    configs = preset.configs(["naive"])
    frozen = {c.key().replace("frozen", "?") for c in configs if c.mode == "frozen"}
    inplace = {c.key().replace("last", "?").replace("T1_", "T1?_") for c in configs if c.mode == "inplace"}
    assert len(configs) == 2 * 4 * 6 * 2 and frozen == inplace  # HV x T x B x mode, paired
    assert {c.checkpoints for c in configs if c.mode == "inplace" and c.T > 1} == {"last"}
    target = preset.configs(["triton", "flashinfer", "flashinfer-loggate-sigmoid"], only={"T": (4,)})
    method = Method(kernel=preset.kernel, call=preset.call, placement_processes=preset.placement_processes)
    assert len(target) == 72 and estimate_seconds(target, method, "cuda") <= 300


def test_presets_take_the_layout_and_narrow_to_given_axes():
    layout = PoolLayout(slots_per_row=2, slot_order="sorted", placements=4)
    narrowed = PRESETS["kimi-linear-48b"].configs(["naive"], layout, only={"B": (1, 64), "slot_pad": (16,)})
    assert {(c.B, c.slot_pad) for c in narrowed} == {(1, 16), (64, 16)}
    assert len(narrowed) == 4 and {c.state_dtype for c in narrowed} == {"bfloat16", "float32"}
    assert all(c.layout == layout for c in narrowed)
    assert PRESETS["kimi-linear-48b"].configs(["naive"], only={"HV": (64,)}) == []


def test_axes_alone_define_a_grid():
    grid = adhoc_configs(["naive", "triton"], {"B": (1, 16), "HV": (32, 64), "state_dtype": ("float32",)})
    assert len(grid) == 2 * 2 * 2 and {c.state_dtype for c in grid} == {"float32"}
    assert all(c.H == c.HV and c.K == c.V == 128 for c in grid)
    gva = adhoc_configs(["naive"], {"H": (8,), "HV": (32,), "K": (64,), "V": (32,)})
    assert {(c.B, c.H, c.HV, c.K, c.V) for c in gva} == {(b, 8, 32, 64, 32) for b in (1, 16, 64, 256)}


def test_the_stated_commit_wins_over_a_stale_checkout(monkeypatch, tmp_path):
    """On a lent GPU box the tree may come with an old .git: KDA_GIT_SHA, when set, is the record."""
    from kda_impls.bench.results import git_state

    monkeypatch.delenv("KDA_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # this checkout's own history
        assert git_state(tmp_path)["sha"] == head.stdout.strip()
    monkeypatch.setenv("KDA_GIT_SHA", "f" * 40)
    monkeypatch.setenv("KDA_GIT_DIRTY", "0")
    assert git_state(tmp_path) == {"sha": "f" * 40, "dirty": False,
                                   "source": "environment (KDA_GIT_SHA, KDA_GIT_DIRTY)"}


# ---- on a GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("entry", list(l2.ENTRY_STATES))
def test_gpu_kernel_time_per_entry_state(entry):
    """Events inside the CUDA graph time each call; the entry op is outside the time, so a step
    far smaller than the flush takes far less than the flush."""
    cfg = Config("triton", B=4, H=4, HV=4, K=64, V=64, layout=PoolLayout(placements=2))
    row = run_case(cfg, "cuda", Method(entry=entry, kernel=Budget(5, 200, 0.1), call=Budget(3, 50, 0.05)))
    assert row["status"] == "ok" and row["kernel_method"] == "cuda-graph", row["reason"]
    made = "dirty" if entry == "previous-step" else entry  # a tiny step: the rotation would need too many sets
    assert row["l2_entry"] == made
    first = row["kernel_placement_us"][:2]  # more only where those two spread (method 3)
    spread = max(first) / min(first) - 1 > timing.PLACEMENT_SPREAD_LIMIT
    assert len(row["kernel_placement_us"]) == (2 + timing.EXTRA_PLACEMENTS if spread else 2)
    flush_us = 3 * l2.l2_bytes("cuda") / 4e12 * 1e6  # the entry op moves 3 L2s at ~4 TB/s
    assert 0 < row["kernel_us_mean"] < flush_us / 4
    assert row["sm_mhz_median"] > 0 and row["throttled"] in (True, False)  # NVML answered


@pytest.mark.gpu
def test_gpu_previous_step_rotates_over_sets_adding_up_to_three_l2s():
    cfg = Config("triton", B=128, H=32, HV=32, K=128, V=128, layout=PoolLayout(placements=1))
    row = run_case(cfg, "cuda", Method(entry="previous-step", kernel=Budget(5, 100, 0.1), call=None))
    assert row["status"] == "ok" and row["l2_entry"] == "previous-step"
    per_set = cfg.make_inputs("cuda").pool_span().nbytes
    assert 2 <= row["input_sets"] <= l2.MAX_INPUT_SETS
    assert row["input_sets"] * per_set >= 2.5 * l2.l2_bytes("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("disjoint", [True, False])
def test_gpu_disjoint_placements_land_on_memory_no_earlier_one_used(disjoint):
    """Disjoint: each placement's pool lies outside every earlier one's (their memory is held). Freed
    between placements, the allocator hands the same addresses out again, so the test can tell."""
    spans = []

    def make(placement):
        inputs = make_inputs(64, 32, 32, 128, 128, seed=placement, device="cuda")
        pool = inputs.pool_span()
        spans.append((pool.data_ptr(), pool.data_ptr() + pool.nbytes))
        return inputs

    before = torch.cuda.memory_allocated()
    kernel_time(make, lambda x: (lambda: None), "cuda", Budget(3, 10, 0.05), placements=4, entry="hot",
                disjoint=disjoint)
    overlaps = [a < d and c < b for i, (a, b) in enumerate(spans) for c, d in spans[:i]]
    assert len(spans) == 4 and any(overlaps) != disjoint, spans
    assert torch.cuda.memory_allocated() - before < spans[0][1] - spans[0][0]  # nothing held after the row


@pytest.mark.parametrize("first, extra, l2, timed", [
    ([1.00, 1.019, 1.01], 6, 1 << 30, 3),  # within 2%: the layout's three
    ([1.00, 1.021, 1.01], 6, 1 << 30, 9),  # wider: six more
    ([1.00, 1.05, 1.00], 0, 1 << 30, 3),   # none allowed
    ([1.00, 1.00, 1.00], 6, 1024, 9),      # agreeing, but the step exceeds the L2: six more all the same
    ([1.00, 1.00, 1.00], 6, 0, 3),         # no L2 modelled (the CPU's)
])
def test_placements_are_added_where_the_first_ones_spread_wide(monkeypatch, first, extra, l2, timed):
    """Where the step is larger than the L2, three placements can all land in one cluster of a wide
    placement distribution and agree: such rows get the extra placements whatever the first say."""
    medians = iter(first + [1.0] * extra)
    monkeypatch.setattr(timing, "_time_placement",
                        lambda launchers, device, share, made, cycle: Timing([next(medians)], "perf_counter"))
    monkeypatch.setattr(timing, "l2_bytes", lambda device: l2)
    drawn = []

    def make(placement):
        drawn.append(placement)
        return make_inputs(1, 1, 1, 16, 16, seed=placement)

    result = kernel_time(make, lambda x: (lambda: None), "cpu", placements=3, extra_placements=extra)
    assert len(result.placement_medians) == timed and drawn == list(range(timed))  # each a fresh placement
    assert result.placement_medians[:3] == first


def test_every_placement_is_drawn_after_the_cache_is_handed_back(monkeypatch):
    """The first placement too, so that every pool is a fresh allocation as a serving engine's is,
    not carved out of what the row's correctness check left cached."""
    events = []
    monkeypatch.setattr(timing, "release_cache", lambda device, settle_s=0.0: events.append("release"))
    monkeypatch.setattr(timing, "_time_placement",
                        lambda launchers, device, share, made, cycle: Timing([1.0], "perf_counter"))

    def make(placement):
        events.append(f"make {placement}")
        return make_inputs(1, 1, 1, 16, 16, seed=placement)

    kernel_time(make, lambda x: (lambda: None), "cpu", placements=3)
    assert events == ["release", "make 0", "release", "make 1", "release", "make 2", "release"]


def test_a_freed_placement_holds_nothing_when_its_memory_is_handed_back(monkeypatch):
    """Without disjoint placements, nothing of a placement (its inputs, their copies, the launchers)
    is alive at the hand-back after it: the next placement may then land on the memory it used."""
    import gc
    import weakref

    made, alive_at_release = [], []

    def release(device, settle_s=0.0):
        gc.collect()
        alive_at_release.append([ref() is not None for ref in made])

    monkeypatch.setattr(timing, "release_cache", release)
    monkeypatch.setattr(timing, "_time_placement",
                        lambda launchers, device, share, made, cycle: Timing([1.0], "perf_counter"))

    def make(placement):
        inputs = make_inputs(1, 1, 1, 16, 16, seed=placement)
        made.append(weakref.ref(inputs))
        return inputs

    kernel_time(make, lambda x: (lambda: x), "cpu", placements=2)
    assert alive_at_release == [[], [False], [False, False]]


def test_every_release_of_a_row_may_settle(monkeypatch):
    """--settle reaches each hand-back of the row: before the first placement, after each, and the
    held placements' at the end (held here although the CPU never holds: the room check says yes)."""
    settles = []
    monkeypatch.setattr(timing, "release_cache", lambda device, settle_s=0.0: settles.append(settle_s))
    monkeypatch.setattr(timing, "_room_for_another", lambda device, placement_bytes: True)
    monkeypatch.setattr(timing, "_time_placement",
                        lambda launchers, device, share, made, cycle: Timing([1.0], "perf_counter"))
    kernel_time(lambda p: make_inputs(1, 1, 1, 16, 16, seed=p), lambda x: (lambda: None), "cpu", placements=2,
                disjoint=True, settle_s=0.5)
    assert settles == [0.5, 0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="settle_s must be >= 0; got -1"):
        Method(settle_s=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("freed, settles", [(timing.SETTLE_MIN_BYTES + (64 << 20), True),
                                            (timing.SETTLE_MIN_BYTES // 4, False)])
def test_gpu_release_idles_only_after_handing_back_a_large_allocation(freed, settles):
    torch.cuda.empty_cache()
    block = torch.empty(freed, dtype=torch.uint8, device="cuda")
    del block
    start = time.perf_counter()
    timing.release_cache(torch.device("cuda", torch.cuda.current_device()), settle_s=0.3)
    assert (time.perf_counter() - start >= 0.3) == settles


def test_cupti_replay_splits_the_pass_into_calls(monkeypatch):
    """Two replays of a pass of three calls, each a flush kernel then the step's kernel, 2 us apart:
    busy is the step's kernel, period the pass's span per call (gaps and flush included)."""
    from scripts.crosscheck import cupti

    trace, start = [], 1.7e9
    for replay in range(2):
        for _ in range(3):
            trace += [(start, 5.0, "flush"), (start + 6.0, 10.0 + replay, "main")]
            start += 18.0
        start += 1000.0
    monkeypatch.setattr(cupti, "kernel_trace", lambda run, device: trace)
    monkeypatch.setattr(cupti, "timed_pass", lambda launchers, device, before: (lambda: None, 3, "cuda-graph", 0.0))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    timed = cupti.replay_durations([lambda: None], "cpu", before=lambda: None, before_kernels=1, replays=2)
    assert timed["busy_us"] == 10.5 and timed["method"] == "cuda-graph"
    assert timed["period_us"] == pytest.approx((2 * 18.0 + 6.0 + 10.5) / 3)  # the median of the two replays


def test_cupti_trace_splits_into_steps_with_each_kernels_share(monkeypatch):
    """A synthetic trace at large absolute times: three steps of a precompute and a main kernel,
    each after one kernel of the op before it."""
    from scripts.crosscheck import cupti

    trace, start = [], 1.7e9  # microseconds, as the profiler's clock gives them
    for i in range(3):
        trace += [(start, 5.0, "flush"), (start + 6.0, 1.0 + i, "gate"), (start + 8.0, 10.3, "main")]
        start += 100.0
    monkeypatch.setattr(cupti, "kernel_trace", lambda run, device: trace)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    steps = cupti.step_durations([lambda: None], "cpu", calls=3, before=lambda: None, before_kernels=1)
    assert steps["kernels"] == 2 and steps["busy_samples_us"] == [1.0 + 10.3, 2.0 + 10.3, 3.0 + 10.3]
    # exactly the gap plus the last kernel: (start + duration) - first start loses digits at 1.7e9
    assert steps["span_us"] == 2.0 + 10.3 and steps["busy_us"] == 2.0 + 10.3 and steps["before_busy_us"] == 5.0
    assert steps["kernel_us"] == [("gate", 2.0), ("main", 10.3)] and steps["names"] == ["gate", "main"]


@pytest.mark.gpu
def test_gpu_cupti_durations_split_into_steps():
    from scripts.crosscheck import cupti

    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    flush = l2.entry_op("dirty", "cuda")
    steps = cupti.step_durations([lambda: torch.mul(x, 2.0, out=y), lambda: torch.add(x, 1.0, out=y)], "cuda",
                                 calls=10, before=flush, before_kernels=cupti.kernels_of(flush, "cuda"))
    assert steps["kernels"] == 1 and len(steps["busy_samples_us"]) == 10 and 0 < steps["busy_us"] <= steps["span_us"]


@pytest.mark.gpu
def test_gpu_cupti_replay_of_the_harness_pass():
    from scripts.crosscheck import cupti

    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    timed = cupti.replay_durations([lambda: torch.mul(x, 2.0, out=y)], "cuda", replays=3)
    assert timed["method"] == "cuda-graph" and timed["calls"] > 1 and 0 < timed["busy_us"] <= timed["period_us"]


def test_device_info_asks_nvidia_smi_about_the_gpu_by_its_uuid(monkeypatch):
    """On a (faked) GPU seen as cuda:0 through CUDA_VISIBLE_DEVICES: nvidia-smi's --id is the UUID,
    not 0, which nvidia-smi would read as the box's first GPU."""
    from types import SimpleNamespace

    from kda_impls.bench import results

    asked = []
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=1, multi_processor_count=132,
                            L2_cache_size=62_914_560, uuid="152dc65d-d3f5-48c6-c070-b94578bea03b")
    monkeypatch.setattr(results.torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(results, "_command", lambda *args: asked.append(args) or "580.159.04")
    info = results.device_info(torch.device("cuda", 0))
    assert info["uuid"] == "GPU-152dc65d-d3f5-48c6-c070-b94578bea03b" and info["driver"] == "580.159.04"
    assert asked == [("nvidia-smi", "--id=GPU-152dc65d-d3f5-48c6-c070-b94578bea03b", "--query-gpu=driver_version",
                      "--format=csv,noheader")]


@pytest.mark.gpu
def test_gpu_device_info_names_the_physical_gpu_and_its_driver():
    """The UUID, not the index (relative to CUDA_VISIBLE_DEVICES): two runs on two GPUs of one box
    say which ran where; nvidia-smi is asked about that GPU."""
    from kda_impls.bench.results import device_info

    info = device_info(torch.device("cuda", 0))
    assert info["uuid"].startswith("GPU-") and info["uuid"] in subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    assert info["driver"] and "error" not in info["driver"].lower()


@pytest.mark.gpu
def test_gpu_limits_and_clocks_are_read():
    limits = clocks.gpu_limits("cuda")
    assert limits.get("power_limit_w", 0) > 0 and limits.get("sm_max_mhz", 0) > 0
    with clocks.ClockMonitor("cuda") as monitor:
        time.sleep(0.05)
    assert monitor.summary()["sm_mhz_median"] > 0


def test_each_placement_process_gets_its_seeds_and_a_share_of_the_extra_placements_and_budget():
    method = Method(placement_processes=3, extra_placements=24, seed=5,
                    kernel=timing.Budget(min_samples=30, max_samples=3000, max_seconds=0.75))
    shares = [method.in_process(i) for i in range(3)]
    assert [m.seed for m in shares] == [5, 5 + case.PROCESS_SEED_STRIDE, 5 + 2 * case.PROCESS_SEED_STRIDE]
    assert all(m.extra_placements == 8 and m.placement_processes == 1 for m in shares)
    assert all(m.kernel == timing.Budget(min_samples=10, max_samples=1000, max_seconds=0.25) for m in shares)
    # the call is timed once, in the first process (merge_rows keeps the first's)
    assert shares[0].call == method.call is not None and shares[1].call is None and shares[2].call is None
    assert Method().in_process(0) == Method()  # one process: the method itself
    with pytest.raises(ValueError, match="placement_processes must be >= 1; got 0"):
        Method(placement_processes=0)


def test_each_placement_process_worker_is_started_with_its_share(monkeypatch, tmp_path):
    """The sweep hands worker i of a row the method of placement process i (its seeds, its share of
    the extra placements), not the sweep's method as it is."""
    started = []

    class Recorded:
        def __init__(self, impl, device, method, warm=()):
            started.append(method)

    monkeypatch.setattr(driver, "Worker", Recorded)
    method = Method(placement_processes=2, extra_placements=24)
    runner = driver.Sweep([], tmp_path, ["cpu"], method, command="", preset="smoke")
    for process in range(2):
        runner._worker("naive", "cpu", process)
    runner._worker("naive", "cpu", 1)  # kept, not started again
    assert started == [method.in_process(0), method.in_process(1)]
    assert started[1].seed == case.PROCESS_SEED_STRIDE and started[1].extra_placements == 12


def _timed_row(placements_us: list[float], sm_min: int, throttled: bool, err: float, first_call_ms: float) -> dict:
    samples = [p + d for p in placements_us for d in (-0.1, 0.0, 0.1)]
    kernel = Timing([s / 1e6 for s in samples], "cuda-graph", [p / 1e6 for p in placements_us], entry="previous-step",
                    input_sets=2)
    clock = {"sm_mhz_min": sm_min, "sm_mhz_median": 1980.0, "mem_mhz_median": 3201.0, "power_w_max": 400.0 + sm_min,
             "temp_c_max": 45, "throttle_reasons": "sw-power-cap" if throttled else "", "throttled": throttled}
    return (case.empty_row(Config("naive", 4, 2, 2, 16, 16)) | clock
            | {"status": "ok", "err_out": err, "err_state": err,
            "first_call_ms": first_call_ms, "call_us_median": 5 * first_call_ms, "retimed": throttled}
            | case._kernel_columns(kernel, 10_000, 4e12))


def test_rows_of_several_processes_pool_their_placements():
    """Two processes of three placements: the kernel time is the mean of all six, min/max and the
    sample count over both; the worst error, the lowest clock and any slowdown carry over; the
    first call and the call time are the first process's."""
    rows = [_timed_row([10.0, 10.2, 10.4], 1980, False, 1e-6, 12.0),
            _timed_row([10.6, 10.8, 11.0], 1900, True, 3e-6, 2.0)]
    merged = case.merge_rows(rows)
    assert merged["kernel_us_mean"] == pytest.approx(10.5) and merged["placements_timed"] == 6
    assert merged["kernel_us_placement_min"] == pytest.approx(10.0)
    assert merged["kernel_us_placement_max"] == pytest.approx(11.0)
    assert merged["n_samples"] == 18 and merged["gbps"] == pytest.approx(10_000 / 10.5e-6 / 1e9)
    assert merged["err_out"] == 3e-6 and merged["sm_mhz_min"] == 1900 and merged["throttled"] and merged["retimed"]
    assert merged["throttle_reasons"] == "sw-power-cap" and merged["power_w_max"] == 2380.0
    assert merged["first_call_ms"] == 12.0 and merged["call_us_median"] == 60.0  # the first process's, not the second's
    wrong = rows[1] | {"status": "wrong", "reason": "state differs"}
    assert case.merge_rows([rows[0], wrong])["reason"] == "placement process 2 of 2: state differs"


def test_sweep_times_each_row_in_its_placement_processes(tmp_path):
    """On the CPU (no extra placements): two processes of two placements each, four in the row; the
    key keeps the layout's placements, the settings the processes."""
    out = tmp_path / "two"
    done = subprocess.run([*SWEEP, "--impls", "naive", "--B", "1", "--H", "1", "--HV", "1",
                           "--K", "16", "--V", "16", "--devices", "cpu", "--placements", "2", "--placement-processes",
                           "2", "--settle", "0.01", "--no-charts", "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert row.status == "ok" and row.placements_timed == 4 and row.key.endswith("_pl2")
    method = json.loads((out / "meta.json").read_text())["settings"]["method"]
    assert method["placement_processes"] == 2 and method["settle_s"] == 0.01
    with pytest.raises(SettingError, match="settle: -1 must be a number >= 0"):  # refused before anything runs
        SweepSpec(settle=-1)


def test_sweeps_settle_by_default_after_a_hand_back_like_the_one_that_slowed_the_h200():
    """On the H200 the 0.5 GiB of a bf16 HV=64 K=V=128 B=256 check's inputs, handed back, slowed the next
    placement by 8%, and 10 ms of idling ended such a slowdown (results/h200/timing-evidence/settle.md):
    a sweep idles at least that long, by default, after a hand-back that large. Fails if the default
    goes back to no settling or the threshold rises past that hand-back."""
    assert SweepSpec().settle == sweep_module.spec_from_argv([]).settle == Method().settle_s >= 0.01
    assert timing.SETTLE_MIN_BYTES < 256 * 64 * 128 * 128 * torch.bfloat16.itemsize


def test_the_command_line_keeps_the_interrupts_ignored_through_its_exit(monkeypatch, tmp_path):
    """kda-sweep asks its Sweep to leave the interrupts ignored once one arrived: handed back, a late
    SIGTERM killed the exit under load (tests/test_sweep_cli.py's burst)."""
    made = {}

    class Interrupted(driver.Sweep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.update(kwargs)

        def run(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "Sweep", Interrupted)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as ended:
            sweep_module.main(["--devices", "cpu", "--impls", "naive", "--B", "1", "--HV", "2", "--K", "16",
                               "--out", str(tmp_path / "s"), "--no-charts"])
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert ended.value.code == sweep_module.INTERRUPTED and made["exits_on_interrupt"] is True


@pytest.mark.parametrize("exits", [False, True], ids=["returns", "exits"])
def test_an_interrupt_during_the_cleanup_does_not_cut_it_short(monkeypatch, tmp_path, exits):
    """`timeout` signals the driver and then its whole process group: an interrupt while the first
    one's cleanup runs (here, as the workers are stopped) is ignored, the run is still written into
    meta.json, and the handlers are back when the cleanup is done, unless the caller exits on the
    interrupt (the command line), where they stay ignored through the exit. Without that, a call cut
    off by its time limit leaves neither results.csv nor its run."""

    class Interrupting:
        def __init__(self, impl, device, method, warm=()):
            self.hello = {}

        def ready(self):
            pass

        def measure(self, cfg, copy_bw, timeout):
            os.kill(os.getpid(), signal.SIGINT)  # the first interrupt, while a row is measured
            time.sleep(0.5)
            return case.empty_row(cfg, "unsupported", "recorded")

        def stop(self, now=False):
            os.kill(os.getpid(), signal.SIGINT)  # the second, during the cleanup
            time.sleep(0.2)

    monkeypatch.setattr(driver, "Worker", Interrupting)
    monkeypatch.setattr(driver, "copy_bandwidth", lambda device: 1e9)
    handlers = {interrupt: signal.getsignal(interrupt) for interrupt in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt):
            driver.Sweep([Config("naive", 1, 2, 2, 16, 16)], tmp_path, ["cpu"], Method(), command="",
                               preset="smoke", exits_on_interrupt=exits).run()
        after = {interrupt: signal.getsignal(interrupt) for interrupt in handlers}
    finally:
        for interrupt, handler in handlers.items():
            signal.signal(interrupt, handler)
    assert json.loads((tmp_path / "meta.json").read_text())["runs"][-1]["rows_measured"] == 0
    assert (tmp_path / "results.csv").exists()
    assert after == ({interrupt: signal.SIG_IGN for interrupt in handlers} if exits else handlers)


def test_sweep_starts_every_worker_before_it_times_a_row_and_warms_only_the_extra_processes(monkeypatch, tmp_path):
    """Every worker has said hello (imported, made its warm-up calls) before the first row is timed:
    a worker's start would share the GPU with a timed row. Only the second and later placement
    processes warm up, on each compile group's shape at B = 1; the first process's rows time their
    own first calls."""
    events = []

    class Recorded:
        def __init__(self, impl, device, method, warm=()):
            self.impl, self.process = impl, method.seed // case.PROCESS_SEED_STRIDE
            self.hello = None
            events.append(("start", impl, self.process, tuple(c.key() for c in warm)))

        def ready(self):
            events.append(("ready", self.impl, self.process))
            self.hello = {}

        def measure(self, cfg, copy_bw, timeout):
            events.append(("measure", cfg.impl, self.process))
            return case.empty_row(cfg, "unsupported", "recorded")

        def stop(self, now=False):
            pass

    monkeypatch.setattr(driver, "Worker", Recorded)
    monkeypatch.setattr(driver, "copy_bandwidth", lambda device: 1e9)
    configs = [Config(impl, B, 2, 2, K, K) for impl in ("naive", "triton") for K in (16, 32) for B in (4, 1)]
    driver.Sweep(configs, tmp_path, ["cpu"], Method(placement_processes=2), command="", preset="smoke").run()
    kinds = [event[0] for event in events]
    assert kinds.index("measure") > max(i for i, kind in enumerate(kinds) if kind == "ready")
    assert sum(kind == "ready" for kind in kinds) == 4  # two implementations x two processes
    warmed = {(impl, process): warm for kind, impl, process, *warm in events if kind == "start"}
    assert warmed[("naive", 0)] == [()] and warmed[("triton", 0)] == [()]
    assert warmed[("triton", 1)] == [tuple(Config("triton", 1, 2, 2, K, K).key() for K in (16, 32))]
    configs = [Config("naive", 4, 2, 2, 16, 16)]  # a group without a row at B = 1 warms at B = 1
    events.clear()
    driver.Sweep(configs, tmp_path / "b4", ["cpu"], Method(placement_processes=2), command="", preset="smoke").run()
    warmed = [warm for kind, impl, process, *warm in events if kind == "start"]
    assert warmed == [[()], [(Config("naive", 1, 2, 2, 16, 16).key(),)]]


def test_worker_preloads_its_implementation_before_it_says_hello(monkeypatch):
    """A worker imports its library when it starts (beside the other workers' starts, before any row is
    timed), not inside its first row; a library that fails to preload still says hello, for its rows
    to report why."""
    from kda_impls.bench import worker

    calls = []

    class Recorded:
        def __init__(self, fails):
            self.fails = fails

        def preload(self):
            calls.append("preload")
            if self.fails:
                raise ImportError("no such library")

    class Connection:
        def send(self, message):
            calls.append("hello")

        def recv(self):
            return None

    monkeypatch.setattr(worker, "run_case", lambda cfg, device: calls.append(f"warm B={cfg.B}"))
    for fails in (False, True):
        calls.clear()
        monkeypatch.setattr(worker.registry, "get", lambda name, fails=fails: Recorded(fails))
        monkeypatch.setattr(worker, "describe", lambda name: {})
        monkeypatch.setattr(worker.torch, "set_num_threads", lambda n: None)  # not this test process's
        worker.serve("naive", "cpu", Method(), Connection())
        assert calls == ["preload", "hello"]
    calls.clear()  # an extra placement process makes its warm-up calls before its hello
    worker.serve("naive", "cpu", Method(), Connection(),
                 warm=(Config("naive", 1, 2, 2, 16, 16), Config("naive", 4, 2, 2, 16, 16)))
    assert calls == ["preload", "warm B=1", "warm B=4", "hello"]


@pytest.mark.parametrize("preset, argv, device_type, processes", [
    ("published", [], "cuda", 3), ("shapes", [], "cuda", 3), ("targets", [], "cuda", 1),
    ("kimi-linear-48b", [], "cuda", 1), ("published", [], "cpu", 1),
    ("published", ["--placement-processes", "1"], "cuda", 1), ("targets", ["--placement-processes", "3"], "cuda", 3),
    ("smoke", ["--placement-processes", "2"], "cpu", 2)])
def test_sweep_placement_processes_default_by_preset_and_device(preset, argv, device_type, processes):
    """On a GPU the thorough presets time a row in three processes, the fast ones (a minute for
    kimi-linear-48b) in one; the CPU, whose rows are not ranked, in one; the option overrides both."""
    spec = sweep_module.spec_from_argv(["--preset", preset, "--devices", "cpu", *argv])
    assert spec.method(device_type).placement_processes == processes


def test_worker_hands_its_cache_back_after_each_row_with_the_methods_settle(monkeypatch):
    """A row's leftovers are handed back before its row is sent (39 idle workers' caches filled the
    H200), idling as the method settles; a row that lost the CUDA context is sent as crashed without
    touching the device again."""
    from kda_impls.bench import worker

    events, requests = [], [(Config("naive", 1, 2, 2, 16, 16), 1e9), (Config("naive", 4, 2, 2, 16, 16), 1e9), None]

    class Connection:
        def send(self, message):
            events.append(("send", message.get("status")))

        def recv(self):
            return requests.pop(0)

    statuses = iter(["ok", "error"])
    monkeypatch.setattr(worker, "describe", lambda name: {"status": "hello"})
    monkeypatch.setattr(worker.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(worker, "run_case",
                        lambda cfg, device, method=None, copy_bw=None: {"status": next(statuses), "reason": "x"})
    monkeypatch.setattr(worker, "release_cache", lambda device, settle_s=0.0: events.append(("release", settle_s)))
    monkeypatch.setattr(worker, "_cuda_context_lost", lambda device: True)
    worker.serve("naive", "cpu", Method(settle_s=0.5), Connection())
    assert events == [("release", 0.0), ("send", "hello"), ("release", 0.5), ("send", "ok"), ("send", "crashed")]


def test_fla_preload_imports_its_kernel_module():
    code = ("import sys; from kda_impls import registry; from kda_impls.impls.fla_kda import _FLA_MODULE; "
            "assert _FLA_MODULE not in sys.modules; registry.get('fla').preload(); assert _FLA_MODULE in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr


# ---- cached-input replay rows ---------------------------------------------------------------------
REPLAY = Config("naive", B=3, H=1, HV=2, K=16, V=16, mode="replay", ring=4, layout=PoolLayout(placements=1))


def test_a_replay_row_round_trips():
    big = Config("triton", B=64, H=32, HV=32, K=128, V=128, mode="replay", ring=16)
    assert big.key() == "triton_B64_H32_HV32_K128_V128_T1ring16_bfloat16_padrows0_slotpad0_spr1_random_pl3"
    assert replace(big, mode="inplace", ring=0).key() == big.key().replace("T1ring16", "T1")  # the keys resumed
    assert big.columns()["ring"] == 16 and Config.from_columns(big.columns() | {"status": "ok"}) == big
    x, checked = REPLAY.make_inputs("cpu"), REPLAY.make_inputs("cpu", timed=False)
    assert x.replay and x.update_state and x.cache.L == 4 and (x.N, checked.N) == (3, 6)
    inplace = replace(REPLAY, mode="inplace", ring=0).make_inputs("cpu")
    assert x.nbytes() == 3 * x.slot_bytes() + x.bytes_besides_pool() + 3 * 2 * 16 * 2 + x.replay_bytes()
    assert x.nbytes() < inplace.nbytes()  # the state write is the flush's, one step in L


@pytest.mark.parametrize("axes, words", [
    (dict(mode="inplace", ring=16), "ring is the record ring of mode replay only; got ring=16 with mode inplace"),
    (dict(mode="frozen", T=2, ring=4), "mode replay only; got ring=4 with mode frozen"),
    (dict(mode="replay"), "mode replay needs ring >= T (a step's records must fit in the ring; --ring L): got ring=0"),
    (dict(mode="replay", T=4, ring=2), "got ring=2, T=4"),
    (dict(mode="replay", T=2, ring=16), "mode replay times one-token decode steps: T must be 1"),
])
def test_replay_combinations_a_config_refuses_in_one_line(axes, words):
    with pytest.raises(ValueError, match=None) as refused:
        Config("naive", B=2, H=1, HV=2, K=16, V=16, **axes)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_replay_rows_timed_passes_are_whole_ring_cycles_of_each_input_set():
    """Each sample is whole ring cycles: a pass calls every input set a multiple of L times (on the CPU's
    path as on the GPU's, one rule), so every slot flushes once per L steps in every sample; the cache's
    lengths stay legal ([0, L)) across the launches, and a rotation's copy has a cache of its own."""
    for call_s, sets, L in itertools.product((1e-7, 1e-5, 1e-3), (1, 3, 256), (1, 4, 16, 32)):
        reps = timing._reps(call_s, sets, L)
        assert reps % L == 0 and reps >= L and (L > 1 or reps * sets <= max(timing.MAX_CALLS_PER_PASS, sets))
    from kda_impls.registry import get

    naive, inputs, calls = get("naive"), [], []

    def bind(x):
        inputs.append(x)
        launch = naive.bind(x)
        return lambda: (calls.append(1), launch())

    t = kernel_time(lambda p: REPLAY.make_inputs("cpu", p), bind, "cpu", Budget(min_samples=3, max_samples=3,
                                                                               max_seconds=5, rel_ci=0.0))
    per_pass = (len(calls) - 2) / t.n  # the first call, the calibration pass, then the samples' passes
    assert t.n == 3 and per_pass == int(per_pass) and per_pass % REPLAY.ring == 0, (len(calls), t.n)
    (x,) = inputs
    assert ((x.cache.length >= 0) & (x.cache.length < REPLAY.ring)).all()
    copy = x.clone()
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(copy.cache.tensors().values(),
                                                          x.cache.tensors().values(), strict=True))
    assert working_set_bytes(x) == working_set_bytes(replace(x, cache=None)) + sum(
        t.nbytes for t in x.cache.tensors().values())


def test_replay_and_spec_step_presets_pair_their_rows():
    replay = PRESETS["replay"].configs(["triton"])
    rings = {(c.HV, c.state_dtype, c.B): set() for c in replay}
    for c in replay:
        rings[c.HV, c.state_dtype, c.B].add(c.ring if c.mode == "replay" else "inplace")
    assert set(map(frozenset, rings.values())) == {frozenset({"inplace", 8, 16, 32})} and len(rings) == 2 * 2 * 6
    assert all(c.T == 1 and c.K == c.V == 128 for c in replay)
    narrowed = PRESETS["replay"].configs(["triton"], only={"ring": (16,)})  # the in-place rows stay beside
    assert {c.ring for c in narrowed} == {0, 16} and len(narrowed) == len(replay) // 2
    spec = PRESETS["spec-step"].configs(["triton"])
    for B in (1, 16, 32, 64, 128, 256):
        mine = {(c.mode, c.T, c.checkpoints) for c in spec if c.B == B}
        assert mine == ({("inplace", T, "all") for T in (1, 2, 4, 8)} | {("frozen", T, "all") for T in (2, 4, 8)}
                        | {("inplace", a, "last") for a in range(2, 9)})


@pytest.mark.gpu
def test_gpu_replay_pass_is_whole_ring_cycles_and_leaves_every_sets_ring_where_it_was():
    """On the GPU the timed pass is a CUDA graph of our replay kernel over the rotation's input sets: a
    replay of it is whole ring cycles of each set, so every set's lengths come back to where they were."""
    from kda_impls.registry import get

    cfg = Config("triton", B=64, H=32, HV=32, K=128, V=128, mode="replay", ring=16)
    _, sets = l2.rotation_inputs(l2.DEFAULT_ENTRY, cfg.make_inputs("cuda", 1), "cuda")
    launchers = [get("triton").bind(x) for x in sets]
    run, calls, method, _ = timing.timed_pass(launchers, torch.device("cuda"), None, cfg.ring)
    assert method == "cuda-graph" and len(sets) >= 2 and calls % (cfg.ring * len(sets)) == 0
    before = [x.cache.length.clone() for x in sets]
    run()
    torch.cuda.synchronize()
    assert all(torch.equal(x.cache.length, b) for x, b in zip(sets, before, strict=True))
    assert all(((b >= 0) & (b < cfg.ring)).all() for b in before)


def test_an_implementation_that_cannot_run_on_the_device_gets_its_rows_without_a_worker(tmp_path, monkeypatch):
    """A GPU-only library on the CPU (FlashInfer: its packages missing here, CUDA absent): its rows are
    unsupported with the reason its worker would give, and no worker process is started for it."""
    started = []
    monkeypatch.setattr(driver, "Worker", lambda impl, *args: started.append(impl) or pytest.fail(f"{impl} started"))
    cfg = Config("flashinfer", 1, 2, 2, 16, 16)
    table = driver.Sweep([cfg], tmp_path, ["cpu"], QUICK, command="", preset="smoke").run()
    assert started == [] and table.status.tolist() == ["unsupported"]
    reason = case.run_case(cfg, "cpu")["reason"]
    assert table.reason.tolist() == [reason] and reason  # what the worker's run_case says, word for word
    assert table.library.tolist() == ["flashinfer"]


def test_a_rows_fingerprint_names_what_differs_now(monkeypatch):
    """What resume compares (bench/fingerprint.py): the target, every loaded file of this package (a
    tuning table too), the library versions and the KDA_* kernel settings; provenance variables such as
    KDA_GIT_SHA are not kernel settings."""
    from kda_impls.bench import fingerprint

    target = "kda_impls.impls.triton.kernel:TritonKDA"
    registry.get("triton")  # its modules loaded, as in a worker that measured it
    monkeypatch.delenv("KDA_TRITON_CONFIG", raising=False)
    measured_by = fingerprint.record(target, {"torch": "2.0"})
    assert {"kda_impls/impls/triton/kernel.py", "kda_impls/impls/triton/tuning.json"} <= set(measured_by["files"])
    assert fingerprint.changes(measured_by, target, {"torch": "2.0"}) is None
    monkeypatch.setenv("KDA_GIT_SHA", "0" * 40)
    assert fingerprint.changes(measured_by, target, {"torch": "2.0"}) is None
    assert fingerprint.changes(measured_by, target, {"torch": "2.1"}) == ("other code", "torch 2.0 -> 2.1")
    assert fingerprint.changes(measured_by, "mine:Other", {"torch": "2.0"}) == ("other code", f"{target} -> mine:Other")
    gone = measured_by | {"files": measured_by["files"] | {"kda_impls/impls/gone.py": "0" * 16}}
    assert fingerprint.changes(gone, target, {"torch": "2.0"}) == ("other code", "gone.py gone")
    edited = measured_by | {"files": measured_by["files"] | {"kda_impls/impls/triton/tuning.json": "0" * 16}}
    assert fingerprint.changes(edited, target, {"torch": "2.0"}) == ("other code", "tuning.json changed")
    monkeypatch.setenv("KDA_TRITON_CONFIG", "BV=32")
    assert fingerprint.changes(measured_by, target, {"torch": "2.0"}) == ("other settings", "KDA_TRITON_CONFIG set")
    assert fingerprint.changes(None, target, {}) == ("other code", "the row records none of the files that measured it")
