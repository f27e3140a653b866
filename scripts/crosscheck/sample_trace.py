"""What a held sample spends its GPU time on, from a CUPTI trace taken inside the sample loop of a clock
that times one launch between events while a holder kernel keeps the stream: nvbench's cold measurement
(its ``block_stream`` kernel) and the harness's eager timer (:func:`.eager.held_call_time`, torch's
``spin_kernel``). Each sample is the holder, nvbench's clock-rate probe (a timestamp kernel before its
start event), then the call's kernels; the flush before nvbench's hold is a memset, not a kernel.
Per sample: ``lead_us`` from the end of the last of those (the release, or the probe after it) through
the start event to the call's first kernel, ``busy_us`` the call's kernels' summed durations,
``gap_us`` the idle time between them, ``span_us`` first start to last end, ``kernel<j>_us`` each
kernel's duration. Events are not in the trace: the time from the last kernel to the end event is not
seen.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

NVBENCH_HOLDER = "block_stream"  # nvbench/blocking_kernel.cu
# nvbench's clock-rate probes (detail/timestamps_kernel.cu) around its events, inside the hold: its clock, not the call
CLOCK_KERNELS = ("get_timestamps_kernel",)
HARNESS_HOLDER = "spin_kernel"  # torch.cuda._sleep (aten/src/ATen/cuda/Sleep.cu)
PARTS = ("lead_us", "busy_us", "gap_us", "span_us")

Kernel = tuple[float, float, str]  # (start us, duration us, name), as cupti.kernel_trace gives them


def held_samples(kernels: list[Kernel], holder: str, per_call: int) -> pd.DataFrame:
    """One row per sample in ``kernels`` (start order): a kernel whose name holds ``holder``, any
    CLOCK_KERNELS, then ``per_call`` kernels that are neither; the lead runs from the last of the
    holder and clock kernels to the call. Raises RuntimeError, naming the kernels seen, when no sample
    is found (a holder renamed, a wrong ``per_call``)."""
    def clock(name: str) -> bool:
        return holder in name or any(c in name for c in CLOCK_KERNELS)

    rows = []
    for i, (_, _, name) in enumerate(kernels):
        if holder not in name:
            continue
        first = next((j for j in range(i + 1, len(kernels)) if not clock(kernels[j][2])), len(kernels))
        call = kernels[first:first + per_call]
        if len(call) < per_call or any(clock(n) for _, _, n in call):
            continue
        released = kernels[first - 1][0] + kernels[first - 1][1]
        busy = sum(d for _, d, _ in call)
        span = call[-1][0] - call[0][0] + call[-1][1]  # starts subtracted first: they are large numbers
        rows.append({"lead_us": call[0][0] - released, "busy_us": busy, "gap_us": span - busy,
                     "span_us": span, **{f"kernel{j}_us": d for j, (_, d, _) in enumerate(call)}})
    if not rows:
        names = sorted({n for _, _, n in kernels})[:8]
        raise RuntimeError(f"no sample of a '{holder}' kernel then {per_call} others in a trace of "
                           f"{len(kernels)} kernels ({', '.join(names) or 'none'})")
    return pd.DataFrame(rows)


def summary(samples: pd.DataFrame, prefix: str) -> dict:
    """``{prefix}_<part>``: each part's median over the samples, ``{prefix}_mean_<part>`` its mean (what
    a clock's mean is made of), the gap's quartiles (``{prefix}_gap_p25_us``, ``_p75_us``: a gap with two
    modes shows as quartiles apart) and ``{prefix}_samples``."""
    gap = samples["gap_us"]
    return ({f"{prefix}_{part}": float(np.median(samples[part])) for part in samples}
            | {f"{prefix}_mean_{part}": float(np.mean(samples[part])) for part in PARTS}
            | {f"{prefix}_gap_p25_us": float(gap.quantile(0.25)), f"{prefix}_gap_p75_us": float(gap.quantile(0.75)),
               f"{prefix}_samples": len(samples)})


def traced(run: Callable[[], object], device, holder: str, per_call: int, prefix: str) -> tuple[object, dict]:
    """``run``'s result, and its held samples' :func:`summary` from a trace of it (CUDA kernels)."""
    import torch

    from scripts.crosscheck.cupti import kernel_trace

    result = []
    kernels = kernel_trace(lambda: result.append(run()), torch.device(device))
    return result[0], summary(held_samples(kernels, holder, per_call), prefix)
