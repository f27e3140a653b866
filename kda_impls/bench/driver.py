"""The sweep's driver: configurations measured in isolated worker processes on one or several devices,
resumable, each row recorded with what measured it.

Each device is a *lane* that measures one row at a time, so each row is timed alone on its GPU.
Rows go to lanes in compile groups (:mod:`.schedule`), so that what an implementation compiles in its
own process (FlashInfer's CuTe DSL kernels) is compiled on one lane, not on each. In a lane each
implementation gets a worker process (multiprocessing "spawn": a fresh interpreter, no CUDA state
inherited) that handles all its rows there, so imports, the CUDA context and JIT caches are paid
once; on a GPU a thorough preset times each row in three such processes in turn
(``Method.placement_processes``), and every worker has started before the first row is timed. A
worker that dies (a segfault, an illegal memory access, which poisons the CUDA context, a row past
the timeout) makes its row ``crashed``; the next row gets a fresh worker. Each finished row is a file
in ``DIR/rows/`` that names the commit and what measured it (:mod:`.fingerprint`: the code the
worker loaded, the kernel settings, the library versions): a later run of the same settings keeps
the ok rows that the code and settings of now would measure the same way, and measures the others
again, saying why.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import platform
import signal
import threading
import time
from collections import Counter
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

from ..cli import UsageError
from ..contract import package_version
from .case import Method, empty_row, merge_rows, refused_on, refused_row
from .config import Config
from .lock import Lock
from .results import (
    assemble,
    device_info,
    environment,
    read_meta,
    read_rows,
    remove_stale_temporaries,
    write_meta,
    write_row,
)
from .resume import Plan, plan
from .roofline import copy_bandwidth
from .schedule import GroupScheduler, compile_groups
from .timing import METHOD_VERSION
from .worker import UNGUARDED, UNGUARDED_EXIT, current_versions, serve_ignoring_interrupts

MAX_CRASHES = 3  # per implementation and run; its remaining rows are then recorded, not run
STARTUP_TIMEOUT_S = 600.0
INTERRUPTED = 130


class WorkerDied(Exception):
    pass


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"worker killed by {signal.Signals(-code).name}"
    return f"worker exited with code {code}"


class Worker:
    """The driver's handle on one implementation's worker process on one device."""

    def __init__(self, impl: str, device: str, method: Method, warm: tuple[Config, ...] = ()):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: a library may start processes of its own (JIT compilers)
        self.process = ctx.Process(target=serve_ignoring_interrupts, args=(impl, device, method, child, warm),
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
        if self.process.exitcode == UNGUARDED_EXIT:
            raise UsageError(UNGUARDED)
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

def settings_of(devices: list[str], method: Method) -> dict:
    """What a sweep directory's rows depend on besides their configurations: one directory holds one."""
    settings = {"device_type": torch.device(devices[0]).type, "method": asdict(method) | {"version": METHOD_VERSION}}
    return json.loads(json.dumps(settings))  # as read back from meta.json (tuples as lists)


