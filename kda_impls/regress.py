"""The performance regression gate: compare two result sets from one machine; fail on a slowdown
or on anything that is not a clean comparison.

A result set is either an asv result file (``<results_dir>/<machine>/<commit>-<env>.json``, run
with ``--record-samples`` so the samples are there; the suite's samples are one median per
placement) or a sweep directory (``results.csv``, ``samples.json`` with the raw samples,
``placements.json`` with the per-placement medians); both are read by
:mod:`kda_impls.regress_load`. Each benchmark (each parameter combination) gets one verdict; the
measured ones get it from :func:`kda_impls.regress_rule.verdict`, the one rule of both forms on
every device. Its ratio is how many times slower B is: B/A of a time, A/B of a bandwidth (the asv
suite's ``track_gbps`` and ``track_roofline_frac``), so that a bandwidth drop is ``slower``.

* **broken**: B has no result where a bug is the likely cause: a sweep row wrong, error or crashed,
  an asv benchmark that failed (its result null), or a combination unsupported in B (asv: skipped,
  NaN) that A ran. The row's reason goes into the table.
* **slower** / **faster**: moved by more than the threshold, significantly, placements apart.
* **missing**: in A, absent from B (a smaller grid, a deleted benchmark, a run cut short).
* **unsure**: the samples cannot support a verdict (too few for any ``p < alpha``, a move that is
  not significant, or one the placements could explain): the reason is in the table.
* **same**: within the threshold, with evidence enough for a test.
* **new** (measured in B only), **skipped** (unsupported in B, not measured in A), **incomparable**
  (another asv benchmark version), **informational** (a benchmark only reported).

**broken**, **slower**, **missing** and **unsure** fail the gate (exit 1). ``--allow-missing``
passes missing ones (a deliberate change of the benchmark set) and ``--allow-unsure`` unsure ones
(samples known to be too few), never broken or slower ones. Without samples, asv's 99% confidence
intervals of the median stand in for the test. :func:`asv_regression_settings` puts the same
threshold table into asv.conf.json for asv's Regressions page.

``asv compare`` prints the same kind of table but always exits 0, and ``asv continuous`` cannot run
against an existing environment (asv 0.6.6): hence this module. ``kda-regress`` (or
``python3 -m kda_impls.regress``) runs :func:`main`:
exit 1 when the gate fails, 0 otherwise, 2 on unusable input (checked before anything is compared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

from . import repro
from .bench.results import atomic_write
from .cli import Parser
from .regress_load import RATES, UNSUPPORTED, Failure, InputError, Measurement, ResultSet, check_comparable, load
from .regress_rule import (
    CPU_TIMER,
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLDS,
    FAILING,
    STATUSES,
    TIMER_THRESHOLDS,
    noise_floor,
    outcome,
    slowdown,
    spread_overlap,
    threshold_for,
    threshold_rule,
    verdict,
)

__all__ = ["STATUSES", "Failure", "InputError", "Measurement", "ResultSet", "check_comparable", "compare", "load",
           "main", "spread_overlap", "threshold_for", "threshold_rule", "verdict"]


# ---- comparing -----------------------------------------------------------------------------------

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
        if limit is not None and ma and mb:
            limit = max(limit, noise_floor(ma, mb))
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


HELP = f"""\
Verdict per benchmark (B against A; t = its threshold; ratio = how many times slower B is:
time B/A, bandwidth A/B):
  broken   B has no result where a bug is the likely cause: a sweep row wrong, error or
           crashed, asv's benchmark failed; or unsupported (asv: skipped) where A ran it.
           The row's reason is in the test column
  slower   ratio > 1+t, Mann-Whitney U (two-sided) p < alpha, and the placements apart:
           the same test on the per-placement medians p < alpha where both sides have more
           than three, else their spreads (min..max) overlap by <= t of A's time
  missing  in A, absent from B (a smaller grid, a deleted benchmark, a run cut short)
  unsure   the samples cannot support a verdict: too few for any p < alpha; or beyond t
           but not significant; or the placements not apart by that rule (placement could
           explain the move). The reason is in the test column
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
A row timed on the CPU ({CPU_TIMER}) is judged at t >= {TIMER_THRESHOLDS[CPU_TIMER]:g}: CPU times of one
commit move by up to 2x between runs.
Exit status: 1 if any benchmark is broken, slower, missing or unsure (--allow-missing and
--allow-unsure pass those two), 2 on unusable input (nothing compared), 0 otherwise.
Without samples, asv's 99% intervals stand in for the test."""


