"""`kda-perf-ci`: the jobs a team's perf CI runs on a self-hosted GPU runner, each failing exactly when
the gate fails (exit 1; 2 on unusable input).

* ``main``: the asv suite at the checked-out commit, recorded into the history (``.asv/results``,
  which CI restores before and saves after), gated against the history's run of the nearest earlier
  commit of the branch that has one, and published (``.asv/html``).
* ``pr``: the head against its merge base. Where ``--history`` finds main's run of the base for this
  machine, the head's asv run is gated against it (the quick grid is a subset of main's full one:
  ``--allow-missing``); else ``kda-ab`` measures both side by side. ``--shard i/n`` measures every n-th
  configuration, one shard per job of a CI matrix.
* ``gate``: the shards' A/B directories merged into one and judged as one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .. import regress
from ..bench.merge import main as merge_sweeps
from ..cli import Parser, UsageError, fail
from . import ab, paired, revisions

PROG = "kda-perf-ci"
RESULTS = Path(".asv/results")
SHARD_FILE = "shard.json"  # in a pr shard's A/B directory: {"index": i, "count": n}


def _sh(*args: str, env: dict | None = None) -> int:
    """Run a command with its output shown; its exit status."""
    print("+ " + " ".join(args), flush=True)
    return subprocess.run(args, env=None if env is None else os.environ | env).returncode


def asv_env(profile: str, impls: str | None, top: Path) -> dict:
    return {"KDA_ASV_PROFILE": profile, "ASV_PYTHONPATH": os.environ.get("ASV_PYTHONPATH", str(top)),
            **({"KDA_ASV_IMPLS": impls} if impls else {})}


def machine(args, env: dict) -> str:
    """The asv machine name: --machine, else this GPU registered with asv (kda_impls.asv_machine)."""
    if args.machine:
        return args.machine
    done = subprocess.run([sys.executable, "-m", "kda_impls.asv_machine"], capture_output=True, text=True,
                          env=os.environ | env)
    sys.stderr.write(done.stderr)
    if done.returncode:
        raise SystemExit(done.returncode)
    return done.stdout.strip().splitlines()[-1]


def result_file(results: Path, name: str, sha: str) -> Path | None:
    """The history's result file of commit ``sha`` on machine ``name`` (asv names it by 8 hex digits)."""
    found = sorted((results / name).glob(f"{sha[:8]}-existing-*.json"))
    return found[0] if found else None


def asv_run(name: str, sha: str, env: dict) -> int:
    return _sh(sys.executable, "-m", "asv", "run", "-E", "existing", "--machine", name, "--set-commit-hash", sha,
               "--record-samples", "--show-stderr", env=env)


def gate_files(a: Path, b: Path, out: Path, gate_args: list[str]) -> int:
    """kda-regress of two asv result files, its report in ``out``/gate.json; its exit status."""
    out.mkdir(parents=True, exist_ok=True)
    return regress.main([str(a), str(b), "--json", str(out / "gate.json"), *gate_args])


def gate_argv(args) -> list[str]:
    """The gate options given, as kda-regress takes them."""
    argv = ["--threshold", str(args.threshold), "--alpha", str(args.alpha)]
    for pattern, value in args.threshold_for or ():
        argv += ["--threshold-for", f"{pattern}={'none' if value is None else value}"]
    return argv + ["--allow-unsure"] * args.allow_unsure + ["--allow-missing"] * args.allow_missing


def job_main(args) -> int:
    top = revisions.repository(Path.cwd())
    sha = revisions.git("rev-parse", "HEAD", cwd=top)
    env = asv_env(args.profile, args.asv_impls, top)
    name = machine(args, env)
    ran = asv_run(name, sha, env)
    earlier = next((f for c in revisions.git("rev-list", "--first-parent", "--skip=1", "-n", str(args.look_back),
                                             "HEAD", cwd=top).split() if (f := result_file(RESULTS, name, c))), None)
    current = result_file(RESULTS, name, sha)
    status = 0
    if current is None:
        print(f"{PROG}: asv recorded no result for {sha[:8]} on {name}: the run failed", file=sys.stderr)
        status = 1
    elif earlier is None:
        print(f"{PROG}: no earlier run on {name} in the last {args.look_back} commits: nothing to gate against")
    else:
        status = gate_files(earlier, current, args.out, gate_argv(args))
    if ran:
        print(f"{PROG}: asv run exited {ran}: a benchmark failed (its error is above)", file=sys.stderr)
        status = 1
    if not args.no_publish:
        _sh(sys.executable, "-m", "asv", "publish")
    return status


