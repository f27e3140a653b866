"""One KDA decode step of every registered implementation: GPU kernel time over the profile's grid,
and the latency of one eager call over its batch sizes.

The implementation is the first parameter of every benchmark (scripts/asv_validate.py relies on
it). No ``setup_cache``: its result reaches the benchmark process pickled, and CUDA tensors and
bound launchers do not survive that; drawing the inputs on the device costs less than the process
start-up anyway.
"""

from __future__ import annotations

from . import common


class KernelTime:
    """GPU time per call of one decode step, L2-cold: launches cycle through input sets that add up
    to 3x the L2, replayed from a CUDA graph (kda_impls.bench.timing.kernel_time)."""

    params = [common.IMPLS, common.PROFILE["B"], common.PROFILE["heads"], common.PROFILE["slot_pad"],
              common.PROFILE["state_dtype"]]
    param_names = ["impl", "B", "heads", "slot_pad", "state_dtype"]
    unit = "seconds"
    version = common.VERSION

    def setup(self, impl, B, heads, slot_pad, state_dtype):
        self.launchers = common.bind(common.config(impl, B, heads, slot_pad, state_dtype))

    def track_kernel(self, impl, B, heads, slot_pad, state_dtype):
        return common.kernel_seconds(self.launchers)


class CallTime:
    """Latency of one eager call as a serving engine makes it, from an idle GPU with the L2 flushed:
    Python, argument handling, launch and kernel (kda_impls.bench.timing.call_time). Layouts barely
    move host overhead, so this runs on the first head layout with a compact bf16 pool only."""

    params = [common.IMPLS, common.PROFILE["call_B"]]
    param_names = ["impl", "B"]
    unit = "seconds"
    version = common.VERSION

    def setup(self, impl, B):
        # one input set: call_time flushes the L2 before every call itself
        self.launchers = common.bind(common.config(impl, B, common.PROFILE["heads"][0]), l2_cold=False)

    def track_call(self, impl, B):
        return common.call_seconds(self.launchers)
