"""The performance regression gate: compare two result sets from one machine; fail on a slowdown.

A result set is either an asv result file (``<results_dir>/<machine>/<commit>-<env>.json``, run
with ``--record-samples`` so the samples are there; the suite's samples are one median per
placement) or a sweep directory (``results.csv`` with the placement spread of each row,
``samples.json`` with the raw samples, ``placements.json`` with the per-placement medians). Each
benchmark (each parameter combination) gets one verdict:

* **same**: the time (asv: its median; a sweep row: its kernel time) moved by no more than the
  threshold (B/A within [1/(1+t), 1+t]), with enough samples on both sides to have told a difference;
* **slower** / **faster**: it moved by more than the threshold, a two-sided Mann-Whitney U test on
  the samples gives ``p < alpha``, and the placements do not explain the move: where each side has
  enough per-placement medians for a test (more than three against three; a row that spread or
  whose step exceeds the L2 gets 27), the same test on them gives ``p < alpha``; else the two sides' placement spreads (min..max
  of the per-placement medians) overlap by no more than the threshold (as a share of A's time);
* **unsure**: the samples cannot support the test (too few for any ``p < alpha``: a one- or
  two-sample CPU row, say), or the move is beyond the threshold but not significant, or the
  placements could explain it (per-placement medians not apart, or, with too few of them, placement
  spreads that overlap by more than the threshold). One outlier placement widens a range but barely
  moves a rank test: a planted 5.3% slowdown whose pool, on both sides, put one placement in nine
  about 10% slow was unsure by the ranges (results/h200/gate-validation/planted/gate-a1-slow-y.txt; those runs predate
  placements.json).
  A sweep row timed on the CPU is always unsure: CPU times move with the machine's load, and the
  harness times the CPU to smoke-test itself, not to rank kernels.

A large ratio on noise is not a regression, and neither is a significant but small shift, nor one
that the placements alone produce. Only **slower** fails the gate (exit 1); **unsure** is listed and
fails it only with ``--strict``. Benchmarks whose name matches a pattern of ``thresholds`` use that
pattern's threshold, or are only reported (``informational``) where it is None; B = 1 kernel time is
gated at 10% (one-row steps move by up to 6% between processes: :data:`DEFAULT_THRESHOLDS`). Host-inclusive call
latency moves by more than any useful threshold between two asv runs of one commit (Python, process
start, CPU clocks on a VM; results/h200/asv-validation), so call-time benchmarks are informational by
:data:`DEFAULT_THRESHOLDS`. Without samples, asv's 99% confidence intervals of the median stand in
for the test (non-overlapping intervals: significant).

``asv compare`` prints the same kind of table but always exits 0, and ``asv continuous`` cannot run
against an existing environment (asv 0.6.6): hence this module. ``kda-regress`` (or
``scripts/regress.py``) runs :func:`main`: exit 1 on a slower benchmark (or, with ``--strict``, an
unsure one), 0 otherwise, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from scipy.special import comb
from scipy.stats import mannwhitneyu

from .bench.results import SweepDirError
from .bench.results import load as load_sweep_dir
from .cli import Parser

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
# regex (searched in the benchmark name) -> threshold, None: reported, never gated. Two A/A
# validations on the H200 (results/h200/asv-validation) kept every kernel time within 1% while call
# times moved by a factor of up to 1.6 in the first and up to 1.9 in the second.
# A one-row step (B = 1, 2-15 us) moves between processes by more than 5% with nothing changed: in
# the three `published` runs of 2026-11-30c FlashInfer's dense call took 6.99, 7.03 and 7.40 us
# (5.9%, every placement of the third run above the first two's) and in the three of method 2 FlashInfer
# moved by 5.8%, while every row at B >= 16 stayed within 5.3% (results/h200/gate-validation/sweep/spread.csv,
# docs/timing.md). So B = 1 kernel time is gated at 10%: what two runs of one commit can tell apart.
DEFAULT_THRESHOLDS: dict[str, float | None] = {r"CallTime|track_call": None,
                                               r"_B1_|track_kernel\('[^']*', 1[,)]": 0.10}

# A sweep row's kernel_method on the CPU: times there move with whatever else the machine runs
# (a back-to-back pair of CPU sweeps on a busy 2-core box differed 2x), so they are never judged.
CPU_TIMER = "perf_counter"

# Order of the table: what needs attention first.
STATUSES = ("slower", "unsure", "faster", "incomparable", "new", "missing", "informational", "same")


@dataclass(frozen=True)
class Measurement:
    """One benchmark's result in one result set (seconds or any unit shared by both sets)."""

    time: float  # asv: its median of the samples; a sweep row: its kernel time (kernel_us_mean)
    samples: tuple[float, ...] | None = None
    spread: tuple[float, float] | None = None  # min and max of the per-placement medians
    ci99: tuple[float, float] | None = None  # asv's 99% confidence interval of the median
    version: str | None = None  # asv's benchmark version: results of different versions never compare
    timer: str | None = None  # a sweep row's kernel_method; "perf_counter" on the CPU
    placements: tuple[float, ...] | None = None  # the per-placement medians (asv: the samples)


