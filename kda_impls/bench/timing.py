"""Timers for KDA launchers, and the input sets they time.

:func:`kernel_time` is the per-call GPU time of a launcher: a pass (every launcher of an L2-cold
rotation, repeated until it lasts ~0.3 ms) is captured in a CUDA graph, events bracket each replay
and the time is divided by the calls in it. :func:`call_time` is the latency of one eager call as a
serving engine makes it (Python, argument handling, launch and kernel, from an idle GPU with the L2
flushed). At B=1 the two differ several-fold on the H200 (`kernel_us_median` and `call_us_median` in
results/h200/kimi-linear-48b/results.csv), and both matter. Both make a first call (JIT compilation,
autotuning) before sampling, and sample until the median's confidence interval is narrow enough or a
:class:`Budget` runs out.

On the CPU the same functions time with ``time.perf_counter`` and model no cache: that lets the
harness run anywhere, not rank implementations.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from scipy import stats

from ..contract import Implementation
from ..inputs import DecodeInputs
from .config import Config

Launcher = Callable[[], object]

# One timed pass (one sample) lasts about this long, so event resolution (~0.5 us) and the gap before
# a graph replay stay near 1% of it; the cap bounds the capture time of the tiniest kernels.
TARGET_PASS_S = 3e-4
MAX_CALLS_PER_PASS = 1000
COLD_FACTOR = 3  # input sets rotate until their bytes are this many times the L2
MIN_INPUT_SETS = 2  # see rotation_inputs
BATCH = 8  # samples taken between checks of the stopping rule
CONFIDENCE = 0.95


@dataclass
class Timing:
    samples: list[float]  # seconds per call
    method: str  # "cuda-graph" | "cuda-events" | "perf_counter"

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def p25(self) -> float:
        return float(np.percentile(self.samples, 25))

    @property
    def p75(self) -> float:
        return float(np.percentile(self.samples, 75))

    def median_ci(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """Distribution-free confidence interval of the median, from order statistics (NaN while
        there are too few samples for ``confidence``: fewer than 6 at 95%)."""
        ci = stats.quantile_test(self.samples, p=0.5).confidence_interval(confidence)
        return float(ci.low), float(ci.high)

    def converged(self, rel_ci: float) -> bool:
        """Whether the median's confidence interval lies within +-rel_ci of the median."""
        lo, hi = self.median_ci()
        return max(self.median - lo, hi - self.median) <= rel_ci * self.median  # NaN: False


@dataclass(frozen=True)
class Budget:
    """When a timer stops: once the median converges (after ``min_samples``), or at ``max_samples``,
    or when ``max_seconds`` of sampling have passed, whichever comes first."""

    min_samples: int = 10
    max_samples: int = 1000
    max_seconds: float = 0.5
    rel_ci: float = 0.01


def as_device(device) -> torch.device:
    """``device`` with the CUDA index made explicit (caches keyed by device need one spelling)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def l2_bytes(device) -> int:
    """The GPU's L2 size in bytes; 0 on the CPU, whose caches these timers do not model."""
    device = as_device(device)
    return torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0


@functools.cache
def _flush_buffer(device: torch.device) -> torch.Tensor:
    return torch.empty(2 * l2_bytes(device), dtype=torch.uint8, device=device)


def flush_l2(device) -> None:
    """Evict the L2 by writing a buffer twice its size, queued on the current stream (no-op on CPU)."""
    device = as_device(device)
    if device.type == "cuda":
        _flush_buffer(device).zero_()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synced_call(launch: Launcher, device) -> tuple[float, object]:
    """(wall seconds, result) of one call, from an idle device until it is idle again."""
    device = as_device(device)
    _sync(device)
    start = time.perf_counter()
    result = launch()
    _sync(device)
    return time.perf_counter() - start, result


def timed_runs(run: Callable[[], object], k: int, device) -> list[float]:
    """Seconds of each of ``k`` back-to-back calls of ``run``: from CUDA events recorded between them
    on the current stream, with one synchronization at the end; perf_counter on the CPU."""
    device = as_device(device)
    if device.type != "cuda":
        stamps = [time.perf_counter()]
        for _ in range(k):
            run()
            stamps.append(time.perf_counter())
        return np.diff(stamps).tolist()
    with torch.cuda.device(device):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(k + 1)]
        events[0].record()
        for event in events[1:]:
            run()
            event.record()
        events[-1].synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in itertools.pairwise(events)]


def _sample(take: Callable[[int], list[float]], sample_s: float, budget: Budget) -> list[float]:
    """Call ``take(k)`` (k new samples) until ``budget`` says stop. ``sample_s`` estimates the wall
    time of one sample, so that a batch does not overrun ``max_seconds``."""
    samples: list[float] = []
    deadline = time.perf_counter() + budget.max_seconds
    while True:
        left = deadline - time.perf_counter()
        k = max(1, min(BATCH, budget.max_samples - len(samples), int(left / max(sample_s, 1e-9))))
        start = time.perf_counter()
        samples += take(k)
        sample_s = (time.perf_counter() - start) / k
        if len(samples) >= budget.max_samples or time.perf_counter() >= deadline:
            return samples
        if len(samples) >= budget.min_samples and Timing(samples, "").converged(budget.rel_ci):
            return samples


