"""The performance regression gate: compare two result sets from one machine, fail on a regression.

A result set is either an asv result file (``<results_dir>/<machine>/<commit>-<env>.json``, run
with ``--record-samples`` so the raw samples are there) or a sweep directory (``results.csv``
and ``samples.json``). Per benchmark (per parameter combination) the gate flags a regression
only when both hold:

* the median got slower by more than ``threshold`` (``median_b / median_a > 1 + threshold``), and
* the difference is statistically significant: a two-sided Mann-Whitney U test on the samples
  gives ``p < alpha``.

A large ratio on noise is not a regression, and neither is a significant but small shift.
Benchmarks whose name matches a pattern of ``thresholds`` use that pattern's threshold, or are
only reported (status "informational") where it is None. Host-inclusive call latency moves by
more than any useful threshold between two asv runs of one commit (Python, process start, CPU
clocks on a VM; results/h200/asv-validation), where the samples of one run cannot see it, so
call-time benchmarks are informational by :data:`DEFAULT_THRESHOLDS` unless told otherwise. Where
the samples cannot support the test (none recorded, or too few for any ``p`` below ``alpha``) it
falls back the way ``asv compare`` does: non-overlapping 99% confidence intervals of the median
when asv stored them, the ratio alone when there is nothing else.

``asv compare`` prints the same kind of table but always exits 0, and ``asv continuous`` cannot
run against an existing environment (asv 0.6.6): hence this module. ``python scripts/regress.py``
and ``python -m kda_impls.regress`` run :func:`main`; it exits 1 on any regression, 0 otherwise,
2 on unusable input.
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

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
# regex (searched in the benchmark name) -> threshold, None: reported, never gated. Two A/A
# validations on the H200 (results/h200/asv-validation) kept every kernel time within 1% while call
# times moved by a factor of up to 1.6 in the first and up to 1.9 in the second.
DEFAULT_THRESHOLDS: dict[str, float | None] = {r"CallTime|track_call": None}

# Order of the table: what needs attention first.
STATUSES = ("regressed", "improved", "incomparable", "new", "missing", "informational", "unchanged")


@dataclass(frozen=True)
class Measurement:
    """One benchmark's result in one result set (seconds or any unit shared by both sets)."""

    median: float
    samples: tuple[float, ...] | None = None
    ci99: tuple[float, float] | None = None  # asv's 99% confidence interval of the median
    version: str | None = None  # asv's benchmark version: results of different versions never compare