@dataclass(frozen=True)
class ResultSet:
    source: str
    kind: str  # "asv" or "sweep"
    machine: str | None
    measurements: dict[str, Measurement]
    method: dict | None = None  # a sweep's timing method (L2 entry state, budgets)


class InputError(ValueError):
    """A result set that cannot be read or compared."""


# ---- reading -------------------------------------------------------------------------------------

def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def load_asv(path: Path) -> ResultSet:
    """Read an asv (API version 2) result file.

    Each benchmark row is a list aligned with ``result_columns``; a parametrised benchmark's
    ``result``/``samples``/``stats_*`` are lists over ``itertools.product(*params)`` (params
    stored as reprs), ``null`` where it failed, ``NaN`` where it was skipped; an unparametrised
    benchmark has lists of one. A whole column is ``null`` (or the row is cut short) when nothing
    in it was recorded, e.g. ``samples`` without ``--record-samples``. The suite's samples are
    one median per placement, so their range is the placement spread.
    """
    try:
        data = json.loads(path.read_text())
        columns = data["result_columns"]
        rows = data["results"]
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON, empty or cut short ({exc})") from None
    except (KeyError, TypeError) as exc:
        raise InputError(f"{path}: not an asv result file (no {exc})") from None
    measurements = {}
    for bench, row in rows.items():
        field = dict(itertools.zip_longest(columns, row))
        params = field["params"] or []
        names = [bench] if not params else [f"{bench}({', '.join(combo)})" for combo in itertools.product(*params)]

        results, samples, lo, hi, repeat = (
            field.get(key) or [None] * len(names)
            for key in ("result", "samples", "stats_ci_99_a", "stats_ci_99_b", "stats_repeat"))
        for name, median, s, a, b, n in zip(names, results, samples, lo, hi, repeat):
            if not _finite(median):  # failed (None) or skipped (NaN): nothing to compare
                continue
            kept = tuple(x for x in s if _finite(x)) if s else ()
            # a single sample's "interval" is a posterior guess, not a measurement of spread
            ci = (a, b) if _finite(a) and _finite(b) and (n or 0) > 1 else None
            spread = (min(kept), max(kept)) if len(kept) > 1 else None
            measurements[name] = Measurement(float(median), kept or None, spread, ci, field["version"],
                                             placements=kept or None)
    return ResultSet(str(path), "asv", data.get("params", {}).get("machine"), measurements)


def load_sweep(directory: Path) -> ResultSet:
    """Read a sweep directory (:func:`kda_impls.bench.results.load`): per ok row its key, kernel
    time and placement spread, with the raw kernel samples and the per-placement medians (older
    directories have none) in microseconds. A wrong or failed row has no timing worth comparing."""
    try:
        sweep = load_sweep_dir(directory)
    except SweepDirError as exc:
        raise InputError(str(exc)) from None
    measurements = {}
    for row in sweep.ok.itertuples(index=False):
        kept = tuple(x for x in sweep.samples.get(row.key, ()) if _finite(x))
        spread = (row.kernel_us_placement_min, row.kernel_us_placement_max) \
            if _finite(getattr(row, "kernel_us_placement_min", None)) else None
        placed = tuple(x for x in sweep.placements.get(row.key, ()) if _finite(x))
        measurements[row.key] = Measurement(float(row.kernel_us_mean), kept or None, spread,
                                            timer=getattr(row, "kernel_method", None), placements=placed or None)
    return ResultSet(str(directory), "sweep", sweep.meta.get("gpu"), measurements,
                     sweep.meta.get("settings", {}).get("method"))


