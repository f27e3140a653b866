"""Timers for KDA launchers and the placements they time on (the L2 entry state: :mod:`.l2`).

**Kernel time** (:func:`kernel_time`) is the GPU time of one call in a stream of calls. A pass (every
launcher of the placement's input sets, repeated until it lasts ~0.5 ms) is captured in a CUDA graph
and events bracket each replay, which is divided by its calls: events between calls would add a
dependent-launch gap of their own to each (2.2-3.0 us on the H200 against CUPTI's kernel durations,
results/h200/timing-evidence/cupti.md). The L2 state a call starts from (:data:`.l2.ENTRY_STATES`) is made by the
rotation itself, or by an op before each call, whose time is taken out by timing passes of the op
alone in the same batch. A row is timed on several *placements* (fresh allocations behind a spacer
of random size, so that the pools land on other pages); the kernel time is the mean over
placements of each one's median, their spread reported beside it.

**Call time** (:func:`call_time`) is the latency of one eager call as a serving engine makes it
(Python, argument handling, launch and kernel) from an idle GPU in the same entry state. At B=1
the two differ several-fold, and both matter.

Both make a first call (JIT compilation, autotuning) before sampling, and sample until the median's
confidence interval is narrow enough or a :class:`Budget` runs out. On the CPU the same functions
time with ``time.perf_counter`` and model no cache: that lets the harness run anywhere, not rank
implementations.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from ..inputs import DecodeInputs
from .l2 import DEFAULT_ENTRY, as_device, entry_op, l2_bytes, rotation_inputs
from .stats import median_ci, spread

Launcher = Callable[[], object]

# Bump when what the timers measure changes (entry state, placements, what a sample is, the event
# placement): the asv suite versions its benchmarks by it, and results of two versions never compare.
METHOD_VERSION = 4

# A row whose step moves more bytes than the L2 holds, or whose placements' medians spread by more than this (max /
# min - 1), gets EXTRA_PLACEMENTS more. Large steps land anywhere in a 10% range by placement, in clusters, and three
# draws can all fall in one cluster (results/h200/timing-evidence/placements.md; docs/timing.md, "Placements").
PLACEMENT_SPREAD_LIMIT = 0.02
EXTRA_PLACEMENTS = 24

# One replay (one sample) lasts about this long, so that event resolution (~0.5 us) and the gap before a replay stay
# near 1% of it; the cap bounds the capture time of the tiniest kernels (but for a replay step's whole ring cycles).
TARGET_PASS_S = 5e-4
MAX_CALLS_PER_PASS = 1000
BATCH = 8  # samples taken between checks of the stopping rule
CONFIDENCE = 0.95
# Disjoint placements keep each earlier placement's memory until the row ends, as long as this
# fraction of the device stays free after the next one (other workers and processes share it).
HOLD_HEADROOM = 0.25
SPACER_PAGES = 64  # a placement's spacer is 1..SPACER_PAGES pages of 2 MiB (the allocator's segment unit)
PAGE_BYTES = 2 << 20
# Right after the driver takes back a large allocation, the next large placement runs up to 10% slow; 10 ms of idling
# ends it (results/h200/timing-evidence/settle.md). ``settle_s`` (Method.settle_s, --settle) idles after a release of
# more than this many bytes.
SETTLE_MIN_BYTES = 64 << 20


@dataclass
class Timing:
    """Seconds per call. ``samples`` pools every placement's; ``placement_medians`` holds one
    median per placement."""

    samples: list[float]
    method: str  # "cuda-graph" | "cuda-events" | "perf_counter"
    placement_medians: list[float] | None = None  # None: one placement, these samples
    entry: str = ""  # the L2 entry state the timer made
    input_sets: int = 1  # the input sets each placement rotated over

    def __post_init__(self):
        if self.placement_medians is None:
            self.placement_medians = [float(np.median(self.samples))]

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def time(self) -> float:
        """The time a row reports: the mean over placements of each placement's median (one
        placement: its samples' median). Where a pool lands moves some kernels by up to 10%, in
        clusters (docs/timing.md, "Placements"): the median over placements then jumps from one
        cluster to another between runs, while the mean, the expected time of a pool placed at
        random, settles as placements are added."""
        return float(np.mean(self.placement_medians))

    @property
    def p25(self) -> float:
        return float(np.percentile(self.samples, 25))

    @property
    def p75(self) -> float:
        return float(np.percentile(self.samples, 75))

    @property
    def placement_min(self) -> float:
        return min(self.placement_medians)

    @property
    def placement_max(self) -> float:
        return max(self.placement_medians)

    def median_ci(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """Distribution-free confidence interval of the samples' median, from order statistics (NaN
        while there are too few samples for ``confidence``: fewer than 6 at 95%)."""
        return median_ci(self.samples, confidence)

    def converged(self, rel_ci: float) -> bool:
        """Whether the samples' median confidence interval lies within +-rel_ci of their median."""
        lo, hi = self.median_ci()
        median = float(np.median(self.samples))
        return max(median - lo, hi - median) <= rel_ci * median  # NaN: False


