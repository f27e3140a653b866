"""The sweep: implementations x configurations (a preset, or axes from the command line), measured in
isolated worker processes on one or several devices, resumable, with a progress bar, a summary
table, the wall time and charts at the end.

Each device is a *lane* that measures one row at a time, so each row is timed alone on its GPU.
Rows go to lanes in compile groups (:func:`compile_groups`: one implementation's rows of one shape
and dtype), and a lane keeps to the implementations it has started (:class:`GroupScheduler`), so
that what an implementation compiles in its own process (FlashInfer's CuTe DSL kernels) is compiled
on one lane, not on each. In a
lane each implementation gets a worker process (multiprocessing "spawn": a fresh interpreter, no
CUDA state inherited) that handles all its rows there, so imports, the CUDA context and JIT caches
are paid once; on a GPU a thorough preset times each row in three such processes in turn
(``--placement-processes``), and every worker has started before the first row is timed. A worker that dies (a segfault,
an illegal memory access, which poisons the CUDA context, a row past the timeout) makes its row
``crashed``; the next row gets a fresh worker. Each finished row is a file in ``DIR/rows/``:
re-running the same command skips them. ``--shard i/n`` measures every n-th configuration so that
machines of one kind split a sweep, and ``kda-merge`` joins their directories.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import shlex
import signal
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import asdict, replace
from datetime import datetime, timezone
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from .. import dtypes, registry
from ..cli import Parser, comma_list, fail, non_negative_float, non_negative_int, positive_float, positive_int
from ..contract import package_version
from .case import STATUSES, Method, empty_row, merge_rows
from .config import CHECKPOINTS, SLOT_ORDERS, Config, PoolLayout
from .presets import AXES, PRESETS, Preset, adhoc_configs
from .results import assemble, environment, read_meta, read_rows, remove_stale_temporaries, write_meta, write_row
from .roofline import copy_bandwidth
from .timing import DEFAULT_ENTRY, ENTRY_STATES, METHOD_VERSION, PLACEMENT_SPREAD_LIMIT, Budget
from .worker import serve

MAX_CRASHES = 3  # per implementation and run; its remaining rows are then recorded, not run
STARTUP_TIMEOUT_S = 600.0
INTERRUPTED = 130


class WorkerDied(Exception):
    pass


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"worker killed by {signal.Signals(-code).name}"
    return f"worker exited with code {code}"


def _ignore_interrupts_then_serve(*args) -> None:
    # Ctrl-C reaches every process of the terminal's group, and so does a time limit's SIGTERM
    # (`timeout` signals the driver, then its whole group): the driver handles it (stopping the
    # workers, saving what is done), so a worker must not die of it with a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(*args)


class Worker:
    """The driver's handle on one implementation's worker process on one device."""

    def __init__(self, impl: str, device: str, method: Method, warm: tuple[Config, ...] = ()):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: a library may start processes of its own (JIT compilers)
        self.process = ctx.Process(target=_ignore_interrupts_then_serve, args=(impl, device, method, child, warm),
                                   name=f"kda-bench-{impl}-{device}")
        self.process.start()
        child.close()  # so that the worker's death reads as end-of-file here
        self.hello: dict | None = None
        # On Ctrl-C the driver stops every worker while a lane may stop the same one (its row died
        # with it): one of them stops it, once (two closes of the pipe raced into EBADF).
        self._stopping = threading.Lock()
        self._stopped = False

    def _receive(self, timeout: float):
        ready = wait([self.conn, self.process.sentinel], timeout)
        if not ready:
            self.process.kill()
            self.process.join()
            raise WorkerDied(f"no answer within {timeout:g} s; worker killed")
        if self.conn in ready:
            with suppress(EOFError):
                return self.conn.recv()
        self.process.join()
        raise WorkerDied(_exit_reason(self.process.exitcode))

    def ready(self) -> None:
        """Wait for the worker's hello: it has imported its library and made its warm-up calls
        (:func:`worker.serve`). Raises :class:`WorkerDied` (again at each call) if it died first."""
        if self.hello is None:
            self.hello = self._receive(STARTUP_TIMEOUT_S)

    def measure(self, cfg: Config, copy_bw: float, timeout: float) -> dict:
        self.ready()
        try:
            self.conn.send((cfg, copy_bw))
        except OSError:
            self.process.join()
            raise WorkerDied(_exit_reason(self.process.exitcode)) from None
        return self._receive(timeout)

    def stop(self, now: bool = False) -> None:
        with self._stopping:
            if self._stopped:
                return
            self._stopped = True
            if not now:
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


def settings_of(devices: list[str], method: Method) -> dict:
    """What a sweep directory's rows depend on besides their configurations: one directory holds one."""
    return _jsonable({"device_type": torch.device(devices[0]).type,
                      "method": asdict(method) | {"version": METHOD_VERSION}})


