"""The process that measures one implementation's rows for the sweep driver (kda_impls.bench.sweep).

Kept apart from the driver so that a worker imports only what measuring needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from .. import registry
from .measure import measure
from .timing import Budget, as_device

@dataclass(frozen=True)
class Settings:
    """What a measurement depends on besides its configuration; one sweep directory holds one."""

    device: str
    l2_cold: bool
    kernel: Budget
    call: Budget
    seed: int = 0
    pool_slots_per_row: int = 1  # timed pools hold this many slots per batch row
    sorted_slots: bool = False  # rows name their slots in ascending order, not at random


def _cuda_context_lost(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        torch.ones(1, device=device).item()
    except RuntimeError:  # e.g. after an illegal memory access every CUDA call fails
        return True
    return False


def serve(impl: str, settings: Settings, conn: Connection) -> None:
    """A worker's life: say hello (the implementation's versions, or why it does not import), then
    measure each (config, copy bandwidth) the driver sends until it sends None. A row that leaves
    the CUDA context unusable is reported ``crashed`` and ends the worker."""
    device = as_device(settings.device)
    if device.type == "cpu":
        # More threads than idle cores spin against each other in OpenMP barriers (40 ms per small
        # matmul on a busy 2-core machine); CPU timings only smoke-test the harness anyway.
        torch.set_num_threads(1)
    try:
        implementation = registry.get(impl)
        hello = {"versions": implementation.versions(), "supports": implementation.capabilities.describe()}
    except Exception as exc:  # measure() reports it again on each row
        hello = {"error": f"{type(exc).__name__}: {exc}"}
    torch.empty(0, device=device)  # create the CUDA context now, while another worker measures
    conn.send(hello)
    while (request := conn.recv()) is not None:
        cfg, copy_bw = request
        row = measure(cfg, device, l2_cold=settings.l2_cold, pool_slots_per_row=settings.pool_slots_per_row,
                      sorted_slots=settings.sorted_slots, copy_bw=copy_bw, kernel_budget=settings.kernel,
                      call_budget=settings.call, seed=settings.seed)
        lost = row["status"] == "error" and _cuda_context_lost(device)
        if lost:
            row |= {"status": "crashed", "reason": f"CUDA context lost: {row['reason']}"}
        conn.send(row)
        if lost:
            return