def differences(old, new, prefix: str = "") -> list[str]:
    """``field: old -> new`` for every leaf that differs between two settings dicts."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new))
                for d in differences(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


class Sweep:
    """One run of the driver over ``configs`` into ``out_dir`` on ``devices``. A row already in the
    directory is kept when it is ok and :func:`fingerprint.changes` finds nothing changed, unless ``fresh``.
    ``exits_on_interrupt``: the caller ends the process when :meth:`run` is interrupted (the command
    line), so the interrupt handlers stay ignored after the first interrupt, through the exit;
    otherwise they are handed back once the run's cleanup is done."""

    def __init__(self, configs: list[Config], out_dir: Path, devices: list[str], method: Method, *,
                 command: str, preset: str, row_timeout: float = 600.0, fresh: bool = False,
                 cooldown_s: float = 0.0, exits_on_interrupt: bool = False):
        self.configs, self.out_dir, self.devices, self.method = configs, Path(out_dir), devices, method
        self.command, self.preset, self.row_timeout = command, preset, row_timeout
        self.fresh, self.cooldown_s = fresh, cooldown_s
        self.exits_on_interrupt = exits_on_interrupt
        self.crashes: Counter[str] = Counter()
        self.impls_meta: dict[str, dict] = {}
        self.versions = {impl: current_versions(impl) for impl in dict.fromkeys(c.impl for c in configs)}
        self.provenance: dict = {}  # what each row records of the code that measured it
        self.measured = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.workers: dict[tuple[str, str, int], Worker | None] = {}
        self.warm: dict[str, list[Config]] = {}  # per implementation: its extra processes' warm-up

    # -- setup
    def check_directory(self, meta: dict, gpu_name: str) -> None:
        """Raise :class:`UsageError` where the directory's rows were measured with other settings."""
        settings = settings_of(self.devices, self.method)
        if meta and (meta.get("settings") != settings or meta.get("gpu") != gpu_name):
            changes = differences({"gpu": meta.get("gpu"), **meta.get("settings", {})}, {"gpu": gpu_name, **settings})
            raise UsageError(f"{self.out_dir} holds rows measured otherwise ({'; '.join(changes)}): "
                             f"pass another --out, or the same settings to resume")

    def check_resumable(self) -> None:
        """:meth:`check_directory` on what is in ``out_dir`` now (before a run takes the lock); writes nothing."""
        self.check_directory(read_meta(self.out_dir), device_info(torch.device(self.devices[0]))["name"])

    def plan(self) -> Plan:
        """What :meth:`run` would measure; reads the directory, writes nothing."""
        rows = {row["key"]: row for row in read_rows(self.out_dir)} if self.out_dir.is_dir() else {}
        return plan(self.configs, rows, self.versions, fresh=self.fresh)

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
        if cfg.impl in self.refused:
            return refused_row(cfg, self.refused[cfg.impl])
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
        write_row(self.out_dir, row | self.provenance | {"device": row.get("device") or device, "host": platform.node(),
                                                         "started_utc": started.isoformat(timespec="milliseconds"),
                                                         "row_s": round(time.perf_counter() - clock, 3)})
        with self.lock:
            self.measured += 1
            bar.set_postfix_str(cfg.key(), refresh=False)
            bar.update()
        return True

    # -- the run
    def run(self) -> pd.DataFrame:
        """Measure what :meth:`plan` finds to measure, holding the directory's lock; the directory's table."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with Lock(self.out_dir):
            try:
                return self._run()
            except UsageError:  # a worker's start said the caller's script lacks its __main__ guard
                for worker in filter(None, self.workers.values()):
                    worker.stop(now=True)
                raise

    def _run(self) -> pd.DataFrame:
        started = time.perf_counter()
        remove_stale_temporaries(self.out_dir)
        meta = read_meta(self.out_dir)
        env = environment(torch.device(self.devices[0]), self.out_dir, self.command)
        self.check_directory(meta, env["gpu"])
        self.provenance = {"commit": env["git"]["sha"], "dirty": env["git"]["dirty"]}
        plan = self.plan()
        pending = plan.pending
        print(f"{len(self.configs)} rows in {self.out_dir}: {plan.describe()}, on {env['gpu']} "
              f"({', '.join(self.devices)}; L2 entry state {self.method.entry}){plan.why_again()}")
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

        # what cannot run on these devices whatever its inputs (a package missing) starts no worker
        self.refused = {impl: reason for impl in self.versions if (reason := refused_on(impl, self.devices[0]))}
        groups = compile_groups(pending)
        for group in groups:  # each group's shape at B = 1: what is compiled per shape, in little memory
            self.warm.setdefault(group[0].impl, []).append(replace(group[0], B=1))
        for impl in set(self.warm) - set(self.refused):
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
            # `timeout` signals the driver and then its process group: the first interrupt is the last
            # heard until the cleanup below is done, so that results.csv and meta.json are written
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