def _differences(old, new, prefix: str = "") -> list[str]:
    """``field: old -> new`` for every leaf that differs between two settings dicts."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new))
                for d in _differences(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


class Sweep:
    """One run of the driver over ``configs`` into ``out_dir`` on ``devices``. ``exits_on_interrupt``:
    the caller ends the process when :meth:`run` is interrupted (the command line), so the interrupt
    handlers stay ignored after the first interrupt, through the exit; otherwise they are handed back
    once the run's cleanup is done."""

    def __init__(self, configs: list[Config], out_dir: Path, devices: list[str], method: Method, *,
                 command: str, preset: str, row_timeout: float = 600.0, retry_crashed: bool = False,
                 cooldown_s: float = 0.0, exits_on_interrupt: bool = False):
        self.configs, self.out_dir, self.devices, self.method = configs, Path(out_dir), devices, method
        self.command, self.preset, self.row_timeout = command, preset, row_timeout
        self.retry_crashed, self.cooldown_s = retry_crashed, cooldown_s
        self.exits_on_interrupt = exits_on_interrupt
        self.crashes: Counter[str] = Counter()
        self.impls_meta: dict[str, dict] = {}
        self.measured = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.workers: dict[tuple[str, str, int], Worker | None] = {}
        self.warm: dict[str, list[Config]] = {}  # per implementation: its extra processes' warm-up

    # -- setup
    def _check_directory(self, meta: dict, gpu_name: str) -> None:
        settings = settings_of(self.devices, self.method)
        if meta and (meta.get("settings") != settings or meta.get("gpu") != gpu_name):
            changes = _differences({"gpu": meta.get("gpu"), **meta.get("settings", {})},
                                   {"gpu": gpu_name, **settings})
            raise SystemExit(f"sweep: error: {self.out_dir} holds rows measured otherwise ({'; '.join(changes)}): "
                             f"pass another --out, or the same settings to resume")

    def _pending(self) -> list[Config]:
        done = {row["key"]: row["status"] for row in read_rows(self.out_dir)}
        return [c for c in self.configs
                if c.key() not in done or (self.retry_crashed and done[c.key()] == "crashed")]

    # -- one lane per device
    def _worker(self, impl: str, device: str, process: int) -> Worker:
        worker = self.workers.get((impl, device, process))
        if worker is None:
            worker = self.workers[(impl, device, process)] = Worker(
                impl, device, self.method.in_process(process), tuple(self.warm.get(impl, ())) if process else ())
        return worker

    def _measure(self, cfg: Config, device: str, copy_bw: float) -> dict:
        """The row of ``cfg`` from each of the method's placement processes in turn (one at a time:
        a row is timed alone on its device), merged (:func:`case.merge_rows`); the first that
        is not ok ends it."""
        with self.lock:
            if self.crashes[cfg.impl] >= MAX_CRASHES:
                return empty_row(cfg, "crashed", f"not run: {cfg.impl} crashed {MAX_CRASHES} times in this run")
        rows = []
        for process in range(self.method.placement_processes):
            rows.append(self._measure_in(cfg, device, copy_bw, process))
            if rows[-1]["status"] != "ok":
                break
        return rows[0] if len(rows) == 1 else merge_rows(rows)

    def _measure_in(self, cfg: Config, device: str, copy_bw: float, process: int) -> dict:
        worker = self._worker(cfg.impl, device, process)
        try:
            row = worker.measure(cfg, copy_bw, self.row_timeout)
        except WorkerDied as exc:
            row = empty_row(cfg, "crashed", str(exc))
        if worker.hello and "versions" in worker.hello:
            self.impls_meta[cfg.impl] = worker.hello
        if row["status"] == "crashed":
            with self.lock:
                self.crashes[cfg.impl] += 1
            worker.stop(now=True)
            self.workers[(cfg.impl, device, process)] = None
        return row

    def _lane(self, device: str, copy_bw: float, todo: GroupScheduler, bar: tqdm) -> None:
        while not self.stopping.is_set() and (group := todo.next(device)) is not None:
            for cfg in group:
                if self.stopping.is_set() or not self._measure_and_write(cfg, device, copy_bw, bar):
                    return

    def _measure_and_write(self, cfg: Config, device: str, copy_bw: float, bar: tqdm) -> bool:
        """One row measured on ``device`` and written; False where the interrupt stopped it."""
        if self.cooldown_s:
            time.sleep(self.cooldown_s)
        started, clock = datetime.now(timezone.utc), time.perf_counter()
        try:
            row = self._measure(cfg, device, copy_bw)
        except Exception:
            if self.stopping.is_set():  # its worker was stopped under it by the interrupt
                return False
            raise
        if self.stopping.is_set():  # killed by the interrupt: not a result
            return False
        write_row(self.out_dir, row | {"device": row.get("device") or device, "host": platform.node(),
                                       "started_utc": started.isoformat(timespec="milliseconds"),
                                       "row_s": round(time.perf_counter() - clock, 3)})
        with self.lock:
            self.measured += 1
            bar.set_postfix_str(cfg.key(), refresh=False)
            bar.update()
        return True

    # -- the run
    def run(self) -> pd.DataFrame:
        started = time.perf_counter()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.out_dir)
        meta = read_meta(self.out_dir)
        env = environment(torch.device(self.devices[0]), self.out_dir, self.command)
        self._check_directory(meta, env["gpu"])
        pending = self._pending()
        print(f"{len(self.configs)} rows, {len(self.configs) - len(pending)} already in {self.out_dir}, "
              f"{len(pending)} to measure on {env['gpu']} ({', '.join(self.devices)}; L2 entry state "
              f"{self.method.entry})")
        # before any worker starts, so that nothing else touches a device while it is measured; a
        # resumed directory keeps its rooflines
        by_device = meta.get("copy_bandwidth_by_device", {})
        for device in self.devices:
            by_device.setdefault(f"{platform.node()}/{device}", copy_bandwidth(device))
        copy_bws = {device: by_device[f"{platform.node()}/{device}"] for device in self.devices}
        meta |= env | {"settings": settings_of(self.devices, self.method), "copy_bandwidth_by_device": by_device,
                       "copy_bandwidth_Bps": float(np.median(list(by_device.values()))),
                       "presets": sorted(set(meta.get("presets", [])) | {self.preset})}
        write_meta(self.out_dir, meta)
        self.impls_meta = meta.get("impls", {})

        groups = compile_groups(pending)
        for group in groups:  # each group's shape at B = 1: what is compiled per shape, in little memory
            self.warm.setdefault(group[0].impl, []).append(replace(group[0], B=1))
        for impl in self.warm:
            for device in self.devices[:len(pending)]:
                for process in range(self.method.placement_processes):
                    self._worker(impl, device, process)
        # Nothing is timed until every worker has started: a worker's start creates a CUDA context
        # and makes warm-up calls, which would share the GPU with a row being timed
        for worker in list(self.workers.values()):
            with suppress(WorkerDied):  # its rows report it
                worker.ready()
        todo = GroupScheduler(groups)
        bar = tqdm(total=len(pending), unit="row", dynamic_ncols=True, smoothing=0.1)
        lanes = [threading.Thread(target=self._lane, args=(d, copy_bws[d], todo, bar), daemon=True)
                 for d in self.devices]
        held = {}  # interrupt handlers set aside while the cleanup runs
        try:
            for lane in lanes:
                lane.start()
            for lane in lanes:
                while lane.is_alive():
                    lane.join(timeout=0.2)  # a join without timeout would not see Ctrl-C
        except KeyboardInterrupt:
            self.stopping.set()
            # `timeout` sends its SIGTERM to the driver and then to the driver's process group: a
            # second interrupt must not cut the cleanup below short (on the H200 one did: no
            # results.csv, no run in meta.json), so the first one is the last heard until it is done
            if threading.current_thread() is threading.main_thread():
                held = {interrupt: signal.signal(interrupt, signal.SIG_IGN)
                        for interrupt in (signal.SIGINT, signal.SIGTERM)}
            raise
        finally:
            bar.close()
            # all at once: a library's worker can take seconds to exit (its CUDA context, its JIT's
            # threads), and stopped in turn 13 implementations x 2 GPUs would add those seconds up
            workers = list(filter(None, self.workers.values()))
            with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
                list(pool.map(lambda worker: worker.stop(now=self.stopping.is_set()), workers))
            for lane in lanes:
                lane.join(timeout=5)
            table = assemble(self.out_dir)
            self._finish_meta(meta, started)
            # a caller that exits would otherwise die of a later signal on its way out (Python hands
            # its handlers back to the system's as it shuts down, and a SIGTERM kills by default; an
            # ignored signal stays ignored)
            if not self.exits_on_interrupt:
                for interrupt, handler in held.items():
                    signal.signal(interrupt, handler)
        return table

    def _finish_meta(self, meta: dict, started: float) -> None:
        versions = {"python": platform.python_version(), "torch": torch.__version__,
                    "triton": package_version("triton")}
        for hello in self.impls_meta.values():
            versions |= hello["versions"]
        meta |= {"impls": self.impls_meta, "versions": versions,
                 "runs": meta.get("runs", []) + [{"utc": meta["utc"], "command": self.command, "git": meta["git"],
                                                  "environment": meta["environment"],
                                                  "host": meta["host"], "devices": self.devices,
                                                  "rows_measured": self.measured,
                                                  "wall_s": round(time.perf_counter() - started, 2)}]}
        write_meta(self.out_dir, meta)


