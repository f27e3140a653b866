"""One row of a sweep: an implementation on one configuration, checked against the reference, then
timed."""

from __future__ import annotations

from dataclasses import asdict

import torch

from ..contract import Implementation, Unsupported
from ..inputs import DecodeInputs
from ..registry import get
from ..verify import verify
from .config import Config
from .roofline import copy_bandwidth
from .timing import Budget, as_device, bind_rotation, call_time, kernel_time, synced_call

# ok: matches the reference; wrong: timed anyway, flagged; unsupported: cannot run here (reason);
# error: ContractError or a runtime failure (message); crashed: the worker process died (the sweep).
STATUSES = ("ok", "wrong", "unsupported", "error", "crashed")

COLUMNS = [
    "impl", "B", "H", "HV", "K", "V", "slot_pad", "state_dtype", "pad_rows", "key",
    "status", "reason", "err_out", "err_state",
    "kernel_us_median", "kernel_us_p25", "kernel_us_p75", "n_samples", "kernel_method", "input_sets",
    "call_us_median", "call_us_p25", "call_us_p75", "first_call_ms",
    "bytes", "gbps", "roofline_frac", "floor_us", "copy_gbps",
]

MAX_REASON_CHARS = 2000


class _TimedFirstLaunch:
    """Stands in for an implementation inside :func:`verify`, whose one launch is this
    configuration's first call in the process: times it, synchronized. That includes the JIT
    compilation and autotuning an implementation leaves to its first call (fla, FlashInfer), not
    what it does in ``bind`` (Triton compiles and loads its kernel there)."""

    def __init__(self, impl: Implementation):
        self.impl = impl
        self.seconds: float | None = None

    def bind(self, inputs: DecodeInputs, out: torch.Tensor | None = None):
        launch = self.impl.bind(inputs, out)

        def timed():
            self.seconds, result = synced_call(launch, inputs.device)
            return result

        return timed


def _one_line(exc: BaseException) -> str:
    text = " | ".join(line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip())
    return text[:MAX_REASON_CHARS]


def empty_row(cfg: Config, status: str | None = None, reason: str = "") -> dict:
    """A row of ``cfg`` with no measurements."""
    return dict.fromkeys(COLUMNS) | asdict(cfg) | {"key": cfg.key(), "status": status, "reason": reason,
                                                   "kernel_samples_us": [], "call_samples_us": []}


def measure(
    cfg: Config,
    device,
    *,
    l2_cold: bool = True,
    pool_slots_per_row: int = 1,
    sorted_slots: bool = False,
    copy_bw: float | None = None,
    kernel_budget: Budget = Budget(),
    call_budget: Budget = Budget(max_seconds=0.2),
    seed: int = 0,
) -> dict:
    """One tidy row (keys :data:`COLUMNS`, plus the raw samples ``kernel_samples_us`` and
    ``call_samples_us``) for ``cfg`` on ``device``.

    The correctness gate comes first, on fresh inputs (:func:`verify`, whose launch is also the
    timed first call); then the kernel time over an L2-cold rotation (:func:`kernel_time`), the
    latency of one eager call (:func:`call_time`), the bytes moved and the share of the copy
    bandwidth ``copy_bw`` (bytes/s; measured here when None) they reach. A failure becomes the row's
    status and reason; only KeyboardInterrupt and the like propagate.
    """
    device = as_device(device)
    row = empty_row(cfg)
    try:
        impl = get(cfg.impl)
        check_inputs = cfg.make_inputs(device, seed)
        reason = impl.unsupported(check_inputs)
        if reason:
            return row | {"status": "unsupported", "reason": reason}
        first = _TimedFirstLaunch(impl)
        verdict = verify(first, check_inputs)
        nbytes = check_inputs.nbytes()  # the timed sets' too: the same rows, whatever their pools' size
        del check_inputs  # its pool (2B slots) is not needed while timing
        row |= {"err_out": verdict.err_out, "err_state": verdict.err_state,
                "first_call_ms": first.seconds * 1e3, "status": "ok" if verdict.ok else "wrong",
                "reason": "; ".join(verdict.problems)}

        launchers = bind_rotation(impl, cfg, device, l2_cold=l2_cold, seed=seed + 1,
                                  pool_slots_per_row=pool_slots_per_row, sorted_slots=sorted_slots)
        kernel = kernel_time(launchers, device, kernel_budget)
        call = call_time(launchers[0], device, call_budget, l2_cold=l2_cold)
    except (ImportError, Unsupported) as exc:  # a library missing; a reason only bind() found
        return row | {"status": "unsupported", "reason": _one_line(exc)}
    except Exception as exc:  # ContractError, a failed launch, out of memory, a library's own error
        return row | {"status": "error", "reason": _one_line(exc)}

    copy_bw = copy_bandwidth(device) if copy_bw is None else copy_bw
    return row | {
        "kernel_us_median": kernel.median * 1e6, "kernel_us_p25": kernel.p25 * 1e6,
        "kernel_us_p75": kernel.p75 * 1e6, "n_samples": kernel.n, "kernel_method": kernel.method,
        "input_sets": len(launchers),
        "call_us_median": call.median * 1e6, "call_us_p25": call.p25 * 1e6, "call_us_p75": call.p75 * 1e6,
        "bytes": nbytes, "gbps": nbytes / kernel.median / 1e9, "roofline_frac": nbytes / kernel.median / copy_bw,
        "floor_us": nbytes / copy_bw * 1e6, "copy_gbps": copy_bw / 1e9,
        "kernel_samples_us": [s * 1e6 for s in kernel.samples], "call_samples_us": [s * 1e6 for s in call.samples],
    }
