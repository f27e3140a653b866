"""Prove the regression gate (kda_impls.regress) on a GPU box: it must pass every A/A pair and flag a
real small slowdown, in both forms it reads.

    python3 -m scripts.gate.validate_gate planted [--tune-rows CSV]   # the planted slowdown (below), printed
    python3 -m scripts.gate.validate_gate asv OUT [--profile gate] [--impls triton,fla] [--max-runs N]
    python3 -m scripts.gate.validate_gate sweep OUT A1 A2 A3 SLOW     # four sweep directories, already run

**The planted slowdown** is a Triton tile config that the committed tune runs the table was written
from (``TUNE_CSVS``, each point read from the last run that measured it) put 5-10% behind the
tuning table's choice at the most B >= 64 points of Kimi-Linear's layer, forced through
``KDA_TRITON_CONFIG``: a slowdown of
the size a careless change makes, not a 4x one no gate can miss.

**asv form**: the suite's kernel-time benchmarks (``KDA_ASV_PROFILE``, default ``gate``: the B >= 64
points; call latency is not gated) run three times
on one commit (a1, a2, a3) and once with the planted config (slow). asv 0.6.6 saves an existing
environment's results only under ``--set-commit-hash`` and names the file after machine, commit and
environment, so the runs of one commit go to separate results directories (one generated copy of
asv.conf.json each). Runs already in OUT are kept, so a validation cut off by a call's time limit
resumes (``--max-runs`` bounds the new runs of one call; exit 3 when it stopped before the last).
``asv publish`` renders the a1 run into ``OUT/html``.

**sweep form**: the same checks on four sweep directories (three of one commit, one with the
planted config).

The checks: each A/A pair (a1-a2, a2-a3, a1-a3) has no "slower" benchmark; in a1-slow every Triton
kernel-time benchmark whose median got >= 5% slower is flagged "slower", and no benchmark of another
implementation is. OUT gets ``gate-<pair>.json``/``.txt`` (the gate's report and table),
``spread.csv`` (each benchmark's medians over the A runs) and ``summary.json``. Exit 0 when every
check holds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from kda_impls import regress
from kda_impls.impls.triton.tiles import CONFIG_ENV, TileConfig, choose_config
from scripts.tuning.tuning_table import kept_config

REPO = Path(__file__).resolve().parents[2]  # the checkout: its benchmarks/ and asv.conf.json

# The tune runs the planted config is chosen from: one-token runs of the kernel the table runs (head
# counts passed at run time, const_heads=0), since a config's ratio to the table's choice depends on the
# kernel it was timed with. The last two are the over-table runs that set the table's B = 256 fp32 entry
# at the planted shape. A point is read from the last run that timed it, the table's choice with it. No
# run gives the bf16 B = 256 point a ratio (its entry was timed only against near variants), so the
# planted config is chosen on the other three points.
TUNE_ROWS = Path("results/h200/tuning-table/rows.csv")  # default --tune-rows: every tune run the table is written from
TUNE_CSVS = [f"results/h200/{run}/triton_tune.csv"  # those runs' names in the tune rows, last one read first
             for run in ("triton-tune-v3", "triton-tune-subtiles", "triton-tune-eviction-tiles/bf16",
                         "triton-tune-eviction-tiles/fp32")]
PLANTED_SHAPE = dict(HV=32, K=128, V=128)  # Kimi-Linear's layer, what the gate profile times
PLANTED_RANGE = (1.05, 1.10)
RUN_TO_RUN_LIMIT, RUN_TO_RUN_MIN_B = 0.02, 16  # every kernel time at B >= 16 within 2% over the A runs
SLOWDOWN_FLAGGED_FROM = 1.05
A_RUNS = ("a1", "a2", "a3")


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
            runs_left: list[int]) -> tuple[Path | None, float | None, int]:
    """Run the suite (``bench``: asv --bench arguments) into ``out/results-<label>``; (result file,
    seconds, asv's exit status). A run whose result file is already there is kept, not repeated
    (seconds None): a validation cut short by a call's time limit resumes where it stopped.
    ``runs_left`` ([n], decremented) bounds the new runs of this call: with none left,
    RunLimitReached is raised instead of starting one that a time limit would cut off."""
    conf_path = out / f"{label}.conf.json"  # written anew: asv publish reads run a1's
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


def planted_config(tune_rows: Path = TUNE_ROWS, tune_csvs: list[Path | str] = TUNE_CSVS) -> tuple[str, pd.DataFrame]:
    """(the config, the tune's ratio of it to the table's choice per state dtype and B >= 64) for
    the tiled shape PLANTED_SHAPE: the tuned config that falls in PLANTED_RANGE at the most points
    (ties: the smallest worst ratio). A point measured by several runs is read from the last, as the
    table is. ``tune_csvs``: run names of ``tune_rows``, or paths of tune CSVs."""
    every = pd.read_csv(tune_rows) if any(isinstance(run, str) for run in tune_csvs) else None
    tune = pd.concat([(every[every.run == run] if isinstance(run, str) else pd.read_csv(run)).assign(run=i)
                      for i, run in enumerate(tune_csvs)], ignore_index=True)
    tune = tune[(tune.status == "ok") & (tune.slot_pad == 0) & (tune.B >= 64) & (tune.source != "best, padded pool")
                & (tune.HV == PLANTED_SHAPE["HV"]) & (tune.K == PLANTED_SHAPE["K"]) & (tune.V == PLANTED_SHAPE["V"])]
    tune = tune[tune.run == tune.groupby(["state_dtype", "B"]).run.transform("max")]
    # Configs compared as parsed: the CSV's strings name every field of the run's TileConfig (the kernels'
    # forms only: kept_config leaves out a row of a dropped form).
    tune = tune.assign(config=[kept_config(c) for c in tune.config]).dropna(subset=["config"])
    tune = tune.assign(config=[str(TileConfig.parse(c, TileConfig(BV=PLANTED_SHAPE["V"]))) for c in tune.config])
    ratios = []
    for (dtype, B), rows in tune.groupby(["state_dtype", "B"]):
        chosen = str(choose_config(getattr(torch, dtype), B=B, **PLANTED_SHAPE))
        table_us = rows.loc[rows.config == chosen, "us"]
        if table_us.empty:
            continue
        ratios += [dict(state_dtype=dtype, B=B, config=r.config, ratio=r.us / table_us.iloc[0])
                   for r in rows.itertuples() if r.config != chosen]
    ratios = pd.DataFrame(ratios)
    ratios["in_range"] = ratios.ratio.between(*PLANTED_RANGE)
    score = ratios.groupby("config").agg(points=("in_range", "sum"), worst=("ratio", "max"))
    best = score.sort_values(["points", "worst"], ascending=[False, True]).index[0]
    return best, ratios[ratios.config == best].drop(columns="config").reset_index(drop=True)


def gate(out: Path, label: str, a: Path, b: Path) -> tuple[int, dict]:
    """Run kda-regress on (a, b); its table goes to gate-<label>.txt, its report to gate-<label>.json."""
    report = out / f"gate-{label}.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = regress.main([str(a), str(b), "--json", str(report)])
    (out / f"gate-{label}.txt").write_text(printed.getvalue())
    print(f"gate {label}: exit {code}", flush=True)
    return code, (json.loads(report.read_text()) if report.exists() else {})


def impl_of(benchmark: str) -> str:
    """The implementation: the first parameter of every asv benchmark, the first field of a sweep key."""
    found = re.search(r"\('([^']*)'", benchmark)
    return found.group(1) if found else benchmark.split("_B")[0]


def batch_of(benchmark: str) -> int:
    """The batch size: an asv benchmark's second parameter, a sweep key's ``_B<n>_`` field."""
    found = re.search(r"\('[^']*', (\d+)", benchmark) or re.search(r"_B(\d+)_", benchmark)
    return int(found.group(1))


def run_to_run(table: pd.DataFrame, limit: float = RUN_TO_RUN_LIMIT, min_batch: int = RUN_TO_RUN_MIN_B) -> dict:
    """The kernel-time criterion of the A runs: at B >= ``min_batch``, how many benchmarks moved by
    <= ``limit`` (max / min - 1 over the runs), and the largest move per implementation."""
    large = table[[is_kernel_time(b) and batch_of(b) >= min_batch for b in table.index]]
    moved = large["max_over_min"] - 1
    return dict(min_batch=min_batch, limit=limit, benchmarks=len(large), within=int((moved <= limit).sum()),
                largest_per_impl=moved.groupby([impl_of(b) for b in large.index]).max().round(4).to_dict())


def is_kernel_time(benchmark: str) -> bool:
    return "CallTime" not in benchmark


def evaluate(out: Path, runs: dict[str, Path], form: str, extra: dict) -> dict:
    """Gate every A/A pair and a1-slow; write spread.csv and summary.json; return the summary."""
    pairs = {}
    for x, y in itertools.combinations(A_RUNS, 2):
        code, report = gate(out, f"{x}-{y}", runs[x], runs[y])
        pairs[f"{x}-{y}"] = dict(exit=code, counts=report.get("counts"), slower=report.get("slower"))
    code, report = gate(out, "a1-slow", runs["a1"], runs["slow"])
    rows = report.get("rows", [])
    triton = [r for r in rows if impl_of(r["benchmark"]) == "triton" and is_kernel_time(r["benchmark"])
              and r["ratio"] is not None]
    must_flag = [r["benchmark"] for r in triton if r["ratio"] >= SLOWDOWN_FLAGGED_FROM]
    slow = dict(exit=code, counts=report.get("counts"),
                triton_ratios={r["benchmark"]: [round(r["ratio"], 4), r["status"]] for r in triton},
                missed=[b for b in must_flag if b not in report.get("slower", [])],
                flagged_not_triton=[b for b in report.get("slower", []) if impl_of(b) != "triton"])
    medians = {label: {name: m.time for name, m in regress.load(runs[label]).measurements.items()}
               for label in A_RUNS}
    table = pd.DataFrame(medians)
    table["max_over_min"] = table.max(axis=1) / table.min(axis=1)
    table.rename_axis("benchmark").to_csv(out / "spread.csv")
    summary = dict(form=form, runs={k: str(v) for k, v in runs.items()}, aa=pairs, slow=slow,
                   max_aa_spread=float(table["max_over_min"].max()), run_to_run=run_to_run(table),
                   planted_flagged=len(must_flag) - len(slow["missed"]),
                   planted_must_flag=len(must_flag), **extra)
    summary["ok"] = (all(p["exit"] == 0 and not p["slower"] for p in pairs.values())
                     and not slow["missed"] and not slow["flagged_not_triton"] and bool(must_flag))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    print(json.dumps(summary, indent=1, default=float))
    return summary


def asv_form(args) -> int:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    machine = args.machine or sh([sys.executable, "-m", "kda_impls.asv_machine", "--suffix", args.machine_suffix],
                                 cwd=REPO, capture_output=True, check=True).stdout.strip()
    repo, commit, branch = commit_to_label(out / "scratch-repo", args.results_commit)
    import json5  # asv's own reader of asv.conf.json (it has comments); the other forms run without asv

    conf = json5.loads((REPO / "asv.conf.json").read_text())
    conf.update(repo=str(repo), branches=[branch], benchmark_dir=str(REPO / "benchmarks"), html_dir=str(out / "html"))
    # The benchmark processes import this checkout's kda_impls, whatever else is installed: asv
    # puts ASV_PYTHONPATH on their sys.path (and drops PYTHONPATH).
    base_env = {k: v for k, v in os.environ.items() if k != CONFIG_ENV}
    base_env.update(KDA_ASV_PROFILE=args.profile, KDA_ASV_IMPLS=args.impls,
                    ASV_PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("ASV_PYTHONPATH")])))
    slow_config = planted_config(args.tune_rows)[0] if args.slow_config == "auto" else args.slow_config
    runs, seconds, exits = {}, {}, {}
    runs_left = [args.max_runs]
    try:
        for label in (*A_RUNS, "slow"):
            env = {**base_env, CONFIG_ENV: slow_config} if label == "slow" else base_env
            runs[label], seconds[label], exits[label] = asv_run(out, label, conf, machine, commit, env,
                                                                ["--bench", r"^decode\.KernelTime\."], runs_left)
    except RunLimitReached as stopped:
        print(f"validate_gate: --max-runs {args.max_runs} reached before run {stopped}; run again to resume",
              flush=True)
        return INCOMPLETE
    if not all(runs.values()):
        print("validate_gate: a run saved no result file; see the logs", file=sys.stderr)
        return 1
    publish = sh([sys.executable, "-m", "asv", "publish", "--config", str(out / "a1.conf.json")], cwd=REPO,
                 env=base_env, capture_output=True)
    (out / "publish.log").write_text(publish.stdout + publish.stderr)
    summary = evaluate(out, runs, "asv", dict(
        machine=machine, commit=commit, profile=args.profile, impls=args.impls, slow_config=slow_config,
        source_commit=os.environ.get("KDA_GIT_SHA") if repo != REPO else commit, seconds=seconds,
        this_call_s=round(time.monotonic() - started), asv_run_exit=exits, publish_exit=publish.returncode))
    return 0 if summary["ok"] and not any(exits.values()) and publish.returncode == 0 else 1


def sweep_form(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    runs = dict(zip((*A_RUNS, "slow"), (args.a1, args.a2, args.a3, args.slow), strict=True))
    return 0 if evaluate(args.out, runs, "sweep", {})["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    forms = parser.add_subparsers(dest="form", required=True)
    planted = forms.add_parser("planted", help="print the planted slowdown's config and its tuned ratios")
    asv = forms.add_parser("asv", help="run the asv suite 3+1 times and gate the runs")
    asv.add_argument("out", type=Path, help="directory for every output (created)")
    asv.add_argument("--profile", default="gate", help="KDA_ASV_PROFILE of the runs (default %(default)s)")
    asv.add_argument("--impls", default="triton,fla", help="KDA_ASV_IMPLS: the implementations timed (default "
                     "%(default)s: the planted kernel and a control; each costs a process per grid point)")
    asv.add_argument("--slow-config", default="auto", help="KDA_TRITON_CONFIG of the slow run (default: planted)")
    asv.add_argument("--machine-suffix", default="", help="passed to python3 -m kda_impls.asv_machine --suffix")
    asv.add_argument("--max-runs", type=int, default=4, metavar="N",
                     help=f"start at most N new asv runs in this call, then exit {INCOMPLETE}; run again to resume")
    asv.add_argument("--results-commit", metavar="SHA",
                     help="the commit of this checkout that runs already in OUT are filed under: re-evaluate "
                          "them with --max-runs 0, on any machine")
    asv.add_argument("--machine", help="an asv machine already registered (asv machine --machine NAME --yes), "
                                       "instead of registering this GPU")
    for form in (planted, asv):
        form.add_argument("--tune-rows", type=Path, default=TUNE_ROWS,
                          help="the tune runs' rows the planted config is chosen from (default %(default)s)")
    sweep = forms.add_parser("sweep", help="gate four sweep directories")
    sweep.add_argument("out", type=Path)
    for label in (*A_RUNS, "slow"):
        sweep.add_argument(label, type=Path)
    args = parser.parse_args(argv)
    if args.form == "planted":
        config, ratios = planted_config(args.tune_rows)
        print(config)
        print(ratios.to_string(index=False), file=sys.stderr)
        return 0
    return asv_form(args) if args.form == "asv" else sweep_form(args)


if __name__ == "__main__":
    sys.exit(main())
