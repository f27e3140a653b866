"""The naive decode plus real extra work, about 10% of its step. No sleep: the extra work is arithmetic
on a buffer the size of an eighth of the step's states, repeated as many times as bind measures (twice) to
take a tenth of the step (shapes differ in how much of a step is per-op overhead), so the gate's
tests see a 10% slowdown at any shape, in kernel and call times alike."""

import statistics
import time

import torch

from kda_impls.impls.naive import NaiveTorch

SLOWDOWN = 0.10


def _median_seconds(fn, calls: int = 15) -> float:
    fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class Slower(NaiveTorch):
    name = "planted-slower"
    library = "planted"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        scratch = torch.ones(max(inputs.B * inputs.T * inputs.slot_elements // 8, 64), device=inputs.device)

        def unit():
            scratch.mul_(1.0)

        # measured on a copy (bind must leave the pool alone), the same layout
        step = _median_seconds(super()._launcher(inputs.clone(), torch.empty_like(out)))
        repeats = max(1, round(SLOWDOWN * step / _median_seconds(unit)))

        def slower(launch=launch):
            for _ in range(repeats):
                unit()
            return launch()

        # once more from what that costs beside the step (a unit alone runs hotter than between steps)
        copy = super()._launcher(inputs.clone(), torch.empty_like(out))
        extra = _median_seconds(lambda: slower(copy)) / step - 1
        repeats = max(1, round(repeats * min(max(SLOWDOWN / max(extra, 1e-9), 0.5), 2.0)))  # noise: by 2x at most
        return slower
