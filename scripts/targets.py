#!/usr/bin/env python3
"""The Triton kernel's targets, judged on a sweep directory (the `targets` preset measures them all).

    python scripts/targets.py results/h200/targets [--impl triton] [--baseline flashinfer]

Writes DIR/targets.md and prints it:
- latency per (HV, K = V, B) for every implementation and state dtype, with the share of the
  measured copy bandwidth (unpadded pools);
- bandwidth: >= 90% of the copy roofline at B >= 64;
- speed-up: >= 1.15x the baseline at B >= 16 (bf16 state, the baseline's only one); at B = 1 no
  slower, where "no slower" allows the two interquartile ranges to overlap (noise);
- slot padding (64 elements per slot) costs <= 2%.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

SHAPE = ["HV", "K", "V", "B"]
BANDWIDTH_TARGET, SPEEDUP_TARGET, PADDING_TARGET = 0.90, 1.15, 0.02


def cell(row) -> str:
    return f"{row.kernel_us_median:.2f} us ({row.roofline_frac:.0%})"


def latency_table(ok: pd.DataFrame) -> pd.DataFrame:
    flat = ok[(ok.slot_pad == 0) & (ok.H == ok.HV) & (ok.K == ok.V)].copy()
    flat["column"] = flat.impl + " " + flat.state_dtype.str.replace("bfloat16", "bf16").str.replace("float32", "fp32")
    flat["cell"] = flat.apply(cell, axis=1)
    return flat.pivot_table(index=SHAPE, columns="column", values="cell", aggfunc="first").fillna("-")


def verdict(passed: pd.Series) -> str:
    return f"{int(passed.sum())}/{len(passed)} met"


def judge(ok: pd.DataFrame, impl: str, baseline: str) -> tuple[list[str], dict]:
    mine = ok[(ok.impl == impl) & (ok.H == ok.HV) & (ok.K == ok.V)]
    flat = mine[mine.slot_pad == 0]
    sections, summary = [], {}

    big = flat[flat.B >= 64].assign(met=lambda t: t.roofline_frac >= BANDWIDTH_TARGET)
    summary["bandwidth"] = verdict(big.met)
    sections.append(f"## Bandwidth >= {BANDWIDTH_TARGET:.0%} of copy at B >= 64: {summary['bandwidth']}\n\n"
                    + big[["state_dtype", *SHAPE, "kernel_us_median", "roofline_frac", "met"]]
                    .to_markdown(index=False, floatfmt=".3f"))

    base = ok[(ok.impl == baseline) & (ok.slot_pad == 0)]
    pair = flat.merge(base, on=["state_dtype", "H", *SHAPE], suffixes=("", "_base"))
    if len(pair):
        pair["speedup"] = pair.kernel_us_median_base / pair.kernel_us_median
        overlap = (pair.kernel_us_p25 <= pair.kernel_us_p75_base) & (pair.kernel_us_p25_base <= pair.kernel_us_p75)
        pair["met"] = (pair.speedup >= SPEEDUP_TARGET).where(pair.B >= 16, (pair.speedup >= 1) | overlap)
        summary["speedup"] = verdict(pair.met)
        sections.append(f"## Speed-up over {baseline}: >= {SPEEDUP_TARGET}x at B >= 16, no slower at B = 1: "
                        f"{summary['speedup']}\n\n"
                        + pair[["state_dtype", *SHAPE, "kernel_us_median", "kernel_us_median_base", "speedup", "met"]]
                        .to_markdown(index=False, floatfmt=".3f"))

    padded = mine[mine.slot_pad > 0].merge(flat, on=["state_dtype", "H", *SHAPE], suffixes=("", "_flat"))
    if len(padded):
        padded["cost"] = padded.kernel_us_median / padded.kernel_us_median_flat - 1
        padded["met"] = padded.cost <= PADDING_TARGET
        summary["padding"] = verdict(padded.met)
        sections.append(f"## Slot padding costs <= {PADDING_TARGET:.0%}: {summary['padding']}\n\n"
                        + padded[["state_dtype", *SHAPE, "slot_pad", "kernel_us_median_flat", "kernel_us_median",
                                  "cost", "met"]].to_markdown(index=False, floatfmt=".3f"))
    return sections, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--baseline", default="flashinfer")
    args = parser.parse_args()
    table = pd.read_csv(args.dir / "results.csv")
    meta = json.loads((args.dir / "meta.json").read_text())
    ok = table[table.status == "ok"]
    sections, summary = judge(ok, args.impl, args.baseline)
    versions = ", ".join(f"{k} {v}" for k, v in sorted(meta.get("versions", {}).items()))
    text = "\n\n".join([
        f"# {args.impl} targets on {meta.get('gpu')} (copy {meta.get('copy_bandwidth_Bps', 0) / 1e9:.0f} GB/s, "
        f"L2-cold kernel time)\n\n{versions}; commit {meta.get('git', {}).get('sha')}\n\n"
        + "\n".join(f"- {name}: {result}" for name, result in summary.items()),
        "## Latency (share of copy bandwidth), unpadded pools\n\n" + latency_table(ok).to_markdown(),
        *sections,
    ]) + "\n"
    (args.dir / "targets.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
