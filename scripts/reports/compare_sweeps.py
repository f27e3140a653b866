"""Two sweep directories of the same configurations, row by row: how far each row timed in both
moved (B / A kernel time), and what each side's first calls (compilation included) took.

    python3 -m scripts.reports.compare_sweeps results/h200/targets TWO_GPU_RUN --min-B 16
    python3 -m scripts.reports.compare_sweeps OLD NEW --name-a OLD_SHA --name-b NEW_SHA --out FILE.md
    python3 -m scripts.reports.compare_sweeps ONE_GPU TWO_GPUS --run-to-run ANOTHER_ONE_GPU_RUN

For the multi-GPU proof (a sweep over two GPUs against one GPU's run of the same preset: do the
rows agree within the run-to-run spread? ``--run-to-run`` names another one-GPU run to judge by)
and for what moved between two commits' runs (every row beyond ``--flag`` is listed, with each
implementation's median ratio beside it, so that a whole machine running faster is told from one
implementation getting slower). Not a gate: ``kda-regress`` decides what is slower; this prints how
the two runs compare.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from kda_impls.bench.case import CONFIG_COLUMNS
from kda_impls.bench.results import SweepDirError, load
from kda_impls.cli import fail, print_and_save

SHOWN = ["impl", "state_dtype", "HV", "K", "V", "B", "T", "slot_pad"]


def paired(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The rows ok in both, by configuration, with ``ratio`` = B / A kernel time."""
    ok = [t[t.status == "ok"][[*CONFIG_COLUMNS, "kernel_us_mean"]] for t in (a, b)]
    both = ok[0].merge(ok[1], on=CONFIG_COLUMNS, suffixes=("_a", "_b"))
    return both.assign(ratio=both.kernel_us_mean_b / both.kernel_us_mean_a)


def first_calls(table: pd.DataFrame) -> pd.DataFrame:
    """Seconds of first calls per implementation (rows) and device (columns)."""
    return table.pivot_table(index="impl", columns="device", values="first_call_ms", aggfunc="sum") / 1e3


def library_first_calls(table: pd.DataFrame) -> pd.Series:
    """Seconds of first calls per library (its call variants together) and in all."""
    by_library = table.groupby(table.library.astype(object).fillna(table.impl)).first_call_ms.sum() / 1e3
    return pd.concat([by_library, pd.Series({"all": by_library.sum()})])


def row_time(table: pd.DataFrame) -> pd.DataFrame:
    """Per implementation: seconds its rows took (``row_s``), those less their first calls (what the
    timers and the placements cost), and the placements a row was timed on, on average."""
    by_impl = table.groupby("impl")
    # columns older sweeps lack: placements_timed (method 3 on), row_s (the multi-GPU lanes on)
    placements = by_impl.placements_timed.mean() if "placements_timed" in table else float("nan")
    rows_s = by_impl.row_s.sum() if "row_s" in table else pd.Series(float("nan"), index=list(by_impl.groups))
    return pd.DataFrame({"rows s": rows_s, "less first calls": rows_s - by_impl.first_call_ms.sum() / 1e3,
                         "placements": placements})


def wall_s(meta: dict) -> float:
    return sum(run.get("wall_s") or 0.0 for run in meta.get("runs", []))


def against_run_to_run(a, b, c, min_b: int) -> pd.DataFrame:
    """Per implementation at B >= ``min_b``: the range of B / A beside the range of C / A, where C
    is another run like A (the run-to-run spread B's moves are to be judged against)."""
    ranges = {}
    for name, other in (("B", b), ("C", c)):
        ratio = paired(a.table, other.table).query("B >= @min_b").groupby("impl").ratio
        ranges |= {f"{name} / A, min": ratio.min(), f"{name} / A, max": ratio.max()}
    return pd.DataFrame(ranges)


