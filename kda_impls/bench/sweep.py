"""The sweep: implementations x a preset's configurations, measured in isolated worker processes,
resumable, with a progress bar, a summary table, the wall time and charts at the end.

Each implementation gets a worker process (multiprocessing "spawn": a fresh interpreter, no CUDA
state inherited) that handles all its rows, so imports, the CUDA context and JIT caches are paid once.
The workers start together, importing while the first one measures; the driver sends one row at a
time, so only one of them touches the GPU at once. A worker that dies (a segfault, an illegal memory
access, which poisons the CUDA context, a row past the timeout) makes its row ``crashed``; the next
row gets a fresh worker. Each finished row is a file in ``DIR/rows/``: re-running the same command
skips them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shlex
import signal
import sys
import time
from collections import Counter
from contextlib import suppress
from dataclasses import asdict
from multiprocessing.connection import wait
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from .. import dtypes, registry
from ..contract import package_version
from .config import Config
from .measure import STATUSES, empty_row
from .presets import PRESETS
from .results import REPO, assemble, device_info, environment, read_meta, read_rows, remove_stale_temporaries, \
    write_meta, write_row
from .roofline import copy_bandwidth
from .timing import as_device
from .worker import Settings, serve

MAX_CRASHES = 3  # per implementation and run; its remaining rows are then recorded, not run
STARTUP_TIMEOUT_S = 600.0


class WorkerDied(Exception):
    pass


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"worker killed by {signal.Signals(-code).name}"
    return f"worker exited with code {code}"


class Worker:
    """The driver's handle on one implementation's worker process."""

    def __init__(self, impl: str, settings: Settings):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: a library may start processes of its own (JIT compilers)
        self.process = ctx.Process(target=serve, args=(impl, settings, child), name=f"kda-bench-{impl}")
        self.process.start()
        child.close()  # so that the worker's death reads as end-of-file here
        self.hello: dict | None = None

    def _receive(self, timeout: float):
        ready = wait([self.conn, self.process.sentinel], timeout)
        if not ready:
            self.process.kill()
            self.process.join()
            raise WorkerDied(f"no answer within {timeout:.0f} s; worker killed")
        if self.conn in ready:
            with suppress(EOFError):
                return self.conn.recv()
        self.process.join()
        raise WorkerDied(_exit_reason(self.process.exitcode))

    def measure(self, cfg: Config, copy_bw: float, timeout: float) -> dict:
        if self.hello is None:
            self.hello = self._receive(STARTUP_TIMEOUT_S)
        try:
            self.conn.send((cfg, copy_bw))
        except OSError:
            self.process.join()
            raise WorkerDied(_exit_reason(self.process.exitcode)) from None
        return self._receive(timeout)

    def stop(self) -> None:
        with suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


# ---- the driver ---------------------------------------------------------------------------------

def _jsonable(value):
    return json.loads(json.dumps(value))


def run_sweep(configs: list[Config], out_dir: Path, settings: Settings, *, command: str, preset: str,
              row_timeout: float = 600.0, retry_crashed: bool = False) -> pd.DataFrame:
    """Measure every configuration not yet in ``out_dir`` (crashed ones too with ``retry_crashed``);
    return the assembled results of the whole directory."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)
    device = as_device(settings.device)
    meta, info = read_meta(out_dir), device_info(device)
    if meta and (meta["settings"] != _jsonable(asdict(settings)) or meta["device"]["name"] != info["name"]):
        raise SystemExit(f"{out_dir} holds rows measured on {meta['device']['name']} with settings "
                         f"{meta['settings']}; this run is {info['name']} with {_jsonable(asdict(settings))}. "
                         f"Pass another --out.")
    done = {row["key"]: row["status"] for row in read_rows(out_dir)}
    pending = [c for c in configs if c.key() not in done or (retry_crashed and done[c.key()] == "crashed")]
    print(f"{len(configs)} rows in the preset, {len(configs) - len(pending)} already in {out_dir}, "
          f"{len(pending)} to measure on {info['name']}")

    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read at import by the workers: Triton on CPU tensors
    # before any worker starts, so that nothing else touches the device while it is measured; a
    # resumed directory keeps its roofline
    copy_bw = meta.get("copy_bandwidth_Bps") or copy_bandwidth(device)
    workers = {impl: Worker(impl, settings) for impl in dict.fromkeys(c.impl for c in pending)}
    impls_meta = meta.get("impls", {})
    meta |= environment(device, out_dir, command) | {
        "settings": _jsonable(asdict(settings)), "copy_bandwidth_Bps": copy_bw,
        "presets": sorted(set(meta.get("presets", [])) | {preset}),
    }
    write_meta(out_dir, meta)

    crashes: Counter[str] = Counter()
    measured = 0
    bar = tqdm(total=len(pending), unit="row", dynamic_ncols=True, smoothing=0.1)
    try:
        for cfg in pending:
            bar.set_description(cfg.impl)
            bar.set_postfix_str(cfg.key(), refresh=True)
            if crashes[cfg.impl] >= MAX_CRASHES:
                row = empty_row(cfg, "crashed", f"not run: {cfg.impl} crashed {MAX_CRASHES} times in this run")
            else:
                worker = workers.get(cfg.impl) or Worker(cfg.impl, settings)
                workers[cfg.impl] = worker
                try:
                    row = worker.measure(cfg, copy_bw, row_timeout)
                except WorkerDied as exc:
                    row = empty_row(cfg, "crashed", str(exc))
                if worker.hello and "versions" in worker.hello:
                    impls_meta[cfg.impl] = worker.hello
                if row["status"] == "crashed":
                    crashes[cfg.impl] += 1
                    worker.stop()
                    workers[cfg.impl] = None
            write_row(out_dir, row)
            measured += 1
            bar.update()
    finally:
        bar.close()
        for worker in filter(None, workers.values()):
            worker.stop()
        table = assemble(out_dir)
        wall_s = time.perf_counter() - started
        versions = {"python": platform.python_version(), "torch": torch.__version__,
                    "triton": package_version("triton")}
        for hello in impls_meta.values():
            versions |= hello["versions"]
        meta |= {"impls": impls_meta, "versions": versions,
                 "runs": meta.get("runs", []) + [{"utc": meta["utc"], "command": command, "git": meta["git"],
                                                  "rows_measured": measured, "wall_s": round(wall_s, 2)}]}
        write_meta(out_dir, meta)
    return table