def lane_summary(table: pd.DataFrame) -> str:
    """Per device: rows, the seconds its rows took, and the seconds of their first calls (the
    compilation a library leaves to them): where a sweep over several GPUs did not divide."""
    lanes = table.groupby("device").agg(rows=("key", "size"), busy=("row_s", "sum"),
                                        first=("first_call_ms", lambda ms: ms.sum() / 1e3))
    return "; ".join(f"{r.Index} {r.rows}, {r.busy:.1f} s, {r.first:.1f} s" for r in lanes.itertuples())


def summary_table(table: pd.DataFrame) -> str:
    """Median kernel time, bandwidth and share of the copy roofline per configuration (rows) and
    implementation (columns); the status where nothing was timed."""
    def cell(row) -> str:
        if row.status not in ("ok", "wrong"):
            return row.status
        gbps = f"{row.gbps:.0f}" if row.gbps >= 100 else f"{row.gbps:.2g}"
        text = f"{row.kernel_us_mean:.1f} us {gbps} GB/s {row.roofline_frac:.0%}"
        return text + (" WRONG" if row.status == "wrong" else "")

    shown = table.assign(cell=table.apply(cell, axis=1), state=table.state_dtype.map(dtypes.short))
    shown["T"] = [f"{t}" if t == 1 else f"{t} {c}" for t, c in zip(shown["T"], shown["checkpoints"])]
    pivot = shown.pivot(index=["H", "HV", "K", "V", "state", "T", "slot_pad", "pad_rows", "B"], columns="impl",
                        values="cell")
    return pivot.fillna("").to_string()


