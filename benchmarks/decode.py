"""One KDA decode step of every registered implementation: GPU kernel time and the bandwidth it
reaches over the profile's grid, the same for one frozen-verify point (``Frozen*``, common.FROZEN) and
one replay point (``Replay*``, common.REPLAY), and the latency of one eager call over its batch sizes.

The implementation is the first parameter of every benchmark (scripts.gate.validate_gate relies on
it). Every benchmark shares one ``setup_cache`` (common.shared_rows): the first process of a run
that needs a combination measures it, the others read its row, so each combination is measured
once per run, in a process of its own (CUDA tensors do not survive setup_cache's pickling, so the
measurement is not made there). ``cache``, asv's argument for it, is the directory of the run's rows.
"""

from __future__ import annotations

from . import common

GRID = [common.IMPLS, common.PROFILE["B"], common.PROFILE["heads"], common.PROFILE["slot_pad"],
        common.PROFILE["state_dtype"], common.PROFILE["T"]]
GRID_NAMES = ["impl", "B", "heads", "slot_pad", "state_dtype", "T"]
FROZEN_GRID = [common.FROZEN_IMPLS, common.FROZEN["B"], common.FROZEN["heads"], [0], common.FROZEN["state_dtype"],
               common.FROZEN["T"]]
REPLAY_GRID = [common.REPLAY_IMPLS, common.REPLAY["B"], common.REPLAY["heads"], [0], common.REPLAY["state_dtype"], [1]]


class KernelTime:
    """GPU time of one decode step (T tokens per row) in the default L2 entry state
    (kda_impls.bench.timing), median over placements; the samples are the per-placement medians."""

    params = GRID
    param_names = GRID_NAMES
    unit = "seconds"
    version = common.VERSION
    setup_cache = common.shared_rows

    mode = "inplace"
    ring = 0

    def setup(self, cache, impl, B, heads, slot_pad, state_dtype, T):
        self.row = common.measure(common.config(impl, B, heads, slot_pad, state_dtype, T, self.mode, self.ring), cache)

    def track_kernel(self, cache, impl, B, heads, slot_pad, state_dtype, T):
        return common.asv_samples(common.placement_seconds(self.row))


class Bandwidth:
    """What the kernel time's measurement reaches: the bytes one step moves (the sweeps' byte model,
    ``DecodeInputs.nbytes()``) over each placement's median, and that as a fraction of the
    bandwidth of a large device-to-device copy measured in the same process (the sweeps'
    ``gbps`` and ``roofline_frac``). No second timing: the samples are the kernel time's placements
    turned into rates, so a bandwidth drop is the kernel-time rise of the same run."""

    params = GRID
    param_names = GRID_NAMES
    version = common.VERSION
    setup_cache = common.shared_rows

    mode = "inplace"
    ring = 0

    def setup(self, cache, impl, B, heads, slot_pad, state_dtype, T):
        self.row = common.measure(common.config(impl, B, heads, slot_pad, state_dtype, T, self.mode, self.ring), cache)

    def track_gbps(self, cache, impl, B, heads, slot_pad, state_dtype, T):
        return common.asv_samples(common.placement_gbps(self.row))

    track_gbps.unit = "GB/s"

    def track_roofline_frac(self, cache, impl, B, heads, slot_pad, state_dtype, T):
        return common.asv_samples([gbps / self.row["copy_gbps"] for gbps in common.placement_gbps(self.row)])

    track_roofline_frac.unit = "fraction of copy bandwidth"


class FrozenKernelTime(KernelTime):
    """KernelTime of a frozen verify (update_state=False) of T tokens per row: no state written."""

    params = FROZEN_GRID
    mode = "frozen"


class FrozenBandwidth(Bandwidth):
    """Bandwidth of the frozen-verify point, from FrozenKernelTime's measurement (its bytes: each
    live row's state read once, nothing written)."""

    params = FROZEN_GRID
    mode = "frozen"


class ReplayKernelTime(KernelTime):
    """KernelTime of a replay step (one token, a ring of common.REPLAY["ring"] records per slot): the mean
    per step over whole ring cycles, each slot's flush included once per cycle."""

    params = REPLAY_GRID
    mode = "replay"
    ring = common.REPLAY["ring"]


class ReplayBandwidth(Bandwidth):
    """Bandwidth of the replay point, from ReplayKernelTime's measurement (its bytes: each live row's
    checkpoint read, the records read and written, the flush's state write as 1/L of it)."""

    params = REPLAY_GRID
    mode = "replay"
    ring = common.REPLAY["ring"]


class CallTime:
    """Latency of one eager call as a serving engine makes it, from an idle GPU in the default L2
    entry state: Python, argument handling, launch and kernel (kda_impls.bench.timing.call_time).
    Layouts barely move host overhead, so this runs on the first head layout with a compact bf16
    pool only (the kernel-time row of that combination, where the grid has it)."""

    params = [common.IMPLS, common.PROFILE["call_B"]]
    param_names = ["impl", "B"]
    unit = "seconds"
    version = common.VERSION
    setup_cache = common.shared_rows

    def setup(self, cache, impl, B):
        self.row = common.measure(common.config(impl, B, common.PROFILE["heads"][0]), cache)

    def track_call(self, cache, impl, B):
        return common.asv_samples([us / 1e6 for us in self.row["call_samples_us"]])