def _pass(rotation: Sequence[Launcher], reps: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(reps):
            for launch in rotation:
                launch()

    return run


def _gpu_pass(rotation: Sequence[Launcher], reps: int) -> tuple[Callable[[], None], str]:
    """What runs one pass on the current stream, and how: a CUDA graph's replay, or the pass itself
    when capture fails (a launcher that syncs, or allocates outside torch's caching allocator)."""
    run = _pass(rotation, reps)
    graph = torch.cuda.CUDAGraph()
    # Capture needs a side stream; entering it here restores the current stream even when a
    # failed capture skips torch.cuda.graph's own restore (its exit raises first).
    side = torch.cuda.Stream()
    try:
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            run()
        return graph.replay, "cuda-graph"
    except Exception:  # whatever the library raised: a launcher that really fails, fails eagerly too
        torch.cuda.synchronize()
    return run, "cuda-events"


def _reps(call_s: float, calls: int) -> int:
    """How often to repeat ``calls`` calls of ``call_s`` each so that a pass lasts TARGET_PASS_S."""
    return max(1, min(math.ceil(TARGET_PASS_S / max(call_s * calls, 1e-9)), MAX_CALLS_PER_PASS // calls))


def kernel_time(launchers: Sequence[Launcher], device, budget: Budget = Budget()) -> Timing:
    """Per-call kernel time of ``launchers`` (from :func:`bind_rotation`), first call excluded.

    Every launcher runs in turn, each bound to its own inputs: over an L2-cold rotation each call
    finds the L2 holding the others' data; one launcher is timed L2-hot. On a GPU a pass is captured
    in a CUDA graph and each replay timed with events ("cuda-graph"); if capture fails, the pass runs
    eagerly between events ("cuda-events", which then also counts the launch gaps of kernels shorter
    than their launch).
    """
    device = as_device(device)
    rotation = list(launchers)
    if device.type != "cuda":
        synced_call(rotation[0], device)
        call_s = min(timed_runs(_pass(rotation, 1), 1, device)) / len(rotation)
        reps = _reps(call_s, len(rotation))
        run, calls = _pass(rotation, reps), reps * len(rotation)
        samples = _sample(lambda k: [t / calls for t in timed_runs(run, k, device)], call_s * calls, budget)
        return Timing(samples, "perf_counter")

    with torch.cuda.device(device):
        synced_call(rotation[0], device)
        _pass(rotation, 1)()  # warm every launcher before capture (lazy workspaces, handles)
        run, method = _gpu_pass(rotation, 1)
        run()  # a graph's first replay uploads it
        call_s = float(np.median(timed_runs(run, 3, device))) / len(rotation)
        reps = _reps(call_s, len(rotation))
        if reps > 1:
            run, method = _gpu_pass(rotation, reps) if method == "cuda-graph" else (_pass(rotation, reps), method)
            run()
        calls = reps * len(rotation)
        samples = _sample(lambda k: [t / calls for t in timed_runs(run, k, device)], call_s * calls, budget)
    return Timing(samples, method)


def call_time(launcher: Launcher, device, budget: Budget = Budget(max_seconds=0.2), *, l2_cold: bool = True
              ) -> Timing:
    """Latency of one eager call of ``launcher`` as a serving engine sees it, first call excluded.

    Each sample starts from an idle GPU (as between decode steps) with the L2 flushed (``l2_cold``):
    events bracket the call, so the sample is the host's work until the kernel is queued plus the
    kernel, without the final synchronization.
    """
    device = as_device(device)
    first_s, _ = synced_call(launcher, device)
    if device.type != "cuda":
        return Timing(_sample(lambda k: timed_runs(launcher, k, device), first_s, budget), "perf_counter")

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def take(k: int) -> list[float]:
        samples = []
        for _ in range(k):
            if l2_cold:
                flush_l2(device)
            torch.cuda.synchronize(device)
            start.record()
            launcher()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return samples

    with torch.cuda.device(device):
        return Timing(_sample(take, first_s, budget), "cuda-events")


def working_set_bytes(inputs: DecodeInputs) -> int:
    """Bytes of the pool's whole span (slots and the padding between them) and every other input."""
    return inputs.pool_span().nbytes + inputs.bytes_besides_pool()


def rotation_inputs(cfg: Config, device, *, l2_cold: bool = True, seed: int = 0,
                    pool_slots_per_row: int = 1, sorted_slots: bool = False) -> list[DecodeInputs]:
    """Independent input sets of ``cfg`` whose pools and inputs add up to >= 3x the L2, and at least
    two, so that cycling them is L2-cold; one set when ``l2_cold`` is False, and on the CPU. Each
    pool has ``pool_slots_per_row * B`` slots, the rows' slots drawn at random among them: with the
    default 1 every slot is live (the least memory, the same bytes moved); a serving pool holds
    more slots than the batch, and whether that changes the timing is what the option measures.
    The rows name their slots in random order, or ascending with ``sorted_slots`` (a fresh pool's
    order, and the simplest benchmark's ``arange``).

    At least two because consecutive calls in a model update different layers' pools, never one
    pool twice in a row; on the H200 a single pool updated back to back cost fp32 Triton 9% at
    B >= 256 against alternating ones (docs/perf-notes.md).
    """
    device = as_device(device)
    first = cfg.make_inputs(device, seed, n_slots=pool_slots_per_row * cfg.B, sorted_slots=sorted_slots)
    l2 = l2_bytes(device) if l2_cold else 0
    copies = max(MIN_INPUT_SETS, math.ceil(COLD_FACTOR * l2 / working_set_bytes(first))) if l2 else 1
    return [first] + [first.clone() for _ in range(copies - 1)]


def bind_rotation(impl: Implementation, cfg: Config, device, **rotation) -> list[Launcher]:
    """``impl``'s launchers over :func:`rotation_inputs` (``rotation``: its keyword arguments).
    Binding validates and allocates (raising ContractError or Unsupported); the launchers only launch."""
    return [impl.bind(inputs) for inputs in rotation_inputs(cfg, device, **rotation)]