@dataclass(frozen=True)
class Budget:
    """When a timer stops: once the median converges (after ``min_samples``), or at ``max_samples``,
    or when ``max_seconds`` of sampling have passed, whichever comes first."""

    min_samples: int = 10
    max_samples: int = 1000
    max_seconds: float = 0.5
    rel_ci: float = 0.01

    def __post_init__(self):
        if not (1 <= self.min_samples <= self.max_samples):
            raise ValueError(f"budget: need 1 <= min_samples <= max_samples; got {self.min_samples}, "
                             f"{self.max_samples}")
        if not self.max_seconds > 0:
            raise ValueError(f"budget: max_seconds must be > 0; got {self.max_seconds}")

    def share(self, parts: int) -> "Budget":
        """This budget split evenly over ``parts`` placements."""
        return replace(self, min_samples=math.ceil(self.min_samples / parts),
                       max_samples=math.ceil(self.max_samples / parts), max_seconds=self.max_seconds / parts)


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


def _pass(calls: Sequence[Launcher], entry: Callable[[], None] | None) -> Callable[[], None]:
    """Every call of ``calls`` in turn, each after the entry op where there is one."""
    def run() -> None:
        for launch in calls:
            if entry is not None:
                entry()
            launch()

    return run


def _replayable(run: Callable[[], None]) -> tuple[Callable[[], None], str]:
    """What runs ``run``'s work: a CUDA graph's replay, or ``run`` itself when capture fails (a
    launcher that syncs, or allocates outside torch's caching allocator), which then also counts
    the launch gaps the host leaves."""
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


def _time_placement(launchers: Sequence[Launcher], device: torch.device, budget: Budget, entry: str, cycle: int = 1):
    """One placement's :class:`Timing`: each sample the mean time of the calls of one timed pass over
    ``launchers``, each called in whole ``cycle``s (:func:`_reps`).

    Where an entry op runs before each call, a sample is the pass less the median of passes of the entry op
    alone (timed in the same batch): the call's share of the GPU time in a stream of (op, call) pairs, which
    excludes the op and includes what the call costs the op after it (the write-back of its dirty lines)."""
    rotation = list(launchers)
    if device.type != "cuda":
        synced_call(rotation[0], device)
        call_s = min(timed_runs(_pass(rotation, None), 1, device)) / len(rotation)
        reps = _reps(call_s, len(rotation), cycle)
        calls = reps * len(rotation)
        run = _pass(rotation * reps, None)
        return Timing(_sample(lambda k: [t / calls for t in timed_runs(run, k, device)], call_s * calls,
                              budget), "perf_counter")

    prepare = entry_op(entry, device)
    with torch.cuda.device(device):
        run, calls, method, wall_s = timed_pass(rotation, device, prepare, cycle)
        reps = calls // len(rotation)
        if prepare is None:
            def take(k: int) -> list[float]:
                return [t / calls for t in timed_runs(run, k, device)]
        else:
            ops, _ = _replayable(_pass([lambda: None] * calls, prepare))
            ops()

            def take(k: int) -> list[float]:
                passes = timed_runs(run, k, device)
                op_only = float(np.median(timed_runs(ops, k, device)))
                return [(t - op_only) / calls for t in passes]

        return Timing(_sample(take, 2 * wall_s * reps, budget), method)


def timed_pass(launchers: Sequence[Launcher], device: torch.device, prepare: Callable[[], None] | None,
               cycle: int = 1) -> tuple[Callable[[], None], int, str, float]:
    """What one kernel-time sample replays on a GPU, built and uploaded: (the pass, its calls, how it
    runs (a CUDA graph, else eager calls between events), wall seconds of one eager pass over
    ``launchers``). The pass repeats the rotation over ``launchers`` until it lasts TARGET_PASS_S, in
    whole ``cycle``s (:func:`_reps`), each call after the entry op ``prepare`` where there is one
    (:func:`entry_op`). ``python3 -m scripts.crosscheck.cupti_crosscheck --replay`` profiles the same pass."""
    _pass(launchers, prepare)()  # every launcher once before capture (lazy workspaces, handles)
    wall_s, _ = synced_call(_pass(launchers, prepare), device)
    reps = _reps(wall_s / len(launchers), len(launchers), cycle)
    run, method = _replayable(_pass(list(launchers) * reps, prepare))
    run()  # a graph's first replay uploads it
    return run, reps * len(launchers), method, wall_s