def problems_table(table: pd.DataFrame) -> str:
    """Why rows were not ok: implementation, status, reason and how many rows share them."""
    bad = table[table.status != "ok"]
    if bad.empty:
        return ""
    counts = bad.groupby(["impl", "status", "reason"], dropna=False).size().rename("rows").reset_index()
    with pd.option_context("display.max_colwidth", 140, "display.width", 250):
        return counts.to_string(index=False)


# ---- command line --------------------------------------------------------------------------------

def _shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not sep or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r} is not i/n with 0 <= i < n (e.g. 0/2 and 1/2)")
    return i, n


def _checkpoints(text: str) -> str:
    if text not in CHECKPOINTS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(CHECKPOINTS)}")
    return text


def compile_groups(configs: list[Config]) -> list[list[Config]]:
    """``configs`` in groups a lane measures together, in order of first appearance: one
    implementation's rows of one shape, state dtype and tokens per row, which differ in batch size,
    padding and pool layout. A kernel specialised on the shape is compiled once per worker, and a
    compiler without a cache on disk compiles it again in every process. (Groups alone did not
    remove the two-lane excess: FlashInfer's first calls took 113 s in all on two lanes against 69 s
    on one with rows dealt out one by one, and 102 s against 58 s in groups dealt out to whichever
    lane was free: ``git show 716b2b8:results/h200/targets-2gpu/compare-1gpu.md`` and
    ``compare-1gpu-240bc7e.md`` there. Most of a variant's first-call cost is per process, not per
    shape, hence :class:`GroupScheduler`.)"""
    groups: dict[tuple, list[Config]] = {}
    for cfg in configs:
        groups.setdefault((cfg.impl, cfg.H, cfg.HV, cfg.K, cfg.V, cfg.state_dtype, cfg.T), []).append(cfg)
    return list(groups.values())