def check_output_file(path: Path, option: str = "--json") -> None:
    """Raise :class:`InputError` unless ``path`` can be written as a file: not a directory, in an
    existing directory that takes new files, itself writable where it exists."""
    if path.is_dir():
        raise InputError(f"{option} {path} is a directory; name a file")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write in {path.parent} ({exc.strerror or exc}); "
                         f"name a file in a directory you can write to") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{option} {path}: not writable; name a file you can write")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="kda-regress", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=HELP,
                    description="Compare result set B with A from the same machine and fail on a slowdown. "
                                "A and B are asv result files (asv run --record-samples) or sweep directories.")
    parser.add_argument("a", help="baseline: asv result .json or sweep directory")
    parser.add_argument("b", help="candidate: same kind as A")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="relative move of the time that counts, for benchmarks no --threshold-for "
                             "rule names (default %(default)s)")
    parser.add_argument("--threshold-for", metavar="REGEX=VALUE", action="append", type=threshold_rule,
                        help="threshold of benchmarks whose name matches REGEX, or 'none' to report them "
                             f"without gating (repeatable; replaces the default {DEFAULT_THRESHOLDS})")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="significance level of the Mann-Whitney U test (default %(default)s)")
    parser.add_argument("--allow-unsure", action="store_true",
                        help="pass benchmarks whose samples cannot support a verdict (listed with the reason); "
                             "slower and broken ones fail whatever is allowed")
    parser.add_argument("--allow-missing", action="store_true",
                        help="pass benchmarks absent from B (a deliberate change of the benchmark set); "
                             "broken ones fail whatever is allowed")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the comparison as JSON here")
    parser.add_argument("--repro", action="store_true", help="print the command that reproduces each line")
    args = parser.parse_args(argv)
    if not (args.threshold >= 0 and 0 < args.alpha < 1):
        parser.error(f"need --threshold >= 0 and 0 < --alpha < 1; got {args.threshold}, {args.alpha}")

    thresholds = None if args.threshold_for is None else dict(args.threshold_for)
    try:
        if args.json:
            check_output_file(args.json)
        a, b = load(args.a), load(args.b)
        check_comparable(a, b)
    except (InputError, OSError) as exc:
        print(f"kda-regress: error: {exc}", file=sys.stderr)
        return 2
    table = compare(a, b, args.threshold, args.alpha, thresholds)
    counts = table["status"].value_counts().reindex(STATUSES, fill_value=0)
    listed = {status: table.loc[table["status"] == status, "benchmark"].tolist()
              for status in FAILING}

    print(f"A: {a.source}\nB: {b.source}\nslower: time B/A (bandwidth A/B) > 1 + threshold (default "
          f"{args.threshold}, per benchmark in the threshold column), p < {args.alpha} (two-sided Mann-Whitney U) "
          f"and placements apart; broken: no result in B where a bug is the likely cause; unsure: the samples "
          f"cannot support a verdict (the reason in 'test')\n")
    print(format_table(table) if len(table) else "(no benchmarks)")
    if args.repro:
        print(repro.gate_lines(table, args.a, args.b))
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if args.json:
        report = dict(a=a.source, b=b.source, threshold=args.threshold, alpha=args.alpha,
                      allow_unsure=args.allow_unsure, allow_missing=args.allow_missing,
                      thresholds=DEFAULT_THRESHOLDS if thresholds is None else thresholds,
                      counts={s: int(n) for s, n in counts.items()}, **listed,
                      rows=json.loads(table.astype({"status": str}).to_json(orient="records")))
        atomic_write(args.json, json.dumps(report, indent=1) + "\n")
    status, line = outcome(listed, args.allow_missing, args.allow_unsure)
    print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
