"""The process that measures one implementation's rows on one device for the sweep driver
(kda_impls.bench.driver).

Kept apart from the driver so that a worker imports only what measuring needs.
"""

from __future__ import annotations

import signal
from contextlib import suppress
from multiprocessing.connection import Connection

import torch

from .. import registry
from . import fingerprint
from .case import Method, run_case
from .config import Config
from .l2 import as_device
from .timing import release_cache

# A worker started by "spawn" runs the caller's main script again; one whose sweep call is not under
# `if __name__ == "__main__":` would start a sweep of its own there. It exits with this status instead.
UNGUARDED_EXIT = 87
GUARD_ADVICE = 'put the call under `if __name__ == "__main__":` in the script'
UNGUARDED = f"kda_impls.sweep ran again in a worker process, which imports the calling script anew: {GUARD_ADVICE}"


def _cuda_context_lost(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        torch.ones(1, device=device).item()
    except RuntimeError:  # e.g. after an illegal memory access every CUDA call fails
        return True
    return False


def describe(impl: str) -> dict:
    """What a worker says first: the implementation's versions and what it supports (or why it
    does not import)."""
    try:
        implementation = registry.get(impl)
    except Exception as exc:  # run_case reports it again on each row
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"versions": implementation.versions(), "supports": implementation.capabilities.describe()}


def current_versions(impl: str) -> dict:
    """The implementation's library versions here, or the error that keeps it from importing."""
    try:
        return registry.get(impl).versions()
    except Exception as exc:  # its rows say why
        return {"error": type(exc).__name__}


def serve(impl: str, device: str, method: Method, conn: Connection, warm: tuple[Config, ...] = ()) -> None:
    """A worker's life: import its library, make the first call of each configuration in ``warm``,
    say hello (:func:`describe`), then measure each (config, copy bandwidth) the driver sends until
    it sends None. A row that leaves the CUDA context unusable is reported ``crashed`` and ends the
    worker.

    ``warm`` is for a row's second and later placement processes (``Method.placement_processes``):
    the driver waits for every worker's hello before it times anything, so their first calls
    (a library's initialisation, FlashInfer's CuTe DSL compilation: seconds each, in every process)
    run side by side before the sweep instead of one after another inside it. The first process
    makes its own first calls in its rows, which time them (``first_call_ms``)."""
    device = as_device(device)
    if device.type == "cpu":
        # More threads than idle cores spin against each other in OpenMP barriers (40 ms per small
        # matmul on a busy 2-core machine); CPU timings only smoke-test the harness anyway.
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(device)  # libraries that launch on "the current device" use this one
    hello = describe(impl)
    torch.empty(0, device=device)  # create the CUDA context now, before the driver times anything
    with suppress(Exception):  # the row reports it (a library that does not import, say)
        registry.get(impl).preload()
    for cfg in warm:
        run_case(cfg, device)  # a failure is caught there; the row reports it when it is timed
    release_cache(device)  # what the warm-ups left cached, for the rows the other processes time
    conn.send(hello)
    while (request := conn.recv()) is not None:
        cfg, copy_bw = request
        row = run_case(cfg, device, method, copy_bw=copy_bw) | {"device": str(device)}
        measured_by = fingerprint.record(registry.implementations()[impl], current_versions(impl))
        row |= {"fingerprint": fingerprint.digest(measured_by), "measured_by": measured_by}
        if row["status"] == "error" and _cuda_context_lost(device):
            conn.send(row | {"status": "crashed", "reason": f"CUDA context lost: {row['reason']}"})
            return
        # what a row leaves cached, times 39 idle workers, filled the H200; handed back as between
        # placements (idling where the method settles)
        release_cache(device, method.settle_s)
        conn.send(row)


def serve_ignoring_interrupts(*args) -> None:
    """The worker process's target: :func:`serve` with SIGINT and SIGTERM ignored."""
    # Ctrl-C reaches every process of the terminal's group, and so does a time limit's SIGTERM
    # (`timeout` signals the driver, then its whole group): the driver handles it (stopping the
    # workers, saving what is done), so a worker must not die of it with a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(*args)
