#!/usr/bin/env python3
"""Several sweep directories of the same configurations, each from its own process: how far each
row's kernel time moves between the runs (max / min - 1), beside how far its placements spread
within each run.

    python3 scripts/run_to_run.py SWEEP_A SWEEP_B SWEEP_C
    python3 scripts/run_to_run.py DIR... --min-B 64 --limit 0.02 --out FILE.md
    python3 scripts/run_to_run.py DIR... --statistic median   # the same runs, another estimator

Where placements within a run spread less than the runs move, the placements of a run are not
independent draws of what a process can get: the run's kernel time is then the process's, not the
row's. That is the question of results/h200/placements/ (freed placements against disjoint ones).
``--statistic`` recomputes each run's kernel time from its per-placement medians
(``placements.json``) as their median, mean or minimum, whatever the run itself reported (the mean
since timing method 4, the median before): whether another estimator would hold rows steadier
between runs, without timing anything again. ``p_alike`` is the Kruskal-Wallis p-value of the runs'
per-placement medians (rows with at least three in every run): small where the runs' placements are
not draws of one distribution, a shift of the process that more placements in one would not remove.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_impls.bench.case import CONFIG_COLUMNS  # noqa: E402
from kda_impls.bench.results import PLACEMENT_STATISTICS, SweepDirError, load  # noqa: E402
from kda_impls.cli import fail, print_and_save  # noqa: E402

SHOWN = ["impl", "state_dtype", "HV", "K", "V", "B", "slot_pad"]
MIN_PLACEMENTS_TESTED = 3  # per run, for the rank test of the runs' placements


def moves(sweeps: list, statistic: str | None = None) -> pd.DataFrame:
    """One line per configuration ok in every run: each run's kernel time, ``between`` (max / min -
    1 of those) and ``within`` (the largest placement spread, max / min - 1, of any run). With a
    ``statistic``, each kernel time is that statistic of the row's per-placement medians, and rows
    without them are left out."""
    runs = []
    for i, sweep in enumerate(sweeps):
        ok = sweep.table[sweep.table.status == "ok"]
        time = ok.kernel_us_mean
        if statistic:
            time = ok.key.map(lambda key: PLACEMENT_STATISTICS[statistic](sweep.placements[key]) if sweep.placements.get(key)
                              else np.nan)
        runs.append(pd.DataFrame({f"run{i + 1}": time.to_numpy(),
                                  f"within{i + 1}": (ok.kernel_us_placement_max / ok.kernel_us_placement_min - 1).to_numpy(),
                                  f"placements{i + 1}": ok.key.map(lambda key: sweep.placements.get(key) or []).to_numpy()},
                                 index=pd.MultiIndex.from_frame(ok[CONFIG_COLUMNS])))
    both = pd.concat(runs, axis=1, join="inner").dropna(subset=[f"run{i + 1}" for i in range(len(sweeps))])
    times = both[[f"run{i + 1}" for i in range(len(sweeps))]]
    spreads = both[[f"within{i + 1}" for i in range(len(sweeps))]]
    placed = both[[f"placements{i + 1}" for i in range(len(sweeps))]]
    return times.assign(between=times.max(axis=1) / times.min(axis=1) - 1, within=spreads.max(axis=1),
                        p_alike=placed.apply(runs_alike, axis=1)).reset_index()


def runs_alike(placements: pd.Series) -> float:
    """Kruskal-Wallis p-value that the runs' per-placement medians come from one distribution (NaN
    where a run has fewer than MIN_PLACEMENTS_TESTED, or all are equal)."""
    if min(len(p) for p in placements) < MIN_PLACEMENTS_TESTED or len({x for p in placements for x in p}) < 2:
        return float("nan")
    return float(stats.kruskal(*placements).pvalue)


def report(table: pd.DataFrame, names: list[str], min_b: int, limit: float, statistic: str | None = None) -> str:
    large = table[table.B >= min_b]
    per_impl = large.groupby("impl").agg(rows=("between", "size"), within_limit=("between", lambda m: int((m <= limit).sum())),
                                         largest_between=("between", "max"), median_within=("within", "median"),
                                         largest_within=("within", "max"))
    shown = large[[*SHOWN, *[c for c in table.columns if c.startswith("run")], "between", "within", "p_alike"]]
    return "\n\n".join([
        f"# Run to run: {len(names)} runs, {len(large)} configurations at B >= {min_b} ok in all"
        + (f", kernel time the {statistic} over placements" if statistic else ""),
        "Runs: " + ", ".join(f"run{i + 1} = `{name}`" for i, name in enumerate(names)) + ".",
        f"{int((large.between <= limit).sum())} of {len(large)} moved by <= {limit:.0%} between runs "
        f"(max / min - 1 of the kernel times); `within` is the largest placement spread of a run; `p_alike` the "
        f"Kruskal-Wallis p-value of the runs' per-placement medians (small: the runs' placements differ as a "
        f"whole, a shift of the process).",
        "## Per implementation\n\n" + per_impl.round(4).astype(object).to_markdown(),
        "## Every configuration\n\n" + shown.sort_values("between", ascending=False).to_markdown(index=False, floatfmt=".4f"),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="sweep directories of the same configurations (two or more)")
    parser.add_argument("--min-B", type=int, default=16, help="the batch sizes judged (default %(default)s)")
    parser.add_argument("--limit", type=float, default=0.02, help="the run-to-run criterion (default %(default)s)")
    parser.add_argument("--statistic", choices=list(PLACEMENT_STATISTICS),
                        help="of the per-placement medians, the kernel time compared (default: what each run "
                             "reported, kernel_us_mean)")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        fail("run_to_run.py", f"name two or more sweep directories; got {len(args.runs)}")
    try:
        sweeps = [load(run) for run in args.runs]
    except SweepDirError as exc:
        fail("run_to_run.py", str(exc))
    text = report(moves(sweeps, args.statistic), [str(run) for run in args.runs], args.min_B, args.limit, args.statistic)
    return print_and_save(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
