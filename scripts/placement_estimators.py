#!/usr/bin/env python3
"""What a row's placements say about the timing method: whether the first placement of a row
differs from the others, and how far three runs' kernel times would move with n placements each
under each estimator (the median over placements, their mean), resampled from the placements the
runs drew.

    python3 scripts/placement_estimators.py results/h200/placements/disjoint-{1,2,3} --min-B 64

The resampling pools each row's placements over the runs given (the first placement of each run
left out with --skip-first: the bias the first part measures), draws three runs of n placements with
replacement, many times, and counts how often their kernel times lie more than --limit apart
(max / min - 1): the run-to-run criterion's odds for a row whose placements are spread like these.
Pooling treats every placement as a draw from one distribution; a last table keeps each run as a
process of its own and resamples processes too (--processes), for rows whose runs sit apart as a
whole.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kda_impls.bench.results import PLACEMENT_STATISTICS, SweepDirError, load  # noqa: E402
from kda_impls.cli import Parser, comma_list, fail, positive_int, print_and_save  # noqa: E402

RUNS = 3
DRAWS = 20000


FIRST_OFF = 0.05  # rows whose first placement is further than this from the others are listed


def row_name(key: str) -> str:
    """A row's key without its pool layout (the same in every run of a preset)."""
    return key.split("_spr")[0]


def first_placement_rows(sweeps) -> pd.DataFrame:
    """Every row with three placements or more: its first placement's median over the median of
    the others' (``first / others``), with its library and the run it is from."""
    rows = []
    for sweep in sweeps:
        ok = sweep.ok.set_index("key")
        for key, medians in sweep.placements.items():
            if len(medians) >= 3 and key in ok.index:
                row = ok.loc[key]
                library = row.library if isinstance(row.library, str) else row.impl
                rows.append({"run": str(sweep.path), "row": row_name(key), "library": library,
                             "B": "B >= 64" if row.B >= 64 else "B < 64",
                             "first / others": medians[0] / np.median(medians[1:])})
    return pd.DataFrame(rows)


def first_placement(sweeps) -> pd.DataFrame:
    """Per library and batch class: the first placement's median over the median of the others'."""
    ratio = first_placement_rows(sweeps).groupby(["library", "B"])["first / others"]
    return pd.DataFrame({"rows": ratio.size(), "median": ratio.median(), "p90": ratio.quantile(0.9),
                         "share > 1.02": ratio.apply(lambda r: (r > 1.02).mean()),
                         "share < 0.98": ratio.apply(lambda r: (r < 0.98).mean())})


def first_off(sweeps) -> pd.DataFrame:
    rows = first_placement_rows(sweeps)
    return rows[(rows["first / others"] - 1).abs() > FIRST_OFF].drop(columns=["library", "B"])


def placements_by_run(sweeps, min_b: int) -> dict[str, list[np.ndarray]]:
    """Per row key at B >= ``min_b``: the per-placement medians of each run that timed it ok with
    some (a row one run lacks has fewer arrays than there are runs)."""
    by_key: dict[str, list[np.ndarray]] = {}
    for sweep in sweeps:
        for key in sweep.ok[sweep.ok.B >= min_b].key:
            if sweep.placements.get(key):
                by_key.setdefault(key, []).append(np.asarray(sweep.placements[key], dtype=float))
    return by_key


