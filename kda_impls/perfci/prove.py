"""kda-ab proven on a GPU: an A/A pair of this checkout must pass at every point of the gate's grid, a
planted slowdown of one implementation in the head must be ``slower`` at every one of its points and
nothing else may fail, and the A/A spread of the paired form is set beside that of two back-to-back
``kda-sweep`` runs of the grid. The plant (``tests/planted/slowed.py``) joins both sides as the extra
implementation ``planted``, the ``--planted`` kernel, with its extra copy set (``--env-head``) in the
head only.

    python3 -m kda_impls.perfci.prove OUT [--impls triton] [--slowdown 0.06]

OUT receives ``aa/`` and ``planted/`` (kda-ab directories), ``sweep1/`` and ``sweep2/``, ``spread.csv``
and ``spread.json``, and ``summary.json`` (each check, the verdicts, the exit statuses). A step whose
output is already in OUT is kept, so a run cut off resumes. Exit 0 when every check holds, 1 otherwise.
The planted share is of the step's bytes; the slowdown it makes is that share plus the extra copy's
own launch, so a share above the 5% threshold is what a point at the threshold's edge cannot hide in.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .. import regress_rule
from ..cli import Parser
from . import spread

# the gate's points: B 64 and 512 of Kimi-Linear's layer, bf16 and fp32 state (benchmarks/common.py, "gate")
GRID = ["--B", "64,512", "--HV", "32", "--K", "128", "--V", "128", "--state-dtype", "bf16,fp32", "--T", "1",
        "--max-seconds", "0.1"]
CHECKOUT = Path(__file__).resolve().parents[2]  # both sides of each pair: this checkout
TESTS = CHECKOUT / "tests"
SWEEP = "import sys; from kda_impls.bench.sweep import main; main(sys.argv[1:])"
PLANTED = "planted"  # the plant's name in both sides' registries


def _run(argv: list[str], env: dict | None = None) -> int:
    print("+ " + " ".join(argv), flush=True)
    return subprocess.run(argv, env=None if env is None else os.environ | env).returncode


def _statuses(directory: Path) -> dict[str, str]:
    return {row["benchmark"]: row["status"] for row in json.loads((directory / "gate.json").read_text())["rows"]}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python3 -m kda_impls.perfci.prove", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--impls", default="triton", help="implementations of the grid (default %(default)s)")
    p.add_argument("--planted", default="triton", help="the implementation planted, slowed in the head (default "
                   "%(default)s)")
    p.add_argument("--slowdown", type=float, default=0.06,
                   help="planted share of the step's bytes (default %(default)s)")
    p.add_argument("--grid", type=shlex.split, default=GRID, help=f"kda-sweep options of the grid (default "
                   f"{shlex.join(GRID)})")
    args = p.parse_args(argv)
    grid = [*args.grid, "--impls", args.impls]
    ab = [sys.executable, "-m", "kda_impls.perfci.ab", str(CHECKOUT), str(CHECKOUT)]
    codes = {}
    if not (args.out / "aa" / "gate.json").exists():
        codes["aa"] = _run([*ab, *grid, "--out", str(args.out / "aa"), "--fresh"])
    if not (args.out / "planted" / "gate.json").exists():
        path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(TESTS)]))
        env = {"PYTHONPATH": path, "KDA_EXTRA_IMPLS": f"{PLANTED}=planted.slowed:Slowed",
               "KDA_PLANTED_BASE": args.planted}
        codes["planted"] = _run([*ab, *grid[:-1], f"{args.impls},{PLANTED}", "--out", str(args.out / "planted"),
                                 "--fresh", "--env-base", "KDA_PLANTED_SLOWDOWN=0",
                                 "--env-head", f"KDA_PLANTED_SLOWDOWN={args.slowdown}"], env=env)
    for name in ("sweep1", "sweep2"):
        if not (args.out / name / "results.csv").exists():
            codes[name] = _run([sys.executable, "-c", SWEEP, *grid, "--out", str(args.out / name), "--no-charts"])
    spread.main([str(args.out / "aa"), str(args.out / "sweep1"), str(args.out / "sweep2"), "--out", str(args.out)])
    aa, planted = _statuses(args.out / "aa"), _statuses(args.out / "planted")
    slowed = {k: s for k, s in planted.items() if k.startswith(f"{PLANTED}_B") and s != "skipped"}
    failing = set(regress_rule.FAILING)
    checks = {
        "aa_passes": not failing & set(aa.values()) and any(s == "same" for s in aa.values()),
        "planted_slower_everywhere": bool(slowed) and all(s == "slower" for s in slowed.values()),
        "planted_nothing_else": all(s not in failing for k, s in planted.items() if k not in slowed),
    }
    summary = {"checks": checks, "exit_statuses": codes, "aa": aa, "planted": planted, "grid": grid,
               "slowdown_share": args.slowdown, "spread": json.loads((args.out / "spread.json").read_text())}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(checks, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
