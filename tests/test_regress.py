"""The regression gate (kda_impls.regress, kda-regress) on synthetic samples, in both input
formats, and on result files written by asv itself."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import mannwhitneyu

from helpers import (
    CPU_SWEEP,
    EXISTING,
    MACHINE,
    REPO,
    asv_env,
    once,
    register_machine,
    run_asv,
    sweep_process,
    write_sweep_dir,
)
from kda_impls import regress, regress_rule
from kda_impls.bench.config import Config

regress_cpu_skip = torch.cuda.is_available()  # the shared suite run is the CPU profile's

BENCH = "decode.KernelTime.track_kernel"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def asv_file(path: Path, samples: dict[tuple, list | None], machine: str = MACHINE, version: str = "v1",
             params: list[list[str]] | None = None, record_samples: bool = True, bench: str = BENCH) -> Path:
    """A result file as asv 0.6.6 writes it for one benchmark parametrised over (impl, B):
    ``samples`` maps (impl repr, B repr) to the raw samples, None for a failed combination;
    combinations absent from it were skipped (NaN)."""
    params = params or [sorted({k[0] for k in samples}), sorted({k[1] for k in samples})]
    result, lo, hi, repeat, kept = [], [], [], [], []
    for combo in itertools.product(*params):
        s = samples.get(combo)
        if s is None:
            result.append(None if combo in samples else math.nan)
            lo.append(None), hi.append(None), repeat.append(None), kept.append(None)
            continue
        q = np.quantile(s, [0.005, 0.995])  # stands in for asv's order-statistic interval
        result.append(float(np.median(s)))
        lo.append(float(q[0])), hi.append(float(q[1])), repeat.append(len(s)), kept.append(list(s))
    row = [result, params, version, 1700000000000, 1.0, lo, hi, None, None, [1] * len(result), repeat,
           kept if record_samples else None]
    data = {"commit_hash": "0" * 40, "env_name": "existing-py", "date": 1700000000000,
            "params": {"machine": machine, "python": "3.11"}, "python": "3.11", "requirements": {},
            "env_vars": {}, "result_columns": COLUMNS, "results": {bench: row}, "durations": {}, "version": 2}
    path.write_text(json.dumps(data))
    return path


def timings(seed: int, n: int = 60, median: float = 20e-6, cv: float = 0.01) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(median * rng.lognormal(0.0, cv, n))


def name(impl: str, B: int) -> str:
    return f"{BENCH}('{impl}', {B})"


def gate(tmp_path: Path, a: Path, b: Path, *extra: str, cli: bool = False) -> tuple[int, dict, str]:
    """(exit status, JSON report, printed text) of the gate; ``cli``: in its own process."""
    out = tmp_path / "gate.json"
    args = [str(a), str(b), "--json", str(out), *extra]
    if cli:  # as kda-regress runs it, this checkout's code
        done = subprocess.run([sys.executable, "-m", "kda_impls.regress", *args], cwd=REPO, capture_output=True,
                              text=True)
        code, printed = done.returncode, done.stdout + done.stderr
    else:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = regress.main(args)
        printed = printed.getvalue()
    report = json.loads(out.read_text()) if out.exists() else {}
    return code, report, printed


def statuses(report: dict) -> dict[str, str]:
    return {row["benchmark"]: row["status"] for row in report["rows"]}


def test_equal_distributions_pass(tmp_path):
    combos = [("'triton'", "1"), ("'triton'", "64"), ("'naive'", "1")]
    a = asv_file(tmp_path / "a.json", {c: timings(i) for i, c in enumerate(combos)})
    b = asv_file(tmp_path / "b.json", {c: timings(100 + i) for i, c in enumerate(combos)})
    code, report, out = gate(tmp_path, a, b)
    assert code == 0, out
    assert report["counts"]["same"] == 3 and report["slower"] == []


def test_ten_percent_shift_fails_naming_it(tmp_path):
    combos = [("'triton'", "1"), ("'triton'", "64"), ("'naive'", "1")]
    a = asv_file(tmp_path / "a.json", {c: timings(i) for i, c in enumerate(combos)})
    slower = {c: timings(100 + i) for i, c in enumerate(combos)}
    slower[("'triton'", "64")] = [1.10 * x for x in slower[("'triton'", "64")]]
    b = asv_file(tmp_path / "b.json", slower)
    code, report, out = gate(tmp_path, a, b, cli=True)
    assert code == 1, out
    assert report["slower"] == [name("triton", 64)]
    assert f"FAIL: 1 slower: {name('triton', 64)}" in out
    row = next(r for r in report["rows"] if r["benchmark"] == name("triton", 64))
    assert row["ratio"] == pytest.approx(1.10, abs=0.01) and row["p"] < 1e-6 and row["test"] == "mann-whitney"


def test_improvement_passes(tmp_path):
    a = asv_file(tmp_path / "a.json", {("'triton'", "1"): timings(0)})
    b = asv_file(tmp_path / "b.json", {("'triton'", "1"): [0.8 * x for x in timings(1)]})
    code, report, _ = gate(tmp_path, a, b)
    assert code == 0 and statuses(report) == {name("triton", 1): "faster"}


def test_noisy_but_equal_is_unsure_and_fails_unless_allowed(tmp_path):
    # 40% spread and few samples: the medians differ by more than the threshold by chance, and the
    # test sees that this is chance. The samples cannot support a verdict: the gate fails, saying so,
    # unless --allow-unsure accepts that
    a = asv_file(tmp_path / "a.json", {("'fla'", "16"): timings(3, n=8, cv=0.4)})
    b = asv_file(tmp_path / "b.json", {("'fla'", "16"): timings(4, n=8, cv=0.4)})
    code, report, out = gate(tmp_path, a, b)
    (row,) = report["rows"]
    assert row["ratio"] > 1.05 and row["p"] > 0.01, row
    assert code == 1 and row["status"] == "unsure" and "not significant" in row["test"], out
    assert report["unsure"] == [name("fla", 16)] and out.splitlines()[-1] == f"FAIL: 1 unsure: {name('fla', 16)}"
    code, report, out = gate(tmp_path, a, b, "--allow-unsure")
    assert code == 0 and out.splitlines()[-1].startswith("pass, with 1 unsure (--allow-unsure): "), out


@pytest.mark.parametrize("threshold, regressed", [(None, False), ("0.01", True)])
def test_a_significant_shift_regresses_only_beyond_the_threshold(tmp_path, threshold, regressed):
    """A 2% shift, highly significant: the same under the 5% default, slower under 1%."""
    a = asv_file(tmp_path / "a.json", {("'triton'", "16"): timings(0, n=200, cv=0.002)})
    b = asv_file(tmp_path / "b.json", {("'triton'", "16"): [1.02 * x for x in timings(1, n=200, cv=0.002)]})
    code, report, _ = gate(tmp_path, a, b, *(["--threshold", threshold] if threshold else []))
    (row,) = report["rows"]
    assert row["p"] < 1e-10 and code == int(regressed)
    assert row["status"] == ("slower" if regressed else "same")


def test_broken_missing_new_and_skipped(tmp_path):
    """fla failed in B (null): broken; naive unsupported in B (NaN) where A ran it: broken; triton
    ran only in B: new; flashinfer skipped on both sides: skipped; B = 64 is absent from B: missing.
    broken fails whatever is allowed, missing fails unless --allow-missing."""
    impls = ["'fla'", "'flashinfer'", "'naive'", "'triton'"]
    a = asv_file(tmp_path / "a.json", {("'naive'", "1"): timings(0), ("'fla'", "1"): timings(1),
                                       ("'naive'", "64"): timings(4)}, params=[impls, ["1", "64"]])
    b = asv_file(tmp_path / "b.json", {("'fla'", "1"): None, ("'triton'", "1"): timings(3)}, params=[impls, ["1"]])
    code, report, out = gate(tmp_path, a, b)
    assert code == 1, out
    assert statuses(report) == {name("fla", 1): "broken", name("naive", 1): "broken", name("triton", 1): "new",
                                name("flashinfer", 1): "skipped", name("naive", 64): "missing",
                                name("fla", 64): "missing", name("flashinfer", 64): "missing",
                                name("triton", 64): "missing"}
    reasons = {row["benchmark"]: row["test"] for row in report["rows"]}
    assert reasons[name("fla", 1)].startswith("failed: asv recorded no result")
    assert reasons[name("naive", 1)].startswith("unsupported: ") and reasons[name("naive", 1)].endswith("(A ran it)")
    assert report["broken"] == [name("fla", 1), name("naive", 1)]
    assert "FAIL: 2 broken, 4 missing: " in out
    code, report, out = gate(tmp_path, a, b, "--allow-missing")
    assert code == 1 and "FAIL: 2 broken: " in out and "missing" not in out.splitlines()[-1]
    c = asv_file(tmp_path / "c.json", {("'naive'", "1"): timings(5), ("'fla'", "1"): timings(6)},
                 params=[impls, ["1"]])
    code, report, out = gate(tmp_path, a, c)
    assert code == 1 and report["missing"] == [name(i.strip("'"), 64) for i in impls], out
    code, report, out = gate(tmp_path, a, c, "--allow-missing")
    assert code == 0 and "pass, with 4 missing" in out, out


def test_without_samples_uses_confidence_intervals(tmp_path):
    a = asv_file(tmp_path / "a.json", {("'triton'", "16"): timings(0), ("'naive'", "16"): timings(1, cv=0.3)},
                 record_samples=False)
    b = asv_file(tmp_path / "b.json", {("'triton'", "16"): [1.2 * x for x in timings(2)],
                                       ("'naive'", "16"): [1.1 * x for x in timings(3, cv=0.3)]},
                 record_samples=False)
    code, report, _ = gate(tmp_path, a, b)
    assert code == 1 and report["slower"] == [name("triton", 16)]
    tests = {row["benchmark"]: row["test"] for row in report["rows"]}
    assert tests == {name("triton", 16): "ci99-overlap", name("naive", 16): "ci99-overlap: not significant"}
    assert statuses(report)[name("naive", 16)] == "unsure"  # 10% off, but the wide intervals overlap


def test_changed_timing_method_is_not_compared(tmp_path):
    a = asv_file(tmp_path / "a.json", {("'triton'", "1"): timings(0)}, version="v1")
    b = asv_file(tmp_path / "b.json", {("'triton'", "1"): [2 * x for x in timings(1)]}, version="v2")
    code, report, _ = gate(tmp_path, a, b)
    assert code == 0 and statuses(report) == {name("triton", 1): "incomparable"}


def test_refuses_results_from_different_machines(tmp_path):
    a = asv_file(tmp_path / "a.json", {("'triton'", "1"): timings(0)}, machine="nvidia-h200")
    b = asv_file(tmp_path / "b.json", {("'triton'", "1"): timings(1)}, machine="nvidia-h100-80gb-hbm3")
    code, _, out = gate(tmp_path, a, b)
    assert code == 2 and "different machines" in out


# ---- result files written by asv itself ------------------------------------------------------------

SUITE = '''
import os
import random

PARAMS = [["fast", "slow"], [1, 64]]


def samples(value):
    rng = random.Random()  # fresh noise every run, as a real timer has
    return {"samples": [value * (1 + 0.01 * rng.random()) for _ in range(40)], "number": 1}


class Toy:
    params = PARAMS
    param_names = ["impl", "B"]
    version = "1"

    def setup(self, impl, B):
        if impl == "slow" and B == 64:
            raise NotImplementedError("slow: B=64 not supported")
        if os.environ.get("BREAK") == f"{impl}-{B}":
            raise RuntimeError(f"{impl}: wrong")


class Decode(Toy):
    unit = "seconds"

    def track_kernel(self, impl, B):
        return samples(float(os.environ.get("SCALE_" + impl.upper(), "1")) * 1e-5)


class Bandwidth(Toy):
    def track_gbps(self, impl, B):
        return samples(float(os.environ.get("GBPS_" + impl.upper(), "1")) * 900.0)

    track_gbps.unit = "GB/s"
'''


@pytest.fixture(scope="module")
def asv_project(tmp_path_factory):
    """A git repository with a tiny asv suite (no torch: a run takes seconds) and its config."""
    root = tmp_path_factory.mktemp("asv-project")
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "decode.py").write_text(textwrap.dedent(SUITE))
    # forkserver: each benchmark process forked from one that imported the suite (a third of spawn's
    # CPU time); the result files are the same
    conf = dict(version=1, project="toy", repo=".", branches=["main"], environment_type="existing",
                benchmark_dir="benchmarks", results_dir="results", html_dir="html", launch_method="forkserver")
    (root / "asv.conf.json").write_text(json.dumps(conf))
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-qm", "suite"], cwd=root, check=True)
    env = asv_env(root)
    register_machine(env)
    return root, env


def asv_results(project, label: str, check: bool = True, **env_extra: str) -> Path:
    """Run the toy suite into results-<label>/ and return its result file (``check``: asv exited 0)."""
    root, env = project
    conf = json.loads((root / "asv.conf.json").read_text())
    conf["results_dir"] = f"results-{label}"
    (root / f"{label}.conf.json").write_text(json.dumps(conf))
    done = run_asv(["run", "--config", f"{label}.conf.json", "-E", EXISTING, "--machine", MACHINE,
                    "--set-commit-hash", "HEAD", "--record-samples"], {**env, **env_extra}, cwd=root)
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    (path,) = (root / f"results-{label}" / MACHINE).glob("*-existing-*.json")
    return path


def test_real_asv_files(tmp_path, asv_project):
    """Files asv itself wrote: an A/A pair is clean; a 7% slower kernel time, a 10% bandwidth drop
    (the benchmark's own direction: higher is better) and a 20% rise, with a combination whose
    setup raised, get same (B = 1 is gated at 10%), slower, faster and broken."""
    a, again = asv_results(asv_project, "a"), asv_results(asv_project, "again")
    changed = asv_results(asv_project, "changed", SCALE_FAST="1.07", GBPS_FAST="0.9", GBPS_SLOW="1.2",
                          BREAK="fast-64", check=False)

    loaded = regress.load(a)
    kernel, gbps = "decode.Decode.track_kernel", "decode.Bandwidth.track_gbps"
    ran = [f"{bench}({impl}, {B})" for bench in (kernel, gbps) for impl, B in (("'fast'", 1), ("'fast'", 64),
                                                                                 ("'slow'", 1))]
    assert loaded.kind == "asv" and loaded.machine == MACHINE and set(loaded.measurements) == set(ran)
    assert all(len(m.samples) == 40 and m.version == "1" for m in loaded.measurements.values())
    assert [m.rate for m in loaded.measurements.values()] == [name.startswith(gbps) for name in loaded.measurements]
    assert {name: f.status for name, f in loaded.failures.items()} == {f"{kernel}('slow', 64)": "unsupported",
                                                                      f"{gbps}('slow', 64)": "unsupported"}

    code, report, out = gate(tmp_path, a, again)
    assert code == 0 and report["counts"]["same"] == 6 and report["counts"]["skipped"] == 2, out
    code, report, out = gate(tmp_path, a, changed)
    assert code == 1, out
    got = statuses(report)
    # 7% slower at B = 1, gated at 10% (DEFAULT_THRESHOLDS); the 10% bandwidth drop is 1.11x in time terms
    assert got[f"{kernel}('fast', 1)"] == "same" and got[f"{gbps}('fast', 1)"] == "slower"
    assert got[f"{gbps}('slow', 1)"] == "faster" and got[f"{kernel}('slow', 1)"] == "same"
    assert got[f"{kernel}('fast', 64)"] == got[f"{gbps}('fast', 64)"] == "broken"  # setup raised: null
    rows = {row["benchmark"]: row for row in report["rows"]}
    assert rows[f"{gbps}('fast', 1)"]["ratio"] == pytest.approx(1 / 0.9, abs=0.005)
    assert rows[f"{gbps}('slow', 1)"]["ratio"] == pytest.approx(1 / 1.2, abs=0.005)
    assert rows[f"{kernel}('fast', 64)"]["test"].startswith("failed: asv recorded no result")


@pytest.mark.skipif(regress_cpu_skip, reason="expects the CPU profile")
def test_the_suites_own_cpu_file_read_with_each_benchmarks_direction(tmp_path, cpu_asv):
    """The real suite's CPU result file (the session-scoped fixture cpu_asv): every bandwidth benchmark reads
    as a rate, every time as a time; the file against itself is clean, and against a copy whose
    one bandwidth benchmark is 20x lower (each sample, its median and interval) that benchmark is
    slower and nothing else moves; the same benchmark skipped in the copy is broken. Every benchmark
    names the CPU timer in its version, so the gate judges it at that timer's threshold."""
    run = cpu_asv
    loaded = regress.load(run.result)
    assert any(m.rate for m in loaded.measurements.values())
    assert all(m.rate == (".track_gbps(" in n or ".track_roofline_frac(" in n) for n, m in loaded.measurements.items())
    code, report, out = gate(tmp_path, run.result, run.result)
    assert all(m.timer == regress_rule.CPU_TIMER for m in loaded.measurements.values())
    assert code == 0 and report["counts"]["same"] + report["counts"]["informational"] == len(loaded.measurements), out
    data = json.loads(run.result.read_text())
    bench = "decode.Bandwidth.track_gbps"
    row = dict(zip(data["result_columns"], data["results"][bench], strict=False))
    planted = next(i for i, value in enumerate(row["result"]) if value is not None and math.isfinite(value))
    for column in ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75"):
        if row.get(column) and row[column][planted] is not None:
            row[column][planted] /= 20
    row["samples"][planted] = [x / 20 for x in row["samples"][planted]]
    data["results"][bench] = [row.get(column) for column in data["result_columns"]]
    dropped = tmp_path / "dropped.json"
    dropped.write_text(json.dumps(data))
    code, report, out = gate(tmp_path, run.result, dropped)
    moved = [r["benchmark"] for r in report["rows"] if r["status"] not in ("same", "skipped", "informational")]
    (name,) = [r["benchmark"] for r in report["rows"] if r["ratio"] is not None and r["ratio"] > 1.01]
    assert name.startswith(bench) and moved == [name], out
    assert code == 1 and statuses(report)[name] == "slower", out  # six placements a side: Mann-Whitney decides
    row["result"][planted] = math.nan
    data["results"][bench] = [row.get(column) for column in data["result_columns"]]
    dropped.write_text(json.dumps(data))
    code, report, out = gate(tmp_path, run.result, dropped)
    assert code == 1 and report["broken"] == [name], out


# ---- sweep directories -----------------------------------------------------------------------------

def sweep_dir(path: Path, rows: dict[Config, list[float] | None], gpu: str = "NVIDIA H200") -> Path:
    """``rows`` maps a config to its kernel samples in microseconds, None for a row that could not run."""
    return write_sweep_dir(path, {cfg: "unsupported" if samples is None else samples for cfg, samples in rows.items()},
                           {"gpu": gpu})


TRITON = Config("triton", 64, 32, 32, 128, 128)
FLA = Config("fla", 64, 32, 32, 128, 128)


def microseconds(seed: int, scale: float = 1.0) -> list[float]:
    return [scale * 1e6 * x for x in timings(seed)]


def test_sweep_directories(tmp_path):
    a = sweep_dir(tmp_path / "a", {TRITON: microseconds(0), FLA: microseconds(1)})
    same = sweep_dir(tmp_path / "same", {TRITON: microseconds(2), FLA: microseconds(3)})
    slower = sweep_dir(tmp_path / "slower", {TRITON: microseconds(4, 1.10)})
    code, report, out = gate(tmp_path, a, same)
    assert code == 0 and report["counts"]["same"] == 2, out
    code, report, out = gate(tmp_path, a, slower)
    assert code == 1, out
    assert report["slower"] == [TRITON.key()] and statuses(report)[FLA.key()] == "missing"
    assert report["rows"][0]["test"] == "mann-whitney" and report["rows"][0]["n_a"] == 60


def test_refuses_mixed_or_foreign_result_sets(tmp_path):
    sweep = sweep_dir(tmp_path / "h200", {TRITON: microseconds(0)})
    other_gpu = sweep_dir(tmp_path / "h100", {TRITON: microseconds(1)}, gpu="NVIDIA H100 80GB HBM3")
    asv = asv_file(tmp_path / "a.json", {("'triton'", "64"): timings(0)})
    assert gate(tmp_path, sweep, other_gpu)[0] == 2
    code, _, out = gate(tmp_path, sweep, asv)
    assert code == 2 and "cannot compare" in out
    assert gate(tmp_path, sweep, tmp_path / "nowhere")[0] == 2


def test_thresholds_by_benchmark_name(tmp_path):
    """Kernel time gets the 5% default; --threshold-for sets a benchmark's own threshold and
    replaces the defaults."""
    shifted = {("'triton'", "1"): timings(1), ("'naive'", "1"): timings(2)}
    slower = {("'triton'", "1"): timings(3, median=24e-6), ("'naive'", "1"): timings(4, median=24e-6)}
    a = asv_file(tmp_path / "a.json", shifted)
    b = asv_file(tmp_path / "b.json", slower)
    code, report, _ = gate(tmp_path, a, b)
    assert code == 1 and len(report["slower"]) == 2  # kernel-time names: the 5% default
    code, report, _ = gate(tmp_path, a, b, "--threshold-for", r"'naive'=0.5")
    assert code == 1 and report["slower"] == [name("triton", 1)]
    assert report["thresholds"] == {"'naive'": 0.5}
    loose = regress.compare(regress.load(a), regress.load(b), thresholds={"track_kernel": 0.5})
    assert set(loose["status"]) == {"same"} and set(loose["threshold"]) == {0.5}


def test_call_time_is_reported_not_gated_by_default(tmp_path):
    """A threshold of None (the default for call latency, 'none' on the command line) reports the
    ratio and p under "informational" and never fails the gate, however large the shift."""
    shifted = {("'triton'", "1"): timings(1), ("'naive'", "1"): timings(2)}
    doubled = {("'triton'", "1"): timings(3, median=40e-6), ("'naive'", "1"): timings(4, median=40e-6)}
    call = "decode.CallTime.track_call"
    code, report, _ = gate(tmp_path, asv_file(tmp_path / "ca.json", shifted, bench=call),
                           asv_file(tmp_path / "cb.json", doubled, bench=call))
    assert code == 0 and {row["status"] for row in report["rows"]} == {"informational"}
    a = asv_file(tmp_path / "a.json", shifted)
    b = asv_file(tmp_path / "b.json", doubled)
    code, report, printed = gate(tmp_path, a, b, "--threshold-for", r"'naive'=none")
    assert code == 1 and report["slower"] == [name("triton", 1)]
    naive = next(row for row in report["rows"] if row["benchmark"] == name("naive", 1))
    assert naive["status"] == "informational" and naive["ratio"] > 1.5 and naive["p"] < 0.01
    assert report["thresholds"] == {"'naive'": None} and "1 informational" in printed


# ---- each decision of the verdict -----------------------------------------------------------------

def measurement(median: float, n: int = 60, spread: float | None = 0.01, timer: str = "cuda-graph",
                seed: int = 0) -> regress.Measurement:
    """``n`` samples around ``median`` (1% noise), placement medians within +-``spread`` of it."""
    samples = tuple(median * np.random.default_rng(seed).lognormal(0.0, 0.01, n)) if n else None
    band = None if spread is None else (median * (1 - spread), median * (1 + spread))
    return regress.Measurement(median, samples, band, timer=timer)


@pytest.mark.parametrize("ratio, status", [(1.0, "same"), (1.049, "same"), (1 / 1.049, "same"), (1.06, "slower"),
                                           (1 / 1.06, "faster")])
def test_verdict_by_ratio_beyond_the_threshold(ratio, status):
    a, b = measurement(10.0, seed=1), measurement(10.0 * ratio, seed=2)
    assert regress.verdict(a, b, 0.05, 0.01)[0] == status


def test_one_row_steps_are_gated_at_ten_percent():
    """B = 1 moves by up to 6% between two processes of one commit on the H200 (FlashInfer's dense
    call, results/h200/gate-validation/sweep/spread.csv): a 7% move there is the same, at B >= 16 slower; 12% is
    slower at B = 1 too. Sweep keys and asv names alike; other batch sizes keep --threshold."""
    one_row = [Config("flashinfer", 1, 32, 32, 128, 128).key(), name("triton", 1),
               "decode.KernelTime.track_kernel('triton', 1, 'HV32-K128-V128', 0, 'bfloat16', 1)"]
    more = [Config("flashinfer", 16, 32, 32, 128, 128).key(), Config("naive", 128, 32, 32, 128, 128).key(),
            name("triton", 16), "decode.KernelTime.track_kernel('triton', 512, 'HV32-K128-V128', 0, 'bfloat16', 1)"]
    a = regress.ResultSet("a", "sweep", "H200", {n: measurement(10.0, seed=i) for i, n in enumerate(one_row + more)})
    for ratio, at_one_row in ((1.07, "same"), (1.12, "slower")):
        b = regress.ResultSet("b", "sweep", "H200", {n: measurement(10.0 * ratio, seed=50 + i)
                                                     for i, n in enumerate(one_row + more)})
        table = regress.compare(a, b, threshold=0.05).set_index("benchmark")
        assert (table.loc[one_row, "status"] == at_one_row).all() and (table.loc[one_row, "threshold"] == 0.10).all()
        assert (table.loc[more, "status"] == "slower").all() and (table.loc[more, "threshold"] == 0.05).all()


def test_too_few_samples_are_unsure_whatever_the_ratio():
    for n in (1, 2, 4):  # 4 against 4: no ranking gives p < 0.01
        for ratio in (1.0, 1.5):
            status, p, test = regress.verdict(measurement(10.0, n=n), measurement(10.0 * ratio, n=n), 0.05, 0.01)
            assert (status, p) == ("unsure", None) and test == f"too few samples ({n} vs {n}) for any p < 0.01"
    assert regress.verdict(measurement(10.0, n=0), measurement(20.0, n=0), 0.05, 0.01)[0] == "unsure"
    assert regress.verdict(measurement(10.0, n=6), measurement(20.0, n=6), 0.05, 0.01)[0] == "slower"


def test_overlapping_placement_spreads_make_a_significant_move_unsure():
    """B's samples are 8% slower, but each side's placements range over +-6%: the ranges overlap
    by 4.5% of A (under the 5% threshold: slower); over +-10% they overlap by 12.8% (unsure)."""
    a, b = measurement(10.0, spread=0.06, seed=1), measurement(10.8, spread=0.06, seed=2)
    assert regress.spread_overlap(a, b) == pytest.approx((10.6 - 10.152) / 10.0)
    assert regress.verdict(a, b, 0.05, 0.01)[0] == "slower"
    a, b = measurement(10.0, spread=0.10, seed=1), measurement(10.8, spread=0.10, seed=2)
    status, _, test = regress.verdict(a, b, 0.05, 0.01)
    assert status == "unsure" and "placement spreads overlap by 12.8%" in test
    assert regress.verdict(measurement(10.0, spread=None), measurement(10.8, spread=0.10), 0.05, 0.01)[0] == "slower"


def test_rows_timed_on_the_cpu_are_judged_by_the_same_rule_at_the_cpu_timers_threshold():
    """A CPU timer's rows go through the one verdict, at a threshold of at least the timer's noise
    floor (2: three times slower), in both forms: a 2.5x move is the same, a 4x one slower, and
    --threshold cannot take the floor away. A GPU row of the same samples is slower at 2.5x."""
    names = [TRITON.key(), name("triton", 64)]
    for timer_a, timer_b in (("perf_counter", "perf_counter"), ("cuda-graph", "perf_counter")):
        a = regress.ResultSet("a", "sweep", "cpu", {n: measurement(10.0, timer=timer_a, seed=i)
                                                    for i, n in enumerate(names)})
        for ratio, status in ((2.5, "same"), (4.0, "slower")):
            b = regress.ResultSet("b", "sweep", "cpu", {n: measurement(10.0 * ratio, timer=timer_b, seed=9 + i)
                                                        for i, n in enumerate(names)})
            table = regress.compare(a, b, threshold=0.05)
            assert set(table.status) == {status} and set(table.threshold) == {2.0}, table
    a, b = measurement(10.0, seed=1), measurement(25.0, seed=2)
    assert regress.verdict(a, b, 0.05, 0.01)[0] == "slower"


def sweep_dir_with_placements(path: Path, rows: dict[Config, list[float]], placements: int = 3, **meta) -> Path:
    """Sweep rows whose ``placements`` placements are equal parts of their samples, in order."""
    medians = {cfg: [float(np.median(part)) for part in np.array_split(np.asarray(samples), placements)]
               for cfg, samples in rows.items()}
    out = write_sweep_dir(path, rows, {"gpu": "NVIDIA H200"} | meta, medians)  # meta may name another gpu
    table = pd.read_csv(out / "results.csv")
    for cfg, placed in medians.items():
        table.loc[table.key == cfg.key(), ["kernel_us_placement_min", "kernel_us_placement_max"]] = \
            [min(placed), max(placed)]
    table.to_csv(out / "results.csv", index=False)
    return out


def test_sweep_directories_carry_their_placement_spread(tmp_path):
    narrow = microseconds(0)
    wide = list(np.concatenate([np.array(narrow[:20]) * 0.9, narrow[20:40], np.array(narrow[40:]) * 1.1]))
    a = sweep_dir_with_placements(tmp_path / "a", {TRITON: wide})
    b = sweep_dir_with_placements(tmp_path / "b", {TRITON: [1.08 * x for x in wide]})
    loaded = regress.load(a).measurements[TRITON.key()]
    assert loaded.spread[0] < loaded.time < loaded.spread[1] and loaded.timer == "cuda-graph"
    code, report, _ = gate(tmp_path, a, b)
    assert code == 1 and statuses(report) == {TRITON.key(): "unsure"}  # +-10% placements, 8% move
    c = sweep_dir_with_placements(tmp_path / "c", {TRITON: narrow})
    d = sweep_dir_with_placements(tmp_path / "d", {TRITON: [1.08 * x for x in narrow]})
    code, report, _ = gate(tmp_path, c, d)
    assert code == 1 and report["slower"] == [TRITON.key()]


def test_one_outlier_placement_does_not_hide_a_move_the_placements_show(tmp_path):
    """Nine placements a side, the last about 12% slow on both (a large pool on the H200 puts one of
    nine about 10% slow): a 6% move, and the min..max ranges overlap by more than 5% of A. The
    per-placement medians (placements.json, written from each row's) are apart: slower. Where the
    nine spread evenly over +-10%, they are not: unsure. Three a side are too few for the test: the
    ranges decide."""
    steady = [x for i in range(8) for x in microseconds(i)[:10]]
    outlier = steady + [1.12 * x for x in microseconds(9)[:10]]
    a = sweep_dir_with_placements(tmp_path / "a", {TRITON: outlier}, placements=9)
    b = sweep_dir_with_placements(tmp_path / "b", {TRITON: [1.06 * x for x in outlier]}, placements=9)
    ma, mb = (regress.load(d).measurements[TRITON.key()] for d in (a, b))
    assert len(ma.placements) == 9 and regress.spread_overlap(ma, mb) > 0.05
    code, report, _ = gate(tmp_path, a, b)
    (row,) = report["rows"]
    assert code == 1 and row["status"] == "slower", row  # by the ranges alone: unsure

    even = [x * (0.9 + 0.2 * i / 8) for i in range(9) for x in microseconds(i)[:10]]
    c = sweep_dir_with_placements(tmp_path / "c", {TRITON: even}, placements=9)
    d = sweep_dir_with_placements(tmp_path / "d", {TRITON: [1.08 * x for x in even]}, placements=9)
    code, report, _ = gate(tmp_path, c, d)
    (row,) = report["rows"]
    assert code == 1 and row["status"] == "unsure" and "per-placement medians not apart" in row["test"], row

    e = sweep_dir_with_placements(tmp_path / "e", {TRITON: outlier}, placements=3)
    f = sweep_dir_with_placements(tmp_path / "f", {TRITON: [1.06 * x for x in outlier]}, placements=3)
    me, mf = (regress.load(x).measurements[TRITON.key()] for x in (e, f))
    assert regress_rule._mann_whitney(me.placements, mf.placements, 0.01) is None
    code, report, _ = gate(tmp_path, e, f)
    assert report["rows"][0]["test"] == "mann-whitney"  # decided by the ranges, which are apart here


def test_refuses_sweeps_timed_from_different_l2_entry_states(tmp_path):
    a = sweep_dir_with_placements(tmp_path / "a", {TRITON: microseconds(0)}, settings={"method": {"entry": "clean"}})
    b = sweep_dir_with_placements(tmp_path / "b", {TRITON: microseconds(1)}, settings={"method": {"entry": "dirty"}})
    code, _, out = gate(tmp_path, a, b)
    assert code == 2 and "different L2 entry states (entry: 'clean' vs 'dirty')" in out


@pytest.mark.parametrize("field, a, b", [("placement_processes", 1, 3), ("settle_s", 0.0, 1.0),
                                         ("placement_processes", None, 1)])
def test_refuses_sweeps_whose_placements_were_made_differently(tmp_path, field, a, b):
    """Two values of a setting, or one side that does not record it, are refused; one value on both
    sides compares."""
    one = sweep_dir_with_placements(tmp_path / "one", {TRITON: microseconds(0)},
                                    settings={"method": {"entry": "clean"} | ({} if a is None else {field: a})})
    other = sweep_dir_with_placements(tmp_path / "other", {TRITON: microseconds(1)},
                                      settings={"method": {"entry": "clean", field: b}})
    again = sweep_dir_with_placements(tmp_path / "again", {TRITON: microseconds(2)},
                                      settings={"method": {"entry": "clean", field: b}})
    code, _, out = gate(tmp_path, one, other)
    assert code == 2 and f"made their placements differently ({field}: {a!r} vs {b!r})" in out
    assert gate(tmp_path, other, again)[0] == 0


def test_refuses_sweeps_timed_by_different_timing_methods(tmp_path):
    """Method 4 reports the mean over placements, 3 their median: a move between them is the
    estimator's, so the gate refuses the pair."""
    a = sweep_dir_with_placements(tmp_path / "a", {TRITON: microseconds(0)},
                                  settings={"method": {"entry": "clean", "version": 3}})
    b = sweep_dir_with_placements(tmp_path / "b", {TRITON: microseconds(1)},
                                  settings={"method": {"entry": "clean", "version": 4}})
    code, _, out = gate(tmp_path, a, b)
    assert code == 2 and "different timing methods (version: 3 vs 4); re-run the older one" in out
    c = sweep_dir_with_placements(tmp_path / "c", {TRITON: microseconds(2)},
                                  settings={"method": {"entry": "clean", "version": 4}})
    assert gate(tmp_path, b, c)[0] in (0, 1)


# A user's implementation "mine" in three versions, each swept on helpers.CPU_SWEEP's grid
PLANTED_MINE = {"correct": "planted.correct:Correct", "slow": "planted.slow:SeveralTimesSlower",
                "buggy": "planted.decay:ForgetsDecay"}


@pytest.fixture(scope="session")
def cpu_sweeps(tmp_path_factory, cpu_sweep, cpu_shards) -> dict[str, Path]:
    """Real CPU sweeps of tiny shapes, through the command line: ``a`` (naive, B 1 and 2: the shared
    cpu_sweep), ``again`` (its shard of B = 1 only: an A/A pair on the row both have), and the
    user's implementation ``mine`` (joined through KDA_EXTRA_IMPLS as a user's own would be) as
    ``correct``, several times ``slow`` (planted/slow.py) and ``buggy`` (every row wrong); helpers.once."""
    def make(root: Path) -> dict:
        path = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
        args = [*CPU_SWEEP[:CPU_SWEEP.index("--impls")], "--impls", "mine",
                *CPU_SWEEP[CPU_SWEEP.index("--impls") + 2:]]
        for label, target in PLANTED_MINE.items():
            done = sweep_process(*args, "--out", str(root / label),
                                 env={"KDA_EXTRA_IMPLS": f"mine={target}", "PYTHONPATH": path})
            assert (root / label / "results.csv").exists(), done.stdout + done.stderr
        return {label: str(root / label) for label in PLANTED_MINE}

    made = once(tmp_path_factory, "mine-sweeps", make)
    return {"a": cpu_sweep, "again": cpu_shards[0], **{label: Path(out) for label, out in made.items()}}


def test_two_cpu_sweeps_of_one_commit_pass_the_gate_on_the_rows_both_have(tmp_path, cpu_sweeps):
    """The A/A pair on a CPU, whose times move with the machine's load: the row both have is the
    same (judged at the CPU timer's threshold). The B = 2 row the second sweep left out is missing:
    the gate fails, unless --allow-missing says the smaller grid is meant."""
    code, report, out = gate(tmp_path, cpu_sweeps["a"], cpu_sweeps["again"])
    assert code == 1 and out.splitlines()[-1].startswith("FAIL: 1 missing: naive_B2_"), out
    assert report["counts"]["same"] == 1 and report["counts"]["missing"] == 1, out
    code, report, out = gate(tmp_path, cpu_sweeps["a"], cpu_sweeps["again"], "--allow-missing")
    assert code == 0 and report["counts"]["same"] == 1, out
    assert out.splitlines()[-1].startswith("pass, with 1 missing (--allow-missing)"), out


def sweep_as_asv(directory: Path, path: Path) -> Path:
    """The kernel samples of a CPU sweep's rows as an asv result file of one benchmark per row (in
    seconds, the version naming the CPU timer as benchmarks/common.py's does on a CPU)."""
    sweep = regress.load(directory)
    samples = {(f"'{key}'",): [us / 1e6 for us in m.samples] for key, m in sweep.measurements.items()}
    return asv_file(path, samples, version=f"4.2+{regress_rule.CPU_TIMER}", params=[sorted(k[0] for k in samples)],
                    machine=sweep.machine)


def test_a_several_times_slower_kernel_fails_the_gate_on_a_cpu_in_both_forms(tmp_path, cpu_sweeps):
    """On the CPU, in the sweep form (the command as users run it) and in the asv form of the same
    samples: the planted slowdown (8x, planted/slow.py) against the correct version of the same
    implementation is slower on every row, exit 1; the A/A pair of two sweeps of one commit is the
    same on the row both have (--allow-missing for the row the second left out), exit 0. One rule:
    each benchmark's verdict is the same in both forms."""
    for a, b, verdict, code in (("correct", "slow", "slower", 1), ("a", "again", "same", 0)):
        sweep_code, report, out = gate(tmp_path, cpu_sweeps[a], cpu_sweeps[b], "--allow-missing", cli=True)
        asv_code, asv_report, asv_out = gate(tmp_path, sweep_as_asv(cpu_sweeps[a], tmp_path / f"{a}.json"),
                                             sweep_as_asv(cpu_sweeps[b], tmp_path / f"{b}.json"), "--allow-missing")
        sweep_verdicts = {row["benchmark"]: row["status"] for row in report["rows"] if row["status"] != "missing"}
        asv_verdicts = {row["benchmark"][len(BENCH) + 2:-2]: row["status"] for row in asv_report["rows"]
                        if row["status"] != "missing"}
        assert sweep_verdicts == asv_verdicts and set(sweep_verdicts.values()) == {verdict}, (out, asv_out)
        assert (sweep_code, asv_code) == (code, code), (out, asv_out)
    # judged at the CPU timer's threshold: slower means more than 1 + 2 = 3 times the time
    rows = gate(tmp_path, cpu_sweeps["correct"], cpu_sweeps["slow"], "--allow-missing")[1]["rows"]
    timed = [row for row in rows if row["status"] != "missing"]
    assert timed and all(row["threshold"] == 2.0 and row["ratio"] > 3 for row in timed), rows
    assert out.splitlines()[-1].startswith("pass, with 1 missing (--allow-missing)"), out


def test_a_sweep_with_wrong_rows_is_broken_whatever_is_allowed(tmp_path, cpu_sweeps):
    """Every row of the buggy kernel is WRONG: none of them may drop out of the comparison. Each is
    broken with the check's reason, and the gate fails, --allow-missing or not."""
    table = pd.read_csv(cpu_sweeps["buggy"] / "results.csv")
    assert set(table.status) == {"wrong"}, table
    for extra, cli in (((), True), (("--allow-missing", "--allow-unsure"), False)):  # one: the command as users run it
        code, report, out = gate(tmp_path, cpu_sweeps["correct"], cpu_sweeps["buggy"], *extra, cli=cli)
        assert code == 1 and out.splitlines()[-1].startswith("FAIL: 2 broken"), out
        assert report["broken"] == sorted(table.key)
        rows = {row["benchmark"]: row for row in report["rows"]}
        assert all(rows[key]["test"].startswith("wrong: ") for key in table.key)
        assert report["missing"] == [] and report["counts"]["same"] == 0


def test_five_samples_a_side_can_decide_and_four_cannot():
    """The smallest two-sided Mann-Whitney p is 2 / C(n+m, n): 0.0079 for 5 against 5, under 0.01;
    0.029 for 4 against 4."""
    assert regress.verdict(measurement(10.0, n=5), measurement(12.0, n=5), 0.05, 0.01)[0] == "slower"
    assert regress.verdict(measurement(10.0, n=4), measurement(12.0, n=4), 0.05, 0.01)[0] == "unsure"


def test_one_side_with_samples_or_intervals_only_is_not_tested_on_them():
    """Samples (or asv's intervals) on one side only cannot be compared: the other evidence is used,
    else the benchmark is unsure."""
    with_samples, without = measurement(10.0), measurement(20.0, n=0, spread=None)
    assert regress.verdict(with_samples, without, 0.05, 0.01)[:3:2] == ("unsure",
                                                                         "too few samples (60 vs 0) for any p < 0.01")
    a = regress.Measurement(10.0, ci99=(9.0, 11.0))
    b = regress.Measurement(20.0)
    assert regress.verdict(a, b, 0.05, 0.01)[0] == "unsure"
    assert regress.verdict(b, a, 0.05, 0.01)[0] == "unsure"


@pytest.mark.parametrize("ci_a, ci_b, significant", [
    ((9.0, 11.0), (11.5, 13.0), True),   # apart
    ((9.0, 11.0), (11.0, 13.0), False),  # touching: they share a value
    ((9.0, 14.0), (11.0, 12.0), False),  # B's inside A's
    ((11.0, 12.0), (9.0, 14.0), False),  # A's inside B's
    ((11.5, 13.0), (9.0, 11.0), True),   # apart, B lower
    ((13.0, 15.0), (11.0, 13.0), False),  # touching, B lower
])
def test_confidence_intervals_stand_in_for_missing_samples(ci_a, ci_b, significant):
    a = regress.Measurement(sum(ci_a) / 2, ci99=ci_a)
    b = regress.Measurement(sum(ci_b) / 2, ci99=ci_b)
    assert regress_rule._significance(a, b, 0.01) == (significant, None, "ci99-overlap")


def test_the_comparison_table_row_by_row():
    """Every column of every row, and the order (what needs attention first: by status, then the
    largest ratio), for one benchmark of each status (new, skipped, informational: in other tests)."""
    fixed = tuple(np.linspace(9.9, 10.1, 10))
    a = regress.ResultSet("a", "asv", "m", {
        "same": regress.Measurement(10.0, fixed, (9.9, 10.1), version="1"),
        "slower": regress.Measurement(10.0, fixed, (9.9, 10.1), version="1"),
        "slowest": regress.Measurement(10.0, fixed, (9.9, 10.1), version="1"),
        "faster": regress.Measurement(10.0, fixed, (9.9, 10.1), version="1"),
        "missing": regress.Measurement(10.0, fixed, version="1"),
        "incomparable": regress.Measurement(10.0, fixed, version="1"),
        "broken": regress.Measurement(10.0, fixed, version="1"),
    }, failures={"was-broken": regress.Failure("error", "RuntimeError: out of memory")})
    b = regress.ResultSet("b", "asv", "m", {
        "same": regress.Measurement(10.0, fixed, (9.9, 10.1), version="1"),
        "slower": regress.Measurement(12.0, tuple(1.2 * x for x in fixed), (11.9, 12.1), version="1"),
        "slowest": regress.Measurement(15.0, tuple(1.5 * x for x in fixed), (14.9, 15.1), version="1"),
        "faster": regress.Measurement(8.0, tuple(0.8 * x for x in fixed), (7.9, 8.1), version="1"),
        "new": regress.Measurement(10.0, fixed[:3], version="1"),
        "was-broken": regress.Measurement(10.0, fixed[:3], version="1"),
        "incomparable": regress.Measurement(10.0, fixed, version="2"),
    }, failures={"broken": regress.Failure("wrong", "err_out 0.3 > 0.01")})
    table = regress.compare(a, b)
    p = float(mannwhitneyu(fixed, [1.2 * x for x in fixed], alternative="two-sided").pvalue)
    same_p = float(mannwhitneyu(fixed, fixed, alternative="two-sided").pvalue)
    rows = table.astype({"status": str}).to_dict("records")
    base = dict(threshold=0.05, time_a=10.0, n_a=10, n_b=10)
    expected = [
        dict(base, benchmark="broken", status="broken", ratio=None, p=None, time_b=None, n_b=0,
             test="wrong: err_out 0.3 > 0.01"),
        dict(base, benchmark="slowest", status="slower", ratio=1.5, p=p, time_b=15.0, test="mann-whitney"),
        dict(base, benchmark="slower", status="slower", ratio=1.2, p=p, time_b=12.0, test="mann-whitney"),
        dict(base, benchmark="missing", status="missing", ratio=None, p=None, time_b=None, n_b=0,
             test="absent from B"),
        dict(base, benchmark="faster", status="faster", ratio=0.8, p=p, time_b=8.0, test="mann-whitney"),
        dict(base, benchmark="incomparable", status="incomparable", ratio=None, p=None, time_b=10.0,
             test="version 1 != 2"),
        dict(base, benchmark="new", status="new", ratio=None, p=None, time_a=None, n_a=0, time_b=10.0, n_b=3,
             test=None),
        dict(base, benchmark="was-broken", status="new", ratio=None, p=None, time_a=None, n_a=0, time_b=10.0,
             n_b=3, test="A: error"),  # measured now, a failure in A: new, with what A was
        dict(base, benchmark="same", status="same", ratio=1.0, p=same_p, time_b=10.0, test="mann-whitney"),
    ]
    assert list(table.columns) == ["benchmark", "status", "ratio", "threshold", "p", "time_a", "time_b", "n_a",
                                   "n_b", "test"]
    assert len(rows) == len(expected)
    # rows numbered in that order; statuses ordered by severity, so that a caller can compare them
    assert list(table.index) == list(range(len(expected))) and table.status.cat.ordered
    for got, want in zip(rows, expected, strict=True):
        got = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in got.items()}
        assert got.keys() == want.keys() and got["benchmark"] == want["benchmark"], (got, want)
        for key, value in want.items():
            assert got[key] == pytest.approx(value) if isinstance(value, float) else got[key] == value, (key, got, want)