def resampled(sweeps, min_b: int, sizes: list[int], limit: float, skip_first: bool, seed: int) -> pd.DataFrame:
    """Per row whose pooled placements spread by more than ``limit``: the odds that three runs of
    n placements each move by more than ``limit``, per estimator and n."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, runs in sorted(placements_by_run(sweeps, min_b).items()):
        values = np.concatenate([run[1 if skip_first else 0:] for run in runs])
        if len(values) < 2 or values.max() / values.min() - 1 <= limit:
            continue
        row = {"row": row_name(key), "placements": len(values),
               "sd %": 100 * values.std() / np.median(values)}
        for n in sizes:
            runs = rng.choice(values, (DRAWS, RUNS, n))
            for name, estimator in PLACEMENT_STATISTICS.items():
                times = estimator(runs, axis=-1)
                row[f"{name} n={n}"] = float((times.max(axis=1) / times.min(axis=1) - 1 > limit).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def resampled_by_process(sweeps, min_b: int, placements: int, processes: list[int], limit: float,
                         seed: int) -> pd.DataFrame:
    """Per row timed in every run, whose pooled placements spread by more than ``limit``: the odds
    that three runs move by more than ``limit`` when each run's kernel time (the mean) pools
    ``placements`` placements from P processes, ceil(placements / P) from each. Each run given is
    one process: a resampled run draws P of them with replacement, then placements from each one's
    own, so a process whose placements sit apart as a whole stays apart (what
    ``--placement-processes`` is for)."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, runs in sorted(placements_by_run(sweeps, min_b).items()):
        pooled = np.concatenate(runs)
        if len(runs) < len(sweeps) or pooled.max() / pooled.min() - 1 <= limit:
            continue
        lengths = np.array([len(r) for r in runs])
        padded = np.full((len(runs), lengths.max()), np.nan)
        for i, r in enumerate(runs):
            padded[i, :len(r)] = r
        row = {"row": row_name(key), "processes given": len(runs)}
        for count in processes:
            each = -(-placements // count)
            chosen = rng.integers(0, len(runs), (DRAWS, RUNS, count, 1))
            drawn = padded[chosen, (rng.random((DRAWS, RUNS, count, each)) * lengths[chosen]).astype(int)]
            times = drawn.reshape(DRAWS, RUNS, -1).mean(axis=-1)
            row[f"P={count}"] = float((times.max(axis=1) / times.min(axis=1) - 1 > limit).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def processes_per_run(sweeps) -> list[int]:
    """The placement processes each run pooled into a row (1 for runs from before the setting)."""
    return [sweep.meta.get("settings", {}).get("method", {}).get("placement_processes", 1) for sweep in sweeps]


def process_section(sweeps, args) -> str:
    """The odds with each run kept as a process, where each run is one; else why not."""
    pooled = processes_per_run(sweeps)
    if max(pooled) > 1:
        return (f"Not drawn: these runs pooled {'/'.join(map(str, pooled))} placement processes a row each, so a "
                f"run is not one process (the table needs runs of one process a row).")
    by_process = resampled_by_process(sweeps, args.min_B, args.process_placements, args.processes, args.limit,
                                      args.seed)
    return (f"Each run given is one process; three runs of {args.process_placements} placements each, their mean, "
            f"drawn {DRAWS} times: a run takes P processes of those given (with replacement) and an equal share of "
            f"its placements from each one's own. P = 1 is one process a row (the fast presets); P > 1 is "
            f"`--placement-processes P` (the thorough presets: 3). Few processes given make it a rough guide.\n\n"
            + (by_process.to_markdown(index=False, floatfmt=".3f") if len(by_process) else "(none)"))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep directories with placements.json")
    parser.add_argument("--min-B", type=positive_int, default=16, help="rows resampled (default %(default)s)")
    parser.add_argument("--sizes", type=comma_list(positive_int), default=(3, 9, 15, 27),
                        help="placements per run to resample (default 3,9,15,27)")
    parser.add_argument("--limit", type=float, default=0.02, help="run-to-run limit (default %(default)s)")
    parser.add_argument("--skip-first", action="store_true", help="leave each run's first placement out")
    parser.add_argument("--processes", type=comma_list(positive_int), default=(1, 3, 5),
                        help="placement processes per run to resample, the runs given being the processes "
                             "(default 1,3,5)")
    parser.add_argument("--process-placements", type=positive_int, default=27, metavar="N",
                        help="placements per resampled run in that table (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    try:
        sweeps = [load(d) for d in args.dirs]
    except SweepDirError as exc:
        fail("placement_estimators.py", str(exc))
    odds = resampled(sweeps, args.min_B, args.sizes, args.limit, args.skip_first, args.seed)
    text = "\n\n".join([
        "# Placements and estimators",
        "Runs: " + ", ".join(f"`{d}`" for d in args.dirs) + ".",
        "## The first placement of a row against the others\n\nPer library: the first placement's median "
        "over the median of the other placements' (rows with three or more).\n\n"
        + first_placement(sweeps).reset_index().to_markdown(index=False, floatfmt=("", "", ".0f", ".3f", ".3f",
                                                                                    ".3f", ".3f")),
        f"Rows whose first placement is more than {FIRST_OFF:.0%} off the others:\n\n"
        + (off.to_markdown(index=False, floatfmt=".3f") if len(off := first_off(sweeps)) else "(none)"),
        f"## Odds that three runs move by more than {args.limit:.0%}\n\nRows at B >= {args.min_B} whose placements, "
        f"pooled over the runs{' (each first left out)' if args.skip_first else ''}, spread by more; three runs "
        f"of n placements drawn from them {DRAWS} times, each run's kernel time by each estimator.\n\n"
        + (odds.to_markdown(index=False, floatfmt=".3f") if len(odds) else "(none)"),
        "## The same odds with each run kept as a process\n\n" + process_section(sweeps, args),
    ]) + "\n"
    return print_and_save(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
