#!/usr/bin/env python3
"""Our Triton kernel's targets, judged on a sweep directory (the `targets` preset measures them all),
and README's H200 table.

    python scripts/targets.py results/h200/targets [--impl triton] [--readme README.md]

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
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_impls import dtypes  # noqa: E402
from kda_impls.bench.results import SweepDirError, best_per_library, kernel_time_words, load  # noqa: E402
from kda_impls.cli import fail  # noqa: E402

POINT = ["state_dtype", "HV", "K", "V", "B"]
B1_RATIO, PLACEMENT_SPREAD, PADDING_TARGET = 0.95, 0.02, 0.02
README_BEGIN, README_END = "<!-- h200-table:begin -->", "<!-- h200-table:end -->"
README_SHAPES = [(32, 128), (64, 128), (32, 64)]  # (HV, K = V): Kimi-Linear's layer first


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


def judge(ok: pd.DataFrame, impl: str) -> tuple[list[str], dict]:
    mine_all = ok[(ok.impl == impl) & (ok.H == ok.HV) & (ok.K == ok.V) & (ok.pad_rows == 0) & (ok["T"] == 1)]
    mine = mine_all[mine_all.slot_pad == 0]
    library = mine.library.dropna().iloc[0] if mine.library.notna().any() else impl
    sections, summary = [], {}

    others = best_per_library(flat(ok))
    others = others[others.library != library]
    rivals = others.sort_values("kernel_us_mean").drop_duplicates(POINT)
    pair = mine.merge(rivals[[*POINT, "impl", "kernel_us_mean"]], on=POINT, suffixes=("", "_best"))
    if len(pair):
        pair["ratio"] = pair.kernel_us_mean / pair.kernel_us_mean_best
        pair["met"] = (pair.ratio <= B1_RATIO).where(pair.B == 1, pair.ratio < 1)
        summary["speed"] = verdict(pair.met)
        sections.append(f"## Faster than every other library's best variant ({impl} / best <= {B1_RATIO} at B = 1, "
                        f"< 1 elsewhere): {summary['speed']}\n\n"
                        + pair[[*POINT, "kernel_us_mean", "impl_best", "kernel_us_mean_best", "ratio", "met"]]
                        .to_markdown(index=False, floatfmt=".3f"))

    judged = mine.assign(target=[bandwidth_target(r.state_dtype, r.K, r.B) for r in mine.itertuples()])
    judged = judged.dropna(subset=["target"])
    judged = judged.assign(met=judged.roofline_frac >= judged.target)
    summary["bandwidth"] = verdict(judged.met)
    sections.append(f"## Share of the copy bandwidth: {summary['bandwidth']}\n\n"
                    + judged[[*POINT, "kernel_us_mean", "roofline_frac", "target", "met"]]
                    .to_markdown(index=False, floatfmt=".3f"))

    spread = mine[mine.B >= 16].assign(spread=lambda t: t.kernel_us_placement_max / t.kernel_us_placement_min - 1)
    spread = spread.assign(met=spread.spread <= PLACEMENT_SPREAD)
    summary["placements"] = verdict(spread.met)
    # placements_timed: the layout's placements and those added where they spread (older runs lack it)
    timed = spread.placements_timed if "placements_timed" in spread else spread.placements
    spread = spread.assign(placements_timed=timed.astype(int))
    sections.append(f"## Placement spread (max / min - 1 over the placements timed) <= "
                    f"{PLACEMENT_SPREAD:.0%} at B >= 16: {summary['placements']}\n\n"
                    + spread[[*POINT, "placements_timed", "kernel_us_placement_min", "kernel_us_placement_max",
                              "spread", "met"]]
                    .to_markdown(index=False, floatfmt=".3f"))

    padded = mine_all[mine_all.slot_pad > 0].merge(mine, on=POINT, suffixes=("", "_flat"))
    if len(padded):
        padded["cost"] = padded.kernel_us_mean / padded.kernel_us_mean_flat - 1
        padded["met"] = padded.cost <= PADDING_TARGET
        summary["padding"] = verdict(padded.met)
        sections.append(f"## Slot padding costs <= {PADDING_TARGET:.0%}: {summary['padding']}\n\n"
                        + padded[[*POINT, "slot_pad", "kernel_us_mean_flat", "kernel_us_mean", "cost", "met"]]
                        .to_markdown(index=False, floatfmt=".3f"))
    return sections, summary


def write_readme_table(readme: Path, ok: pd.DataFrame, source: Path, meta: dict) -> None:
    """Replace README's block between the h200-table markers with the latency table of the
    README's shapes, generated from ``source`` (never typed)."""
    entry = meta.get("settings", {}).get("method", {}).get("entry", "?")
    table = latency_table(ok)
    table = table[[(hv, k) in README_SHAPES for hv, k, _, _ in table.index]]
    block = (f"{README_BEGIN}\n<!-- generated by: python scripts/targets.py {source} --readme {readme.name} -->\n"
             f"Kernel time ({kernel_time_words(meta)}, L2 entry state `{entry}`) and share of the measured copy "
             f"bandwidth, each library at its fastest verified variant (named where it is not the library's own "
             f"call); index (HV, K, V, B), H = HV, unpadded pool:\n\n{table.to_markdown()}\n{README_END}")
    text = readme.read_text()
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    readme.write_text(text[:start] + block + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--readme", type=Path, help="also rewrite this README's h200-table block")
    args = parser.parse_args()
    try:
        sweep = load(args.dir)
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
    if args.readme:
        write_readme_table(args.readme, ok, args.dir, meta)


if __name__ == "__main__":
    main()
