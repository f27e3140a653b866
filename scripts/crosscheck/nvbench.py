"""A third clock: NVIDIA's nvbench (its Python package ``cuda-bench``: ``pip install 'kda-impls[nvbench]'``)
timing a sweep's rows with the implementations' own bound launchers, beside the harness's kernel time of the
same launcher on the same inputs, taken in the same process just before.

Each row becomes one nvbench benchmark: its inputs drawn again (the first placement's seed), bound, called
once (compilation, autotuning), timed by the harness (:func:`harness_times`: ``timing.kernel_time``, the
sweep's timer, with the sweep's budget and entry state, and once more in the ``dirty`` entry state, whose
L2 is written over before each call as nvbench's flush leaves it), timed once more with one eager call per
sample between events in the sweep's entry state (:func:`.eager.held_call_time`: nvbench's cold method less
its flush) and once more after a write over the L2 before each sample (its cold method whole), its kernels
per call counted (CUPTI through ``torch.profiler``), then handed to ``State.exec`` and
launched on nvbench's stream (``torch.cuda.ExternalStream`` over ``launch.get_stream()``). nvbench's *cold*
measurement writes a buffer of the L2's size before every sample and brackets one launch with events,
until its relative noise is under ``--max-noise`` after ``--min-time`` of GPU time (or the noise stops
changing, or ``--timeout``); samples taken while the SM clock throttles are dropped. An *empty launch* (a
copy of one byte), timed by both (and by the eager timer), measures what nvbench's method adds to every
sample; each distinct byte count gets a ``copy`` benchmark (half those bytes read, half written):
nvbench's own roofline.

With ``--trace`` each row has a traced twin benchmark run right after it, nvbench's samples and the
flushed eager timer's under CUPTI (:mod:`.sample_trace`), so that what each clock's samples hold can be
compared part by part without the profiler's cost in the row's own times.

:func:`compare` joins the three; :mod:`.nvbench_report` names the cause of each difference and writes
the report. ``cuda-bench`` is imported only when something is timed (:func:`import_bench`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from kda_impls.bench.config import CONFIG_COLUMNS
from kda_impls.bench.l2 import as_device
from kda_impls.bench.timing import Budget, Launcher, kernel_time
from scripts.crosscheck.eager import held_call_time
from scripts.crosscheck.sample_trace import HARNESS_HOLDER, NVBENCH_HOLDER, traced

# nvbench's summary tags (nvbench/json_printer.cu, detail/measure_cold.cu) -> our columns; times in seconds
TAGS = {"nvbench_us": "nv/cold/time/gpu/mean", "nvbench_median_us": "nv/cold/time/gpu/median",
        "nvbench_noise": "nv/cold/time/gpu/stdev/relative", "nvbench_samples": "nv/cold/sample_size",
        "nvbench_walltime_s": "nv/cold/walltime",
        "nvbench_batch_us": "nv/batch/time/gpu/mean", "nvbench_batch_samples": "nv/batch/sample_size"}
MICROSECONDS = {"nvbench_us", "nvbench_median_us", "nvbench_batch_us"}
# what a cross-check row keeps of its sweep's row (kernel_us_mean as sweep_us: the sweep's run, not this one)
ROW_COLUMNS = (*CONFIG_COLUMNS, "library", "sweep_us", "kernel_us_placement_min", "kernel_us_placement_max",
               "bytes", "key")
EMPTY = "empty launch"  # the name of the benchmark of a one-byte copy
TRACED = " traced"  # a traced twin's name: its job's and this
# the harness's kernel-time columns of a row: in the sweep's entry state, and in the one nvbench's flush makes
HARNESS_COLUMNS = ("harness_us", "harness_dirty_us")
EAGER_COLUMN = "harness_eager_us"  # one eager call per sample between events, the sweep's entry state
# the same after a write over the L2 before each sample: nvbench's cold method, flush and all, on the harness's clock
FLUSHED_EAGER_COLUMN = "harness_eager_flushed_us"
# the same samples' mean, nvbench's statistic: a call whose kernels' gap has two modes moves its median by a mode
FLUSHED_EAGER_MEAN_COLUMN = "harness_eager_flushed_mean_us"
KERNELS_COLUMN = "kernels_per_call"  # GPU kernels one eager call launches


class NvbenchMissing(RuntimeError):
    """cuda-bench (or a CUDA device for it) is not there: the message says what to install."""


def import_bench():
    """The ``cuda.bench`` module, imported on first use: most users never need it."""
    try:
        import cuda.bench as bench
    except ImportError as exc:
        raise NvbenchMissing(f"cuda-bench is not installed ({exc}); pip install 'kda-impls[nvbench]'") from None
    return bench


def nvbench_argv(settings: dict, extra: list[str]) -> list[str]:
    """nvbench's command line for ``settings`` (max-noise in %, min-time and timeout in seconds): its
    stdrel criterion named first, since nvbench accepts a criterion's parameters only after it."""
    return ["--stopping-criterion", "stdrel", *(a for k, v in settings.items() for a in (f"--{k}", str(v))), *extra]


