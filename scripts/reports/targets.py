"""Our Triton kernel's targets, judged on a sweep directory (the `targets` preset measures them all).

    python3 -m scripts.reports.targets results/h200/targets [--impl triton] [--across RUN ...]

Writes DIR/targets.md and prints it. Every other library enters at its fastest verified variant per
point (kda_impls.bench.results.best_per_library), named. The targets (the kernel issue's):
- speed: faster than every other library's best at every point; at B = 1 no more than 0.95x its time;
- bandwidth: bf16 state >= 92% of the measured copy bandwidth at B >= 64 for K = V = 128, >= 88% at
  B = 256 and >= 80% at B = 64 for K = V = 64; fp32 state >= 94% at B >= 64 for K = V = 128;
- placements: the kernel time's spread over placements (max / min - 1) <= 2% at every B >= 16;
- slot padding (64 elements per slot) costs <= 2% (the first Triton issue's, still reported).
Only one-token steps on unpadded pools with H = HV and K = V count, except in the padding section.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from kda_impls import dtypes
from kda_impls.bench.results import SweepDirError, best_per_library, load
from kda_impls.cli import fail

POINT = ["state_dtype", "HV", "K", "V", "B"]
B1_RATIO, PLACEMENT_SPREAD, PADDING_TARGET = 0.95, 0.02, 0.02


def flat(ok: pd.DataFrame) -> pd.DataFrame:
    return ok[(ok.slot_pad == 0) & (ok.pad_rows == 0) & (ok.H == ok.HV) & (ok.K == ok.V) & (ok["T"] == 1)]


def cell(row) -> str:
    winner = "" if row.impl == row.library else f" {row.impl}"
    return f"{row.kernel_us_mean:.2f} us ({row.roofline_frac:.0%}){winner}"


def latency_table(ok: pd.DataFrame) -> pd.DataFrame:
    """Each library at its best variant (named where it is not the library's own name): kernel time
    (share of the copy bandwidth) per point and state dtype."""
    best = best_per_library(flat(ok))
    best = best.assign(column=best.library + " " + best.state_dtype.map(dtypes.short), cell=best.apply(cell, axis=1))
    return best.pivot_table(index=POINT[1:], columns="column", values="cell", aggfunc="first").fillna("-")


def engine_table(ok: pd.DataFrame) -> pd.DataFrame:
    """The configurations serving engines call today, each by name."""
    engines = flat(ok)[flat(ok).engine_call.astype(object).fillna("").astype(str) != ""]
    engines = engines.assign(column=engines.impl + " " + engines.state_dtype.map(dtypes.short),
                             cell=[f"{r.kernel_us_mean:.2f} us ({r.roofline_frac:.0%})" for r in engines.itertuples()])
    return engines.pivot_table(index=POINT[1:], columns="column", values="cell", aggfunc="first").fillna("-")


def engine_legend(ok: pd.DataFrame) -> str:
    calls = ok[ok.engine_call.fillna("").astype(str) != ""].drop_duplicates("impl")
    return "\n".join(f"- `{r.impl}`: {r.engine_call}" for r in calls.itertuples())


def verdict(passed: pd.Series) -> str:
    return f"{int(passed.sum())}/{len(passed)} met"


def bandwidth_target(state_dtype: str, K: int, B: int) -> float | None:
    """The share of the copy bandwidth a point must reach (K = V), or None where none is set."""
    if K == 128 and B >= 64:
        return {"bfloat16": 0.92, "float32": 0.94}.get(state_dtype)
    if K == 64 and state_dtype == "bfloat16":
        return {64: 0.80, 256: 0.88}.get(B)
    return None


def judged(ok: pd.DataFrame, impl: str) -> dict[str, pd.DataFrame]:
    """Each target's points, judged: a frame per target (POINT, its figure in FIGURE, met), where the
    run has the rows to judge it (speed needs other libraries, padding padded pools)."""
    ok = ok[ok["mode"] == "inplace"]  # the targets are in-place decode's: a frozen row must not meet them
    mine_all = ok[(ok.impl == impl) & (ok.H == ok.HV) & (ok.K == ok.V) & (ok.pad_rows == 0) & (ok["T"] == 1)]
    mine = mine_all[mine_all.slot_pad == 0]
    library = mine.library.dropna().iloc[0] if mine.library.notna().any() else impl
    frames = {}

    others = best_per_library(flat(ok))
    others = others[others.library != library]
    rivals = others.sort_values("kernel_us_mean").drop_duplicates(POINT)
    pair = mine.merge(rivals[[*POINT, "impl", "kernel_us_mean"]], on=POINT, suffixes=("", "_best"))
    if len(pair):
        pair["ratio"] = pair.kernel_us_mean / pair.kernel_us_mean_best
        pair["met"] = (pair.ratio <= B1_RATIO).where(pair.B == 1, pair.ratio < 1)
        frames["speed"] = pair[[*POINT, "kernel_us_mean", "impl_best", "kernel_us_mean_best", "ratio", "met"]]

    bandwidth = mine.assign(target=[bandwidth_target(r.state_dtype, r.K, r.B) for r in mine.itertuples()])
    bandwidth = bandwidth.dropna(subset=["target"])
    frames["bandwidth"] = bandwidth.assign(met=bandwidth.roofline_frac >= bandwidth.target)[
        [*POINT, "kernel_us_mean", "roofline_frac", "target", "met"]]

    spread = mine[mine.B >= 16].assign(spread=lambda t: t.kernel_us_placement_max / t.kernel_us_placement_min - 1)
    # placements_timed: the layout's placements and those added where they spread (older runs lack it)
    timed = spread.placements_timed if "placements_timed" in spread else spread.placements
    frames["placements"] = spread.assign(met=spread.spread <= PLACEMENT_SPREAD, placements_timed=timed.astype(int))[
        [*POINT, "placements_timed", "kernel_us_placement_min", "kernel_us_placement_max", "spread", "met"]]

    padded = mine_all[mine_all.slot_pad > 0].merge(mine, on=POINT, suffixes=("", "_flat"))
    if len(padded):
        padded["cost"] = padded.kernel_us_mean / padded.kernel_us_mean_flat - 1
        padded["met"] = padded.cost <= PADDING_TARGET
        frames["padding"] = padded[[*POINT, "slot_pad", "kernel_us_mean_flat", "kernel_us_mean", "cost", "met"]]
    return frames


HEADINGS = {
    "speed": f"Faster than every other library's best variant ({{impl}} / best <= {B1_RATIO} at B = 1, < 1 elsewhere)",
    "bandwidth": "Share of the copy bandwidth",
    "placements": f"Placement spread (max / min - 1 over the placements timed) <= {PLACEMENT_SPREAD:.0%} at B >= 16",
    "padding": f"Slot padding costs <= {PADDING_TARGET:.0%}",
}
FIGURE = {"speed": "ratio", "bandwidth": "roofline_frac", "placements": "spread", "padding": "cost"}


def judge(ok: pd.DataFrame, impl: str) -> tuple[list[str], dict]:
    sections, summary = [], {}
    for name, frame in judged(ok, impl).items():
        summary[name] = verdict(frame.met)
        sections.append(f"## {HEADINGS[name].format(impl=impl)}: {summary[name]}\n\n"
                        + frame.to_markdown(index=False, floatfmt=".3f"))
    return sections, summary


def misses_across(runs: dict[str, pd.DataFrame], impl: str) -> str:
    """The points each target misses in any of ``runs`` (name -> ok rows), with the figure in every run
    and how many of the runs that judge the point miss it: a miss in every run against one that comes
    and goes between runs of the same code."""
    per_run = {name: judged(ok, impl) for name, ok in runs.items()}
    sections = []
    for target in HEADINGS:
        frames = {name: judged_run[target] for name, judged_run in per_run.items() if target in judged_run}
        if not frames:
            continue
        keys = POINT + (["slot_pad"] if target == "padding" else [])
        figures = pd.concat({name: f.set_index(keys)[FIGURE[target]] for name, f in frames.items()}, axis=1)
        missed = pd.concat({name: ~f.set_index(keys).met for name, f in frames.items()}, axis=1)
        figures["missed in"] = missed.sum(axis=1).astype(int).astype(str) + "/" + missed.notna().sum(axis=1).astype(str)
        table = figures[missed.any(axis=1)].assign(order=missed.sum(axis=1)).sort_values("order", ascending=False)
        always = int((missed.all(axis=1)).sum())
        sections.append(f"## {HEADINGS[target].format(impl=impl)}: {FIGURE[target]} per run; missed in every run "
                        f"at {always} points, in some at {int(missed.any(axis=1).sum()) - always}\n\n"
                        + (table.drop(columns="order").reset_index().to_markdown(index=False, floatfmt=".3f")
                           if len(table) else "None missed."))
    return "\n\n".join(sections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--across", type=Path, nargs="+", metavar="RUN",
                        help="also judge these runs (of the same preset) and write DIR/misses.md: each point a "
                             "target misses in any run, its figure in each, and in how many runs it is missed")
    args = parser.parse_args()
    try:
        sweep = load(args.dir)
        across = {run: load(run).ok for run in args.across or []}
    except SweepDirError as exc:
        fail("targets.py", str(exc))
    ok, meta = sweep.ok, sweep.meta
    sections, summary = judge(ok, args.impl)
    entry = meta.get("settings", {}).get("method", {}).get("entry", "?")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(meta.get("versions", {}).items()))
    engines = engine_table(ok)
    text = "\n\n".join([
        f"# {args.impl} targets on {meta.get('gpu')} (copy {meta.get('copy_bandwidth_Bps', 0) / 1e9:.0f} GB/s, "
        f"L2 entry state {entry})\n\n{versions}; commit {meta.get('git', {}).get('sha')}\n\n"
        + "\n".join(f"- {name}: {result}" for name, result in summary.items()),
        "## Each library at its best variant (share of copy bandwidth), unpadded pools\n\n"
        + latency_table(ok).to_markdown(),
        *(["## The calls serving engines make today\n\n" + engine_legend(ok) + "\n\n" + engines.to_markdown()]
          if len(engines) else []),
        *sections,
    ]) + "\n"
    (args.dir / "targets.md").write_text(text)
    print(text)
    if across:
        # each run named by its path below the runs' common folder
        common = os.path.commonpath([args.dir, *args.across])
        misses = misses_across({os.path.relpath(args.dir, common): ok,
                                **{os.path.relpath(run, common): rows for run, rows in across.items()}},
                               args.impl)
        (args.dir / "misses.md").write_text(f"# {args.impl}: the targets' misses across runs\n\n"
                                            f"Command: `{' '.join(['scripts.reports.targets', *sys.argv[1:]])}`\n\n"
                                            + misses + "\n")
        print(misses)


if __name__ == "__main__":
    main()
