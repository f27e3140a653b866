"""The regression gate's one rule: the verdict of one benchmark, B against A, from its samples.

Both forms of the gate (asv result files and sweep directories, :mod:`kda_impls.regress_load`) call
:func:`verdict` with the same kind of evidence, on any device: the samples, the per-placement
medians and their spread, asv's 99% intervals where there are no samples, and a threshold.

The threshold is the benchmark's (:func:`threshold_for`: by name, else ``--threshold``), raised to
the noise floor of the timer that measured it (:data:`TIMER_THRESHOLDS`): what two runs of one
commit on that device can tell apart. A CPU's times move with whatever else the machine runs, so a
CPU row is judged at 2 (three times slower), where a GPU's kernel time is judged at 5%.
"""

from __future__ import annotations

import argparse
import math
import re

from scipy.special import comb
from scipy.stats import mannwhitneyu

from .regress_load import CPU_TIMER, Measurement

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
# Every status a benchmark can get, in the order of the table: what needs attention first.
STATUSES = ("broken", "slower", "missing", "unsure", "faster", "incomparable", "new", "skipped", "informational",
            "same")
# The statuses that fail the gate; --allow-missing and --allow-unsure pass the last two, never the others.
FAILING = ("broken", "slower", "missing", "unsure")
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

# The timer of a measurement (a sweep row's kernel_method; an asv benchmark's version suffix) ->
# the smallest threshold its run-to-run noise allows. Back-to-back A/A pairs of CPU sweeps on a
# loaded 2-core machine differed by up to 2x; a planted 8x slowdown is far beyond that.
TIMER_THRESHOLDS = {CPU_TIMER: 2.0}


def threshold_for(name: str, threshold: float, thresholds: dict[str, float | None]) -> float | None:
    """The first of ``thresholds`` whose regex occurs in ``name``, else ``threshold``; None: not gated."""
    return next((value for pattern, value in thresholds.items() if re.search(pattern, name)), threshold)


def threshold_rule(text: str) -> tuple[str, float | None]:
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


def failing(allow_missing: bool, allow_unsure: bool) -> list[str]:
    """The statuses that fail the gate: broken and slower always, missing and unsure unless allowed."""
    allowed = {"missing": allow_missing, "unsure": allow_unsure}
    return [status for status in FAILING if not allowed.get(status)]


def outcome(listed: dict[str, list[str]], allow_missing: bool, allow_unsure: bool) -> tuple[int, str]:
    """(exit status, last line) of a gate whose benchmarks of each status are ``listed`` (status ->
    names): 1 and ``FAIL: ...`` where a failing status is present, else 0 and ``pass``, naming the
    benchmarks an --allow-* option passed."""
    fails = [status for status in failing(allow_missing, allow_unsure) if listed.get(status)]
    if fails:
        counted = ", ".join(f"{len(listed[s])} {s}" for s in fails)
        return 1, f"FAIL: {counted}: {', '.join(name for s in fails for name in listed[s])}"
    passed = [s for s in ("missing", "unsure") if listed.get(s)]
    if not passed:
        return 0, "pass"
    return 0, (f"pass, with {' and '.join(f'{len(listed[s])} {s}' for s in passed)} "
               f"({', '.join(f'--allow-{s}' for s in passed)}): " + ", ".join(n for s in passed for n in listed[s]))


def within(ratio: float, threshold: float) -> bool:
    """Whether ``ratio`` is within ``[1/(1+threshold), 1+threshold]``: no move the gate counts."""
    return 1 / (1 + threshold) <= ratio <= 1 + threshold


def moved(ratio: float) -> str:
    """The status of a significant move beyond the threshold: slower or faster."""
    return "slower" if ratio > 1 else "faster"


def noise_floor(a: Measurement, b: Measurement) -> float:
    """The smallest threshold the timers of ``a`` and ``b`` allow (0 for a GPU's)."""
    return max(TIMER_THRESHOLDS.get(m.timer, 0.0) for m in (a, b))


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
    return None, None, f"too few samples ({n_a} vs {n_b}) for any p < {alpha:g}"


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
    """(same | slower | faster | unsure, p, how it was decided) for B against A at ``threshold``:

    * same: the ratio within [1/(1+t), 1+t], with evidence enough for a test;
    * slower / faster: beyond it, significant (p < alpha), and the placements apart: the same test on
      the per-placement medians where each side has enough for one, else placement spreads that
      overlap by no more than t of A's time;
    * unsure: the evidence cannot support a test, or the move is not significant, or the placements
      could explain it. The reason is the third element.
    """
    ratio = slowdown(a, b)
    significant, p, test = _significance(a, b, alpha)
    if significant is None:
        return "unsure", p, test
    if within(ratio, threshold):
        return "same", p, test
    if not significant:
        return "unsure", p, f"{test}: not significant"
    # Could where the pools landed explain the move? The placements themselves say so where there
    # are enough of them (one outlier placement must not widen the range over the move); else their
    # ranges' overlap.
    p_placed = _mann_whitney(a.placements, b.placements, alpha)  # asv's: the test above again
    if p_placed is not None:
        if p_placed >= alpha:
            return "unsure", p, f"{test}; per-placement medians not apart (p = {p_placed:.2g})"
        return moved(ratio), p, test
    overlap = spread_overlap(a, b)
    if overlap > threshold:
        return "unsure", p, f"{test}; placement spreads overlap by {overlap:.1%}"
    return moved(ratio), p, test