def job_pr(args, rest: list[str]) -> int:
    top = revisions.repository(Path.cwd())
    base = args.base or revisions.git("merge-base", args.main_branch, args.head, cwd=top, check=False)
    if not base:
        fail(PROG, f"no merge base of {args.main_branch} and {args.head}: pass --base REV")
    base, head = (revisions.commit_of(spec, top) for spec in (base, args.head))
    if args.history:
        env = asv_env(args.profile, args.asv_impls, top)
        name = machine(args, env)
        earlier = result_file(RESULTS, name, base)
        if earlier is not None:
            if rest:
                fail(PROG, f"options {' '.join(rest)} are kda-ab's; the history's gate runs asv's --profile")
            ran = asv_run(name, head, env)
            current = result_file(RESULTS, name, head)
            if ran or current is None:
                return 1
            return gate_files(earlier, current, args.out, [*gate_argv(args), "--allow-missing"])
        print(f"{PROG}: no run of {base[:8]} on {name} in the history: measuring both with kda-ab")
    argv = [base, head, "--out", str(args.out), *gate_argv(args), *rest, *(["--shard", args.shard] * bool(args.shard))]
    ab.checked_spec(ab.parser().parse_args(argv))  # kda-ab's options checked (exit 2) before anything is written
    if args.shard:
        index, count = args.shard.split("/")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / SHARD_FILE).write_text(json.dumps({"index": int(index), "count": int(count)}) + "\n")
    return ab.run(argv)


def job_gate(args) -> int:
    """Merge the shards' A/B directories into ``args.out`` and judge them as one run."""
    shards = []
    for directory in args.shards:
        path = directory / SHARD_FILE
        if not path.exists():
            fail(PROG, f"{directory}: no {SHARD_FILE}: not the A/B directory of a `{PROG} pr --shard` job")
        shards.append(json.loads(path.read_text()))
    counts = {s["count"] for s in shards}
    indices = sorted(s["index"] for s in shards)
    if len(counts) != 1 or indices != list(range(next(iter(counts)))):
        print(f"{PROG}: FAIL: shards {indices} of {sorted(counts)}: a shard is missing or repeated (its job failed "
              f"or was cut short)")
        return 1
    if any((args.out / side).exists() for side in paired.SIDES):
        fail(PROG, f"{args.out} holds a merged run: name a new directory")
    rounds: dict = {}
    for directory in args.shards:
        for key, value in json.loads((directory / paired.ROUNDS_FILE).read_text()).items():
            if key in rounds:
                fail(PROG, f"{key} is in two shards; shards of one run do not overlap")
            rounds[key] = value
    for side in paired.SIDES:
        merge_sweeps([str(args.out / side), *(str(d / side) for d in args.shards)])
    (args.out / paired.ROUNDS_FILE).write_text(json.dumps(rounds, indent=1) + "\n")
    return ab.report(args.out, args, f"{PROG} gate", args.repro)


def parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=__doc__.split("\n\n", 1)[1])
    jobs = p.add_subparsers(dest="job", required=True, parser_class=Parser)
    main_job = jobs.add_parser("main", help="asv run of this commit into the history, gated and published")
    pr = jobs.add_parser("pr", help="the head against its merge base (kda-ab; or the history's base run)",
                         epilog="Options not listed here are kda-ab's (the grid, timing, --rounds, --env-head, ...).")
    gate = jobs.add_parser("gate", help="merge the shards of `pr --shard` and gate them as one run")
    for job in (main_job, pr):
        job.add_argument("--machine", help="asv machine name (default: this GPU, registered with asv)")
        job.add_argument("--asv-impls", help="KDA_ASV_IMPLS of the asv run (default: the suite's)")
    main_job.add_argument("--profile", default="full", help="KDA_ASV_PROFILE (default %(default)s)")
    main_job.add_argument("--look-back", type=int, default=50, metavar="N",
                          help="gate against the nearest of the N earlier first-parent commits with a run")
    main_job.add_argument("--no-publish", action="store_true", help="leave .asv/html as it is")
    main_job.add_argument("--out", type=Path, default=Path("perf-ci"), help="where gate.json goes")
    pr.add_argument("--base", help="the base revision (default: the merge base of --main-branch and --head)")
    pr.add_argument("--head", default="HEAD")
    pr.add_argument("--main-branch", default="origin/main")
    pr.add_argument("--history", action="store_true",
                    help="gate against main's asv run of the base where the history has one")
    pr.add_argument("--profile", default="quick", help="KDA_ASV_PROFILE of the head's run with --history")
    pr.add_argument("--shard", help="i/n: this job's share of the grid (kda-sweep's --shard)")
    pr.add_argument("--out", type=Path, default=Path("perf-ci"), help="the A/B directory (default %(default)s)")
    gate.add_argument("out", type=Path, help="the merged A/B directory")
    gate.add_argument("shards", type=Path, nargs="+", help="the shards' A/B directories")
    for job in (main_job, pr, gate):
        ab.add_gate_options(job)
    return p


def main(argv: list[str] | None = None) -> None:
    args, rest = parser().parse_known_args(argv)
    try:
        if args.job != "pr" and rest:
            raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
        status = {"main": lambda: job_main(args), "pr": lambda: job_pr(args, rest), "gate": lambda: job_gate(args)
                  }[args.job]()
    except UsageError as exc:
        fail(PROG, str(exc))
    raise SystemExit(status)


if __name__ == "__main__":
    main()