class GroupScheduler:
    """Which compile group a free lane measures next: the next group of an implementation the lane
    has started; else, of the implementations no lane has started, the one with the most rows left
    (the longest first, so that the last ones even the lanes out); else the last group of the
    implementation with the most rows left on another lane. A library's first call in a process
    costs seconds whatever the shape (FlashInfer's CuTe DSL variants: 8.1-14.3 s each on one H200
    lane, ``git show 716b2b8:results/h200/targets-2gpu/compare-1gpu.md``), so a lane takes another lane's implementation only
    when nothing else is left. Thread-safe: lanes call :meth:`next` from their threads."""

    def __init__(self, groups: list[list[Config]]):
        self._left: dict[str, deque[list[Config]]] = {}
        for group in groups:
            self._left.setdefault(group[0].impl, deque()).append(group)
        self._lanes: dict[str, set[str]] = {}  # implementation -> the lanes that have started it
        self._lock = threading.Lock()

    def _rows_left(self, impl: str) -> int:
        return sum(len(group) for group in self._left[impl])

    def next(self, lane: str) -> list[Config] | None:
        with self._lock:
            waiting = [impl for impl, groups in self._left.items() if groups]
            own = [impl for impl in waiting if lane in self._lanes.get(impl, ())]
            if own:
                return self._left[own[0]].popleft()
            if not waiting:
                return None
            fresh = [impl for impl in waiting if impl not in self._lanes]
            impl = max(fresh or waiting, key=self._rows_left)  # max keeps the first of equals
            self._lanes.setdefault(impl, set()).add(lane)
            return self._left[impl].popleft() if fresh else self._left[impl].pop()


def _devices(text: str) -> list[str]:
    """``all`` (every visible GPU, else the CPU), ``cpu``, ``cuda`` (the current GPU) or a list
    such as ``cuda:0,cuda:1``; each one checked to exist."""
    if text == "all":
        count = torch.cuda.device_count()
        return [f"cuda:{i}" for i in range(count)] if count else ["cpu"]
    devices = []
    for name in dict.fromkeys(part.strip() for part in text.split(",")):
        try:
            device = torch.device(name)
        except RuntimeError:
            raise argparse.ArgumentTypeError(f"{name!r} is not a device (cpu, cuda, cuda:N)") from None
        if device.type == "cuda":
            count = torch.cuda.device_count()
            if not count:
                raise argparse.ArgumentTypeError(f"{name}: no CUDA GPU is visible here")
            index = torch.cuda.current_device() if device.index is None else device.index
            if index >= count:
                raise argparse.ArgumentTypeError(f"{name}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1})")
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise argparse.ArgumentTypeError(f"{name!r}: only cpu and cuda devices are measured")
        devices.append(str(device))
    if len({torch.device(d).type for d in devices}) > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one sweep measures on one kind of device (all cuda or cpu)")
    return devices


