"""What every benchmark of the suite shares: the device, the parameter grid, the timing budgets, the
version of the timing method, and the rule that makes an unsupported combination asv's skip.

Timing is the harness's (kda_impls.bench.timing), the code path of the sweeps: launchers bound over
an L2-cold rotation of input sets, kernel time from CUDA-graph replays, call time from single eager
calls. asv spawns one process per benchmark and parameter combination, so the run time of the suite
is mostly process and CUDA start-up, and the grid is what sets it.

``KDA_ASV_PROFILE`` picks the grid (default ``full`` with a CUDA GPU, ``cpu`` without):

- ``full``: the perf-CI run on main: 4 implementations x 12 (B, heads, state dtype) kernel times
  + 4 call latencies, 52 processes. A process costs 9-12 s on the H200 (the quick profile's 20 took
  3.0-3.9 min: results/h200/asv-validation/{a1,a2,slow}.log), so 8-10 minutes; each registered implementation
  or grid value added grows the run with it. Slot padding is left to the sweeps: it changes a
  runtime stride, not the compiled kernel, so it adds time here and little regression coverage.
- ``quick``: the gate on pull requests and scripts/asv_validate.py: 20 processes, 3-4 minutes.
- ``cpu``: tiny shapes for a box without a GPU, where CI checks the suite: naive and the Triton
  kernels (interpreted) run, the GPU-only ones skip with their reason.

``quick`` is a subset of ``full``, and results of different profiles share benchmark names and
versions: a pull request's quick run is gated against main's full run, on the combinations they
have in common (asv and scripts/regress.py compare those).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # Without a GPU the Triton kernels (ours and fla's) can only run interpreted, and Triton fixes
    # that when a kernel's module is imported: so before any is (as tests/conftest.py does).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kda_impls import Unsupported, get, names  # noqa: E402
from kda_impls.bench import timing  # noqa: E402
from kda_impls.bench.config import Config  # noqa: E402
from kda_impls.bench.timing import Budget  # noqa: E402

# Head layouts, named "[H<h>-]HV<hv>-K<k>-V<v>" (H = HV unless given). HV32-K128-V128 is
# Kimi-Linear's KDA layer on one GPU; the H16 variant exercises grouped value heads (GVA).
KIMI = "HV32-K128-V128"
GVA = "H16-HV32-K128-V128"
TINY = "H2-HV4-K16-V16"

PROFILES = {
    "full": dict(B=[1, 64, 512], heads=[KIMI, GVA], slot_pad=[0], state_dtype=["bfloat16", "float32"],
                 call_B=[1]),
    "quick": dict(B=[1, 512], heads=[KIMI, GVA], slot_pad=[0], state_dtype=["bfloat16"], call_B=[1]),
    "cpu": dict(B=[2], heads=[TINY], slot_pad=[0], state_dtype=["bfloat16"], call_B=[2]),
}
PROFILE_NAME = os.environ.get("KDA_ASV_PROFILE") or ("full" if DEVICE == "cuda" else "cpu")
try:
    PROFILE = PROFILES[PROFILE_NAME]
except KeyError:
    raise ValueError(f"KDA_ASV_PROFILE={PROFILE_NAME!r}: must be one of {', '.join(PROFILES)}") from None
IMPLS = names()

# Budgets: at least 30 samples a side, so the gate's Mann-Whitney test has power; the sampling
# stops once the median is known to +-1% (95% CI) or the time is up. On the CPU nothing is ranked.
if DEVICE == "cuda":
    KERNEL_BUDGET = Budget(min_samples=30, max_samples=1000, max_seconds=0.5, rel_ci=0.01)
    CALL_BUDGET = Budget(min_samples=30, max_samples=1000, max_seconds=0.2, rel_ci=0.01)
else:
    KERNEL_BUDGET = CALL_BUDGET = Budget(min_samples=3, max_samples=10, max_seconds=0.1, rel_ci=0.05)

# asv versions a benchmark by its own source only, not by helpers it calls; results of different
# versions are never compared. Bump METHOD_VERSION when the measurement changes in a way neither
# timing.py nor the budgets show (what the benchmarks pass to the harness, say).
METHOD_VERSION = 1
VERSION = hashlib.sha256(
    f"{METHOD_VERSION}\n{KERNEL_BUDGET}\n{CALL_BUDGET}\n{inspect.getsource(timing)}".encode()).hexdigest()[:16]


def config(impl: str, B: int, heads: str, slot_pad: int = 0, state_dtype: str = "bfloat16") -> Config:
    dims = {name: int(value) for name, value in re.findall(r"([A-Z]+)(\d+)", heads)}
    return Config(impl, B, dims.get("H", dims["HV"]), dims["HV"], dims["K"], dims["V"], slot_pad=slot_pad,
                  state_dtype=state_dtype)


def bind(cfg: Config, l2_cold: bool = True) -> list[timing.Launcher]:
    """Launchers over an L2-cold rotation of ``cfg``'s inputs on :data:`DEVICE` (one input set
    when not ``l2_cold``).

    A combination the implementation cannot run here raises NotImplementedError, asv's skip, with
    the implementation's reason (asv prints it under --show-stderr), as a sweep marks it
    "unsupported": asked first on a one-row draw (binding would fail a declared capability as a
    broken contract), then from binding, for reasons only the full batch shows. A contract the
    grid breaks otherwise is a bug and fails the benchmark.
    """
    try:
        impl = get(cfg.impl)
        reason = impl.unsupported(cfg.at_batch(1).make_inputs(DEVICE))
        if reason:
            raise Unsupported(reason)
        return timing.bind_rotation(impl, cfg, DEVICE, l2_cold=l2_cold)
    except (ImportError, Unsupported) as exc:
        raise NotImplementedError(f"{cfg.impl}: {exc}") from None


def asv_samples(measured: timing.Timing) -> dict:
    """What an asv track benchmark returns to have its samples kept: asv stores their median as
    the result, its 99% CI and quartiles, and (with --record-samples) the samples themselves."""
    return {"samples": measured.samples, "number": 1}


def kernel_seconds(launchers: list[timing.Launcher]) -> dict:
    return asv_samples(timing.kernel_time(launchers, DEVICE, KERNEL_BUDGET))


def call_seconds(launchers: list[timing.Launcher]) -> dict:
    return asv_samples(timing.call_time(launchers[0], DEVICE, CALL_BUDGET))
