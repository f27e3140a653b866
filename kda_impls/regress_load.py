"""The regression gate's inputs: asv result files and sweep directories read as result sets, each
benchmark either measured or failed (with its status and reason), and the rule of which two sets
may be compared at all. The verdicts are in :mod:`kda_impls.regress`."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .bench.results import SweepDirError
from .bench.results import load as load_sweep_dir

# Benchmarks whose value is a rate (higher is better): the asv suite's bandwidth benchmarks. Their
# ratio is A/B, so that for every benchmark a ratio above 1 is a slowdown.
RATES = r"\.track_(gbps|roofline_frac)\b"
CPU_TIMER = "perf_counter"  # the harness's timer on a CPU: a sweep row's kernel_method, an asv version's suffix
UNSUPPORTED = "unsupported"  # a sweep row's status (and asv's skip) for a combination that cannot run here


@dataclass(frozen=True)
class Measurement:
    """One benchmark's result in one result set (seconds or any unit shared by both sets)."""

    time: float  # asv: its median of the samples; a sweep row: its kernel time (kernel_us_mean)
    samples: tuple[float, ...] | None = None
    spread: tuple[float, float] | None = None  # min and max of the per-placement medians
    ci99: tuple[float, float] | None = None  # asv's 99% confidence interval of the median
    version: str | None = None  # asv's benchmark version: results of different versions never compare
    timer: str | None = None  # a sweep row's kernel_method; asv: its version's suffix ("4.2+perf_counter" on a CPU)
    placements: tuple[float, ...] | None = None  # the per-placement medians (asv: the samples)
    rate: bool = False  # a bandwidth: higher is better


@dataclass(frozen=True)
class Failure:
    """A benchmark of a result set that has no measurement: a sweep row's status (wrong, error,
    crashed, unsupported) and reason, or asv's failed (null) or skipped (NaN) result."""

    status: str
    reason: str


@dataclass(frozen=True)
class ResultSet:
    source: str
    kind: str  # "asv" or "sweep"
    machine: str | None
    measurements: dict[str, Measurement]
    method: dict | None = None  # a sweep's timing method (L2 entry state, budgets)
    failures: dict[str, Failure] = field(default_factory=dict)


class InputError(ValueError):
    """A result set that cannot be read or compared."""


ASV_FAILED = Failure("failed", "asv recorded no result: setup or the benchmark raised (asv run --show-stderr says why)")
ASV_SKIPPED = Failure(UNSUPPORTED, "asv skipped it: setup raised NotImplementedError (unsupported here)")


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def load_asv(path: Path) -> ResultSet:
    """Read an asv (API version 2) result file.

    Each benchmark row is a list aligned with ``result_columns``; a parametrised benchmark's
    ``result``/``samples``/``stats_*`` are lists over ``itertools.product(*params)`` (params
    stored as reprs), ``null`` where it failed, ``NaN`` where it was skipped; an unparametrised
    benchmark has lists of one. A whole column is ``null`` (or the row is cut short) when nothing
    in it was recorded, e.g. ``samples`` without ``--record-samples``. The suite's samples are
    one median per placement, so their range is the placement spread. A version's suffix after
    ``+`` names the timer (benchmarks/common.py: ``perf_counter`` on a CPU).
    """
    try:
        data = json.loads(path.read_text())
        columns = data["result_columns"]
        rows = data["results"]
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON, empty or cut short ({exc})") from None
    except (KeyError, TypeError) as exc:
        raise InputError(f"{path}: not an asv result file (no {exc})") from None
    measurements, failures = {}, {}
    for bench, row in rows.items():
        field_of = dict(itertools.zip_longest(columns, row))
        params = field_of["params"] or []
        names = [bench] if not params else [f"{bench}({', '.join(combo)})" for combo in itertools.product(*params)]
        rate = re.search(RATES, bench) is not None

        results, samples, lo, hi, repeat = (
            field_of.get(key) or [None] * len(names)
            for key in ("result", "samples", "stats_ci_99_a", "stats_ci_99_b", "stats_repeat"))
        for name, median, s, a, b, n in zip(names, results, samples, lo, hi, repeat, strict=False):
            if not _finite(median):
                failures[name] = ASV_FAILED if median is None else ASV_SKIPPED
                continue
            kept = tuple(x for x in s if _finite(x)) if s else ()
            # a single sample's "interval" is a posterior guess, not a measurement of spread
            ci = (a, b) if _finite(a) and _finite(b) and (n or 0) > 1 else None
            spread = (min(kept), max(kept)) if len(kept) > 1 else None
            measurements[name] = Measurement(float(median), kept or None, spread, ci, field_of["version"],
                                             timer=str(field_of["version"]).partition("+")[2] or None,
                                             placements=kept or None, rate=rate)
    return ResultSet(str(path), "asv", data.get("params", {}).get("machine"), measurements, failures=failures)


