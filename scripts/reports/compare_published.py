"""Our sweeps against published timings: does a table someone measured reproduce here, with which
of the library's call variants, and under which pool layout?

    python3 -m scripts.reports.compare_published results/published/triton-issue-h200.csv SWEEP_DIR [SWEEP_DIR ...]
        [--out DIR]   # writes DIR/comparison.csv and DIR/comparison.md (default: print only)

A published figure names a library (its ``impl`` column: ``flashinfer``, ``fla``). In each run
(sweep directory) the library's figure is that of its fastest verified variant at the point
(kda_impls.bench.results.best_per_library), named in the table. Runs of one *layout* (slots per
row, slot order, L2 entry state) form one group, whose figure for a published row is the median of
its runs' figures. The run-to-run spread of a row is the largest max/min - 1 of its figures within
any layout that has at least two runs; a layout reproduces a published figure when
|ours / published - 1| is within that spread. With no repeated layout there is no spread, and
nothing is called reproduced. Only one-token steps on unpadded pools without padding rows are compared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from kda_impls.bench.results import SweepDirError, best_per_library, load
from kda_impls.cli import Parser, fail

KEY = ["impl", "state_dtype", "H", "HV", "K", "V", "B"]  # impl: the published table's library


def layout_label(row) -> str:
    """The pool layout and L2 entry state a row was timed in. Sampling budgets and placements are
    not part of it: they change how well a median is known, not what is measured."""
    return f"pool {row.slots_per_row}xB, {row.slot_order} slots, L2 {row.l2_entry}"


def load_runs(dirs: list[Path]) -> pd.DataFrame:
    """One row per (run, library, configuration) measured ok on an unpadded pool: KEY (impl: the
    library), kernel_us_mean, best_impl (the variant that was fastest), run, layout."""
    frames = []
    for run in dirs:
        table = load(run).ok
        table = table[(table.slot_pad == 0) & (table.pad_rows == 0) & (table["T"] == 1) & (table["mode"] == "inplace")]
        best = best_per_library(table).rename(columns={"impl": "best_impl"}).rename(columns={"library": "impl"})
        frames.append(best[KEY + ["kernel_us_mean", "best_impl"]].assign(
            run=str(run), layout=[layout_label(r) for r in best.itertuples()]))
    return pd.concat(frames, ignore_index=True)


def compare(published: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per published figure and layout: ours (median over the layout's runs), the variants
    that won in those runs, ratio, n_runs, the row's run-to-run spread and whether the figure is
    reproduced within it."""
    per_layout = runs.groupby(KEY + ["layout"]).agg(
        ours_us=("kernel_us_mean", "median"), n_runs=("kernel_us_mean", "count"),
        layout_spread=("kernel_us_mean", lambda s: s.max() / s.min() - 1),
        best_impl=("best_impl", lambda v: ", ".join(sorted(set(v))))).reset_index()
    repeated = per_layout[per_layout.n_runs >= 2]
    spread = repeated.groupby(KEY).layout_spread.max().rename("run_to_run_spread").reset_index()
    table = (published.rename(columns={"kernel_us": "published_us"})
             .merge(per_layout.drop(columns="layout_spread"), on=KEY, how="left")
             .merge(spread, on=KEY, how="left"))
    table["ratio"] = table.ours_us / table.published_us
    table["reproduced"] = (table.ratio - 1).abs() <= table.run_to_run_spread  # False where no spread is known
    return table.sort_values(["layout", "impl", "state_dtype", "HV", "K", "B"], ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per layout: figures compared, reproduced, and the range and median of ours / published."""
    return table.dropna(subset=["ours_us"]).groupby("layout").agg(
        figures=("ratio", "count"), reproduced=("reproduced", "sum"), ratio_min=("ratio", "min"),
        ratio_median=("ratio", "median"), ratio_max=("ratio", "max")).reset_index()


def markdown(table: pd.DataFrame, source: Path, dirs: list[Path]) -> str:
    wide = table.dropna(subset=["ours_us"]).assign(
        cell=lambda t: t.apply(lambda r: f"{r.ours_us:.2f} ({r.ratio - 1:+.1%}{'' if r.reproduced else ' !'}) "
                                         f"{r.best_impl}", axis=1))
    wide = wide.pivot_table(index=KEY + ["published_us", "run_to_run_spread"], columns="layout", values="cell",
                            aggfunc="first").reset_index()
    return "\n\n".join([
        f"# Published figures ({source}) against our runs",
        "Runs: " + ", ".join(f"`{d}`" for d in dirs),
        "Cells: our median kernel time in us of the library's fastest verified variant (ours / published - 1), "
        "then that variant; `!` where the ratio is outside the run-to-run spread of the row (largest max/min - 1 "
        "within a repeated layout).",
        wide.to_markdown(index=False, floatfmt=".3f"),
        "## Per layout",
        summary(table).to_markdown(index=False, floatfmt=".3f"),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="compare_published.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("published", type=Path, help="CSV of published figures: impl, state_dtype, H, HV, K, V, B, "
                                                     "kernel_us (more columns are carried along)")
    parser.add_argument("runs", type=Path, nargs="+", help="sweep result directories")
    parser.add_argument("--out", type=Path, help="write comparison.csv and comparison.md here")
    args = parser.parse_args(argv)
    published = pd.read_csv(args.published)
    missing = set(KEY + ["kernel_us"]) - set(published.columns)
    if missing:
        parser.error(f"{args.published} lacks the columns {sorted(missing)}")
    try:
        runs = load_runs(args.runs)
    except SweepDirError as exc:
        fail(parser.prog, str(exc))
    table = compare(published, runs)
    text = markdown(table, args.published, args.runs)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "comparison.csv", index=False)
        (args.out / "comparison.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