@dataclass(frozen=True)
class ResultSet:
    source: str
    kind: str  # "asv" or "sweep"
    machine: str | None
    measurements: dict[str, Measurement]


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
    in it was recorded, e.g. ``samples`` without ``--record-samples``.
    """
    data = json.loads(path.read_text())
    try:
        columns = data["result_columns"]
        rows = data["results"]
    except KeyError as exc:
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
            kept = tuple(x for x in s if _finite(x)) if s else None
            # a single sample's "interval" is a posterior guess, not a measurement of spread
            ci = (a, b) if _finite(a) and _finite(b) and (n or 0) > 1 else None
            measurements[name] = Measurement(float(median), kept or None, ci, field["version"])
    return ResultSet(str(path), "asv", data.get("params", {}).get("machine"), measurements)


def load_sweep(directory: Path) -> ResultSet:
    """Read a sweep directory (kda_impls.bench.results): ``results.csv`` with one row per
    configuration (``key``, ``status``, ``kernel_us_median``), ``samples.json`` with the raw kernel
    samples in microseconds by key, and ``meta.json`` naming the GPU. Only rows with status "ok"
    count: a wrong or failed row has no timing worth comparing."""
    table = pd.read_csv(directory / "results.csv")
    samples_path, meta_path = directory / "samples.json", directory / "meta.json"
    samples = json.loads(samples_path.read_text()) if samples_path.exists() else {}
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    measurements = {}
    for row in table[(table["status"] == "ok") & table["kernel_us_median"].notna()].itertuples(index=False):
        kept = tuple(x for x in samples.get(row.key, ()) if _finite(x))
        measurements[row.key] = Measurement(float(row.kernel_us_median), kept or None)
    return ResultSet(str(directory), "sweep", meta.get("gpu"), measurements)


def load(path: str | Path) -> ResultSet:
    path = Path(path)
    if path.is_dir():
        if not (path / "results.csv").exists():
            raise InputError(f"{path}: a sweep directory must contain results.csv")
        return load_sweep(path)
    if path.is_file():
        return load_asv(path)
    raise InputError(f"{path}: no such file or directory")


# ---- comparing -----------------------------------------------------------------------------------

def _significance(a: Measurement, b: Measurement, alpha: float) -> tuple[bool, float | None, str]:
    """(significant, p, test used) for the difference between ``a`` and ``b``."""
    if a.samples and b.samples:
        n, m = len(a.samples), len(b.samples)
        # the smallest two-sided p any ranking can give; below alpha or the test can never fire
        if 2 / comb(n + m, min(n, m)) < alpha:
            p = float(mannwhitneyu(a.samples, b.samples, alternative="two-sided").pvalue)
            return p < alpha, p, "mann-whitney"
    if a.ci99 and b.ci99:
        overlap = a.ci99[1] >= b.ci99[0] and a.ci99[0] <= b.ci99[1]
        return not overlap, None, "ci99-overlap"
    return True, None, "ratio-only"


def threshold_for(name: str, threshold: float, thresholds: dict[str, float | None]) -> float | None:
    """The first of ``thresholds`` whose regex occurs in ``name``, else ``threshold``; None: not gated."""
    return next((value for pattern, value in thresholds.items() if re.search(pattern, name)), threshold)


def compare(a: ResultSet, b: ResultSet, threshold: float = DEFAULT_THRESHOLD,
            alpha: float = DEFAULT_ALPHA, thresholds: dict[str, float | None] | None = None) -> pd.DataFrame:
    """One row per benchmark in either set: status, ratio (B/A medians), p and the inputs."""
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    rows = []
    for name in sorted(set(a.measurements) | set(b.measurements)):
        ma, mb = a.measurements.get(name), b.measurements.get(name)
        limit = threshold_for(name, threshold, thresholds)
        row = dict(benchmark=name, median_a=ma and ma.median, median_b=mb and mb.median,
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
            ratio = mb.median / ma.median
            significant, p, test = _significance(ma, mb, alpha)
            if limit is None:
                status = "informational"
            elif significant and ratio > 1 + limit:
                status = "regressed"
            elif significant and ratio < 1 / (1 + limit):
                status = "improved"
            else:
                status = "unchanged"
            row.update(status=status, ratio=ratio, p=p, test=test)
        rows.append(row)
    columns = ["benchmark", "status", "ratio", "threshold", "p", "median_a", "median_b", "n_a", "n_b", "test"]
    table = pd.DataFrame(rows, columns=columns)
    table["status"] = pd.Categorical(table["status"], categories=STATUSES, ordered=True)
    return table.sort_values(["status", "ratio"], ascending=[True, False], na_position="last",
                             ignore_index=True)


def check_comparable(a: ResultSet, b: ResultSet) -> None:
    if a.kind != b.kind:
        raise InputError(f"cannot compare an {a.kind} result set with a {b.kind} one")
    if a.machine and b.machine and a.machine != b.machine:
        raise InputError(f"results come from different machines ({a.machine!r} vs {b.machine!r}); "
                         f"timings are only comparable on one machine")


# ---- command line --------------------------------------------------------------------------------

def format_table(table: pd.DataFrame) -> str:
    shown = table.astype(object).where(table.notna(), "")
    shown["ratio"] = [f"{r:.3f}" if r != "" else "" for r in shown["ratio"]]
    shown["p"] = [f"{p:.1e}" if p != "" else "" for p in shown["p"]]
    for col in ("median_a", "median_b"):
        shown[col] = [f"{v:.4g}" if v != "" else "" for v in shown[col]]
    return shown.to_string(index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="regress.py",
        description="Fail (exit 1) when result set B is slower than A: median ratio B/A above "
                    "1+threshold and a significant Mann-Whitney U test. A and B are asv result "
                    "files (asv run --record-samples) or sweep directories, from one machine.")
    parser.add_argument("a", help="baseline: asv result .json or sweep directory")
    parser.add_argument("b", help="candidate: same kind as A")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="relative slowdown of the median that counts (default %(default)s)")
    parser.add_argument("--threshold-for", metavar="REGEX=VALUE", action="append", default=None,
                        help="threshold of benchmarks whose name matches REGEX, or 'none' to report them "
                             f"without gating (repeatable; replaces the default {DEFAULT_THRESHOLDS})")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="significance level of the Mann-Whitney U test (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the comparison as JSON here")
    args = parser.parse_args(argv)

    try:
        thresholds = None if args.threshold_for is None else {
            pattern: None if value.lower() == "none" else float(value)
            for pattern, _, value in (item.rpartition("=") for item in args.threshold_for)}
        a, b = load(args.a), load(args.b)
        check_comparable(a, b)
    except (InputError, OSError, ValueError) as exc:
        print(f"regress: {exc}", file=sys.stderr)
        return 2
    table = compare(a, b, args.threshold, args.alpha, thresholds)
    counts = table["status"].value_counts().reindex(STATUSES, fill_value=0)
    regressed = table.loc[table["status"] == "regressed", "benchmark"].tolist()

    print(f"A: {a.source}\nB: {b.source}\nregression: median B/A > 1 + threshold (default {args.threshold}, "
          f"per benchmark in the threshold column) and p < {args.alpha} (two-sided Mann-Whitney U)\n")
    print(format_table(table) if len(table) else "(no benchmarks)")
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if args.json:
        report = dict(a=a.source, b=b.source, threshold=args.threshold, alpha=args.alpha,
                      thresholds=DEFAULT_THRESHOLDS if thresholds is None else thresholds,
                      counts={s: int(n) for s, n in counts.items()}, regressed=regressed,
                      rows=json.loads(table.astype({"status": str}).to_json(orient="records")))
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if regressed:
        print(f"FAIL: {len(regressed)} regressed: " + ", ".join(regressed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