def parser() -> Parser:
    p = Parser(prog="kda-sweep", description=__doc__.split("\n\n")[0],
               epilog="Axes take comma-separated values; given with a preset they narrow it, alone they define "
                      "the grid (Kimi-Linear's layer for what is not given: B 1,16,64,256, HV 32, K 128, "
                      "H = HV, V = K). Example: kda-sweep --B 1,16,64 --HV 32,64 --state-dtype bf16,fp32")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="named grid (default: kimi-linear-48b on a GPU; smoke on the CPU, or the axes given)")
    p.add_argument("--impls", type=comma_list(str),
                   help=f"comma-separated implementations (default: every registered one: {','.join(registry.names())})")
    axes = p.add_argument_group("axes (comma-separated values)")
    for axis, kind in (("B", non_negative_int), ("H", positive_int), ("HV", positive_int), ("K", positive_int),
                       ("V", positive_int)):
        axes.add_argument(f"--{axis}", type=comma_list(kind), metavar="N,...")
    axes.add_argument("--state-dtype", type=comma_list(dtypes.full), metavar="DTYPE,...",
                      help="bf16, fp16, fp32 (or torch's names)")
    axes.add_argument("--slot-pad", type=comma_list(non_negative_int), metavar="N,...",
                      help="elements of padding after each state slot")
    axes.add_argument("--pad-rows", type=comma_list(non_negative_int), metavar="N,...", help="batch rows with slot -1")
    axes.add_argument("--T", type=comma_list(positive_int), metavar="N,...",
                      help="tokens per row (speculative verify when > 1)")
    axes.add_argument("--checkpoints", type=comma_list(_checkpoints), metavar="all,last",
                      help="with T > 1: the state stored after every token (all) or the last only")
    layout = p.add_argument_group("pool layout")
    layout.add_argument("--slots-per-row", type=positive_int, default=PoolLayout.slots_per_row, metavar="N",
                        help="timed pools hold N*B slots, the rows' drawn among them (default %(default)s)")
    layout.add_argument("--slot-order", choices=SLOT_ORDERS, default=PoolLayout.slot_order,
                        help="order the rows name their slots in (default %(default)s)")
    layout.add_argument("--placements", type=positive_int, default=PoolLayout.placements, metavar="N",
                        help="independent allocations each row is timed on (default %(default)s)")
    layout.add_argument("--extra-placements", type=non_negative_int, default=Method.extra_placements, metavar="N",
                        help="placements added on a GPU to a row whose step moves more bytes than the L2 "
                             f"holds, or whose first placements spread by more than {PLACEMENT_SPREAD_LIMIT * 100:g}%% "
                             "(max / min - 1) (default %(default)s)")
    layout.add_argument("--disjoint-placements", action=argparse.BooleanOptionalAction,
                        default=Method.disjoint_placements,
                        help="keep each placement's memory until its row ends, so that the next lands on pages "
                             "no earlier one used (the driver may hand freed pages out again; default %(default)s)")
    layout.add_argument("--settle", type=non_negative_float, default=Method.settle_s, metavar="S",
                        help="idle S seconds after handing more than 64 MiB back to the driver between "
                             "placements and rows (on the H200 a large row's first placement ran 10%% slow "
                             "right after such a release, and not 10 ms later; default %(default)s)")
    layout.add_argument("--placement-processes", type=positive_int, metavar="N",
                        help="time each row in N worker processes of its implementation, one after another, "
                             "each with its own inputs, spacers and share of the kernel budget and of the extra "
                             "placements, and pool their placements: a process's placements can sit apart from "
                             "another's as a whole; the extra processes make their first calls before the sweep "
                             "times anything (default: the preset's on a GPU, 3 for published, gva, shapes, full "
                             "and ad-hoc axes, 1 for the others; 1 on the CPU; docs/timing.md, \"Placement "
                             "processes\")")
    timing = p.add_argument_group("timing")
    timing.add_argument("--l2-entry", choices=list(ENTRY_STATES), default=DEFAULT_ENTRY,
                        help="what the L2 holds when a timed call starts (default %(default)s; docs/timing.md)")
    timing.add_argument("--min-samples", type=positive_int, metavar="N", help="kernel-time samples at least")
    timing.add_argument("--max-seconds", type=positive_float, metavar="S", help="kernel-time sampling per row at most")
    timing.add_argument("--cooldown", type=positive_float, default=0.0, metavar="S",
                        help="idle seconds before each row (lets a power-capped GPU recover)")
    timing.add_argument("--no-retime", action="store_true", help="keep rows timed while the GPU throttled as they are")
    run = p.add_argument_group("run")
    run.add_argument("--devices", type=_devices, default="all",
                     help="cpu, cuda, or a list such as cuda:0,cuda:1 (default: every visible GPU, else the CPU)")
    run.add_argument("--shard", type=_shard, metavar="I/N", help="measure every N-th configuration from the I-th "
                     "(0-based), to split one sweep over machines; join the directories with kda-merge")
    run.add_argument("--out", type=Path, help="results directory (default: ./sweeps/PRESET-DEVICE)")
    run.add_argument("--row-timeout", type=positive_float, default=600.0, metavar="S",
                     help="seconds before a silent worker is killed and its row recorded as crashed")
    run.add_argument("--retry-crashed", action="store_true", help="measure rows recorded as crashed again")
    run.add_argument("--no-charts", action="store_true", help="leave the charts to kda-plot")
    run.add_argument("--baseline", help="implementation the speedup chart divides by (default: flashinfer, else naive)")
    return p


