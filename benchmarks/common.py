"""What every benchmark of the suite shares: the device, the parameter grid, the timing method, the
benchmark version, and the rule that makes an unsupported combination asv's skip.

Timing is the harness's (kda_impls.bench.run_case), the code path of the sweeps: the correctness
check, then kernel time over placements from CUDA-graph replays in the default L2 entry state, and
call time from single eager calls. A kernel-time benchmark's samples are its per-placement medians:
asv's result is their median (asv keeps its own statistic; the sweeps report their mean) and their
range the placement spread the gate (kda_impls.regress) reads; a bandwidth benchmark's samples are
the same medians turned into GB/s (the row's bytes over each) or into the fraction of the copy
bandwidth the same process measured. asv spawns one process per benchmark and parameter
combination, and the first to need a combination measures it for the others (:func:`measure`), so
the run time of the suite is mostly process and CUDA start-up, and the grid is what sets it.

``KDA_ASV_PROFILE`` picks the grid (default ``full`` with a CUDA GPU, ``cpu`` without):

- ``full``: the perf-CI run on main: every tracked implementation x 32 (B, heads, state dtype,
  tokens per row T = 1 and a 4-token speculative verify) kernel times, as many of each bandwidth
  benchmark, + one call latency each. A measuring process costs 9-12 s on the H200; a bandwidth
  process reads its row and pays only its start-up, so the run grows with each implementation or
  grid value.
  Slot padding is left to the sweeps: it changes a runtime stride, not the compiled kernel.
- ``quick``: the gate on pull requests: B 1 and 512, bf16 state.
- ``gate``: what scripts.gate.validate_gate runs to prove the gate: the B >= 64 points of Kimi-Linear's
  layer, bf16 and fp32 state, where a 5% slowdown of a kernel must be caught.
- ``bandwidth``: Kimi-Linear's layer at B = 256, bf16 and fp32 state, one token: what
  scripts.gate.asv_bandwidth sets beside a sweep of the same points.
- ``cpu``: tiny shapes for a box without a GPU, where CI checks the suite: naive and the Triton
  kernels (interpreted) run, the GPU-only ones skip with their reason.

Beside the grid, one frozen-verify point (``update_state=False``: every token's output from the row's
start state, nothing stored) for our kernel and FlashInfer's fastest variant: :data:`FROZEN` (T = 4,
B = 64 at Kimi-Linear's layer, bf16 state; tiny on the CPU), in every profile; and one replay point
(a one-token step on a ring of cached records, its time the mean over whole ring cycles, flush included)
for our kernel: :data:`REPLAY` (L = 16, B = 64 at Kimi-Linear's layer, bf16 state; tiny on the CPU).

``quick``, ``gate`` and ``bandwidth`` are subsets of ``full``, and results of different profiles share benchmark
names and versions: a pull request's quick run is gated against main's full run, on the
combinations they have in common (asv and kda-regress compare those).
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import torch

from kda_impls import names
from kda_impls.bench import timing
from kda_impls.bench.case import Method, run_case
from kda_impls.bench.config import Config, PoolLayout
from kda_impls.bench.timing import Budget
from kda_impls.registry import interpret_triton_on
from kda_impls.regress_load import CPU_TIMER

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
interpret_triton_on(DEVICE)  # before any kernel module is imported

# Head layouts, named "[H<h>-]HV<hv>-K<k>-V<v>" (H = HV unless given). HV32-K128-V128 is
# Kimi-Linear's KDA layer on one GPU; the H16 variant exercises grouped value heads (GVA).
KIMI = "HV32-K128-V128"
GVA = "H16-HV32-K128-V128"
TINY = "H2-HV4-K16-V16"

PROFILES = {
    "full": dict(B=[1, 64, 256, 512], heads=[KIMI, GVA], slot_pad=[0], state_dtype=["bfloat16", "float32"], T=[1, 4],
                 call_B=[1]),
    "quick": dict(B=[1, 512], heads=[KIMI, GVA], slot_pad=[0], state_dtype=["bfloat16"], T=[1, 4], call_B=[1]),
    "gate": dict(B=[64, 512], heads=[KIMI], slot_pad=[0], state_dtype=["bfloat16", "float32"], T=[1], call_B=[1]),
    "bandwidth": dict(B=[256], heads=[KIMI], slot_pad=[0], state_dtype=["bfloat16", "float32"], T=[1], call_B=[1]),
    "cpu": dict(B=[2], heads=[TINY], slot_pad=[0], state_dtype=["bfloat16"], T=[1, 2], call_B=[2]),
}
PROFILE_NAME = os.environ.get("KDA_ASV_PROFILE") or ("full" if DEVICE == "cuda" else "cpu")
try:
    PROFILE = PROFILES[PROFILE_NAME]
except KeyError:
    raise ValueError(f"KDA_ASV_PROFILE={PROFILE_NAME!r}: must be one of {', '.join(PROFILES)}") from None
# Each implementation costs a process per grid point, so the suite tracks by default our kernel,
# the baseline, and each library in the call serving engines make and in its fastest one (the
# sweeps measure every variant: docs/findings.md); KDA_ASV_IMPLS (comma-separated) chooses others.
# Registered names only, in registry order; the CPU keeps those that can run there.
TRACKED = {"naive", "triton", "fla", "fla-loggate-sigmoid", "flashinfer-sigmoid", "flashinfer-loggate-sigmoid",
           "sglang-cutedsl", "sglang-replayssm"}
DEFAULT_IMPLS = {"gate": {"triton", "fla"}, "cpu": {"naive", "triton", "fla"}}
_wanted = set(filter(None, os.environ.get("KDA_ASV_IMPLS", "").split(","))) or DEFAULT_IMPLS.get(PROFILE_NAME, TRACKED)
IMPLS = [name for name in names() if name in _wanted]

# The frozen-verify point's grid and implementations: of those chosen, the ones tracked for it (else all)
FROZEN = (dict(B=[2], heads=[TINY], state_dtype=["bfloat16"], T=[2]) if PROFILE_NAME == "cpu" else
          dict(B=[64], heads=[KIMI], state_dtype=["bfloat16"], T=[4]))
FROZEN_IMPLS = [name for name in IMPLS if name in {"triton", "flashinfer-loggate-sigmoid"}] or IMPLS
# The replay point's (T = 1; `ring` the records per slot), likewise
REPLAY = (dict(B=[2], heads=[TINY], state_dtype=["bfloat16"], ring=4) if PROFILE_NAME == "cpu" else
          dict(B=[64], heads=[KIMI], state_dtype=["bfloat16"], ring=16))
REPLAY_IMPLS = [name for name in IMPLS if name in {"triton", "sglang-replayssm"}] or IMPLS

# Six placements a benchmark, on every device: enough medians for the gate's Mann-Whitney test to reach
# p < 0.01 (two sides of 6: p >= 0.002), so that it decides on a CPU as on a GPU (there at the CPU
# timer's threshold, kda_impls.regress_rule.TIMER_THRESHOLDS). On a GPU each is sampled until its median
# is known to +-1% (95% CI) or its share of the time is up, and six more are added where they spread or
# the step exceeds the L2 (the sweeps add 24: asv spawns a process per benchmark, and a gate run must
# stay within minutes).
PLACEMENTS = 6
if DEVICE == "cuda":
    METHOD = Method(kernel=Budget(min_samples=60, max_samples=3000, max_seconds=0.6, rel_ci=0.01),
                    call=Budget(min_samples=30, max_samples=1000, max_seconds=0.2, rel_ci=0.01), extra_placements=6)
else:
    METHOD = Method(kernel=Budget(min_samples=5, max_samples=20, max_seconds=0.1, rel_ci=0.05),
                    call=Budget(min_samples=3, max_samples=10, max_seconds=0.1, rel_ci=0.05))

# asv compares results of one benchmark version only. The version is explicit: the harness's
# timing.METHOD_VERSION (bumped when what the timers measure changes) and this suite's own, bumped
# when what the benchmarks ask of the harness changes (budgets, placements, entry state, settling:
# 2 since Method.settle_s idles after each large hand-back by default, as the sweeps' gate refuses
# to compare sweeps that settled differently). On a CPU the version names the timer after a "+", as a
# sweep row's kernel_method does: the gate judges CPU times at that timer's threshold.
SUITE_VERSION = 2
VERSION = f"{timing.METHOD_VERSION}.{SUITE_VERSION}" + ("" if DEVICE == "cuda" else f"+{CPU_TIMER}")


def config(impl: str, B: int, heads: str, slot_pad: int = 0, state_dtype: str = "bfloat16", T: int = 1,
           mode: str = "inplace", ring: int = 0) -> Config:
    """T > 1: a speculative verify of T tokens per row, the state stored after every token (in place)
    or none (``mode="frozen"``); ``mode="replay"``: a replay step on a ring of ``ring`` records."""
    dims = {name: int(value) for name, value in re.findall(r"([A-Z]+)(\d+)", heads)}
    return Config(impl, B, dims.get("H", dims["HV"]), dims["HV"], dims["K"], dims["V"], state_dtype=state_dtype, T=T,
                  mode=mode, ring=ring, slot_pad=slot_pad, layout=PoolLayout(placements=PLACEMENTS))


def shared_rows(benchmark) -> str:
    """Every benchmark's ``setup_cache`` (asv calls it bound to a benchmark instance): asv runs it
    once per run, in a new directory, and hands what it returns (that directory) to every
    benchmark sharing it (one function: one key). :func:`measure` keeps its rows there, so that
    kernel time, bandwidth and call time of one combination come from one measurement."""
    return os.getcwd()


def measure(cfg: Config, rows_dir: str) -> dict:
    """The harness's row for ``cfg`` on :data:`DEVICE` (correctness check, kernel and call time),
    measured by the first benchmark process of the run that asks for it and read back from
    ``rows_dir`` (:func:`shared_rows`) by the others.

    A combination the implementation cannot run here raises NotImplementedError, asv's skip, with
    the implementation's reason (asv prints it under --show-stderr), as a sweep marks it
    "unsupported". A wrong result or a failure fails the benchmark.
    """
    kept = Path(rows_dir) / f"{cfg.key()}.row.pickle"
    if kept.exists():
        row = pickle.loads(kept.read_bytes())
    else:
        row = run_case(cfg, DEVICE, METHOD)
        partial = kept.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(row))
        partial.replace(kept)  # a process killed mid-write leaves no half row behind
    if row["status"] == "unsupported":
        raise NotImplementedError(f"{cfg.impl}: {row['reason']}")
    if row["status"] != "ok":
        raise RuntimeError(f"{cfg.key()}: {row['status']}: {row['reason']}")
    return row


def asv_samples(values: list[float]) -> dict:
    """What an asv track benchmark returns to have its samples kept: asv stores their median as
    the result, its 99% CI and quartiles, and (with --record-samples) the samples themselves."""
    return {"samples": values, "number": 1}


def placement_seconds(row: dict) -> list[float]:
    """A row's per-placement medians of the kernel time, in seconds."""
    return [us / 1e6 for us in row["kernel_placement_us"]]


def placement_gbps(row: dict) -> list[float]:
    """The bandwidth of each placement: the row's bytes (``DecodeInputs.nbytes()``, the sweeps' byte
    model) over its median kernel time, in GB/s."""
    return [row["bytes"] / seconds / 1e9 for seconds in placement_seconds(row)]