@dataclass
class Bound:
    """A job's launcher, and the harness's kernel times of it (``harness()``: columns -> values)."""

    launcher: Launcher
    harness: Callable[[], dict]
    flushed_eager: Callable[[], object]  # the harness's flushed eager timer of it alone, for a sample trace


@dataclass
class Job:
    """One nvbench benchmark: ``setup`` binds the launcher (or returns a reason it cannot run, which
    nvbench records as a skip); ``reads``/``writes`` are the bytes nvbench's bandwidth counts."""

    name: str
    setup: Callable[[], Bound | str]
    reads: int
    writes: int


class _Buffers:
    """A launch's tensors as ``kernel_time`` sees inputs: outside the previous-step rotation (which
    copies DecodeInputs) it asks them only for their bytes."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def harness_times(inputs, launcher: Launcher, bind, device, budget: Budget, entries: dict[str, str]) -> dict:
    """The harness's kernel time (``timing.kernel_time``, as a sweep times a row) of ``launcher`` on
    ``inputs`` in each entry state of ``entries`` (column -> state), in us, and the state each made
    (``<column without _us>_entry``): one placement, these inputs; the other input sets of a rotation
    are copies of them bound by ``bind``, as in a sweep. Then EAGER_COLUMN: one eager call per sample
    (:func:`.eager.held_call_time`) in the first entry state, and FLUSHED_EAGER_COLUMN in ``dirty``
    (FLUSHED_EAGER_MEAN_COLUMN its samples' mean), with the same budget; on a GPU, first,
    KERNELS_COLUMN (CUPTI: the profiler's state is then the same for every job both clocks time)."""
    times = {}
    if as_device(device).type == "cuda":
        from scripts.crosscheck.cupti import kernels_of

        times[KERNELS_COLUMN] = kernels_of(launcher, device)
    for column, entry in entries.items():
        timing = kernel_time(lambda _: inputs, lambda x: launcher if x is inputs else bind(x), device, budget,
                             placements=1, entry=entry)
        times[column] = timing.time * 1e6
        times[column.removesuffix("_us") + "_entry"] = timing.entry
    for column, entry in ((EAGER_COLUMN, next(iter(entries.values()))), (FLUSHED_EAGER_COLUMN, "dirty")):
        eager = held_call_time(inputs, launcher, bind, device, budget, entry)
        times[column] = eager.time * 1e6
        times[column.removesuffix("_us") + "_entry"] = eager.entry
        if column == FLUSHED_EAGER_COLUMN:
            times[FLUSHED_EAGER_MEAN_COLUMN] = float(np.mean(eager.samples)) * 1e6
    return times


def row_job(name: str, row: dict, device, seed: int, entry: str, budget: Budget) -> Job:
    """The benchmark of a sweep row: its configuration's inputs, bound by its implementation, timed by the
    harness in ``entry`` (the sweep's) and in ``dirty`` with ``budget`` (the sweep's kernel budget)."""
    from kda_impls.bench.config import Config
    from kda_impls.registry import get

    def setup():
        cfg = Config.from_columns(row)
        impl = get(cfg.impl)
        inputs = cfg.make_inputs(device, seed)
        reason = impl.unsupported(inputs)
        if reason:
            return reason
        launcher = impl.bind(inputs)
        entries = dict(zip(HARNESS_COLUMNS, (entry, "dirty"), strict=True))
        return Bound(launcher, lambda: harness_times(inputs, launcher, impl.bind, device, budget, entries),
                     lambda: held_call_time(inputs, launcher, impl.bind, device, budget, "dirty"))

    # the whole step's bytes as reads: nvbench adds reads and writes up for its bandwidth
    return Job(name, setup, int(row["bytes"]), 0)


def copy_job(name: str, nbytes: int, device, harness: Budget | None = None) -> Job:
    """A device copy of ``nbytes / 2`` bytes, so that as many bytes are read and written as a step moves;
    with a ``harness`` budget the harness times it too, in the ``hot`` state, and the eager timer (the
    empty launch: its time is the launch's, not the memory's)."""
    import torch

    half = max(1, nbytes // 2)

    def setup():
        src = torch.ones(half, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)

        def launcher():
            return dst.copy_(src)

        if harness is None:
            return Bound(launcher, dict, dict)
        buffers = _Buffers(src, dst)
        return Bound(launcher, lambda: harness_times(buffers, launcher, None, device, harness, {"harness_us": "hot"}),
                     lambda: held_call_time(buffers, launcher, None, device, harness, "dirty"))

    return Job(name, setup, half, half)


def run_jobs(jobs: list[Job], json_path: Path, device, nvbench_args: list[str], batched: bool = False,
             trace: bool = False) -> pd.DataFrame:
    """Register every job with nvbench and run them all (nvbench runs its registry once per process),
    its JSON written to ``json_path``; ``nvbench_args`` go to nvbench's own command line. Returns the
    harness's times of each job (a ``name`` column and its ``harness()`` columns). With ``trace``, each job
    that launches a kernel gets a twin benchmark (its name and TRACED) run right after it, whose nvbench
    samples and flushed eager ones run under CUPTI (:mod:`.sample_trace`: ``trace_nvbench_*``,
    ``trace_eager_*`` columns): the job's own times stay free of the profiler's cost."""
    import torch

    bench = import_bench()
    device = torch.device(device)
    streams: dict[int, torch.cuda.ExternalStream] = {}
    harness: list[dict] = []
    pending: dict[str, tuple] = {}  # a timed job's launcher and harness row, until its traced twin runs

    def on(stream) -> torch.cuda.ExternalStream:
        address = stream.addressof()
        if address not in streams:
            streams[address] = torch.cuda.ExternalStream(address, device=device)
        return streams[address]

    def measure(state, job: Job) -> None:
        try:
            bound = job.setup()
            if not isinstance(bound, str):
                with torch.cuda.stream(on(state.get_stream())):
                    bound.launcher()  # compilation, autotuning, lazy workspaces: before either clock
                torch.cuda.synchronize(device)
                harness.append({"name": job.name} | bound.harness())  # the harness's clocks, just before nvbench's
        except Exception as exc:  # a row that will not run: nvbench records the skip and goes on
            bound = f"{type(exc).__name__}: {exc}"
        if isinstance(bound, str):
            state.skip(" ".join(bound.split())[:300])
            return
        state.add_global_memory_reads(job.reads)
        state.add_global_memory_writes(job.writes)
        launcher = bound.launcher

        def launch(nvbench_launch) -> None:
            with torch.cuda.stream(on(nvbench_launch.get_stream())):
                launcher()

        timed = harness[-1] if harness and harness[-1]["name"] == job.name else {}
        state.exec(launch, batched=batched)
        # a copy: nvbench's roofline, no harness beside it; the empty launch: a memcpy, no kernel to trace
        if trace and timed.get(KERNELS_COLUMN, 0) >= 1:
            pending[job.name] = (bound, launch, timed)  # for its traced twin, which nvbench runs next

    def measure_traced(state, job: Job) -> None:
        """The twin of a timed job: nvbench's cold loop and the flushed eager timer again, each under CUPTI
        (:mod:`.sample_trace`), their times and their samples' parts into the job's harness row."""
        if job.name not in pending:
            state.skip("not traced: the job did not run, or launches no kernel")
            return
        bound, launch, timed = pending.pop(job.name)
        per_call = int(timed[KERNELS_COLUMN])
        try:
            _, nv = traced(lambda: state.exec(launch, batched=False), device, NVBENCH_HOLDER, per_call,
                           "trace_nvbench")
            eager, held = traced(bound.flushed_eager, device, HARNESS_HOLDER, per_call, "trace_eager")
        except RuntimeError as exc:  # a trace that does not split into samples: said in the row, the rest goes on
            timed["trace_error"] = str(exc)
            return
        timed |= nv | held | {"trace_eager_us": float(np.mean(eager.samples)) * 1e6,
                              "trace_eager_median_us": eager.time * 1e6}

    def benchmark_of(job: Job):
        def benchmark(state) -> None:
            measure(state, job)
            torch.cuda.empty_cache()  # the row's inputs, gone with measure's frame, before the next row's

        return benchmark

    def traced_twin(job: Job):
        def benchmark(state) -> None:
            measure_traced(state, job)
            torch.cuda.empty_cache()

        return benchmark

    for job in jobs:
        bench.register(benchmark_of(job)).set_name(job.name)
        if trace:
            bench.register(traced_twin(job)).set_name(f"{job.name}{TRACED}")
    with torch.cuda.device(device):
        bench.run_all_benchmarks(["kda-nvbench", "--json", str(json_path), "--devices", str(device.index or 0),
                                  *nvbench_args])
    return pd.DataFrame(harness) if harness else pd.DataFrame(columns=["name", *HARNESS_COLUMNS, EAGER_COLUMN,
                                                                           FLUSHED_EAGER_COLUMN,
                                                                           FLUSHED_EAGER_MEAN_COLUMN])


def _value(summary: dict) -> float | None:
    for item in summary.get("data", []):
        if item.get("name") == "value":
            return float(item["value"])  # nvbench writes numbers as strings
    return None


def summaries(json_path: Path) -> pd.DataFrame:
    """One row per benchmark state of nvbench's JSON: ``name``, the TAGS columns (microseconds; noise a
    fraction; walltime in seconds), ``error`` (nvbench's skip reason)."""
    root = json.loads(Path(json_path).read_text())
    rows = []
    for benchmark in root.get("benchmarks", []):
        for state in benchmark.get("states", []):
            values = {s["tag"]: _value(s) for s in state.get("summaries") or []}  # a skipped state: null
            row = {"name": benchmark["name"],
                   "error": state.get("skip_reason") if state.get("is_skipped") else None}
            for column, tag in TAGS.items():
                value = values.get(tag)
                row[column] = np.nan if value is None else value * (1e6 if column in MICROSECONDS else 1)
            rows.append(row)
    return pd.DataFrame(rows, columns=["name", "error", *TAGS])


def compare(rows: pd.DataFrame, times: pd.DataFrame, harness: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (a ``name`` each; ``kind`` "row", "copy" or "empty") joined with nvbench's ``times``
    (:func:`summaries`) and the harness's (:func:`run_jobs`): ``ratio`` harness / nvbench,
    ``diff_us`` nvbench - harness, ``sweep_ratio`` the sweep's time / the harness's, ``nvbench_copy_us``
    (the copy of the same bytes) and ``of_copy`` (its share: nvbench's roofline). The causes:
    :func:`.nvbench_report.with_causes`."""
    twins = times.name.str.endswith(TRACED)
    traced_times = times[twins].assign(name=times[twins].name.str.removesuffix(TRACED))[
        ["name", "nvbench_us", "nvbench_median_us"]].rename(
        columns={"nvbench_us": "trace_nvbench_us", "nvbench_median_us": "trace_nvbench_median_us"})
    table = rows.merge(times[~twins], on="name", how="left", suffixes=("", "_nvbench"))
    table = table.merge(traced_times, on="name", how="left")
    table = table.merge(harness, on="name", how="left", suffixes=("", "_harness"))
    if "error_nvbench" in table:
        table["error"] = table.error.fillna(table.pop("error_nvbench"))
    for column in (*HARNESS_COLUMNS, EAGER_COLUMN, FLUSHED_EAGER_COLUMN, FLUSHED_EAGER_MEAN_COLUMN, KERNELS_COLUMN):
        if column not in table:
            table[column] = np.nan
    row = table.kind == "row"
    copies = table[table.kind == "copy"].set_index("bytes").nvbench_us
    table["nvbench_copy_us"] = table.bytes.map(copies).where(row)
    table["of_copy"] = table.nvbench_copy_us / table.nvbench_us
    table["ratio"] = (table.harness_us / table.nvbench_us).where(row)
    table["diff_us"] = table.nvbench_us - table.harness_us
    table["sweep_ratio"] = table.sweep_us / table.harness_us
    return table
