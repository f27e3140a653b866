"""The A/A spread of the paired form beside that of two back-to-back sweeps of the same grid: per
benchmark, kda-ab's median ratio over rounds (and its interval) of one revision against itself, and the
ratio of the kernel times of two ``kda-sweep`` runs of that revision one after the other. The paired
form exists to be the tighter of the two.

    python3 -m kda_impls.perfci.spread AB_DIR SWEEP_1 SWEEP_2 [--out DIR]

prints the table and the largest move of each form, and writes ``spread.csv`` and ``spread.json``
(with both sides' GPU and commit) into ``--out`` (default AB_DIR)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from .. import regress
from ..cli import Parser
from . import paired


def spread_table(ab_dir: Path, first: Path, second: Path) -> pd.DataFrame:
    """One row per benchmark both forms timed: the paired ratio and interval, the back-to-back ratio."""
    rows = {row["benchmark"]: row for row in json.loads((ab_dir / "gate.json").read_text())["rows"]}
    a, b = regress.load(first), regress.load(second)
    regress.check_comparable(a, b)
    found = []
    for name in sorted(set(rows) & set(a.measurements) & set(b.measurements)):
        row = rows[name]
        found.append(dict(benchmark=name, paired_ratio=row["ratio"], paired_ci_low=row["ci_low"],
                          paired_ci_high=row["ci_high"], rounds=row["rounds"],
                          back_to_back_ratio=regress.slowdown(a.measurements[name], b.measurements[name])))
    return pd.DataFrame(found)


def largest_move(ratios: pd.Series) -> float:
    """The largest |log ratio| as a relative move (1.03 and 1/1.03 both 3%)."""
    finite = [r for r in ratios if isinstance(r, float) and math.isfinite(r) and r > 0]
    return math.exp(max((abs(math.log(r)) for r in finite), default=0.0)) - 1


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python3 -m kda_impls.perfci.spread", description=__doc__.split("\n\n")[0])
    p.add_argument("ab_dir", type=Path, help="a kda-ab directory of one revision against itself")
    p.add_argument("first", type=Path, help="a kda-sweep directory of the same grid")
    p.add_argument("second", type=Path, help="the next kda-sweep directory of the same grid")
    p.add_argument("--out", type=Path, help="where spread.csv and spread.json go (default AB_DIR)")
    args = p.parse_args(argv)
    if not (args.ab_dir / "gate.json").exists():
        p.error(f"{args.ab_dir}: no gate.json: not a kda-ab directory")
    try:
        table = spread_table(args.ab_dir, args.first, args.second)
    except regress.InputError as exc:
        p.error(str(exc))
    out = args.out or args.ab_dir
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "spread.csv", index=False)
    metas = {side: json.loads((args.ab_dir / side / "meta.json").read_text()) for side in paired.SIDES}
    summary = {"paired_largest_move": largest_move(table.get("paired_ratio", pd.Series(dtype=float))),
               "back_to_back_largest_move": largest_move(table.get("back_to_back_ratio", pd.Series(dtype=float))),
               "benchmarks": len(table), "ab_dir": str(args.ab_dir), "sweeps": [str(args.first), str(args.second)],
               "gpu": metas["base"].get("gpu"), "commits": {s: m.get("git", {}).get("sha") for s, m in metas.items()}}
    (out / "spread.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}") if len(table) else "(no common benchmarks)")
    print(f"\nlargest A/A move: paired {summary['paired_largest_move']:.2%}, back to back "
          f"{summary['back_to_back_largest_move']:.2%} over {len(table)} benchmarks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