def summary_table(table: pd.DataFrame) -> str:
    """Median kernel time, bandwidth and share of the copy roofline per configuration (rows) and
    implementation (columns); the status where nothing was timed."""
    def cell(row) -> str:
        if row.status not in ("ok", "wrong"):
            return row.status
        gbps = f"{row.gbps:.0f}" if row.gbps >= 100 else f"{row.gbps:.2g}"
        text = f"{row.kernel_us_median:.1f} us {gbps} GB/s {row.roofline_frac:.0%}"
        return text + (" WRONG" if row.status == "wrong" else "")

    shown = table.assign(cell=table.apply(cell, axis=1), state=table.state_dtype.map(dtypes.short))
    pivot = shown.pivot(index=["H", "HV", "K", "V", "state", "slot_pad", "pad_rows", "B"], columns="impl", values="cell")
    return pivot.fillna("").to_string()


def problems_table(table: pd.DataFrame) -> str:
    """Why rows were not ok: implementation, status, reason and how many rows share them."""
    bad = table[table.status != "ok"]
    if bad.empty:
        return ""
    counts = bad.groupby(["impl", "status", "reason"], dropna=False).size().rename("rows").reset_index()
    with pd.option_context("display.max_colwidth", 140, "display.width", 250):
        return counts.to_string(index=False)


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(prog="scripts/sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS),
                        help="default: kimi-linear-48b on a GPU, smoke on the CPU (where every preset runs as smoke)")
    parser.add_argument("--impls", help=f"comma-separated (default: every registered one: {','.join(registry.names())})")
    parser.add_argument("--out", type=Path, help="results directory (default: sweeps/PRESET-DEVICE in the repository)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is available")
    parser.add_argument("--l2-hot", action="store_true", help="time one input set repeatedly instead of an L2-cold rotation")
    parser.add_argument("--pool-slots-per-row", type=int, default=1, metavar="N",
                        help="timed pools hold N*B slots, the rows' slots drawn at random among them (default 1: "
                             "every slot live; a serving pool holds more slots than the batch)")
    parser.add_argument("--sorted-slots", action="store_true",
                        help="rows name their slots in ascending order (a fresh pool's; default: random order)")
    parser.add_argument("--no-charts", action="store_true", help="leave the charts to scripts/plot.py")
    parser.add_argument("--baseline", help="implementation the speedup chart divides by (default: flashinfer, else naive)")
    parser.add_argument("--row-timeout", type=float, default=600.0, help="seconds before a silent worker is killed")
    parser.add_argument("--retry-crashed", action="store_true", help="measure rows recorded as crashed again")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available")
    preset = PRESETS[args.preset or ("kimi-linear-48b" if device == "cuda" else "smoke")]
    if device == "cpu" and preset.name != "smoke":
        print(f"on the CPU: running the smoke preset instead of {preset.name}")
        preset = PRESETS["smoke"]
    impls = args.impls.split(",") if args.impls else registry.names()
    unknown = [name for name in impls if name not in registry.names()]
    if unknown:
        parser.error(f"unknown implementations {unknown}; registered: {registry.names()}")
    out_dir = args.out or REPO / "sweeps" / f"{preset.name}-{device}"
    if args.pool_slots_per_row < 1:
        parser.error("--pool-slots-per-row must be >= 1")
    settings = Settings(device=device, l2_cold=not args.l2_hot, kernel=preset.kernel, call=preset.call,
                        pool_slots_per_row=args.pool_slots_per_row, sorted_slots=args.sorted_slots)

    configs = preset.configs(impls)
    table = run_sweep(configs, out_dir, settings, command=shlex.join(sys.argv if argv is None else argv),
                      preset=preset.name, row_timeout=args.row_timeout, retry_crashed=args.retry_crashed)
    ours = table[table.key.isin({c.key() for c in configs})]
    with pd.option_context("display.width", 250, "display.max_rows", None):
        print(f"\nmedian kernel time, bandwidth, share of the copy roofline ({'L2-cold' if settings.l2_cold else 'L2-hot'}):")
        print(summary_table(ours))
        problems = problems_table(ours)
        if problems:
            print("\nrows not ok:\n" + problems)
    counts = Counter(ours.status)
    print(f"\nrows: {', '.join(f'{counts[s]} {s}' for s in STATUSES if counts[s])}; "
          f"wall time {time.perf_counter() - started:.1f} s; results in {out_dir}/results.csv")

    if args.no_charts:
        return
    from .plots import plot_dir  # matplotlib only once the measuring is over

    charts = plot_dir(out_dir, baseline=args.baseline)
    print(f"charts: {', '.join(p.name for p in charts)}")
