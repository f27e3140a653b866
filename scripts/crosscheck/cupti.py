"""A second clock: per-launch kernel durations from CUPTI (through ``torch.profiler``), to check the
harness's event timings against, and to see what a kernel does inside a sequence of other kernels.

:func:`step_durations` runs ``calls`` steps eagerly, each after an optional op that runs first (an
L2 entry op, or the projection GEMV of a decode layer), under the profiler, and reads back the GPU
kernels of each step from the profiler's trace: their summed durations (the GPU busy with the step)
and their span (first start to last end, which also counts the gaps between a step's kernels).
The caller says how many kernels the op launches (:func:`kernels_of`). Where an op runs before
each step, the step also changes what the op after it costs (it writes back the lines the step left
dirty): :func:`op_busy` times the op after itself, to compare. :func:`replay_durations` profiles
instead the very pass the harness times (a CUDA graph of back-to-back calls), which tells a kernel
that runs slower back to back from the gap between kernels that the harness's clock also counts.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from kda_impls.bench.timing import timed_pass

Launcher = Callable[[], object]


def kernel_trace(run: Callable[[], None], device: torch.device) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of every GPU kernel ``run`` launches, in start order."""
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    kernels = [(float(e["ts"]), float(e["dur"]), e.get("name", "")) for e in events
               if e.get("cat") == "kernel" and "dur" in e]
    return sorted(kernels)


def kernels_of(run: Callable[[], None], device) -> int:
    """How many GPU kernels one call of ``run`` launches (after a warm-up call)."""
    device = torch.device(device)
    with torch.cuda.device(device):
        run()
        return len(kernel_trace(run, device))


def step_durations(launchers: Sequence[Launcher], device, calls: int = 40,
                   before: Callable[[], None] | None = None, before_kernels: int = 0) -> dict:
    """Median (and all) per-step GPU time of ``calls`` eager steps cycling over ``launchers``, each
    after ``before`` (which launches ``before_kernels`` kernels: :func:`kernels_of`): ``busy_us``
    sums the step's kernel durations, ``span_us`` runs from its first kernel's start to its last
    kernel's end, ``kernel_us`` is each of the step's kernels' median duration in launch order
    (``names`` the same kernels' names, sorted). Raises RuntimeError when the trace does not split
    into equal steps."""
    device = torch.device(device)

    def run() -> None:
        for i in range(calls):
            if before is not None:
                before()
            launchers[i % len(launchers)]()

    with torch.cuda.device(device):
        for launch in launchers:  # warm: compilation, autotuning, lazy workspaces
            launch()
        kernels = kernel_trace(run, device)
    per_call, rest = divmod(len(kernels), calls)
    per_step = per_call - before_kernels
    if rest or per_step < 1:
        raise RuntimeError(f"{len(kernels)} kernels in the trace of {calls} steps, each after {before_kernels} "
                           f"kernels of the op before it: the steps do not launch equally many")
    steps = [kernels[i * per_call + before_kernels:(i + 1) * per_call] for i in range(calls)]
    busy, span, before_busy = [], [], []
    for i, step in enumerate(steps):
        busy.append(sum(d for _, d, _ in step))
        # Starts subtracted first: they are large absolute times, and (start + d) - start need not
        # equal d in floating point (a one-kernel step's span came out 16 ps short of its busy time).
        span.append(step[-1][0] - step[0][0] + step[-1][1])
        if i:  # the op after a step (the first one follows nothing measured)
            before_busy.append(sum(d for _, d, _ in kernels[i * per_call:i * per_call + before_kernels]))
    kernel_us = [(steps[0][j][2], float(np.median([step[j][1] for step in steps]))) for j in range(per_step)]
    return {"busy_us": float(np.median(busy)), "span_us": float(np.median(span)), "kernels": per_step,
            "kernel_us": kernel_us,
            "names": sorted({name for _, _, name in kernels[before_kernels:per_call]}), "busy_samples_us": busy,
            "before_busy_us": float(np.median(before_busy)) if before_kernels else 0.0}


def replay_durations(launchers: Sequence[Launcher], device, before: Callable[[], None] | None = None,
                     before_kernels: int = 0, replays: int = 5) -> dict:
    """The harness's own timed pass (:func:`timing.timed_pass`: the rotation over ``launchers``
    repeated, each call after ``before``, captured in a CUDA graph) replayed ``replays`` times under
    the profiler: ``busy_us`` is the median summed duration of one step's kernels inside the replay,
    ``period_us`` the median over replays of (last kernel end - first kernel start) / calls, what
    the harness's events measure per call less the replay's launch (with ``before``, it includes the
    op). ``method`` says whether the pass was a graph."""
    device = torch.device(device)
    with torch.cuda.device(device):
        run, calls, method, _ = timed_pass(list(launchers), device, before)
        kernels = kernel_trace(lambda: [run() for _ in range(replays)], device)
    per_call, rest = divmod(len(kernels), calls * replays)
    per_step = per_call - before_kernels
    if rest or per_step < 1:
        raise RuntimeError(f"{len(kernels)} kernels in the trace of {replays} replays of {calls} calls, each after "
                           f"{before_kernels} kernels of the op before it: the calls do not launch equally many")
    busy, period = [], []
    for r in range(replays):
        replay = kernels[r * calls * per_call:(r + 1) * calls * per_call]
        period.append((replay[-1][0] - replay[0][0] + replay[-1][1]) / calls)
        busy += [sum(d for _, d, _ in replay[i * per_call + before_kernels:(i + 1) * per_call]) for i in range(calls)]
    return {"busy_us": float(np.median(busy)), "period_us": float(np.median(period)), "calls": calls,
            "method": method}


def op_busy(op: Callable[[], None], device, calls: int = 40) -> float:
    """Median GPU time of ``op`` run back to back with itself (CUPTI): what it costs when nothing
    but itself ran before it."""
    device = torch.device(device)
    with torch.cuda.device(device):
        op()
        kernels = kernel_trace(lambda: [op() for _ in range(calls)], device)
    per_op = len(kernels) // calls
    return float(np.median([sum(d for _, d, _ in kernels[i * per_op:(i + 1) * per_op]) for i in range(1, calls)]))
