"""The engines' question, per point: which library's in-place decode is fastest, and whose replay step.

    python3 -m scripts.reports.engines INPLACE_DIR [REPLAY_DIR] [--out FILE]

INPLACE_DIR is a sweep of one-token in-place steps (the `published` preset); every library enters at
its fastest verified variant (kda_impls.bench.results.best_per_library), named. REPLAY_DIR is a
`replay` sweep: each replay implementation's step (over whole ring cycles, flush included) beside our
in-place step of the same point. Each cell gives the time, the bytes one step moves and their rate;
the fastest per point is marked. Writes FILE (default INPLACE_DIR/engines.md) and prints it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from kda_impls import dtypes
from kda_impls.bench.results import SweepDirError, best_per_library, kernel_time_words, load
from kda_impls.cli import fail

POINT = ["state_dtype", "HV", "K", "V", "B"]


def cell(row, fastest: float) -> str:
    mark = " **fastest**" if row.kernel_us_mean == fastest else ""
    variant = "" if row.impl == row.library else f" {row.impl}"
    return f"{row.kernel_us_mean:.2f} us, {row.bytes / 1e6:.1f} MB at {row.gbps:.0f} GB/s{variant}{mark}"


def table(rows: pd.DataFrame, column: str) -> str:
    """Rows (one per point and ``column`` value) as a Markdown table of cells, the fastest marked."""
    fastest = rows.groupby(POINT).kernel_us_mean.transform("min")
    rows = rows.assign(cell=[cell(r, f) for r, f in zip(rows.itertuples(), fastest, strict=True)],
                       point=[f"{dtypes.short(r.state_dtype)} HV={r.HV} K={r.K} V={r.V} B={r.B}"
                              for r in rows.itertuples()])
    ordered = rows.sort_values(POINT).point.unique()
    pivot = rows.pivot_table(index="point", columns=column, values="cell", aggfunc="first").reindex(ordered)
    return pivot.fillna("-").rename_axis(None).to_markdown()


def one_token(ok: pd.DataFrame) -> pd.DataFrame:
    return ok[(ok.slot_pad == 0) & (ok.pad_rows == 0) & (ok["T"] == 1)]


def inplace_section(directory: Path) -> str:
    sweep = load(directory)
    meta, ok = sweep.meta, one_token(sweep.ok)
    ok = ok[ok["mode"] == "inplace"]
    return (f"## In-place decode: each library at its fastest variant\n\nFrom `{directory}` ({meta.get('gpu', '?')}, "
            f"kernel time: {kernel_time_words(meta)}).\n\n" + table(best_per_library(ok), "library") + "\n")


def replay_section(directory: Path) -> str:
    sweep = load(directory)
    meta, ok = sweep.meta, one_token(sweep.ok)
    steps = ok[(ok["mode"] == "replay") | ((ok["mode"] == "inplace") & (ok.impl == "triton"))]
    steps = steps.assign(step=[f"{r.impl} {r.mode}" + (f" L={r.ring}" if r.mode == "replay" else "")
                               for r in steps.itertuples()])
    return (f"## Replay step beside our in-place step\n\nFrom `{directory}` ({meta.get('gpu', '?')}; a replay "
            f"step is the mean over whole ring cycles, flush included).\n\n" + table(steps, "step") + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m scripts.reports.engines", description=__doc__.split("\n")[0])
    p.add_argument("inplace", type=Path, help="a sweep directory of in-place steps (the published preset)")
    p.add_argument("replay", type=Path, nargs="?", help="a replay sweep directory")
    p.add_argument("--out", type=Path, help="the report (default INPLACE/engines.md)")
    args = p.parse_args(argv)
    try:
        text = "# Fastest KDA decode per point\n\n" + inplace_section(args.inplace)
        if args.replay:
            text += "\n" + replay_section(args.replay)
    except SweepDirError as exc:
        fail("engines", str(exc))
    out = args.out or args.inplace / "engines.md"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
