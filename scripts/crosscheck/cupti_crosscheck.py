"""Cross-check a sweep's kernel times with a second clock: CUPTI kernel durations (torch.profiler)
of the same configurations, in the same L2 entry state, on the same GPU.

    python3 -m scripts.crosscheck.cupti_crosscheck SWEEP_DIR [SWEEP_DIR ...] --out DIR [--unpadded-only] [--replay]

For every ok row: the configuration's inputs are drawn again (the first placement's seed), bound,
and ``--calls`` steps run eagerly, each after the entry op the row was timed with (the rotation's
input sets in turn for ``previous-step``), under the profiler. The harness's figure (its statistic
over placements) is compared with the median summed duration of each step's kernels (a replay row's:
their mean over whole ring cycles of every input set, the calls rounded up to them, as the harness
times a replay step with its share of the flush); agreement means
|harness / CUPTI - 1| <= 3%. The harness divides a replay of back-to-back calls by its calls, so it
also counts the launch gap between them, which CUPTI's durations do not (the step's span, first
kernel start to last kernel end, is reported too); where an entry op precedes each call, it also
counts what the step adds to the op after it (the write-back of lines the step left dirty), which
``cupti_charged_us`` adds to the CUPTI figure for a like-for-like comparison. ``--replay`` also
profiles the harness's own pass, to tell the two apart from a kernel that runs slower back to back.
Writes DIR/crosscheck.csv, DIR/crosscheck.md and DIR/meta.json; ``--report-only`` writes crosscheck.md
again from crosscheck.csv.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from kda_impls.bench.config import Config
from kda_impls.bench.l2 import entry_op, rotation_inputs
from kda_impls.bench.results import environment, load, write_meta
from kda_impls.cli import comma_list, positive_int, print_and_save
from kda_impls.registry import get
from scripts.crosscheck.cupti import kernels_of, op_busy, replay_durations, step_durations

AGREEMENT = 0.03


def crosscheck_row(row: dict, device: torch.device, calls: int, seed: int, before_kernels: dict,
                   replay: bool = False) -> dict:
    cfg = Config.from_columns(row)
    impl = get(cfg.impl)
    first = cfg.make_inputs(device, seed + 1)
    made, input_sets = rotation_inputs(row["l2_entry"], first, device)
    launchers = [impl.bind(x) for x in input_sets]
    op = entry_op(made, device)
    if op is not None and made not in before_kernels:
        before_kernels[made] = kernels_of(op, device)
    cycle = whole_cycle(cfg, len(launchers))
    calls = -(-calls // cycle) * cycle
    cupti = step_durations(launchers, device, calls, before=op, before_kernels=before_kernels.get(made, 0))
    if cycle > 1:  # a replay step's time is the mean over whole ring cycles, flush included, as the harness's
        cupti["busy_us"] = float(np.mean(cupti["busy_samples_us"]))
    if op is not None and f"{made}-alone" not in before_kernels:
        before_kernels[f"{made}-alone"] = op_busy(op, device, calls)
    # what the step costs the op after it, as the harness's subtraction counts it
    charged = cupti["before_busy_us"] - before_kernels[f"{made}-alone"] if op is not None else 0.0
    in_replay = {}
    if replay:
        timed = replay_durations(launchers, device, before=op, before_kernels=before_kernels.get(made, 0))
        in_replay = {"replay_busy_us": timed["busy_us"], "replay_period_us": timed["period_us"]}
    del first, launchers
    torch.cuda.empty_cache()
    return in_replay | {"cupti_busy_us": cupti["busy_us"], "cupti_span_us": cupti["span_us"],
            "cupti_charged_us": cupti["busy_us"] + charged, "kernels": cupti["kernels"],
            "kernel_names": " | ".join(cupti["names"])[:300],
            # each kernel's share, in launch order: a precompute launch apart from the main kernel
            "kernel_us": " | ".join(f"{us:.3f}" for _, us in cupti["kernel_us"])}


def whole_cycle(cfg: Config, input_sets: int) -> int:
    """Eager steps that take every slot of every rotated input set through its ring once (each input set
    steps every ``len(sets)``-th call): 1 outside replay, where every step is alike."""
    return input_sets * cfg.ring if cfg.mode == "replay" else 1


def replay_section(table: pd.DataFrame) -> str:
    """The rows profiled inside the harness's own pass: whether a kernel runs slower back to back
    than eagerly (replay_over_eager), and how much of the rest is the gap between kernels (the
    harness against the pass's span per call)."""
    cols = ["impl", "state_dtype", "HV", "K", "B", "kernel_us_mean", "cupti_busy_us", "replay_busy_us",
            "replay_period_us", "ratio", "replay_over_eager", "ratio_to_replay_period"]
    return ("## Inside the harness's pass (`--replay`)\n\nreplay_busy_us: a step's kernels summed inside the "
            "graph the harness times, calls back to back; replay_over_eager: that over the eager steps' "
            "cupti_busy_us; replay_period_us: the pass's first kernel start to last kernel end per call, which "
            "also counts the gaps between kernels; ratio_to_replay_period: the harness over it.\n\n"
            + table[cols].to_markdown(index=False, floatfmt=".3f"))


def agreement_table(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows, rows within AGREEMENT and the ratios' range (to CUPTI's durations and to what the
    harness's subtraction charges) per group."""
    return table.groupby(by).agg(rows=("ratio", "count"), agree=("agrees", "sum"), ratio_min=("ratio", "min"),
                                 ratio_max=("ratio", "max"), charged_ratio_min=("ratio_to_charged", "min"),
                                 charged_ratio_max=("ratio_to_charged", "max")).reset_index()


def report(table: pd.DataFrame) -> str:
    """crosscheck.md from crosscheck.csv's table (the replay section where the run profiled it)."""
    worst = table.assign(off=(table.ratio - 1).abs()).sort_values("off", ascending=False).head(25)
    return "\n\n".join([
        "# Harness kernel time against CUPTI kernel durations",
        f"Sweeps: {', '.join(f'`{s}`' for s in table.sweep.unique())}. ratio = harness kernel time (its sweep's "
        f"statistic over placements) / CUPTI median summed kernel duration per step; agreement: |ratio - 1| <= "
        f"{AGREEMENT:.0%}. ratio_to_charged compares with what the harness's subtraction counts, from CUPTI too: "
        f"the step's kernels plus what it adds to the entry op after it (the write-back of lines it left dirty).",
        f"**{int(table.agrees.sum())} of {len(table)} rows agree.** Rows that did not profile: "
        f"{int(table.error.notna().sum())}.",
        # all numbers: as objects, so that the counts stay whole in the markdown
        "## By batch\n\n" + agreement_table(table, ["B"]).round(3).astype(object).to_markdown(index=False),
        "## By implementation, state dtype and batch\n\n"
        + agreement_table(table, ["impl", "state_dtype", "B"]).to_markdown(index=False, floatfmt=".3f"),
        "## The largest differences\n\n" + worst[["impl", "state_dtype", "HV", "K", "B", "slot_pad", "l2_entry",
                                                  "kernel_us_mean", "cupti_busy_us", "cupti_charged_us", "kernels",
                                                  "ratio", "ratio_to_charged"]].to_markdown(index=False,
                                                                                            floatfmt=".3f"),
    ] + ([replay_section(table)] if "replay_busy_us" in table else [])) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("sweeps", type=Path, nargs="*")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report-only", action="store_true",
                        help="profile nothing: write OUT/crosscheck.md again from OUT/crosscheck.csv (no GPU needed)")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--unpadded-only", action="store_true", help="skip rows with slot padding or padding rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--impls", type=comma_list(str), help="only these implementations (comma-separated)")
    parser.add_argument("--B", type=comma_list(positive_int), help="only these batch sizes (comma-separated)")
    parser.add_argument("--replay", action="store_true",
                        help="also profile the harness's own pass (a CUDA graph of back-to-back calls): "
                             "replay_busy_us, a step's kernels inside it; replay_period_us, the pass's span per "
                             "call, which counts the gaps between kernels as the harness's events do")
    args = parser.parse_args()
    if args.report_only:
        return print_and_save(report(pd.read_csv(args.out / "crosscheck.csv")), args.out / "crosscheck.md")
    if not args.sweeps:
        parser.error("name the sweep directories to cross-check (or --report-only)")
    device = torch.device(args.device)
    started = time.perf_counter()
    rows, before_kernels = [], {}
    for sweep_dir in args.sweeps:
        sweep = load(sweep_dir)
        ok = sweep.ok
        if args.unpadded_only:
            ok = ok[(ok.slot_pad == 0) & (ok.pad_rows == 0)]
        if args.impls:
            ok = ok[ok.impl.isin(args.impls)]
        if args.B:
            ok = ok[ok.B.isin(args.B)]
        seed = sweep.meta.get("settings", {}).get("method", {}).get("seed", 0)
        for row in tqdm(ok.to_dict("records"), desc=sweep_dir.name, mininterval=5):
            base = {k: row[k] for k in ("impl", "state_dtype", "H", "HV", "K", "V", "B", "slot_pad", "pad_rows",
                                        "l2_entry", "kernel_us_mean", "kernel_us_placement_min",
                                        "kernel_us_placement_max")} | {"sweep": str(sweep_dir)}
            try:
                rows.append(base | crosscheck_row(row, device, args.calls, seed, before_kernels, args.replay))
            except Exception as exc:  # a row that will not profile: recorded, not fatal
                rows.append(base | {"error": f"{type(exc).__name__}: {exc}"[:300]})
    table = pd.DataFrame(rows).reindex(columns=[*rows[0], "cupti_busy_us", "cupti_span_us", "cupti_charged_us",
                                                "kernels", "kernel_names", "kernel_us", "error"] if rows else [])
    table = table.loc[:, ~table.columns.duplicated()]
    table["ratio"] = table.kernel_us_mean / table.cupti_busy_us
    table["ratio_to_span"] = table.kernel_us_mean / table.cupti_span_us
    table["ratio_to_charged"] = table.kernel_us_mean / table.cupti_charged_us
    table["agrees"] = (table.ratio - 1).abs() <= AGREEMENT
    if args.replay:  # eager steps' kernels against the same kernels back to back, and the gap between them
        table["replay_over_eager"] = table.replay_busy_us / table.cupti_busy_us
        table["ratio_to_replay_period"] = table.kernel_us_mean / table.replay_period_us
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "crosscheck.csv", index=False)
    write_meta(args.out, environment(device, args.out, shlex.join(sys.argv))
               | {"wall_s": round(time.perf_counter() - started, 1), "calls": args.calls, "agreement": AGREEMENT})
    return print_and_save(report(table), args.out / "crosscheck.md")


if __name__ == "__main__":
    sys.exit(main())
