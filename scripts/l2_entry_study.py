#!/usr/bin/env python3
"""Which L2 entry state stands for a decode layer? CUPTI kernel durations of each implementation's
step after each synthetic entry op, against the step inside a small decode-layer sequence.

    python3 scripts/l2_entry_study.py --out results/h200/l2-entry [--impls triton,fla,flashinfer]

In Kimi-Linear's decode layer the KDA step follows the layer's input projections: a bf16 GEMV that
streams the q, k and v projection weights (hidden 2304 -> 3 x 32 x 128) through the L2. The study
times, with one clock (CUPTI, kda_impls.bench.cupti) and the same inputs, each step:
- ``decode-layer``: after that GEMV (the reference);
- ``clean``, ``dirty``: after the harness's read or write of 3x the L2 (kda_impls.bench.timing);
- ``previous-step``: cycling over the rotation's input sets, no op between.
For each synthetic state it reports |state / decode-layer - 1| per row and its mean, and prints the
closest. Writes DIR/l2_entry.csv, DIR/l2_entry.md, DIR/meta.json.

What the harness can measure is another matter (an op between timed calls is taken out by
subtraction, which charges a call the write-back of its dirty lines: docs/timing.md), so a second
form, which needs no GPU, sets a sweep's kernel times against the study's decode-layer figures:

    python3 scripts/l2_entry_study.py --report results/h200/l2-entry --against results/h200/published
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_impls.bench.config import Config  # noqa: E402
from kda_impls.bench.cupti import kernels_of, step_durations  # noqa: E402
from kda_impls.bench.results import environment, load, write_meta  # noqa: E402
from kda_impls.bench.timing import entry_op, rotation_inputs  # noqa: E402
from kda_impls.registry import get  # noqa: E402

HIDDEN, PROJECTED = 2304, 3 * 32 * 128  # Kimi-Linear-48B-A3B: hidden size; q, k, v of 32 heads of 128
SYNTHETIC = ("clean", "dirty", "previous-step")
BATCHES = (16, 64, 256)


def projection(B: int, device) -> callable:
    """The decode layer's input projection for a batch of B tokens: y = x W^T, W [PROJECTED, HIDDEN] bf16."""
    weight = torch.randn(PROJECTED, HIDDEN, dtype=torch.bfloat16, device=device) * HIDDEN**-0.5
    x = torch.randn(B, HIDDEN, dtype=torch.bfloat16, device=device)
    y = torch.empty(B, PROJECTED, dtype=torch.bfloat16, device=device)
    return lambda: torch.mm(x, weight.t(), out=y)


def study_row(cfg: Config, device, calls: int) -> dict:
    impl = get(cfg.impl)
    reason = impl.unsupported(cfg.make_inputs(device))
    if reason:
        return {"status": "unsupported", "reason": reason}
    row = {"status": "ok"}
    first = cfg.make_inputs(device, seed=1)
    gemv = projection(cfg.B, device)
    row["decode-layer"] = step_durations([impl.bind(first)], device, calls, before=gemv,
                                         before_kernels=kernels_of(gemv, device))["busy_us"]
    for entry in SYNTHETIC:
        made, input_sets = rotation_inputs(entry, first, device)
        launchers = [impl.bind(x) for x in input_sets]
        op = entry_op(made, device)
        row[entry] = step_durations(launchers, device, calls, before=op,
                                    before_kernels=kernels_of(op, device) if op else 0)["busy_us"]
        row[f"{entry}_made"] = made
        del launchers
    torch.cuda.empty_cache()
    return row


def against(study_dir: Path, sweep_dir: Path) -> int:
    """The sweep's kernel times (its L2 entry state) over the study's decode-layer CUPTI figures, on
    the points both have; appended to the study's l2_entry.md as a section of its own."""
    study = pd.read_csv(study_dir / "l2_entry.csv")
    study = study[study.status == "ok"][["impl", "state_dtype", "B", "decode-layer"]]
    sweep = load(sweep_dir).ok
    sweep = sweep[(sweep.H == 32) & (sweep.HV == 32) & (sweep.K == 128) & (sweep.V == 128) & (sweep["T"] == 1)
                  & (sweep.slot_pad == 0) & (sweep.pad_rows == 0)]
    both = study.merge(sweep[["impl", "state_dtype", "B", "kernel_us_mean", "l2_entry"]], on=["impl", "state_dtype", "B"])
    both["harness_over_decode_layer"] = both.kernel_us_mean / both["decode-layer"]
    heading = f"## The harness ({sweep_dir}) against the decode layer"
    text = "\n\n".join([
        heading,
        f"kernel_us_mean: the sweep's kernel time in its L2 entry state; decode-layer: this study's CUPTI figure. "
        f"Mean |harness / decode-layer - 1|: {(both.harness_over_decode_layer - 1).abs().mean():.1%} over {len(both)} rows.",
        both.to_markdown(index=False, floatfmt=".3f")]) + "\n"
    report = study_dir / "l2_entry.md"
    kept = report.read_text().split(heading)[0].rstrip() + "\n\n" if report.exists() else ""
    report.write_text(kept + text)
    print(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, help="the study's directory (measuring)")
    parser.add_argument("--report", type=Path, help="a study's directory, with --against (no GPU)")
    parser.add_argument("--against", type=Path, help="a sweep directory to set against the study")
    parser.add_argument("--impls", default="triton,fla,flashinfer")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated (default %(default)s)")
    parser.add_argument("--state-dtypes", default="bfloat16,float32")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.report:
        return against(args.report, args.against)
    device = torch.device(args.device)
    started = time.perf_counter()
    rows = []
    for impl in args.impls.split(","):
        for state_dtype in args.state_dtypes.split(","):
            for B in map(int, args.batches.split(",")):
                cfg = Config(impl, B, 32, 32, 128, 128, state_dtype=state_dtype)
                try:
                    measured = study_row(cfg, device, args.calls)
                except Exception as exc:  # recorded, not fatal to the study
                    measured = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append({"impl": impl, "state_dtype": state_dtype, "B": B} | measured)
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    ok = table[table.status == "ok"].copy()
    for entry in SYNTHETIC:
        ok[f"{entry}_off"] = (ok[entry] / ok["decode-layer"] - 1).abs()
    mean_off = {entry: float(ok[f"{entry}_off"].mean()) for entry in SYNTHETIC}
    closest = min(mean_off, key=mean_off.get)
    args.out.mkdir(parents=True, exist_ok=True)
    table.merge(ok, how="left").to_csv(args.out / "l2_entry.csv", index=False)
    write_meta(args.out, environment(device, args.out, shlex.join(sys.argv))
               | {"wall_s": round(time.perf_counter() - started, 1), "calls": args.calls,
                  "mean_abs_off": mean_off, "closest": closest})
    text = "\n\n".join([
        "# The L2 entry state a decode layer gives the KDA step",
        "CUPTI median summed kernel duration per step (us), after Kimi-Linear's input projection "
        "(decode-layer) and after each synthetic entry op; *_off = |synthetic / decode-layer - 1|.",
        ok.to_markdown(index=False, floatfmt=".3f"),
        "Mean |synthetic / decode-layer - 1|: " + ", ".join(f"{e} {v:.1%}" for e, v in mean_off.items())
        + f". **Closest: {closest}.**",
        *(["Not measured:\n\n" + table[table.status != "ok"][["impl", "state_dtype", "B", "status", "reason"]]
           .to_markdown(index=False)] if (table.status != "ok").any() else []),
    ]) + "\n"
    (args.out / "l2_entry.md").write_text(text)
    print(text)
    print(f"closest: {closest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