def _reps(call_s: float, calls: int, cycle: int = 1) -> int:
    """How often to repeat ``calls`` calls of ``call_s`` each so that a pass lasts TARGET_PASS_S, in whole ``cycle``s
    (a replay row's: its ring's L, so that every sample holds each slot's flush once per L of its steps)."""
    reps = max(1, min(math.ceil(TARGET_PASS_S / max(call_s * calls, 1e-9)), MAX_CALLS_PER_PASS // calls))
    return math.ceil(reps / cycle) * cycle


def release_cache(device: torch.device, settle_s: float = 0.0) -> None:
    """Hand freed blocks back to the driver, so that the next placement's pools get other pages;
    then, where that handed back more than SETTLE_MIN_BYTES, idle ``settle_s`` seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        torch.cuda.empty_cache()
        if settle_s and before - torch.cuda.memory_reserved(device) > SETTLE_MIN_BYTES:
            time.sleep(settle_s)


def kernel_time(make: Callable[[int], DecodeInputs], bind: Callable[[DecodeInputs], Launcher], device,
                budget: Budget = Budget(), *, placements: int = 1, entry: str = DEFAULT_ENTRY, seed: int = 0,
                extra_placements: int = 0, disjoint: bool = False, settle_s: float = 0.0) -> Timing:
    """Kernel time over ``placements`` placements, ``budget`` shared among them, and
    ``extra_placements`` more, each with the same share, on a GPU where the step moves more bytes
    than the L2 holds or where the first ones' medians spread by more than PLACEMENT_SPREAD_LIMIT
    (max / min - 1).

    Placement ``p`` draws its inputs with ``make(p)`` after a spacer of random size (1 to SPACER_PAGES
    pages of 2 MiB, from ``seed``) is allocated. The allocator's cache is handed back to the driver
    before every placement, so that each pool is a fresh allocation, as a serving engine's pool is, not
    carved out of blocks the row's correctness check left cached. Where a release hands back more than
    SETTLE_MIN_BYTES, ``settle_s`` seconds of idling follow it (the first placement of our kernel's
    largest rows ran 8-10% slower after such a release, fresh allocation or not). Each placement's
    memory is freed before the next, which the driver may then hand out again; with ``disjoint`` it is
    held until the row ends (while the device has room: :data:`HOLD_HEADROOM`), so that each placement
    lands on pages no earlier one used. It rotates over the input sets :func:`rotation_plan` asks for
    (copies of the first), each bound with ``bind``, in whole ring cycles for a replay step; every call
    runs after the entry op of the state the plan makes; the first pass is a warm-up."""
    device = as_device(device)
    rng = np.random.default_rng(seed)
    share = budget.share(placements)
    measured: list[Timing] = []
    held: list[tuple] = []
    made, sets, beyond_l2 = entry, 1, False
    release_cache(device, settle_s)
    for placement in range(placements + extra_placements):
        if (placement == placements and not beyond_l2
                and spread([t.placement_medians[0] for t in measured]) <= PLACEMENT_SPREAD_LIMIT):
            break
        before = _reserved(device)
        spacer = torch.empty(int(rng.integers(1, SPACER_PAGES + 1)) * PAGE_BYTES, dtype=torch.uint8, device=device)
        first = make(placement)
        if placement == 0:
            l2 = l2_bytes(device)  # the CPU's: 0, no cache modelled
            beyond_l2 = l2 > 0 and first.nbytes() > l2
        made, input_sets = rotation_inputs(entry, first, device)  # a replay set's copy: a cache of its own
        sets, launchers = len(input_sets), [bind(x) for x in input_sets]
        cycle = first.cache.L if getattr(first, "cache", None) is not None else 1  # a replay step's ring
        measured.append(_time_placement(launchers, device, share, made, cycle))
        if disjoint and _room_for_another(device, _reserved(device) - before):
            held.append((first, launchers, spacer))
        else:
            held.clear()
        del first, input_sets, launchers, spacer
        release_cache(device, settle_s)
    if held:  # disjoint placements: hand their memory back with the row
        held.clear()
        release_cache(device, settle_s)
    return Timing([s for t in measured for s in t.samples], measured[0].method,
                  [t.placement_medians[0] for t in measured], entry=made, input_sets=sets)


def _reserved(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def _room_for_another(device: torch.device, placement_bytes: int) -> bool:
    """Whether a placement of ``placement_bytes`` more still leaves HOLD_HEADROOM of the device free."""
    if device.type != "cuda":
        return False  # the CPU's timings model no placement
    free, total = torch.cuda.mem_get_info(device)
    return free - placement_bytes > HOLD_HEADROOM * total


def call_time(launcher: Launcher, device, budget: Budget = Budget(max_seconds=0.2), *,
              entry: str = DEFAULT_ENTRY) -> Timing:
    """Latency of one eager call of ``launcher`` as a serving engine sees it, first call excluded.

    Each sample starts from an idle GPU (as between decode steps) whose L2 is in the state
    ``entry`` makes (the dirty write where the state comes from a rotation: one call has none);
    events bracket the call, so the sample is the host's work until the kernel is queued plus the
    kernel, without the final synchronization.
    """
    device = as_device(device)
    first_s, _ = synced_call(launcher, device)
    if device.type != "cuda":
        return Timing(_sample(lambda k: timed_runs(launcher, k, device), first_s, budget), "perf_counter")

    prepare = entry_op("dirty" if entry == "previous-step" else entry, device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def take(k: int) -> list[float]:
        samples = []
        for _ in range(k):
            if prepare is not None:
                prepare()
            torch.cuda.synchronize(device)
            start.record()
            launcher()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return samples

    with torch.cuda.device(device):
        return Timing(_sample(take, first_s, budget), "cuda-events")
