#!/usr/bin/env python3
"""Our sweeps against published timings: does a table someone measured reproduce here, and under
which pool layout?

    python scripts/compare_published.py results/published/triton-issue-h200.csv SWEEP_DIR [SWEEP_DIR ...]
        [--out DIR]   # writes DIR/comparison.csv and DIR/comparison.md (default: print only)

Each sweep directory is one run; runs of one pool layout (slots per row, slot order, L2-cold or
not) form one *variant*, whose figure for a published row is the median of its runs'
medians. The run-to-run spread of a row is the largest max/min - 1 of its medians within any
variant that has at least two runs; a variant reproduces a published figure when
|ours / published - 1| is within that spread. With no repeated variant there is no spread, and
nothing is called reproduced. Only unpadded pools without padding rows are compared.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

KEY = ["impl", "state_dtype", "H", "HV", "K", "V", "B"]


def variant_label(settings: dict) -> str:
    """The pool layout a run timed (and L2-hot, where it was). Sampling budgets are not part of
    it: they change how many samples a median has, not what is measured."""
    slots = settings.get("pool_slots_per_row", 1)
    order = "sorted" if settings.get("sorted_slots", False) else "random"
    return f"pool {slots}xB, {order} slots" + ("" if settings.get("l2_cold", True) else ", L2-hot")


def load_runs(dirs: list[Path]) -> pd.DataFrame:
    """One row per (run, configuration) measured ok on an unpadded pool: KEY, kernel_us_median,
    run, variant."""
    frames = []
    for run in dirs:
        meta = json.loads((run / "meta.json").read_text())
        table = pd.read_csv(run / "results.csv")
        table = table[(table.status == "ok") & (table.slot_pad == 0) & (table.pad_rows == 0)]
        frames.append(table[KEY + ["kernel_us_median"]].assign(
            run=str(run), variant=variant_label(meta.get("settings", {}))))
    return pd.concat(frames, ignore_index=True)


def compare(published: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per published figure and variant: ours (median over the variant's runs), ratio,
    n_runs, the row's run-to-run spread and whether the figure is reproduced within it."""
    per_variant = runs.groupby(KEY + ["variant"]).kernel_us_median.agg(
        ours_us="median", n_runs="count", variant_spread=lambda s: s.max() / s.min() - 1).reset_index()
    repeated = per_variant[per_variant.n_runs >= 2]
    spread = repeated.groupby(KEY).variant_spread.max().rename("run_to_run_spread").reset_index()
    table = (published.rename(columns={"kernel_us": "published_us"})
             .merge(per_variant.drop(columns="variant_spread"), on=KEY, how="left")
             .merge(spread, on=KEY, how="left"))
    table["ratio"] = table.ours_us / table.published_us
    table["reproduced"] = (table.ratio - 1).abs() <= table.run_to_run_spread  # False where no spread is known
    return table.sort_values(["variant", "impl", "state_dtype", "HV", "K", "B"], ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per variant: figures compared, reproduced, and the range and median of ours / published."""
    return table.dropna(subset=["ours_us"]).groupby("variant").agg(
        figures=("ratio", "count"), reproduced=("reproduced", "sum"), ratio_min=("ratio", "min"),
        ratio_median=("ratio", "median"), ratio_max=("ratio", "max")).reset_index()


def markdown(table: pd.DataFrame, source: Path, dirs: list[Path]) -> str:
    wide = table.dropna(subset=["ours_us"]).assign(
        cell=lambda t: t.apply(lambda r: f"{r.ours_us:.2f} ({r.ratio - 1:+.1%}{'' if r.reproduced else ' !'})", axis=1))
    wide = wide.pivot_table(index=KEY + ["published_us", "run_to_run_spread"], columns="variant", values="cell",
                            aggfunc="first").reset_index()
    return "\n\n".join([
        f"# Published figures ({source}) against our runs",
        "Runs: " + ", ".join(f"`{d}`" for d in dirs),
        "Cells: our median kernel time in us (ours / published - 1); `!` where that is outside the "
        "run-to-run spread of the row (largest max/min - 1 within a repeated variant).",
        wide.to_markdown(index=False, floatfmt=".3f"),
        "## Per variant",
        summary(table).to_markdown(index=False, floatfmt=".3f"),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("published", type=Path, help="CSV of published figures: impl, state_dtype, H, HV, K, V, B, "
                                                     "kernel_us (more columns are carried along)")
    parser.add_argument("runs", type=Path, nargs="+", help="sweep result directories")
    parser.add_argument("--out", type=Path, help="write comparison.csv and comparison.md here")
    args = parser.parse_args(argv)
    published = pd.read_csv(args.published)
    missing = set(KEY + ["kernel_us"]) - set(published.columns)
    if missing:
        parser.error(f"{args.published} lacks the columns {sorted(missing)}")
    table = compare(published, load_runs(args.runs))
    text = markdown(table, args.published, args.runs)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "comparison.csv", index=False)
        (args.out / "comparison.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