# What the gate reads of a sweep's results.csv besides the key, status and kernel time
SWEEP_COLUMNS = ("reason", "kernel_method", "kernel_us_placement_min", "kernel_us_placement_max")


def load_sweep(directory: Path) -> ResultSet:
    """Read a sweep directory (:func:`kda_impls.bench.results.load`): per ok row its key, kernel
    time, timer and placement spread, with the raw kernel samples and the per-placement medians in
    microseconds; per other row its status and reason."""
    try:
        sweep = load_sweep_dir(directory)
    except SweepDirError as exc:
        raise InputError(str(exc)) from None
    lacking = [column for column in SWEEP_COLUMNS if column not in sweep.table.columns]
    if lacking:
        raise InputError(f"{directory / 'results.csv'}: no column {', '.join(lacking)} (an older kda-sweep's "
                         f"results); re-run the sweep")
    measurements = {}
    for row in sweep.ok.itertuples(index=False):
        kept = tuple(x for x in sweep.samples.get(row.key, ()) if _finite(x))
        spread = (row.kernel_us_placement_min, row.kernel_us_placement_max) \
            if _finite(row.kernel_us_placement_min) else None
        placed = tuple(x for x in sweep.placements.get(row.key, ()) if _finite(x))
        measurements[row.key] = Measurement(float(row.kernel_us_mean), kept or None, spread,
                                            timer=row.kernel_method, placements=placed or None)
    failures = {}
    for row in sweep.table[~sweep.table.key.isin(measurements)].itertuples(index=False):
        reason = row.reason if isinstance(row.reason, str) and row.reason else "no reason recorded"
        failures[row.key] = Failure(str(row.status), reason if row.status != "ok" else "ok but no kernel time")
    return ResultSet(str(directory), "sweep", sweep.meta.get("gpu"), measurements,
                     sweep.meta.get("settings", {}).get("method"), failures)


def load(path: str | Path) -> ResultSet:
    path = Path(path)
    if path.is_dir():
        return load_sweep(path)
    if path.is_file():
        return load_asv(path)
    raise InputError(f"{path}: no such file or directory")


# What a sweep's timing method records that decides whether two sweeps compare: a different
# timer, L2 entry state, or way of making and settling placements moves times by itself.
METHOD_FIELDS = {
    "version": ("were timed by different timing methods", "re-run the older one"),
    "entry": ("were timed from different L2 entry states", "re-run one with the other's --l2-entry"),
    "placement_processes": ("made their placements differently", "re-run one with the other's setting"),
    "settle_s": ("made their placements differently", "re-run one with the other's setting"),
}


def check_comparable(a: ResultSet, b: ResultSet) -> None:
    if a.kind != b.kind:
        raise InputError(f"cannot compare an {a.kind} result set with a {b.kind} one")
    if a.machine and b.machine and a.machine != b.machine:
        raise InputError(f"results come from different machines ({a.machine!r} vs {b.machine!r}); "
                         f"timings are only comparable on one machine")
    if a.kind == "sweep":
        for name, (what, fix) in METHOD_FIELDS.items():
            value_a, value_b = ((s.method or {}).get(name) for s in (a, b))
            if value_a != value_b:
                raise InputError(f"the sweeps {what} ({name}: {value_a!r} vs {value_b!r}); {fix}")
