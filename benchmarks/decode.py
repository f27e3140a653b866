"""One KDA decode step of every registered implementation: GPU kernel time over the profile's grid,
and the latency of one eager call over its batch sizes.

The implementation is the first parameter of every benchmark (scripts/asv_validate.py relies on
it). No ``setup_cache``: its result reaches the benchmark process pickled, and CUDA tensors do not
survive that; drawing the inputs on the device costs less than the process start-up anyway.
"""

from __future__ import annotations

from . import common


class KernelTime:
    """GPU time of one decode step (T tokens per row) in the default L2 entry state
    (kda_impls.bench.timing), median over placements; the samples are the per-placement medians."""

    params = [common.IMPLS, common.PROFILE["B"], common.PROFILE["heads"], common.PROFILE["slot_pad"],
              common.PROFILE["state_dtype"], common.PROFILE["T"]]
    param_names = ["impl", "B", "heads", "slot_pad", "state_dtype", "T"]
    unit = "seconds"
    version = common.VERSION

    def setup(self, impl, B, heads, slot_pad, state_dtype, T):
        self.row = common.measure(common.config(impl, B, heads, slot_pad, state_dtype, T))

    def track_kernel(self, impl, B, heads, slot_pad, state_dtype, T):
        return common.asv_samples([us / 1e6 for us in self.row["kernel_placement_us"]])


class CallTime:
    """Latency of one eager call as a serving engine makes it, from an idle GPU in the default L2
    entry state: Python, argument handling, launch and kernel (kda_impls.bench.timing.call_time).
    Layouts barely move host overhead, so this runs on the first head layout with a compact bf16
    pool only."""

    params = [common.IMPLS, common.PROFILE["call_B"]]
    param_names = ["impl", "B"]
    unit = "seconds"
    version = common.VERSION

    def setup(self, impl, B):
        self.row = common.measure(common.config(impl, B, common.PROFILE["heads"][0]))

    def track_call(self, impl, B):
        return common.asv_samples([us / 1e6 for us in self.row["call_samples_us"]])