def load(path: str | Path) -> ResultSet:
    path = Path(path)
    if path.is_dir():
        return load_sweep(path)
    if path.is_file():
        return load_asv(path)
    raise InputError(f"{path}: no such file or directory")


# ---- comparing -----------------------------------------------------------------------------------

def _mann_whitney(x: tuple[float, ...] | None, y: tuple[float, ...] | None, alpha: float) -> float | None:
    """Two-sided Mann-Whitney U p of ``x`` against ``y``; None where either is empty or they are too
    few for any ranking to give p < alpha (the smallest p is 2 / C(n + m, n): 5 against 5 can decide,
    4 against 4 cannot)."""
    if not (x and y) or 2 / comb(len(x) + len(y), min(len(x), len(y))) >= alpha:
        return None
    return float(mannwhitneyu(x, y, alternative="two-sided").pvalue)


def _significance(a: Measurement, b: Measurement, alpha: float) -> tuple[bool | None, float | None, str]:
    """(significant, p, test used) for the difference between ``a`` and ``b``; significant is None
    when nothing available can support a test."""
    p = _mann_whitney(a.samples, b.samples, alpha)
    if p is not None:
        return p < alpha, p, "mann-whitney"
    if a.ci99 and b.ci99:
        overlap = a.ci99[1] >= b.ci99[0] and a.ci99[0] <= b.ci99[1]
        return not overlap, None, "ci99-overlap"
    n_a, n_b = (len(m.samples) if m.samples else 0 for m in (a, b))
    return None, None, f"too few samples ({n_a} vs {n_b})"


def spread_overlap(a: Measurement, b: Measurement) -> float:
    """How far the two placement spreads overlap, as a share of A's time (0 where they do not,
    or where either side has no spread)."""
    if not (a.spread and b.spread):
        return 0.0
    return max(0.0, min(a.spread[1], b.spread[1]) - max(a.spread[0], b.spread[0])) / a.time


def verdict(a: Measurement, b: Measurement, threshold: float, alpha: float) -> tuple[str, float | None, str]:
    """(same | slower | faster | unsure, p, how it was decided) for B against A: see the module."""
    ratio = b.time / a.time
    if CPU_TIMER in (a.timer, b.timer):
        return "unsure", None, "timed on the CPU, which the harness smoke-tests, not ranks"
    significant, p, test = _significance(a, b, alpha)
    if significant is None:
        return "unsure", p, test
    if 1 / (1 + threshold) <= ratio <= 1 + threshold:
        return "same", p, test
    if not significant:
        return "unsure", p, f"{test}: not significant"
    # Could where the pools landed explain the move? The placements themselves say so where there
    # are enough of them (placements added where a row spread: one outlier placement must not widen
    # the range over the move); else their ranges' overlap.
    p_placed = _mann_whitney(a.placements, b.placements, alpha)  # asv's: the test above again
    if p_placed is not None:
        if p_placed >= alpha:
            return "unsure", p, f"{test}; per-placement medians not apart (p = {p_placed:.2g})"
        return ("slower" if ratio > 1 else "faster"), p, test
    overlap = spread_overlap(a, b)
    if overlap > threshold:
        return "unsure", p, f"{test}; placement spreads overlap by {overlap:.1%}"
    return ("slower" if ratio > 1 else "faster"), p, test


def threshold_for(name: str, threshold: float, thresholds: dict[str, float | None]) -> float | None:
    """The first of ``thresholds`` whose regex occurs in ``name``, else ``threshold``; None: not gated."""
    return next((value for pattern, value in thresholds.items() if re.search(pattern, name)), threshold)


