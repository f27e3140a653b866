"""A third clock: NVIDIA's nvbench (its Python package ``cuda-bench``: ``pip install 'kda-impls[nvbench]'``)
timing a sweep's rows with the implementations' own bound launchers, beside the harness's kernel time.

Each row becomes one nvbench benchmark: its inputs drawn again (the first placement's seed), bound, called
once (compilation, autotuning), then handed to ``State.exec`` and launched on nvbench's stream
(``torch.cuda.ExternalStream`` over ``launch.get_stream()``). nvbench's *cold* measurement flushes the L2
by writing a buffer of its size before every sample and brackets one launch with events, until its
relative noise is under ``--max-noise`` and ``--min-time`` of GPU time has accumulated (or ``--timeout``);
samples taken while the SM clock throttles are dropped. Each distinct byte count also gets a ``copy``
benchmark (a device copy reading half those bytes and writing the other half), so that nvbench's own
roofline stands in the same report. nvbench's JSON is kept as it wrote it; :func:`summaries` reads it.

:func:`compare` sets each row's cold mean beside the harness's kernel time (``ratio`` = harness /
nvbench) and names the likely cause of each difference over AGREEMENT; :func:`report` is the markdown.
``cuda-bench`` is imported only when something is timed (:func:`import_bench`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from .case import CONFIG_COLUMNS

AGREEMENT = 0.03  # |harness / nvbench - 1|, as for the CUPTI cross-check
SETTLED_B = 16  # batches from which the fixed per-sample overhead is a small share of the time
# nvbench's summary tags (nvbench/json_printer.cu, detail/measure_cold.cu) -> our columns; times in seconds
TAGS = {"nvbench_us": "nv/cold/time/gpu/mean", "nvbench_median_us": "nv/cold/time/gpu/median",
        "nvbench_noise": "nv/cold/time/gpu/stdev/relative", "nvbench_samples": "nv/cold/sample_size",
        "nvbench_batch_us": "nv/batch/time/gpu/mean", "nvbench_batch_samples": "nv/batch/sample_size"}
SECONDS = {"nvbench_us", "nvbench_median_us", "nvbench_batch_us"}
# what a cross-check row keeps of its sweep's row
ROW_COLUMNS = (*CONFIG_COLUMNS, "library", "l2_entry", "kernel_us_mean", "kernel_us_placement_min",
               "kernel_us_placement_max", "bytes", "roofline_frac", "key")
CONFIGURATION = [c for c in CONFIG_COLUMNS if c not in ("impl", "placements")]  # whose implementations rank


class NvbenchMissing(RuntimeError):
    """cuda-bench (or a CUDA device for it) is not there: the message says what to install."""


def import_bench():
    """The ``cuda.bench`` module, imported on first use: most users never need it."""
    try:
        import cuda.bench as bench
    except ImportError as exc:
        raise NvbenchMissing(f"cuda-bench is not installed ({exc}); pip install 'kda-impls[nvbench]'") from None
    return bench


@dataclass
class Job:
    """One nvbench benchmark: ``setup`` makes the zero-argument launcher (or returns a reason it cannot
    run, which nvbench records as a skip); ``reads``/``writes`` are the bytes nvbench's bandwidth counts."""

    name: str
    setup: Callable[[], Callable[[], object] | str]
    reads: int
    writes: int


def row_job(name: str, row: dict, device, seed: int) -> Job:
    """The benchmark of a sweep row: its configuration's inputs, bound by its implementation."""
    from ..registry import get
    from .config import Config

    def setup():
        cfg = Config.from_columns(row)
        impl = get(cfg.impl)
        inputs = cfg.make_inputs(device, seed)
        reason = impl.unsupported(inputs)
        return reason if reason else impl.bind(inputs)

    # the whole step's bytes as reads: nvbench adds reads and writes up for its bandwidth
    return Job(name, setup, int(row["bytes"]), 0)