def test_what_an_asv_file_and_a_sweep_directory_read_as(tmp_path):
    """The fields the gate reads, from each form: source, kind, machine, names, medians, samples,
    spreads (asv: the samples' range; sweeps: the placement columns), intervals (none from a single
    sample), timer; and the unreadable files named in the error."""
    path = asv_file(tmp_path / "a.json", {("'triton'", "1"): [3.0, 1.0, 2.0], ("'naive'", "1"): [5.0]},
                    machine="nvidia-h200")
    loaded = regress.load(path)
    assert (loaded.source, loaded.kind, loaded.machine) == (str(path), "asv", "nvidia-h200")
    triton, naive = loaded.measurements[name("triton", 1)], loaded.measurements[name("naive", 1)]
    assert (triton.time, triton.samples, triton.spread, triton.version) == (2.0, (3.0, 1.0, 2.0), (1.0, 3.0), "v1")
    assert triton.ci99 is not None and naive.ci99 is None  # one sample: no interval
    assert (naive.time, naive.samples, naive.spread) == (5.0, (5.0,), None)
    unparametrised = tmp_path / "u.json"
    data = json.loads(path.read_text())
    data["results"] = {"decode.Track.track_x": [[7.0], None, "v1"]}
    unparametrised.write_text(json.dumps(data))
    assert list(regress.load(unparametrised).measurements) == ["decode.Track.track_x"]
    not_asv = tmp_path / "b.json"
    not_asv.write_text(json.dumps({"results": {}}))
    with pytest.raises(regress.InputError, match=rf"^{not_asv}: not an asv result file \(no 'result_columns'\)$"):
        regress.load(not_asv)

    sweep = sweep_dir_with_placements(tmp_path / "s", {TRITON: microseconds(0)}, gpu="NVIDIA H200")
    loaded = regress.load(sweep)
    assert (loaded.source, loaded.kind, loaded.machine) == (str(sweep), "sweep", "NVIDIA H200")
    (m,) = loaded.measurements.values()
    assert m.timer == "cuda-graph" and len(m.samples) == 60 and m.spread[0] <= m.time <= m.spread[1]
    with pytest.raises(regress.InputError, match=rf"^{tmp_path / 'none'}: no such file or directory$"):
        regress.load(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(regress.InputError, match=r"results.csv: missing"):
        regress.load(tmp_path / "empty")


def test_a_move_of_exactly_the_threshold_is_the_same():
    assert 10.5 / 10.0 == 1 + 0.05 and 10.0 / 10.5 == 1 / (1 + 0.05)  # the boundaries, exactly
    for a, b in ((10.0, 10.5), (10.5, 10.0)):
        status = regress.verdict(measurement(a, spread=None), measurement(b, spread=None, seed=3), 0.05, 0.01)[0]
        assert status == "same"


def test_placement_spreads_overlapping_by_exactly_the_threshold_do_not_make_it_unsure():
    a = regress.Measurement(10.0, tuple(np.linspace(9.9, 10.1, 20)), (9.0, 11.0))
    b = regress.Measurement(12.0, tuple(np.linspace(11.9, 12.1, 20)), (10.5, 12.5))
    assert regress.spread_overlap(a, b) == 0.05
    assert regress.verdict(a, b, 0.05, 0.01)[0] == "slower"


@pytest.mark.parametrize("text, parsed", [("fla=0.1", ("fla", 0.1)), ("a=b=0.2", ("a=b", 0.2)),
                                          ("CallTime=none", ("CallTime", None)), ("x=NONE", ("x", None)),
                                          ("x=0", ("x", 0.0))])
def test_threshold_rules_parse(text, parsed):
    assert regress.threshold_rule(text) == parsed


@pytest.mark.parametrize("text, message", [
    ("bad", "'bad' is not REGEX=VALUE (e.g. 'CallTime=none' or 'fla=0.1')"),
    ("=0.1", "'=0.1' is not REGEX=VALUE (e.g. 'CallTime=none' or 'fla=0.1')"),
    ("(x=0.1", "'(x' is not a valid regular expression (missing ), unterminated subpattern at position 0)"),
    ("x=abc", "'x=abc': the threshold must be a number >= 0 or 'none'"),
    ("x=-0.1", "'x=-0.1': the threshold must be a number >= 0 or 'none'"),
    ("x=inf", "'x=inf': the threshold must be a number >= 0 or 'none'"),
])
def test_threshold_rules_refused_with_what_is_wrong(text, message):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        regress.threshold_rule(text)
    assert str(err.value) == message


def test_comparable_only_from_one_machine_and_one_entry_state():
    def result(machine, entry):
        return regress.ResultSet("x", "sweep", machine, {}, None if entry is None else {"entry": entry})

    with pytest.raises(regress.InputError, match=r"^results come from different machines \('H200' vs 'H100'\); "):
        regress.check_comparable(result("H200", "clean"), result("H100", "clean"))
    with pytest.raises(regress.InputError, match=r"different L2 entry states \(entry: 'clean' vs 'dirty'\)"):
        regress.check_comparable(result("H200", "clean"), result("H200", "dirty"))
    for a, b in (("clean", None), (None, "clean")):  # a side that does not say: refused
        with pytest.raises(regress.InputError, match=r"different L2 entry states"):
            regress.check_comparable(result("H200", a), result("H200", b))
    regress.check_comparable(result(None, "clean"), result("H200", "clean"))


def test_unreadable_and_older_result_files(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(regress.InputError, match=rf"^{empty}: not valid JSON, empty or cut short"):
        regress.load(empty)
    two = asv_file(tmp_path / "two.json", {("'triton'", "1"): [1.0, 2.0]})
    m = regress.load(two).measurements[name("triton", 1)]
    assert m.ci99 is not None and m.spread == (1.0, 2.0)  # two samples: an interval and a range
    data = json.loads(two.read_text())
    del data["params"]
    two.write_text(json.dumps(data))
    assert regress.load(two).machine is None
    # a sweep without the placement and timer columns: refused, naming them; a row missing from
    # samples.json: no samples
    sweep = write_sweep_dir(tmp_path / "old", {TRITON: microseconds(0), FLA: microseconds(1)}, {"gpu": "g"})
    samples = json.loads((sweep / "samples.json").read_text())
    del samples[FLA.key()]
    (sweep / "samples.json").write_text(json.dumps(samples))
    assert regress.load(sweep).measurements[FLA.key()].samples is None
    pd.read_csv(sweep / "results.csv").drop(columns=["kernel_us_placement_max", "kernel_method"]).to_csv(
        sweep / "results.csv", index=False)
    with pytest.raises(regress.InputError, match=r"results.csv: no column kernel_method, kernel_us_placement_max "
                                                 r"\(an older kda-sweep's results\); re-run the sweep$"):
        regress.load(sweep)
    nan_spread = write_sweep_dir(tmp_path / "nan", {TRITON: microseconds(0)}, {"gpu": "g"})  # NaN placement columns
    assert regress.load(nan_spread).measurements[TRITON.key()].spread is None


def test_asv_bandwidth_sets_the_suites_gbps_beside_a_sweeps(tmp_path):
    """scripts.gate.asv_bandwidth's comparison: per point the asv median GB/s beside the sweep's, which
    agree where they differ by no more than the wider placement range (bf16 here, 0.5% apart) and
    not beyond it (fp32, 20% apart); the command refuses a box without a GPU in one line."""
    from scripts.gate import asv_bandwidth

    configs = {dtype: Config("triton", 256, 32, 32, 128, 128, state_dtype=dtype) for dtype in ("bfloat16", "float32")}
    sweep = write_sweep_dir(tmp_path / "sweep", {cfg: microseconds(i) for i, cfg in enumerate(configs.values())},
                            {"gpu": "NVIDIA H200"})
    table = pd.read_csv(sweep / "results.csv")
    table = table.assign(bytes=2e8, gbps=2e8 / table.kernel_us_mean / 1e3, kernel_us_placement_min=table.kernel_us_mean
                         * 0.99, kernel_us_placement_max=table.kernel_us_mean * 1.01)
    table.to_csv(sweep / "results.csv", index=False)
    gbps = dict(zip(table.state_dtype, table.gbps, strict=True))
    params = [["'triton'"], ["256"], ["'HV32-K128-V128'"], ["0"], ["'bfloat16'", "'float32'"], ["1"]]
    result = asv_file(tmp_path / "asv.json", {
        ("'triton'", "256", "'HV32-K128-V128'", "0", "'bfloat16'", "1"): [gbps["bfloat16"] * x for x in
                                                                           (1.0, 1.005, 1.01, 0.995)],
        ("'triton'", "256", "'HV32-K128-V128'", "0", "'float32'", "1"): [gbps["float32"] * 1.2 * x for x in
                                                                          (1.0, 1.005, 1.01, 0.995)]},
        params=params, bench="decode.Bandwidth.track_gbps")
    compared = asv_bandwidth.compare(result, sweep, "triton").set_index("state_dtype")
    assert list(compared.agrees) == [True, False]
    assert compared.difference.to_numpy() == pytest.approx([0.0025, 0.2030], abs=2e-3)
    assert compared.loc["float32", "spread"] == pytest.approx(1.01 / 0.99 - 1)
    done = subprocess.run([sys.executable, "-m", "scripts.gate.asv_bandwidth", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "needs a CUDA GPU" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_asv_file_gives_each_benchmark_its_direction_and_its_placements(tmp_path):
    """Read from asv's own format without an asv run: a bandwidth benchmark (track_gbps) is a rate,
    higher better, and a kernel time is not; each samples list (one median per placement) is the
    measurement's placements, its range the spread. So a bandwidth that fell is slower, and one that
    rose is faster, the way kernel times are judged the other way round."""
    samples = {("'triton'", "64"): [100.0, 102.0, 98.0, 101.0]}
    kernel = regress.load(asv_file(tmp_path / "kernel.json", samples))
    gbps = regress.load(asv_file(tmp_path / "gbps.json", samples, bench="decode.Bandwidth.track_gbps"))
    (k,), (g,) = kernel.measurements.values(), gbps.measurements.values()
    assert (k.rate, g.rate) == (False, True)
    assert g.placements == g.samples == (100.0, 102.0, 98.0, 101.0) and g.spread == (98.0, 102.0)
    fell = regress.load(asv_file(tmp_path / "fell.json", {key: [0.8 * x for x in s] for key, s in samples.items()},
                                 bench="decode.Bandwidth.track_gbps"))
    rose = regress.load(asv_file(tmp_path / "rose.json", {key: [1.25 * x for x in s] for key, s in samples.items()},
                                 bench="decode.Bandwidth.track_gbps"))
    assert regress.compare(gbps, fell)["status"].tolist() == ["slower"]
    assert regress.compare(gbps, rose)["status"].tolist() == ["faster"]


def test_a_sweeps_rows_without_a_kernel_time_are_failures_with_their_status_and_reason(tmp_path):
    """What the gate prints of each row it cannot compare: the row's status and its reason, "no reason
    recorded" where the row has none, "ok but no kernel time" for an ok row without one; every row with
    a kernel time is a measurement, none of them a failure."""
    naive, wrong = Config("naive", 64, 32, 32, 128, 128), Config("naive", 1, 32, 32, 128, 128)
    sweep = write_sweep_dir(tmp_path / "s", {TRITON: microseconds(0), FLA: "unsupported", wrong: "wrong",
                                             naive: microseconds(1)}, {"gpu": "g"})
    table = pd.read_csv(sweep / "results.csv")
    table.loc[table.key == wrong.key(), "reason"] = ""
    table.loc[table.key == naive.key(), "kernel_us_mean"] = float("nan")
    table.to_csv(sweep / "results.csv", index=False)
    loaded = regress.load(sweep)
    assert set(loaded.measurements) == {TRITON.key()}
    assert {key: (f.status, f.reason) for key, f in loaded.failures.items()} == {
        FLA.key(): ("unsupported", "a test's row"), wrong.key(): ("wrong", "no reason recorded"),
        naive.key(): ("ok", "ok but no kernel time")}


@pytest.mark.parametrize("where", ["a directory", "in no directory", "in /proc"])
def test_a_json_path_that_cannot_be_written_is_refused_before_anything_is_compared(tmp_path, where):
    """--json naming a directory, or a file where nothing can be written: one line naming the path,
    exit 2, nothing compared or printed on stdout, nothing written."""
    a = asv_file(tmp_path / "a.json", {("'triton'", "1"): timings(0)})
    b = asv_file(tmp_path / "b.json", {("'triton'", "1"): [2 * x for x in timings(1)]})
    path = {"a directory": tmp_path, "in no directory": tmp_path / "none" / "g.json",
            "in /proc": Path("/proc/no-such-process/g.json")}[where]
    before = sorted(tmp_path.rglob("*"))
    done = subprocess.run([sys.executable, "-m", "kda_impls.regress", str(a), str(b), "--json", str(path)], cwd=REPO,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr.startswith(f"kda-regress: error: --json {path}") and done.stderr.count("\n") == 1, done.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_the_json_report_replaces_the_file_whole(tmp_path):
    """An existing report is replaced by the new one, through a temporary file renamed over it: no
    temporary left beside it."""
    a = asv_file(tmp_path / "a.json", {("'triton'", "1"): timings(0)})
    (tmp_path / "gate.json").write_text("an older report")
    code, report, _ = gate(tmp_path, a, a)
    assert code == 0 and report["counts"]["same"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "gate.json"]