def compare(a: ResultSet, b: ResultSet, threshold: float = DEFAULT_THRESHOLD,
            alpha: float = DEFAULT_ALPHA, thresholds: dict[str, float | None] | None = None) -> pd.DataFrame:
    """One row per benchmark in either set: status, ratio (B/A times), p and the inputs."""
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    rows = []
    for name in sorted(set(a.measurements) | set(b.measurements)):
        ma, mb = a.measurements.get(name), b.measurements.get(name)
        limit = threshold_for(name, threshold, thresholds)
        row = dict(benchmark=name, time_a=ma and ma.time, time_b=mb and mb.time,
                   n_a=len(ma.samples) if ma and ma.samples else 0,
                   n_b=len(mb.samples) if mb and mb.samples else 0, ratio=None, p=None, test=None,
                   threshold=limit)
        if ma is None:
            row["status"] = "new"
        elif mb is None:
            row["status"] = "missing"
        elif ma.version != mb.version:
            row["status"] = "incomparable"  # the timing method changed in between
            row["test"] = f"version {ma.version} != {mb.version}"
        else:
            status, p, test = verdict(ma, mb, DEFAULT_THRESHOLD if limit is None else limit, alpha)
            row.update(status="informational" if limit is None else status, ratio=mb.time / ma.time, p=p,
                       test=test)
        rows.append(row)
    columns = ["benchmark", "status", "ratio", "threshold", "p", "time_a", "time_b", "n_a", "n_b", "test"]
    table = pd.DataFrame(rows, columns=columns)
    table["status"] = pd.Categorical(table["status"], categories=STATUSES, ordered=True)
    return table.sort_values(["status", "ratio"], ascending=[True, False], na_position="last",
                             ignore_index=True)


# Method settings besides the version and the entry state that change where placements land or what
# runs before them, each with the value a directory from before it existed was timed with: one
# process a row, no settling.
PLACEMENT_SETTINGS = {"placement_processes": 1, "settle_s": 0.0}


def check_comparable(a: ResultSet, b: ResultSet) -> None:
    if a.kind != b.kind:
        raise InputError(f"cannot compare an {a.kind} result set with a {b.kind} one")
    if a.machine and b.machine and a.machine != b.machine:
        raise InputError(f"results come from different machines ({a.machine!r} vs {b.machine!r}); "
                         f"timings are only comparable on one machine")
    if a.kind == "sweep":  # directories of timing method 3 and earlier do not say which they are
        version_a, version_b = ((s.method or {}).get("version", "<= 3") for s in (a, b))
        if version_a != version_b:
            raise InputError(f"the sweeps were timed by different timing methods ({version_a} vs {version_b}: "
                             f"kda_impls.bench.timing.METHOD_VERSION); re-run the older one")
        if a.method is not None and b.method is not None:
            for field, before in PLACEMENT_SETTINGS.items():
                value_a, value_b = a.method.get(field, before), b.method.get(field, before)
                if value_a != value_b:
                    raise InputError(f"the sweeps' placements were made differently ({field}: {value_a!r} vs "
                                     f"{value_b!r}); re-run one with the other's setting")
    entry_a, entry_b = ((s.method or {}).get("entry") for s in (a, b))
    if entry_a and entry_b and entry_a != entry_b:
        raise InputError(f"the sweeps were timed from different L2 entry states ({entry_a!r} vs {entry_b!r}); "
                         f"re-run one with --l2-entry {entry_a}")


# ---- command line --------------------------------------------------------------------------------

def format_table(table: pd.DataFrame) -> str:
    shown = table.astype(object).where(table.notna(), "")
    shown["ratio"] = [f"{r:.3f}" if r != "" else "" for r in shown["ratio"]]
    shown["p"] = [f"{p:.1e}" if p != "" else "" for p in shown["p"]]
    for col in ("time_a", "time_b"):
        shown[col] = [f"{v:.4g}" if v != "" else "" for v in shown[col]]
    return shown.to_string(index=False)