def copy_job(name: str, nbytes: int, device) -> Job:
    """A device copy of ``nbytes / 2`` bytes, so that as many bytes are read and written as a step moves."""
    import torch

    half = max(1, nbytes // 2)

    def setup():
        src = torch.ones(half, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    return Job(name, setup, half, half)


def run_jobs(jobs: list[Job], json_path: Path, device, nvbench_args: list[str], batched: bool = False) -> None:
    """Register every job with nvbench and run them all (nvbench runs its registry once per process),
    its JSON written to ``json_path``; ``nvbench_args`` go to nvbench's own command line."""
    import torch

    bench = import_bench()
    device = torch.device(device)
    streams: dict[int, torch.cuda.ExternalStream] = {}

    def on(stream) -> torch.cuda.ExternalStream:
        address = stream.addressof()
        if address not in streams:
            streams[address] = torch.cuda.ExternalStream(address, device=device)
        return streams[address]

    def measure(state, job: Job) -> None:
        try:
            launcher = job.setup()
            if not isinstance(launcher, str):
                with torch.cuda.stream(on(state.get_stream())):
                    launcher()  # compilation, autotuning, lazy workspaces: before nvbench's warm-up
                torch.cuda.synchronize(device)
        except Exception as exc:  # a row that will not run: nvbench records the skip and goes on
            launcher = f"{type(exc).__name__}: {exc}"
        if isinstance(launcher, str):
            state.skip(" ".join(launcher.split())[:300])
            return
        state.add_global_memory_reads(job.reads)
        state.add_global_memory_writes(job.writes)

        def launch(nvbench_launch) -> None:
            with torch.cuda.stream(on(nvbench_launch.get_stream())):
                launcher()

        state.exec(launch, batched=batched)

    def benchmark_of(job: Job):
        def benchmark(state) -> None:
            measure(state, job)
            torch.cuda.empty_cache()  # the row's inputs, gone with measure's frame, before the next row's

        return benchmark

    for job in jobs:
        bench.register(benchmark_of(job)).set_name(job.name)
    with torch.cuda.device(device):
        bench.run_all_benchmarks(["kda-nvbench", "--json", str(json_path), "--devices", str(device.index or 0),
                                  *nvbench_args])


def _value(summary: dict) -> float | None:
    for item in summary.get("data", []):
        if item.get("name") == "value":
            return float(item["value"])  # nvbench writes numbers as strings
    return None


def summaries(json_path: Path) -> pd.DataFrame:
    """One row per benchmark state of nvbench's JSON: ``name``, the TAGS columns (microseconds; noise a
    fraction), ``error`` (nvbench's skip reason)."""
    root = json.loads(Path(json_path).read_text())
    rows = []
    for benchmark in root.get("benchmarks", []):
        for state in benchmark.get("states", []):
            values = {s["tag"]: _value(s) for s in state.get("summaries", [])}
            row = {"name": benchmark["name"],
                   "error": state.get("skip_reason") if state.get("is_skipped") else None}
            for column, tag in TAGS.items():
                value = values.get(tag)
                row[column] = np.nan if value is None else value * (1e6 if column in SECONDS else 1)
            rows.append(row)
    return pd.DataFrame(rows, columns=["name", "error", *TAGS])


def fixed_overhead_us(rows: pd.DataFrame) -> tuple[float, int]:
    """(median of nvbench - harness over the rows at the smallest batch, that batch): the per-sample
    cost nvbench's cold method adds to any kernel (one launch between events), NaN without rows."""
    timed = rows.dropna(subset=["diff_us"])
    if timed.empty:
        return float("nan"), 0
    least = int(timed.B.min())
    return float(timed[timed.B == least].diff_us.median()), least


def _cause(row, overhead: float, max_noise: float) -> str:
    if pd.isna(row.ratio) or row.agrees:
        return ""
    # the fixed overhead first: a difference of its size is explained by it whether or not nvbench settled
    if np.isfinite(overhead) and abs(row.diff_us - overhead) <= max(0.25 * abs(overhead), 0.3):
        return f"nvbench's fixed per-sample overhead (nvbench - harness {row.diff_us:.2f} us, as at the least B)"
    if row.nvbench_noise > max_noise:
        return f"nvbench did not settle: noise {row.nvbench_noise:.1%} over its max-noise {max_noise:.1%}"
    if row.diff_us > 0:
        return "nvbench slower beyond its fixed overhead: its write-flushed L2 or one pool called back to back"
    return "harness slower than nvbench: look at the row with CUPTI (scripts/cupti_crosscheck.py)"


def compare(rows: pd.DataFrame, times: pd.DataFrame, max_noise: float) -> pd.DataFrame:
    """``rows`` (a ``name`` per row; ``kind`` "row" or "copy") joined with nvbench's ``times``
    (:func:`summaries`): ``ratio`` harness / nvbench, ``diff_us`` nvbench - harness, ``agrees``,
    ``nvbench_copy_us`` (the copy of the same bytes) and ``of_copy`` (its share: nvbench's roofline),
    and ``cause`` for each row beyond AGREEMENT."""
    table = rows.merge(times, on="name", how="left", suffixes=("", "_nvbench"))
    if "error_nvbench" in table:
        table["error"] = table.error.fillna(table.pop("error_nvbench"))
    copies = table[table.kind == "copy"].set_index("bytes").nvbench_us
    table["nvbench_copy_us"] = table.bytes.map(copies).where(table.kind == "row")
    table["of_copy"] = table.nvbench_copy_us / table.nvbench_us
    table["ratio"] = (table.kernel_us_mean / table.nvbench_us).where(table.kind == "row")
    table["diff_us"] = table.nvbench_us - table.kernel_us_mean
    table["agrees"] = (table.ratio - 1).abs() <= AGREEMENT
    overhead, _ = fixed_overhead_us(table[table.kind == "row"])
    table["cause"] = [_cause(r, overhead, max_noise) for r in table.itertuples()]
    return table


def _batch_table(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.groupby("B").agg(rows=("ratio", "count"), within=("agrees", "sum"), ratio_min=("ratio", "min"),
                                 ratio_median=("ratio", "median"), ratio_max=("ratio", "max"),
                                 diff_us_median=("diff_us", "median"), noise_max=("nvbench_noise", "max")
                                 ).reset_index()


def same_ranking(rows: pd.DataFrame) -> tuple[int, int]:
    """(configurations whose implementations the harness and nvbench put in the same order, those with
    at least two implementations timed by both)."""
    timed = rows.dropna(subset=["ratio"])
    same = total = 0
    for _, group in timed.groupby(CONFIGURATION):
        if len(group) < 2:
            continue
        total += 1
        same += list(group.sort_values("kernel_us_mean").impl) == list(group.sort_values("nvbench_us").impl)
    return same, total


def _markdown(frame: pd.DataFrame, **kwargs) -> str:
    """A table with whole numbers whole and the rest to 4 significant digits (tabulate's floatfmt is
    per column, and a column of whole numbers read from a CSV is float)."""
    def cell(value):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return float(f"{value:.4g}") if isinstance(value, float) else value

    return frame.map(cell).astype(object).to_markdown(**kwargs)


def report(table: pd.DataFrame, meta: dict) -> str:
    """crosscheck.md from the cross-check table (:func:`compare`) and the run's meta.json."""
    rows = table[table.kind == "row"]
    overhead, least = fixed_overhead_us(rows)
    max_noise = meta.get("nvbench", {}).get("max-noise", 0.5) / 100
    rows = rows.assign(cause=[_cause(r, overhead, max_noise) for r in rows.itertuples()])  # the rules as they are now
    timed = rows.dropna(subset=["ratio"])
    settled = timed[timed.B >= SETTLED_B]
    same, configs = same_ranking(rows)
    copies = table[table.kind == "copy"].dropna(subset=["nvbench_us"])
    copies = copies.assign(nvbench_copy_gbps=copies.bytes / copies.nvbench_us / 1e3)
    worst = timed.assign(off=(timed.ratio - 1).abs()).sort_values("off", ascending=False).head(20)
    settings = meta.get("nvbench", {})
    parts = [
        "# Harness kernel time against nvbench's cold GPU time",
        f"Sources: {', '.join(f'`{s}`' for s in rows.source.unique())}. ratio = harness kernel time / nvbench's "
        f"cold GPU mean; within: |ratio - 1| <= {AGREEMENT:.0%}. nvbench settings: "
        + (", ".join(f"{k} {v}" for k, v in settings.items()) or "its defaults")
        + ". nvbench's own JSON: `nvbench.json.gz`.",
        f"**{int(timed.agrees.sum())} of {len(timed)} rows within {AGREEMENT:.0%}; at B >= {SETTLED_B}: "
        f"{int(settled.agrees.sum())} of {len(settled)}.** Rows nvbench did not time: "
        f"{int(rows.nvbench_us.isna().sum())}. Configurations ranked the same by both: {same} of {configs}.",
    ]
    if np.isfinite(overhead):
        parts.append(f"nvbench - harness at B = {least} (median): {overhead:.2f} us, the cost of one launch between "
                     f"events in each of nvbench's samples, which the harness's replayed passes do not pay.")
    if not timed.empty:
        parts.append("## By batch\n\n" + _markdown(_batch_table(timed), index=False))
        causes = settled[~settled.agrees].cause.str.split(r"[:(]", n=1).str[0].str.strip().value_counts()
        if not causes.empty:
            parts.append(f"## Why rows at B >= {SETTLED_B} differ by more than {AGREEMENT:.0%}\n\n"
                         + _markdown(causes.rename_axis("cause").reset_index(name="rows"), index=False))
        by_impl = timed.astype({"B": int}).pivot_table(index="impl", columns="B", values="ratio", aggfunc="median")
        parts.append("## Median ratio by implementation and batch\n\n" + _markdown(by_impl))
        parts.append("## The largest differences\n\nof_copy: nvbench's copy of the same bytes over the row's time "
                     "(a share of nvbench's own roofline).\n\n" + _markdown(worst[
                         ["impl", "state_dtype", "HV", "K", "B", "slot_pad", "kernel_us_mean", "nvbench_us",
                          "nvbench_noise", "ratio", "of_copy", "cause"]], index=False))
    elif not rows.empty:
        parts.append("## nvbench's times (no harness times to compare: a preset)\n\n" + _markdown(rows[
            ["impl", "state_dtype", "HV", "K", "B", "slot_pad", "nvbench_us", "nvbench_noise", "of_copy"]],
            index=False))
    if not copies.empty:
        parts.append("## nvbench's copy of the same bytes (its roofline)\n\nHalf the bytes read, half written. "
                     "The harness's copy bandwidth on this device (a 1 GiB copy): "
                     f"{meta.get('copy_gbps', float('nan')):,.4g} GB/s.\n\n" + _markdown(copies[
                         ["bytes", "nvbench_us", "nvbench_noise", "nvbench_copy_gbps"]].sort_values("bytes"),
                         index=False))
    errors = rows[rows.error.notna()]
    if not errors.empty:
        parts.append("## Not timed\n\n" + _markdown(errors[["impl", "state_dtype", "HV", "K", "B", "error"]],
                                                       index=False))
    return "\n\n".join(parts) + "\n"

