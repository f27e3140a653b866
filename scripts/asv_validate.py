#!/usr/bin/env python3
"""Validate the asv suite and the regression gate on one GPU box (three quick runs; resumable).

1. Register the machine after its GPU (scripts/asv_machine.py).
2. A/A: run the suite twice on one commit, into two result sets; scripts/regress.py must pass
   (exit 0). Each benchmark's run-to-run spread goes to ``aa_spread.csv``.
3. Planted slowdown: run it a third time with ``KDA_TRITON_CONFIG`` forcing a slow Triton tile
   (asv's spawned benchmark processes inherit the environment); the gate must fail (exit 1)
   and flag no benchmark of another implementation.
4. ``asv publish`` the first run into ``html/``.

asv 0.6.6 saves an existing environment's results only under ``--set-commit-hash`` and names the
file after machine, commit and environment, so the independent result sets of one commit come
from separate results directories: one generated copy of asv.conf.json per run.

    python3 scripts/asv_validate.py OUT [--profile quick] [--slow-config BV=128,num_warps=1] [--max-runs N]

OUT gets ``<run>.conf.json``, ``<run>.log``, ``results-<run>/``, ``gate-aa.json``,
``gate-slow.json`` (and their printed tables in ``gate-*.txt``), ``aa_spread.csv``, ``html/``
and ``summary.json``. Exits 0 when every check holds, 3 when ``--max-runs`` stopped it before the
last run (call it again: it resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import json5  # asv's own reader of asv.conf.json (it has comments)
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kda_impls.regress import load  # noqa: E402

# One warp for a 128-row V tile, far from every tuned tile: on the H200 the planted run measured
# the Triton kernel 3.5-5.1x slower (results/h200/asv-validation/gate-slow.txt).
SLOW_TRITON = "BV=128,num_warps=1"


def sh(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, text=True, **kwargs)


def commit_to_label(scratch: Path, results_commit: str | None = None) -> tuple[Path, str, str]:
    """(repository, commit, branch) to file the results under: ``results_commit`` of this checkout
    when given (runs filed under it earlier), else this checkout's HEAD, or a scratch repository's
    one empty commit when the tree came without its git history or with a stale one (a HEAD
    other than the commit KDA_GIT_SHA says the tree is)."""
    branch = sh(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO, capture_output=True).stdout.strip()
    if results_commit:
        found = sh(["git", "rev-parse", "--verify", f"{results_commit}^{{commit}}"], cwd=REPO, capture_output=True)
        if found.returncode != 0:
            raise SystemExit(f"asv_validate: --results-commit {results_commit} is no commit of this checkout")
        return REPO, found.stdout.strip(), branch
    head = sh(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True)
    stated = os.environ.get("KDA_GIT_SHA")
    if head.returncode == 0 and stated in (None, head.stdout.strip()):
        return REPO, head.stdout.strip(), branch
    print("asv_validate: no git history of this tree here; filing results under a scratch repository's commit",
          flush=True)
    git = ["git", "-C", str(scratch), "-c", "user.name=asv-validate", "-c", "user.email=asv-validate@localhost"]
    if not (scratch / ".git").exists():  # kept across calls, so a resumed validation files under one commit
        sh(["git", "init", "-q", "-b", "main", str(scratch)], check=True)
        source = os.environ.get("KDA_GIT_SHA", "an uncommitted tree")
        sh(git + ["commit", "-q", "--allow-empty", "-m", f"asv validation of {source}"], check=True)
    return scratch, sh(git + ["rev-parse", "HEAD"], capture_output=True, check=True).stdout.strip(), "main"


INCOMPLETE = 3  # exit status when --max-runs stopped the validation before its last run


class RunLimitReached(Exception):
    """--max-runs new asv runs were made in this call."""


def asv_run(out: Path, label: str, conf: dict, machine: str, commit: str, env: dict, bench: list[str],
            runs_left: list[int]) -> tuple[Path | None, float, int]:
    """Run the suite (``bench``: asv --bench arguments) into ``out/results-<label>``; (result file,
    seconds, asv's exit status). A run whose result file is already there is kept, not repeated
    (seconds None): a validation cut short by a call's time limit resumes where it stopped.
    ``runs_left`` ([n], decremented) bounds the new runs of this call: with none left,
    RunLimitReached is raised instead of starting one that a time limit would cut off."""
    conf_path = out / f"{label}.conf.json"  # written anew: asv publish reads the first run's
    conf_path.write_text(json.dumps({**conf, "results_dir": str(out / f"results-{label}")}, indent=1))
    done_before = list((out / f"results-{label}" / machine).glob(f"{commit[:8]}-existing-*.json"))
    if len(done_before) == 1:
        print(f"asv run {label}: kept from an earlier call", flush=True)
        return done_before[0], None, 0
    if runs_left[0] <= 0:
        raise RunLimitReached(label)
    runs_left[0] -= 1
    start = time.monotonic()
    with open(out / f"{label}.log", "w") as log:
        done = sh([sys.executable, "-m", "asv", "run", "--config", str(conf_path), "-E", f"existing:{sys.executable}",
                   "--machine", machine, "--set-commit-hash", commit, "--record-samples", "--show-stderr",
                   "--durations", "10", *bench], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    files = list((out / f"results-{label}" / machine).glob(f"{commit[:8]}-existing-*.json"))
    print(f"asv run {label}: exit {done.returncode}, {seconds:.0f} s", flush=True)
    return (files[0] if len(files) == 1 else None), seconds, done.returncode


def gate(out: Path, label: str, a: Path, b: Path) -> tuple[int, dict]:
    report = out / f"gate-{label}.json"
    done = sh([sys.executable, str(REPO / "scripts" / "regress.py"), str(a), str(b), "--json", str(report)],
              capture_output=True)
    (out / f"gate-{label}.txt").write_text(done.stdout + done.stderr)
    print(f"regress {label}: exit {done.returncode}", flush=True)
    return done.returncode, (json.loads(report.read_text()) if report.exists() else {})


def impl_of(benchmark: str) -> str:
    """The implementation parameter: the first one of every benchmark in benchmarks/."""
    found = re.search(r"\('([^']*)'", benchmark)
    return found.group(1) if found else ""


def spread(a1: Path, a2: Path, slow: Path, aa_report: dict) -> pd.DataFrame:
    """Per benchmark: the medians of the runs where nothing changed (both A runs, and the slow run
    for other implementations than triton), their coefficient of variation, the A/A ratio and p,
    and the within-run spread (IQR / median of the first run's samples)."""
    runs = {"a1": load(a1).measurements, "a2": load(a2).measurements, "slow": load(slow).measurements}
    aa = {row["benchmark"]: row for row in aa_report.get("rows", [])}
    rows = []
    for name, first in runs["a1"].items():
        medians = pd.Series({run: m[name].median for run, m in runs.items()
                             if name in m and not (run == "slow" and impl_of(name) == "triton")})
        samples = pd.Series(first.samples or [], dtype=float)
        row = dict(benchmark=name, impl=impl_of(name), **medians.add_prefix("median_"), runs=len(medians),
                   cv_of_median=medians.std(ddof=1) / medians.mean(),  # NaN with one run
                   aa_ratio=aa.get(name, {}).get("ratio"), aa_p=aa.get(name, {}).get("p"), n_samples=len(samples),
                   within_run_iqr_over_median=(samples.quantile(0.75) - samples.quantile(0.25)) / samples.median())
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for every output (created)")
    parser.add_argument("--profile", default="quick", help="KDA_ASV_PROFILE of the runs (default %(default)s)")
    parser.add_argument("--slow-config", default=SLOW_TRITON, help="KDA_TRITON_CONFIG of the planted slowdown")
    parser.add_argument("--bench", metavar="REGEX", help="run only the benchmarks asv --bench REGEX selects "
                                                         "(e.g. to fit the budget)")
    parser.add_argument("--machine-suffix", default="", help="passed to scripts/asv_machine.py --suffix")
    parser.add_argument("--max-runs", type=int, default=3, metavar="N",
                        help="start at most N new asv runs in this call, then exit %d; run again to resume "
                             "(a lent GPU's per-call time limit fits fewer than three)" % INCOMPLETE)
    parser.add_argument("--results-commit", metavar="SHA",
                        help="the commit of this checkout that runs already in OUT are filed under: re-evaluate "
                             "them (gates, spread, publish, summary) with --max-runs 0, on any machine")
    parser.add_argument("--machine", help="an asv machine already registered (asv machine --machine NAME "
                                          "--yes), instead of registering this GPU")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    machine = args.machine or sh([sys.executable, str(REPO / "scripts" / "asv_machine.py"), "--suffix",
                                  args.machine_suffix], capture_output=True, check=True).stdout.strip()
    repo, commit, branch = commit_to_label(out / "scratch-repo", args.results_commit)
    conf = json5.loads((REPO / "asv.conf.json").read_text())
    conf.update(repo=str(repo), branches=[branch], benchmark_dir=str(REPO / "benchmarks"), html_dir=str(out / "html"))

    # The benchmark processes import this checkout's kda_impls, whatever else is installed: asv
    # puts ASV_PYTHONPATH on their sys.path (and drops PYTHONPATH).
    base_env = {k: v for k, v in os.environ.items() if k != "KDA_TRITON_CONFIG"}
    base_env.update(KDA_ASV_PROFILE=args.profile,
                    ASV_PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("ASV_PYTHONPATH")])))
    bench = ["--bench", args.bench] if args.bench else []
    runs_left = [args.max_runs]
    slow_env = {**base_env, "KDA_TRITON_CONFIG": args.slow_config}
    try:
        a1, t_a1, rc_a1 = asv_run(out, "a1", conf, machine, commit, base_env, bench, runs_left)
        a2, t_a2, rc_a2 = asv_run(out, "a2", conf, machine, commit, base_env, bench, runs_left)
        slow, t_slow, rc_slow = asv_run(out, "slow", conf, machine, commit, slow_env, bench, runs_left)
    except RunLimitReached as stopped:
        print(f"asv_validate: --max-runs {args.max_runs} reached before run {stopped}; run again to resume",
              flush=True)
        return INCOMPLETE
    if not (a1 and a2 and slow):
        print("asv_validate: a run saved no result file; see the logs", file=sys.stderr)
        return 1

    aa_exit, aa_report = gate(out, "aa", a1, a2)
    slow_exit, slow_report = gate(out, "slow", a1, slow)
    table = spread(a1, a2, slow, aa_report)
    table.to_csv(out / "aa_spread.csv", index=False)

    publish = sh([sys.executable, "-m", "asv", "publish", "--config", str(out / "a1.conf.json")], cwd=REPO,
                 env=base_env, capture_output=True)
    (out / "publish.log").write_text(publish.stdout + publish.stderr)

    triton = sorted(name for name in load(a1).measurements if impl_of(name) == "triton")
    flagged = slow_report.get("regressed", [])
    ratios = {row["benchmark"]: row["ratio"] for row in slow_report.get("rows", [])}
    summary = dict(
        machine=machine, commit=commit, profile=args.profile, slow_config=args.slow_config,
        source_commit=os.environ.get("KDA_GIT_SHA") if repo != REPO else commit,
        seconds=dict(a1=t_a1, a2=t_a2, slow=t_slow, this_call=round(time.monotonic() - started)),
        asv_run_exit=dict(a1=rc_a1, a2=rc_a2, slow=rc_slow),
        aa=dict(exit=aa_exit, counts=aa_report.get("counts"), max_cv_of_median=table["cv_of_median"].max()),
        slow=dict(exit=slow_exit, counts=slow_report.get("counts"), flagged=flagged,
                  flagged_not_triton=[n for n in flagged if impl_of(n) != "triton"],
                  triton_not_flagged={n: ratios.get(n) for n in triton if n not in flagged}),
        publish_exit=publish.returncode)
    summary["ok"] = (rc_a1 == rc_a2 == rc_slow == 0 and aa_exit == 0 and slow_exit == 1
                     and not summary["slow"]["flagged_not_triton"] and publish.returncode == 0)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    print(json.dumps(summary, indent=1, default=float))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
