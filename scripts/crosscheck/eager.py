"""The GPU time of one eager call between CUDA events, as nvbench's cold measurement times a launch less its
L2 flush (:func:`held_call_time`): beside the harness's kernel time (a CUDA graph's replay of back-to-back
calls) it measures, per row, what one launch between events costs that the replay hides (the gaps before,
between and after a call's kernels).

nvbench holds its stream with a blocking kernel while the host enqueues a start event, the launch and an end
event, so the host's Python stays out of the time; here a spin kernel (``torch.cuda._sleep``) holds the
stream instead, and a sample whose enqueue outlasted the hold is dropped and the hold doubled, so that no
sample counts the host. The stopping rule and :class:`.timing.Timing` are the harness's.
"""

from __future__ import annotations

import functools
import time

import torch

from kda_impls.bench.l2 import as_device, entry_op, rotation_inputs
from kda_impls.bench.timing import Budget, Launcher, Timing, _sample, synced_call, timed_runs

HOLD_MIN_S = 50e-6  # the shortest hold: several times a Python launch's enqueue
HOLD_MAX_S = 0.1  # a hold this long that the host still outlasts: something else is wrong


@functools.cache
def _cycles_per_s(device: torch.device) -> float:
    """The spin kernel's clock rate: its cycles over its event-timed duration (the second of two spins)."""
    cycles = 1 << 20
    with torch.cuda.device(device):
        for _ in range(2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def held_call_time(inputs, launcher: Launcher, bind, device, budget: Budget, entry: str) -> Timing:
    """Seconds per call of one eager call of ``launcher`` (bound to ``inputs``) per sample, between CUDA
    events enqueued while the stream is held. The L2 entry state is made as the harness makes ``entry``:
    samples rotate over the rotation's input sets (the others copies of ``inputs`` bound by ``bind``), or
    the entry op runs before the hold; the GPU is idle between samples, as between nvbench's. On the CPU:
    perf_counter around one call (no cache modelled)."""
    device = as_device(device)
    made, input_sets = rotation_inputs(entry, inputs, device)
    launchers = [launcher, *(bind(x) for x in input_sets[1:])]
    first_s = max(synced_call(call, device)[0] for call in launchers)  # the copies' first calls too
    if device.type != "cuda":
        return Timing(_sample(lambda k: timed_runs(launcher, k, device), first_s, budget), "perf_counter", entry=made)
    prepare = entry_op(made, device)
    rate = _cycles_per_s(device)
    hold_s = HOLD_MIN_S
    turn = 0
    held, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))

    def take(k: int) -> list[float]:
        nonlocal hold_s, turn
        samples = []
        while len(samples) < k:
            if prepare is not None:
                prepare()
            torch.cuda.synchronize(device)
            enqueued = time.perf_counter()
            held.record()
            torch.cuda._sleep(int(hold_s * rate))
            start.record()
            launchers[turn % len(launchers)]()
            end.record()
            enqueue_s = time.perf_counter() - enqueued
            end.synchronize()
            if enqueue_s < held.elapsed_time(start) / 1e3:
                samples.append(start.elapsed_time(end) / 1e3)
                turn += 1
            elif hold_s < HOLD_MAX_S:
                hold_s *= 2  # the host was in this sample: drop it, hold longer
            else:
                raise RuntimeError(f"one eager call took the host {enqueue_s * 1e3:.1f} ms to enqueue, "
                                   f"longer than a {HOLD_MAX_S * 1e3:g} ms hold")
        return samples

    with torch.cuda.device(device):
        return Timing(_sample(take, first_s + HOLD_MIN_S, budget), "cuda-events", entry=made)