def report(a, b, name_a: str, name_b: str, min_b: int, flag: float, c=None, name_c: str = "") -> str:
    both = paired(a.table, b.table)
    large = both[both.B >= min_b]
    ratio = large.ratio
    summary = pd.DataFrame([{
        "median": ratio.median(), "p5": ratio.quantile(0.05), "p95": ratio.quantile(0.95),
        "min": ratio.min(), "max": ratio.max(), "within 2%": (ratio.sub(1).abs() <= 0.02).mean(),
        "within 3%": (ratio.sub(1).abs() <= 0.03).mean()}])
    rows = both.B.map(lambda B: f"B >= {min_b}" if B >= min_b else f"B < {min_b}")
    by_impl = both.assign(rows=rows).pivot_table(index="impl", columns="rows", values="ratio", aggfunc="median")
    moved = both[both.ratio.sub(1).abs() > flag].sort_values("ratio")
    calls = pd.concat({name_a: first_calls(a.table), name_b: first_calls(b.table)}, axis=1)
    calls.columns = [f"{side}, {device}" for side, device in calls.columns]
    totals = pd.DataFrame({name: library_first_calls(side.table) for name, side in ((name_a, a), (name_b, b))})
    costs = pd.concat({name_a: row_time(a.table), name_b: row_time(b.table)}, axis=1)
    costs.columns = [f"{side}: {what}" for side, what in costs.columns]
    return "\n\n".join([
        f"# {name_b} against {name_a}",
        f"A: `{name_a}` ({a.meta.get('git', {}).get('sha', '?')[:7]}, {wall_s(a.meta):.1f} s wall); "
        f"B: `{name_b}` ({b.meta.get('git', {}).get('sha', '?')[:7]}, {wall_s(b.meta):.1f} s wall); "
        f"{len(both)} configurations ok in both.",
        f"## B / A kernel time, the {len(large)} rows at B >= {min_b}\n\n"
        + summary.to_markdown(index=False, floatfmt=".4f"),
        "## Median B / A per implementation\n\n" + by_impl.to_markdown(floatfmt=".3f"),
        f"## Rows that moved by more than {flag * 100:g}%\n\n" + (moved[[*SHOWN, "kernel_us_mean_a", "kernel_us_mean_b",
                                                               "ratio"]].to_markdown(index=False, floatfmt=".3f")
                                                        if len(moved) else "(none)"),
        "## First calls (s), per implementation and device\n\n" + calls.to_markdown(floatfmt=".1f")
        + "\n\nPer library, every device (s):\n\n" + totals.to_markdown(floatfmt=".1f"),
        "## What the rows took, per implementation (s; placements: per row, on average)\n\n"
        + costs.to_markdown(floatfmt=".1f"),
    ] + ([f"## Against the run-to-run spread, rows at B >= {min_b}\n\nEach implementation's range of B / A "
          f"beside that of another run like A (`{name_c}`) against A.\n\n"
          + against_run_to_run(a, b, c, min_b).to_markdown(floatfmt=".3f")] if c is not None else [])
    ) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="the reference sweep directory")
    parser.add_argument("b", type=Path, help="the sweep directory compared with it")
    parser.add_argument("--name-a", help="A's name in the report (default: its path)")
    parser.add_argument("--name-b", help="B's name in the report (default: its path)")
    parser.add_argument("--min-B", type=int, default=16, help="the batch sizes summarised (default %(default)s)")
    parser.add_argument("--flag", type=float, default=0.03, help="list rows moved by more (default %(default)s)")
    parser.add_argument("--run-to-run", type=Path, metavar="C",
                        help="another run like A: each implementation's range of B / A is set beside C / A")
    parser.add_argument("--name-c", help="C's name in the report (default: its path)")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    try:
        a, b = load(args.a), load(args.b)
        c = load(args.run_to_run) if args.run_to_run else None
    except SweepDirError as exc:
        fail("compare_sweeps.py", str(exc))
    text = report(a, b, args.name_a or str(args.a), args.name_b or str(args.b), args.min_B, args.flag,
                  c, args.name_c or str(args.run_to_run))
    return print_and_save(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
