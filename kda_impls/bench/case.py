"""The case runner: one implementation on one configuration, checked against the reference and, with
a :class:`Method`, timed. Sweeps, ``python -m kda_impls``, the correctness grid, the tune script and
the asv suite all run cases through :func:`run_case`, so they share one status vocabulary
(:data:`STATUSES`) and one row format (:data:`COLUMNS`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import torch

from ..contract import Implementation, Unsupported
from ..inputs import DecodeInputs
from ..registry import get
from ..verify import Verdict, verify
from . import clocks
from .config import CONFIG_COLUMNS, Config
from .l2 import DEFAULT_ENTRY, ENTRY_STATES, as_device
from .roofline import copy_bandwidth
from .timing import EXTRA_PLACEMENTS, Budget, Timing, call_time, kernel_time, synced_call

# ok: matches the reference; wrong: timed anyway, flagged; unsupported: cannot run here (reason);
# error: ContractError or a runtime failure (message); crashed: the worker process died (sweeps only).
STATUSES = ("ok", "wrong", "unsupported", "error", "crashed")

IMPL_COLUMNS = ["library", "variant", "engine_call"]  # what the implementation says of itself
COLUMNS = [
    # started_utc, row_s: when a sweep began the row and how long it took there, first call and
    # compilation included (a lane's timeline: what two GPUs did in parallel and what they did not)
    *CONFIG_COLUMNS, *IMPL_COLUMNS, "l2_entry", "device", "host", "started_utc", "row_s", "key", "status", "reason",
    "err_out", "err_state", "err_steps", "steps",
    "kernel_us_mean", "kernel_us_p25", "kernel_us_p75", "kernel_us_placement_min", "kernel_us_placement_max",
    "placements_timed", "n_samples", "kernel_method", "input_sets",
    "call_us_median", "call_us_p25", "call_us_p75", "first_call_ms",
    "bytes", "gbps", "roofline_frac", "floor_us", "copy_gbps",
    *clocks.COLUMNS, "retimed",
]

MAX_REASON_CHARS = 2000
PROCESS_SEED_STRIDE = 1000  # the seeds of placement process i start here times i


@dataclass(frozen=True)
class Method:
    """How a case is timed, besides its configuration: the L2 entry state (timing.ENTRY_STATES),
    the budgets of the two timers (the kernel budget shared among the layout's placements), how
    many placements are added on a GPU to a row whose step exceeds the L2 or whose placements spread
    wide (timing.PLACEMENT_SPREAD_LIMIT) and whether each keeps its memory until the row ends, so that
    the next lands on other pages (timing.kernel_time's ``disjoint``), how long to idle after handing
    back a large allocation (timing.SETTLE_MIN_BYTES),
    in how many worker processes a sweep times each row (:meth:`in_process`, :func:`merge_rows`),
    the seed of the inputs and spacers, and whether a row timed
    while the GPU slowed itself down is timed once more."""

    entry: str = DEFAULT_ENTRY
    kernel: Budget = field(default_factory=Budget)
    call: Budget | None = field(default_factory=lambda: Budget(max_seconds=0.2))  # None: no call time
    extra_placements: int = EXTRA_PLACEMENTS
    disjoint_placements: bool = True
    settle_s: float = 0.03  # three times the idle that ended the slowdown (evidence: timing.SETTLE_MIN_BYTES)
    placement_processes: int = 1
    seed: int = 0
    retime_throttled: bool = True

    def __post_init__(self):
        if self.entry not in ENTRY_STATES:
            raise ValueError(f"unknown L2 entry state {self.entry!r}; one of {', '.join(ENTRY_STATES)}")
        if self.placement_processes < 1:
            raise ValueError(f"placement_processes must be >= 1; got {self.placement_processes}")
        if self.settle_s < 0:
            raise ValueError(f"settle_s must be >= 0; got {self.settle_s}")
        if self.extra_placements < 0:
            raise ValueError(f"extra_placements must be >= 0; got {self.extra_placements}")

    def in_process(self, index: int) -> "Method":
        """What the ``index``-th of ``placement_processes`` workers times a row with: its own seeds
        (other inputs and spacers), its share of the kernel budget and of the extra placements, so
        that the row's placements come from several processes, whose memory differs as a whole (on
        the H200 one of fla's kernels moved by 3% between processes, each process's 27 placements
        sitting higher or lower as a whole: docs/timing.md, "Three runs of the `published` preset"),
        pooled, the sampling of one. Only the first times the call: :func:`merge_rows` keeps its.
        The others make their first calls before the sweep times anything (``worker.serve``'s
        ``warm``)."""
        return replace(self, seed=self.seed + index * PROCESS_SEED_STRIDE, placement_processes=1,
                       kernel=self.kernel.share(self.placement_processes), call=self.call if index == 0 else None,
                       extra_placements=math.ceil(self.extra_placements / self.placement_processes))


class _TimedFirstLaunch:
    """Stands in for an implementation inside :func:`verify`, whose first launch (of its several
    steps) is this configuration's first call in the process: times it, synchronized. That includes the JIT
    compilation and autotuning an implementation leaves to its first call (fla, FlashInfer), not
    what it does in ``bind`` (Triton compiles and loads its kernel there)."""

    def __init__(self, impl: Implementation):
        self.impl = impl
        self.seconds: float | None = None

    def unsupported(self, inputs: DecodeInputs) -> str | None:
        return self.impl.unsupported(inputs)  # what verify asks of a later step's form (a replay commit)

    def bind(self, inputs: DecodeInputs, out: torch.Tensor | None = None):
        launch = self.impl.bind(inputs, out)
        if self.seconds is not None:  # verify's later steps
            return launch


        @functools.wraps(launch)  # carries its sync_records
        def timed():
            self.seconds, result = synced_call(launch, inputs.device)
            return result

        return timed


def one_line(exc: BaseException) -> str:
    text = " | ".join(line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip())
    return text[:MAX_REASON_CHARS]


def verdict_columns(verdict: Verdict) -> dict:
    """A row's correctness columns from :func:`verify`'s verdict."""
    return {"err_out": verdict.err_out, "err_state": verdict.err_state, "err_steps": verdict.err_steps,
            "steps": verdict.steps, "status": "ok" if verdict.ok else "wrong", "reason": "; ".join(verdict.problems)}


def empty_row(cfg: Config, status: str | None = None, reason: str = "") -> dict:
    """A row of ``cfg`` with no measurements."""
    return dict.fromkeys(COLUMNS) | cfg.columns() | {"key": cfg.key(), "status": status, "reason": reason,
                                                     "kernel_samples_us": [], "call_samples_us": [],
                                                     "kernel_placement_us": []}


def _kernel_columns(kernel: Timing, nbytes: int, copy_bw: float) -> dict:
    """A row's kernel-time columns, and its samples and per-placement medians (us)."""
    return {
        "l2_entry": kernel.entry,
        "kernel_us_mean": kernel.time * 1e6, "kernel_us_p25": kernel.p25 * 1e6,
        "kernel_us_p75": kernel.p75 * 1e6, "kernel_us_placement_min": kernel.placement_min * 1e6,
        "kernel_us_placement_max": kernel.placement_max * 1e6, "n_samples": kernel.n,
        "placements_timed": len(kernel.placement_medians),
        "kernel_method": kernel.method, "input_sets": kernel.input_sets,
        "bytes": nbytes, "gbps": nbytes / kernel.time / 1e9, "roofline_frac": nbytes / kernel.time / copy_bw,
        "floor_us": nbytes / copy_bw * 1e6, "copy_gbps": copy_bw / 1e9,
        "kernel_samples_us": [s * 1e6 for s in kernel.samples],
        "kernel_placement_us": [s * 1e6 for s in kernel.placement_medians],
    }


def implementation_columns(impl: Implementation) -> dict:
    """What a row says of the implementation that measured it."""
    return {"library": getattr(impl, "library", impl.name), "variant": getattr(impl, "variant", ""),
            "engine_call": getattr(impl, "engine_call", "")}


def refused_on(impl: str, device: str) -> str | None:
    """Why ``impl`` cannot run on ``device`` whatever the inputs (``Implementation.unsupported_on``)."""
    try:
        return get(impl).unsupported_on(torch.device(device))
    except Exception:  # a library that does not import: its worker's rows say why
        return None


def refused_row(cfg: Config, reason: str) -> dict:
    """The ``unsupported`` row of a configuration whose implementation :func:`refused_on` its device."""
    return empty_row(cfg, "unsupported", reason) | implementation_columns(get(cfg.impl))


def merge_rows(rows: list[dict]) -> dict:
    """One row of a configuration timed in several processes (``Method.placement_processes``):
    the first process's row (its first call and call time), with every process's placements and
    samples pooled into the kernel time, the largest errors, and the clocks merged. The first row
    that is not ok stands for them all, its reason saying which process it came from."""
    for i, row in enumerate(rows):
        if row["status"] != "ok":
            return row | {"reason": f"placement process {i + 1} of {len(rows)}: {row['reason']}"}
    first = rows[0]
    kernel = Timing([s / 1e6 for row in rows for s in row["kernel_samples_us"]], first["kernel_method"],
                    [s / 1e6 for row in rows for s in row["kernel_placement_us"]], entry=first["l2_entry"],
                    input_sets=first["input_sets"])
    return first | clocks.merged(rows) | _kernel_columns(kernel, first["bytes"], first["copy_gbps"] * 1e9) | {
        **{col: max((row[col] for row in rows if row.get(col) is not None), default=None)
           for col in ("err_out", "err_state", "err_steps")},  # None where no process measured it
        "retimed": any(row["retimed"] for row in rows)}


def run_case(cfg: Config, device, method: Method | None = None, *, impl: Implementation | None = None,
             copy_bw: float | None = None) -> dict:
    """One tidy row (keys :data:`COLUMNS`, plus the raw samples ``kernel_samples_us`` and
    ``call_samples_us`` and the per-placement medians ``kernel_placement_us``) for ``cfg`` on
    ``device``.

    First the correctness check on fresh inputs (:func:`verify`: one step, then several on the same
    pool, a replay row's across every ring's flush; its first launch is also the timed first call), in
    a pool with spare slots, or in the layout's own pool where the implementation binds only that;
    with a ``method``, then the kernel
    time over the layout's placements and the method's L2 entry state (:func:`kernel_time`, under a
    :class:`clocks.ClockMonitor`: a row timed
    while throttled is timed once more), the latency of one eager call (:func:`call_time`), the
    bytes moved and the share of the copy bandwidth ``copy_bw`` (bytes/s; measured here when None)
    they reach. ``impl`` replaces the registered implementation of ``cfg.impl`` (the tune script's
    forced tile configs). A failure becomes the row's status and reason; only KeyboardInterrupt and
    the like propagate.
    """
    device = as_device(device)
    seed = method.seed if method else 0
    row = empty_row(cfg)
    try:
        impl = impl or get(cfg.impl)
        row |= implementation_columns(impl)
        check_inputs = cfg.make_inputs(device, seed, timed=False)
        reason = impl.unsupported(check_inputs)
        if reason:
            return row | {"status": "unsupported", "reason": reason}
        first = _TimedFirstLaunch(impl)
        try:
            verdict = verify(first, check_inputs)
        except Unsupported:
            # A call form that takes only the timed layout (a dense pool named in order, say)
            # is checked on that layout, without spare slots to see left untouched.
            check_inputs = cfg.make_inputs(device, seed, timed=True)
            verdict = verify(first, check_inputs)
        row |= verdict_columns(verdict) | {"first_call_ms": first.seconds * 1e3}
        del check_inputs  # its pool (2B slots) is not needed while timing
        if method is None:
            return row

        def make(placement: int) -> DecodeInputs:
            return cfg.make_inputs(device, seed + 1 + placement)

        def timed_kernel():
            with clocks.ClockMonitor(device) as monitor:
                # none added on the CPU, whose rows are not ranked (and whose timings always spread)
                extra = method.extra_placements if torch.device(device).type == "cuda" else 0
                timing = kernel_time(make, impl.bind, device, method.kernel, placements=cfg.layout.placements,
                                     entry=method.entry, seed=seed, extra_placements=extra,
                                     disjoint=method.disjoint_placements, settle_s=method.settle_s)
            return timing, monitor.summary()

        kernel, clock = timed_kernel()
        retimed = bool(method.retime_throttled and clock["throttled"])
        if retimed:
            kernel, clock = timed_kernel()
        timed_inputs = make(0)
        nbytes = timed_inputs.nbytes()
        call = call_time(impl.bind(timed_inputs), device, method.call, entry=method.entry) if method.call else None
        del timed_inputs
    except (ImportError, Unsupported) as exc:  # a library missing; a reason only bind() found
        return row | {"status": "unsupported", "reason": one_line(exc)}
    except Exception as exc:  # ContractError, a failed launch, out of memory, a library's own error
        return row | {"status": "error", "reason": one_line(exc)}

    copy_bw = copy_bandwidth(device) if copy_bw is None else copy_bw
    return row | clock | {"retimed": retimed} | _kernel_columns(kernel, nbytes, copy_bw) | ({} if call is None else {
        "call_us_median": call.time * 1e6, "call_us_p25": call.p25 * 1e6, "call_us_p75": call.p75 * 1e6,
        "call_samples_us": [s * 1e6 for s in call.samples]})