def _threshold_rule(text: str) -> tuple[str, float | None]:
    """``REGEX=VALUE`` (VALUE a number >= 0 or ``none``) from --threshold-for."""
    pattern, sep, value = text.rpartition("=")
    if not sep or not pattern:
        raise argparse.ArgumentTypeError(f"{text!r} is not REGEX=VALUE (e.g. 'CallTime=none' or 'fla=0.1')")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{pattern!r} is not a valid regular expression ({exc})") from None
    if value.lower() == "none":
        return pattern, None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not (math.isfinite(number) and number >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: the threshold must be a number >= 0 or 'none'")
    return pattern, number


HELP = """\
Verdict per benchmark (B against A; t = its threshold):
  same     time ratio B/A within [1/(1+t), 1+t], with samples enough for the test
           (time: asv's median; a sweep row's kernel time, kernel_us_mean)
  slower   ratio > 1+t, Mann-Whitney U (two-sided) p < alpha, and the placements apart:
           the same test on the per-placement medians p < alpha where both sides have more
           than three, else their spreads (min..max) overlap by <= t of A's time
  faster   the same with ratio < 1/(1+t)
  unsure   too few samples for any p < alpha; or beyond t but not significant; or the
           placements not apart by that rule (placement could explain the move);
           or a sweep row timed on the CPU (the harness smoke-tests the CPU, never ranks it)
  informational  benchmarks whose threshold is 'none' (call latency by default)
  new / missing / incomparable  in one set only, or timed by another method version
           (two sweeps of different timing methods, L2 entry states, placement processes
           or settle times are refused: exit 2)
Thresholds: --threshold for every benchmark that no rule names; the default rules gate
B = 1 kernel time at 0.10 (one-row steps move by up to 6% between two runs of one commit)
and only report call latency; --threshold-for rules replace them.
Exit status: 1 if any benchmark is slower (or unsure, with --strict), 2 on unusable
input, 0 otherwise. Without samples, asv's 99% intervals stand in for the test."""


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="kda-regress", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=HELP,
                    description="Compare result set B with A from the same machine and fail on a slowdown. "
                                "A and B are asv result files (asv run --record-samples) or sweep directories.")
    parser.add_argument("a", help="baseline: asv result .json or sweep directory")
    parser.add_argument("b", help="candidate: same kind as A")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="relative move of the time that counts, for benchmarks no --threshold-for "
                             "rule names (default %(default)s)")
    parser.add_argument("--threshold-for", metavar="REGEX=VALUE", action="append", type=_threshold_rule,
                        help="threshold of benchmarks whose name matches REGEX, or 'none' to report them "
                             f"without gating (repeatable; replaces the default {DEFAULT_THRESHOLDS})")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="significance level of the Mann-Whitney U test (default %(default)s)")
    parser.add_argument("--strict", action="store_true", help="fail on unsure benchmarks too")
    parser.add_argument("--json", metavar="PATH", help="also write the comparison as JSON here")
    args = parser.parse_args(argv)
    if not (args.threshold >= 0 and 0 < args.alpha < 1):
        parser.error(f"need --threshold >= 0 and 0 < --alpha < 1; got {args.threshold}, {args.alpha}")

    thresholds = None if args.threshold_for is None else dict(args.threshold_for)
    try:
        a, b = load(args.a), load(args.b)
        check_comparable(a, b)
    except (InputError, OSError) as exc:
        print(f"kda-regress: error: {exc}", file=sys.stderr)
        return 2
    table = compare(a, b, args.threshold, args.alpha, thresholds)
    counts = table["status"].value_counts().reindex(STATUSES, fill_value=0)
    slower = table.loc[table["status"] == "slower", "benchmark"].tolist()
    unsure = table.loc[table["status"] == "unsure", "benchmark"].tolist()

    print(f"A: {a.source}\nB: {b.source}\nslower: time B/A > 1 + threshold (default {args.threshold}, per benchmark "
          f"in the threshold column), p < {args.alpha} (two-sided Mann-Whitney U) and placements apart\n")
    print(format_table(table) if len(table) else "(no benchmarks)")
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if args.json:
        report = dict(a=a.source, b=b.source, threshold=args.threshold, alpha=args.alpha, strict=args.strict,
                      thresholds=DEFAULT_THRESHOLDS if thresholds is None else thresholds,
                      counts={s: int(n) for s, n in counts.items()}, slower=slower, unsure=unsure,
                      rows=json.loads(table.astype({"status": str}).to_json(orient="records")))
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    failed = slower + (unsure if args.strict else [])
    if failed:
        print(f"FAIL: {len(slower)} slower" + (f", {len(unsure)} unsure (--strict)" if args.strict else "") + ": "
              + ", ".join(failed))
        return 1
    if unsure:
        print(f"pass, with {len(unsure)} unsure (not gated; --strict gates them): " + ", ".join(unsure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
