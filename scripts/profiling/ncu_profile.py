"""Nsight Compute counters of the Triton KDA decode kernel, beside a device-to-device copy of the
same bytes (where the time goes when the kernel misses the copy bandwidth), beside FlashInfer's
call at B = 1 (where its step is shorter: its launch shape, registers and stalls against ours), and of
its one-token replay step's launches (where replay misses its target), at B = 16 beside SGLang's
ReplaySSM and our in-place step.

    python3 -m scripts.profiling.ncu_profile --out DIR    # our kernel's cases of CASES, under ncu
    python3 -m scripts.profiling.ncu_profile --cases bf16-B1-table,bf16-B1-flashinfer --out DIR   # needs FlashInfer

For each case, ncu (``--clock-control none``: the clocks are left as they run; ``--cache-control
all``: the L2 is flushed before each replay pass, so the state comes from DRAM) profiles the
kernels of one launch (inside an NVTX range, so that nothing the setup launches is taken for it)
after three warm-ups of the implementation's bound launcher on a timed pool (random slot order,
as the sweeps lay it out), with the sections that say how busy DRAM was, how many warps were
resident and what they waited on. Writes ``raw.csv`` (every metric of every case), ``summary.csv``
and ``summary.md`` (the metrics named in SUMMARY), and ``meta.json``.

``--workload CASE`` runs one case's launches without ncu (what ncu runs).
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

from kda_impls.bench.config import Config
from kda_impls.bench.results import environment
from kda_impls.impls.triton.frozen import FROZEN_CONFIG_ENV
from kda_impls.impls.triton.kernel import TritonKDA
from kda_impls.impls.triton.tiles import TileConfig
from kda_impls.registry import get

# name: (implementation, state dtype, HV, K=V, B, T, forced tile config of our kernel, or None for the
# table's choice (another implementation: its own call), "copy", or "replay": a one-token replay step on a
# ring of REPLAY_RING with random lengths, so that about one row in REPLAY_RING flushes at the profiled launch,
# "frozen[:TILE]": a frozen verify step, TILE the KDA_TRITON_FROZEN_CONFIG it runs under)
CASES = {
    "bf16-B256-table": ("triton", "bfloat16", 32, 128, 256, 1, None),
    "bf16-B256-BV8": ("triton", "bfloat16", 32, 128, 256, 1, "BV=8,num_warps=1"),
    "bf16-B256-persistent": ("triton", "bfloat16", 32, 128, 256, 1, "BV=8,num_warps=1,programs_per_sm=8"),
    "bf16-B256-subtiles": ("triton", "bfloat16", 32, 128, 256, 1, "BV=4,num_warps=1,subtiles=16"),
    "fp32-B256-table": ("triton", "float32", 32, 128, 256, 1, None),
    "bf16-B1-table": ("triton", "bfloat16", 32, 128, 1, 1, None),
    "bf16-B128-T8-table": ("triton", "bfloat16", 32, 128, 128, 8, None),
    "bf16-B256-copy": ("triton", "bfloat16", 32, 128, 256, 1, "copy"),
    "bf16-B256-T4-frozen": ("triton", "bfloat16", 32, 128, 256, 4, "frozen"),
    "bf16-B256-T4-frozen-recurrence": ("triton", "bfloat16", 32, 128, 256, 4, "frozen:recurrence=1"),
    "bf16-B256-T8-frozen": ("triton", "bfloat16", 32, 128, 256, 8, "frozen"),
    "bf16-B256-T8-frozen-terms1": ("triton", "bfloat16", 32, 128, 256, 8, "frozen:terms_warps=1"),
    "bf16-B256-replay": ("triton", "bfloat16", 32, 128, 256, 1, "replay"),
    "fp32-B256-replay": ("triton", "float32", 32, 128, 256, 1, "replay"),
    "bf16-B16-table": ("triton", "bfloat16", 32, 128, 16, 1, None),
    "bf16-B16-replay": ("triton", "bfloat16", 32, 128, 16, 1, "replay"),
    "bf16-B16-replayssm": ("sglang-replayssm", "bfloat16", 32, 128, 16, 1, "replay"),
    "bf16-B1-flashinfer": ("flashinfer", "bfloat16", 32, 128, 1, 1, None),
    "bf16-B1-HV64-table": ("triton", "bfloat16", 64, 128, 1, 1, None),
    "bf16-B1-HV64-flashinfer": ("flashinfer", "bfloat16", 64, 128, 1, 1, None),
    "bf16-B1-D64-table": ("triton", "bfloat16", 32, 64, 1, 1, None),
    "bf16-B1-D64-flashinfer": ("flashinfer", "bfloat16", 32, 64, 1, 1, None),
}
OURS = [name for name, case in CASES.items() if case[0] == "triton"]  # the default: no other package needed
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats")
# The summary's metrics (ncu's raw names), each in its own column.
SUMMARY = {
    "gpu__time_duration.sum": "duration",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % of peak",
    "dram__bytes.sum.per_second": "DRAM bytes/s",
    "lts__t_sector_hit_rate.pct": "L2 hit %",
    "launch__registers_per_thread": "regs/thread",
    "launch__grid_size": "programs",
    "launch__block_size": "threads/program",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical occupancy %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active %",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles per issued instruction",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall: long scoreboard",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio": "stall: LG throttle",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "stall: short scoreboard",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall: wait",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "stall: math pipe",
    "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio": "stall: drain",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio": "stall: not selected",
}
WARMUP = 3
REPLAY_RING = 16  # the replay preset's ring
RANGE = "kda-profiled"  # the NVTX range around the profiled launch
NCU_GLOB = "/opt/nvidia/nsight-compute/*/ncu"  # where the H200 image keeps it when it is not on the PATH


def workload(name: str) -> None:
    """Three warm-up launches and one more, in the NVTX range ncu profiles."""
    impl, state_dtype, HV, D, B, T, config = CASES[name]
    replay = dict(mode="replay", ring=REPLAY_RING) if config == "replay" else {}
    if config and config.startswith("frozen"):
        os.environ[FROZEN_CONFIG_ENV] = config.partition(":")[2]
        replay, config = dict(mode="frozen"), None
    inputs = Config(impl, B, HV, HV, D, D, state_dtype=state_dtype, T=T, **replay).make_inputs(torch.device("cuda"))
    if config == "copy":  # the state's bytes read and written once, as the kernel moves them
        # An elementwise kernel, not copy_: a contiguous copy_ is a memcpy, which ncu does not profile.
        source = inputs.state.clone()
        launch = lambda: torch.mul(source, 1, out=inputs.state)  # noqa: E731
    elif config and not replay:
        launch = TritonKDA(TileConfig.parse(config, TileConfig(BV=D))).bind(inputs)
    else:
        launch = get(impl).bind(inputs)
    for _ in range(WARMUP):
        launch()
    with torch.cuda.nvtx.range(RANGE):
        launch()
    torch.cuda.synchronize()


def profile(name: str, ncu: str) -> tuple[pd.DataFrame, pd.Series]:
    """ncu's raw metrics of the case's profiled launch, and their units."""
    command = [ncu, "--clock-control", "none", "--cache-control", "all", "--nvtx", "--nvtx-include", f"{RANGE}/",
               *[a for s in SECTIONS for a in ("--section", s)], "--csv", "--page", "raw",
               sys.executable, "-m", "scripts.profiling.ncu_profile", "--workload", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    csv_text = done.stdout[done.stdout.find('"ID"'):] if '"ID"' in done.stdout else ""
    if done.returncode or not csv_text:
        raise RuntimeError(f"{shlex.join(command)}: exit {done.returncode}\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-2000:]}")
    table = pd.read_csv(io.StringIO(csv_text), low_memory=False)
    units = table.iloc[0]  # the raw page's second line gives each metric's unit
    table = table.iloc[1:].copy()  # one frame, not a fragmented one, before the column is added
    table["case"] = name
    return table, units


def summarise(raw: pd.DataFrame, units: pd.Series) -> pd.DataFrame:
    rows = []
    for _, r in raw.iterrows():
        row = {"case": r["case"], "kernel": r.get("Kernel Name", "")}
        for metric, label in SUMMARY.items():
            unit = units.get(metric, "")
            row[f"{label} ({unit})" if isinstance(unit, str) and unit else label] = r.get(metric, "")
        rows.append(row)
    return pd.DataFrame(rows)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "ncu")
    parser.add_argument("--cases", default=",".join(OURS),
                        help=f"comma-separated, of: {', '.join(CASES)} (default: our kernel's and the copy)")
    parser.add_argument("--workload", choices=CASES, help="run one case's launches (what ncu profiles) and exit")
    return parser


def main() -> int:
    args = arguments().parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    if args.workload:
        workload(args.workload)
        return 0
    ncu = shutil.which("ncu") or next(iter(sorted(glob.glob(NCU_GLOB))[-1:]), None)
    if ncu is None:
        print("ncu (Nsight Compute) is not on the PATH")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tables, failures = [], 0
    for name in args.cases.split(","):
        try:
            table, units = profile(name, ncu)
            tables.append(table)
            print(f"{name}: {len(table)} kernel(s) profiled", flush=True)
        except Exception as exc:  # one case the profiler refuses must not lose the others
            failures += 1
            print(f"{name}: {exc}", flush=True)
    if tables:
        raw = pd.concat(tables, ignore_index=True)
        raw.to_csv(args.out / "raw.csv", index=False)
        summary = summarise(raw, units)
        summary.to_csv(args.out / "summary.csv", index=False)
        (args.out / "summary.md").write_text(f"```\n{summary.set_index('case').T.to_string()}\n```\n")
        print(summary.set_index("case").T.to_string())
    meta = environment(torch.device("cuda"), args.out, shlex.join(sys.argv)) | {
        "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:],
        "cases": {name: CASES[name] for name in args.cases.split(",")}, "sections": SECTIONS}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return 1 if failures or not tables else 0


if __name__ == "__main__":
    sys.exit(main())
