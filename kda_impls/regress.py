"""The performance regression gate: compare two result sets from one machine; fail on a slowdown
or on anything that is not a clean comparison.

A result set is either an asv result file (``<results_dir>/<machine>/<commit>-<env>.json``, run
with ``--record-samples`` so the samples are there; the suite's samples are one median per
placement) or a sweep directory (``results.csv`` with the placement spread of each row,
``samples.json`` with the raw samples, ``placements.json`` with the per-placement medians); both
are read by :mod:`kda_impls.regress_load`. Each benchmark (each parameter combination) gets one
verdict. Its ratio is how many times slower B is: B/A of a time, A/B of a bandwidth (the asv
suite's ``track_gbps`` and ``track_roofline_frac``), so that a bandwidth drop is ``slower``.

* **broken**: B has no result where a bug is the likely cause: a sweep row wrong, error or crashed,
  an asv benchmark that failed (its result null), or a combination unsupported in B (asv: skipped,
  NaN) that A ran. A broken kernel has no timing to compare, so it must not drop out of the
  comparison: the row's reason goes into the table.
* **missing**: in A, absent from B (a smaller grid, a deleted benchmark, a run cut short).
* **same**: the ratio is within [1/(1+t), 1+t] for threshold t, with enough samples on both sides
  to have told a difference;
* **slower** / **faster**: it moved by more than the threshold, a two-sided Mann-Whitney U test on
  the samples gives ``p < alpha``, and the placements do not explain the move: where each side has
  enough per-placement medians for a test (more than three against three; a row that spread or
  whose step exceeds the L2 gets 27), the same test on them gives ``p < alpha``; else the two
  sides' placement spreads (min..max of the per-placement medians) overlap by no more than the
  threshold (as a share of A's value);
* **unsure**: the samples cannot support the test (too few for any ``p < alpha``: a one- or
  two-sample CPU row, say), or the move is beyond the threshold but not significant, or the
  placements could explain it (per-placement medians not apart, or, with too few of them, placement
  spreads that overlap by more than the threshold). One outlier placement widens a range but barely
  moves a rank test: a planted 5.3% slowdown whose pool, on both sides, put one placement in nine
  about 10% slow was unsure by the ranges (results/h200/gate-validation/planted/gate-a1-slow-y.txt).
  A sweep row timed on the CPU is always unsure: CPU times move with the
  machine's load, and the harness times the CPU to smoke-test itself, not to rank kernels.
* **new** (measured in B only), **skipped** (unsupported in B, not measured in A), **incomparable**
  (another asv benchmark version), **informational** (a benchmark only reported).

A large ratio on noise is not a regression, and neither is a significant but small shift, nor one
that the placements alone produce. **broken**, **slower** and **missing** fail the gate (exit 1;
``--allow-missing`` passes missing ones, never broken ones); **unsure** is listed and fails it only
with ``--strict``. Benchmarks whose name matches a pattern of ``thresholds`` use that pattern's
threshold, or are only reported (``informational``) where it is None; B = 1 kernel time and
bandwidth are gated at 10% (one-row steps move by up to 6% between processes:
:data:`DEFAULT_THRESHOLDS`). Host-inclusive call latency moves by more than any useful threshold
between two asv runs of one commit (Python, process start, CPU clocks on a VM;
results/h200/gate-validation/asv), so call-time benchmarks are informational by
:data:`DEFAULT_THRESHOLDS`. Without samples, asv's 99% confidence intervals of the median stand in
for the test (non-overlapping intervals: significant). :func:`asv_regression_settings` puts the
same table into asv.conf.json for asv's Regressions page.

``asv compare`` prints the same kind of table but always exits 0, and ``asv continuous`` cannot run
against an existing environment (asv 0.6.6): hence this module. ``kda-regress`` (or
``scripts/regress.py``) runs :func:`main`: exit 1 when the gate fails, 0 otherwise, 2 on unusable
input.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
from scipy.special import comb
from scipy.stats import mannwhitneyu

from . import repro
from .cli import Parser
from .regress_load import RATES, UNSUPPORTED, Failure, InputError, Measurement, ResultSet, check_comparable, load

__all__ = ["Failure", "InputError", "Measurement", "ResultSet", "check_comparable", "compare", "load", "main",
           "verdict"]

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
# regex (searched in the benchmark name) -> threshold, None: reported, never gated. Two A/A
# validations on the H200 (results/h200/gate-validation/asv) kept every kernel time within 1% while call
# times moved by a factor of up to 1.6 in the first and up to 1.9 in the second.
# A one-row step (B = 1, 2-15 us) moves between processes by more than 5% with nothing changed: in
# three `published` runs FlashInfer's dense call took 6.99, 7.03 and 7.40 us (5.9%, every placement
# of the slowest above the other two's) and in three of timing method 2 FlashInfer moved by 5.8%,
# while every row at B >= 16 stayed within 5.3% (results/h200/gate-validation/sweep/spread.csv,
# docs/timing.md). So B = 1 kernel time is gated at 10%: what two runs of one commit can tell apart;
# and its bandwidth, the same measurement as a rate, with it.
DEFAULT_THRESHOLDS: dict[str, float | None] = {
    r"CallTime|track_call": None,
    r"_B1_|track_(kernel|gbps|roofline_frac)\('[^']*', 1[,)]": 0.10}

# A sweep row's kernel_method on the CPU: times there move with whatever else the machine runs
# (a back-to-back pair of CPU sweeps on a busy 2-core box differed 2x), so they are never judged.
CPU_TIMER = "perf_counter"

# Order of the table: what needs attention first. broken, slower and missing fail the gate.
STATUSES = ("broken", "slower", "missing", "unsure", "faster", "incomparable", "new", "skipped", "informational",
            "same")


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


def slowdown(a: Measurement, b: Measurement) -> float:
    """How many times slower B is than A: B/A of a time, A/B of a rate (a bandwidth)."""
    return a.time / b.time if a.rate else b.time / a.time


def verdict(a: Measurement, b: Measurement, threshold: float, alpha: float) -> tuple[str, float | None, str]:
    """(same | slower | faster | unsure, p, how it was decided) for B against A: see the module."""
    ratio = slowdown(a, b)
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


def _unmeasured(name: str, a: ResultSet, b: ResultSet) -> tuple[str, str | None] | None:
    """(status, reason) of a benchmark that B did not measure; None where B did."""
    failure = b.failures.get(name)
    if failure is None:
        return None if name in b.measurements else ("missing", "absent from B")
    reason = f"{failure.status}: {failure.reason}"
    if failure.status != UNSUPPORTED:  # wrong, error, crashed, failed: broken, whatever A was
        return "broken", reason
    return ("broken", f"{reason} (A ran it)") if name in a.measurements else ("skipped", reason)


def compare(a: ResultSet, b: ResultSet, threshold: float = DEFAULT_THRESHOLD,
            alpha: float = DEFAULT_ALPHA, thresholds: dict[str, float | None] | None = None) -> pd.DataFrame:
    """One row per benchmark in either set: status, ratio (:func:`slowdown`), p and the inputs."""
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    rows = []
    for name in sorted(set(a.measurements) | set(a.failures) | set(b.measurements) | set(b.failures)):
        ma, mb = a.measurements.get(name), b.measurements.get(name)
        limit = threshold_for(name, threshold, thresholds)
        row = dict(benchmark=name, time_a=ma and ma.time, time_b=mb and mb.time,
                   n_a=len(ma.samples) if ma and ma.samples else 0,
                   n_b=len(mb.samples) if mb and mb.samples else 0, ratio=None, p=None, test=None,
                   threshold=limit)
        unmeasured = _unmeasured(name, a, b)
        if unmeasured:
            row["status"], row["test"] = unmeasured
        elif ma is None:
            row["status"] = "new"
            if name in a.failures:
                row["test"] = f"A: {a.failures[name].status}"
        elif ma.version != mb.version:
            row["status"] = "incomparable"  # the timing method changed in between
            row["test"] = f"version {ma.version} != {mb.version}"
        else:
            status, p, test = verdict(ma, mb, DEFAULT_THRESHOLD if limit is None else limit, alpha)
            row.update(status="informational" if limit is None else status, ratio=slowdown(ma, mb), p=p, test=test)
        rows.append(row)
    columns = ["benchmark", "status", "ratio", "threshold", "p", "time_a", "time_b", "n_a", "n_b", "test"]
    table = pd.DataFrame(rows, columns=columns)
    table["status"] = pd.Categorical(table["status"], categories=STATUSES, ordered=True)
    return table.sort_values(["status", "ratio"], ascending=[True, False], na_position="last",
                             ignore_index=True)


def asv_regression_settings(thresholds: dict[str, float | None] = DEFAULT_THRESHOLDS,
                            threshold: float = DEFAULT_THRESHOLD) -> dict[str, dict]:
    """The gate's thresholds as asv.conf.json's ``regressions_thresholds`` and
    ``regressions_first_commits``, for asv publish's Regressions page. asv matches its patterns at
    the start of a name and takes the largest threshold of those that match: each pattern is
    prefixed with ``.*``, and every rule's threshold is at least the default. A pattern the gate only
    reports (None) and the rates get no regression detection (a null first commit): asv flags a rise
    as a regression, where a bandwidth's regression is a drop, which the kernel time of the same
    measurement shows as a rise."""
    gated = {f".*({pattern})": value for pattern, value in thresholds.items() if value is not None}
    if any(value < threshold for value in gated.values()):
        raise ValueError("asv takes the largest matching threshold: no rule may be below the default")
    off = [f".*({pattern})" for pattern, value in thresholds.items() if value is None] + [f".*{RATES}"]
    return {"regressions_thresholds": {".*": threshold, **gated}, "regressions_first_commits": dict.fromkeys(off)}


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
Verdict per benchmark (B against A; t = its threshold; ratio = how many times slower B is:
time B/A, bandwidth A/B):
  broken   B has no result where a bug is the likely cause: a sweep row wrong, error or
           crashed, asv's benchmark failed; or unsupported (asv: skipped) where A ran it.
           The row's reason is in the test column
  slower   ratio > 1+t, Mann-Whitney U (two-sided) p < alpha, and the placements apart:
           the same test on the per-placement medians p < alpha where both sides have more
           than three, else their spreads (min..max) overlap by <= t of A's time
  missing  in A, absent from B (a smaller grid, a deleted benchmark, a run cut short)
  unsure   too few samples for any p < alpha; or beyond t but not significant; or the
           placements not apart by that rule (placement could explain the move);
           or a sweep row timed on the CPU (the harness smoke-tests the CPU, never ranks it)
  faster   ratio < 1/(1+t), significant and the placements apart, as for slower
  same     ratio within [1/(1+t), 1+t], with samples enough for the test
  new / skipped  measured only in B / unsupported in B and not measured in A
  incomparable   timed by another benchmark version (asv)
  informational  benchmarks whose threshold is 'none' (call latency by default)
Two sweeps of different timing methods, L2 entry states, placement processes or settle
times are refused (exit 2).
Thresholds: --threshold for every benchmark that no rule names; the default rules gate
B = 1 kernel time and bandwidth at 0.10 (one-row steps move by up to 6% between two runs
of one commit) and only report call latency; --threshold-for rules replace them.
Exit status: 1 if any benchmark is broken, slower or missing (missing allowed with
--allow-missing; unsure failing too with --strict), 2 on unusable input, 0 otherwise.
Without samples, asv's 99% intervals stand in for the test."""


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
    parser.add_argument("--allow-missing", action="store_true",
                        help="pass benchmarks absent from B (a deliberate change of the benchmark set); "
                             "broken ones fail whatever is allowed")
    parser.add_argument("--json", metavar="PATH", help="also write the comparison as JSON here")
    parser.add_argument("--repro", action="store_true", help="print the command that reproduces each line")
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
    listed = {status: table.loc[table["status"] == status, "benchmark"].tolist()
              for status in ("broken", "slower", "missing", "unsure")}

    print(f"A: {a.source}\nB: {b.source}\nslower: time B/A (bandwidth A/B) > 1 + threshold (default "
          f"{args.threshold}, per benchmark in the threshold column), p < {args.alpha} (two-sided Mann-Whitney U) "
          f"and placements apart; broken: no result in B where a bug is the likely cause (the reason in 'test')\n")
    print(format_table(table) if len(table) else "(no benchmarks)")
    if args.repro:
        print(repro.gate_lines(table, args.a, args.b))
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if args.json:
        report = dict(a=a.source, b=b.source, threshold=args.threshold, alpha=args.alpha, strict=args.strict,
                      allow_missing=args.allow_missing,
                      thresholds=DEFAULT_THRESHOLDS if thresholds is None else thresholds,
                      counts={s: int(n) for s, n in counts.items()}, **listed,
                      rows=json.loads(table.astype({"status": str}).to_json(orient="records")))
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    failing = ["broken", "slower"] + ([] if args.allow_missing else ["missing"]) + (["unsure"] if args.strict else [])
    failed = [name for status in failing for name in listed[status]]
    if failed:
        counted = [f"{len(listed[s])} {s}" + (" (--strict)" if s == "unsure" else "") for s in failing if listed[s]]
        print(f"FAIL: {', '.join(counted)}: {', '.join(failed)}")
        return 1
    passed = [s for s in ("missing", "unsure") if listed[s] and s not in failing]  # missing here: allowed
    if passed:
        print(f"pass, with {' and '.join(f'{len(listed[s])} {s}' for s in passed)} (not gated: --strict gates unsure; "
              f"without --allow-missing missing fails): " + ", ".join(name for s in passed for name in listed[s]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