def configs_from_args(args, devices: list[str]) -> tuple[str, list[Config]]:
    """(the run's name, its configurations) from parsed arguments."""
    layout = PoolLayout(slots_per_row=args.slots_per_row, slot_order=args.slot_order, placements=args.placements)
    given = {axis: getattr(args, axis) for axis in AXES if getattr(args, axis) is not None}
    impls = list(args.impls or registry.names())
    if args.preset is None and given:
        return "adhoc", adhoc_configs(impls, given, layout)
    name = args.preset or ("kimi-linear-48b" if torch.device(devices[0]).type == "cuda" else "smoke")
    return name, PRESETS[name].configs(impls, layout, only=given)


def method_from_args(args, preset: Preset, device_type: str) -> Method:
    """How the sweep times its rows: the preset's budgets unless the arguments narrow them, and
    the preset's placement processes on a GPU unless ``--placement-processes`` says otherwise."""
    kernel = Budget(min_samples=args.min_samples or preset.kernel.min_samples,
                    max_samples=max(preset.kernel.max_samples, args.min_samples or 0),
                    max_seconds=args.max_seconds or preset.kernel.max_seconds, rel_ci=preset.kernel.rel_ci)
    return Method(entry=args.l2_entry, kernel=kernel, call=preset.call, extra_placements=args.extra_placements,
                  disjoint_placements=args.disjoint_placements, settle_s=args.settle,
                  placement_processes=args.placement_processes or (
                      preset.placement_processes if device_type == "cuda" else Method.placement_processes),
                  retime_throttled=not args.no_retime)


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    p = parser()
    args = p.parse_args(argv)
    devices = args.devices
    unknown = [name for name in args.impls or () if name not in registry.names()]
    if unknown:
        p.error(f"unknown implementations {', '.join(unknown)}; registered: {', '.join(registry.names())}")
    name, configs = configs_from_args(args, devices)
    if not configs:
        p.error(f"the axes given leave no configuration of preset {name}")
    if args.shard:
        index, count = args.shard
        configs = configs[index::count]
    if args.baseline and args.baseline not in {c.impl for c in configs}:
        p.error(f"--baseline {args.baseline} is not among this run's implementations "
                f"({', '.join(dict.fromkeys(c.impl for c in configs))})")
    device_type = torch.device(devices[0]).type
    out_dir = args.out or Path.cwd() / "sweeps" / f"{name}-{device_type}"
    if out_dir.exists() and not out_dir.is_dir():
        p.error(f"--out {out_dir} is a file; name a directory (new, or one of an earlier run to resume it)")
    method = method_from_args(args, PRESETS.get(name, PRESETS["published"]), device_type)
    registry.interpret_triton_on(device_type)  # the workers inherit it

    sweep = Sweep(configs, out_dir, devices, method, command=shlex.join(sys.argv if argv is None else argv),
                  preset=name, row_timeout=args.row_timeout, retry_crashed=args.retry_crashed,
                  cooldown_s=args.cooldown, exits_on_interrupt=True)
    # a time limit's SIGTERM (timeout, a batch system) ends the sweep as Ctrl-C does: rows saved,
    # results.csv and meta.json written
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        table = sweep.run()
    except KeyboardInterrupt:
        print(f"\ninterrupted: {sweep.measured} rows saved in {out_dir}; run the same command again to resume",
              file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    ours = table[table.key.isin({c.key() for c in configs})]
    with pd.option_context("display.width", 250, "display.max_rows", None):
        print(f"\nmedian kernel time, bandwidth, share of the copy roofline (L2 entry state {method.entry}):")
        print(summary_table(ours))
        problems = problems_table(ours)
        if problems:
            print("\nrows not ok:\n" + problems)
    counts = Counter(ours.status)
    print(f"\nrows: {', '.join(f'{counts[s]} {s}' for s in STATUSES if counts[s])}; "
          f"wall time {time.perf_counter() - started:.1f} s; results in {out_dir}/results.csv")
    if ours.device.nunique() > 1:
        print(f"lanes (rows, seconds busy, of which first calls): {lane_summary(ours)}")
    if not args.no_charts:
        from .plots import plot_dir  # matplotlib only once the measuring is over

        charts = plot_dir(out_dir, baseline=args.baseline)
        print(f"charts: {', '.join(p.name for p in charts) or 'none (too few ok rows)'}")
    if not counts["ok"]:
        fail("kda-sweep", f"no row succeeded ({dict(counts)}); see the reasons above")


def merge_main(argv: list[str] | None = None) -> None:
    """``kda-merge OUT DIR...``: join sweep directories of one sweep's shards (same settings, same
    GPU) into OUT, which may be one of them."""
    p = Parser(prog="kda-merge", description=merge_main.__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the merged directory (created if missing)")
    p.add_argument("dirs", type=Path, nargs="+", help="sweep directories to join")
    args = p.parse_args(argv)
    metas = []
    for directory in args.dirs:
        meta = read_meta(directory)
        if not meta:
            p.error(f"{directory}: no meta.json: not a sweep directory")
        metas.append(meta)
    first = metas[0]
    for directory, meta in zip(args.dirs[1:], metas[1:]):
        if meta.get("settings") != first.get("settings") or meta.get("gpu") != first.get("gpu"):
            changes = _differences({"gpu": first.get("gpu"), **first.get("settings", {})},
                                   {"gpu": meta.get("gpu"), **meta.get("settings", {})})
            p.error(f"{directory} was measured otherwise than {args.dirs[0]} ({'; '.join(changes)})")
    rows = {}
    for directory in args.dirs:
        for row in read_rows(directory):
            if row["key"] in rows and row["status"] != "crashed" and rows[row["key"]]["status"] != "crashed":
                p.error(f"{row['key']} is in two of the directories; shards of one sweep do not overlap")
            if row["key"] not in rows or rows[row["key"]]["status"] == "crashed":
                rows[row["key"]] = row
    args.out.mkdir(parents=True, exist_ok=True)
    for row in rows.values():
        write_row(args.out, row)
    merged = dict(first)
    for meta in metas[1:]:
        merged["copy_bandwidth_by_device"] = merged.get("copy_bandwidth_by_device", {}) | meta.get(
            "copy_bandwidth_by_device", {})
        merged["impls"] = merged.get("impls", {}) | meta.get("impls", {})
        merged["versions"] = merged.get("versions", {}) | meta.get("versions", {})
        merged["presets"] = sorted(set(merged.get("presets", [])) | set(meta.get("presets", [])))
    merged["runs"] = [run for meta in metas for run in meta.get("runs", [])]
    merged["copy_bandwidth_Bps"] = float(np.median(list(merged.get("copy_bandwidth_by_device", {}).values())))
    merged["merged_from"] = [str(d) for d in args.dirs]
    write_meta(args.out, merged)
    assemble(args.out)
    print(f"{len(rows)} rows from {len(args.dirs)} directories in {args.out}")
