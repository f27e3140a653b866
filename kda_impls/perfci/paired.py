"""The verdict of an A/B run, round by round. Each round measured both sides of a configuration one
after the other (A B, then B A), so a round's ratio head/base cancels whatever drifts slower than a
round: clocks, heat, a neighbour's load. The gate (:mod:`kda_impls.regress`) gives every benchmark its
threshold and its non-timing status (broken, missing, new, skipped) from the two sweep directories;
for a benchmark both sides timed, the timing verdict comes from the rounds:

* the ratio is the median of the per-round ratios, with its confidence interval at ``1 - alpha``
  (:func:`kda_impls.bench.stats.median_ci`);
* a sign test on the rounds (how many rounds head was slower in) decides significance; with too few
  rounds for any ``p < alpha`` (fewer than 8 at alpha 0.01) the benchmark is ``unsure``;
* ``same`` within ``[1/(1+t), 1+t]``; beyond it ``slower`` or ``faster`` where the sign test gives
  ``p < alpha``, else ``unsure``.

Only that statistic is this module's own: the statuses, the thresholds (a row timed on the CPU at
the CPU timer's noise floor, as in the unpaired gate) and which statuses fail are
:mod:`kda_impls.regress_rule`'s.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd

from .. import regress, regress_rule
from ..bench.stats import median_ci

TIMED = ("same", "slower", "faster", "unsure")  # the gate's statuses of a benchmark both sides measured
ROUNDS_FILE = "rounds.json"  # per benchmark, each side's kernel time (us) per round
SIDES = ("base", "head")


def sign_test(above: int, below: int) -> float:
    """Two-sided exact sign test: p of a split at least this uneven among ``above + below`` rounds."""
    n = above + below
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(above, below) + 1)) / 2**n
    return min(1.0, 2 * tail)


def min_rounds(alpha: float) -> int:
    """The fewest rounds whose sign test can give ``p < alpha``."""
    return next(n for n in range(1, 64) if 2 / 2**n < alpha)


def paired_verdict(base: list, head: list, threshold: float, alpha: float) -> dict:
    """status, ratio (median head/base over rounds), its confidence interval, p and how it was decided."""
    ratios = [h / b for b, h in zip(base, head, strict=True) if _finite(b) and _finite(h) and b > 0]
    if not ratios:
        return {"status": "unsure", "test": "no round timed both sides"}
    ratio = statistics.median(ratios)
    low, high = median_ci(ratios, 1 - alpha)
    above, below = sum(r > 1 for r in ratios), sum(r < 1 for r in ratios)
    p = sign_test(above, below)
    found = dict(ratio=ratio, ci_low=low, ci_high=high, p=p, rounds=len(ratios))
    test = f"sign test, {above} of {above + below} rounds slower"
    if len(ratios) < min_rounds(alpha):
        return found | {"status": "unsure", "test": f"too few rounds ({len(ratios)}) for p < {alpha}: "
                                                    f"--rounds {min_rounds(alpha)}"}
    if regress_rule.within(ratio, threshold):
        return found | {"status": "same", "test": test}
    if p >= alpha:
        return found | {"status": "unsure", "test": f"{test}: not significant"}
    return found | {"status": regress_rule.moved(ratio), "test": test}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def judge(out: Path, threshold: float = regress_rule.DEFAULT_THRESHOLD, alpha: float = regress_rule.DEFAULT_ALPHA,
          thresholds: dict | None = None) -> pd.DataFrame:
    """The verdict table of the A/B directory ``out`` (``base/``, ``head/``, :data:`ROUNDS_FILE`): the
    gate's columns, its statuses and thresholds, the timed benchmarks judged round by round.
    :class:`kda_impls.regress.InputError` where the directories cannot be compared."""
    a, b = regress.load(out / "base"), regress.load(out / "head")
    regress.check_comparable(a, b)
    table = regress.compare(a, b, threshold, alpha, thresholds).astype({"status": str})
    rounds = json.loads((out / ROUNDS_FILE).read_text())
    paired = []
    for row in table.to_dict("records"):
        if row["status"] in TIMED and row["benchmark"] in rounds:
            per_round = rounds[row["benchmark"]]
            row |= paired_verdict(per_round["base"], per_round["head"], row["threshold"], alpha)
        elif row["status"] == "informational" and row["benchmark"] in rounds:
            per_round = rounds[row["benchmark"]]
            found = paired_verdict(per_round["base"], per_round["head"], regress_rule.DEFAULT_THRESHOLD, alpha)
            row |= {k: v for k, v in found.items() if k not in ("status", "test")}
        paired.append(row)
    columns = [*table.columns, "ci_low", "ci_high", "rounds"]
    result = pd.DataFrame(paired, columns=columns)
    result["status"] = pd.Categorical(result["status"], categories=regress_rule.STATUSES, ordered=True)
    return result.sort_values(["status", "ratio"], ascending=[True, False], na_position="last", ignore_index=True)


def summary(table: pd.DataFrame, allow_missing: bool, allow_unsure: bool) -> tuple[int, str]:
    """(exit status, last line) by the gate's rule (:func:`kda_impls.regress_rule.outcome`)."""
    listed = {status: table.loc[table["status"] == status, "benchmark"].tolist() for status in regress_rule.FAILING}
    return regress_rule.outcome(listed, allow_missing, allow_unsure)


def format_paired(table: pd.DataFrame) -> str:
    """The table as the gate prints it, with the ratio's confidence interval over rounds."""
    shown = table.drop(columns=["ci_low", "ci_high", "rounds"])
    shown.insert(3, "ci", [f"{lo:.3f}..{hi:.3f}" if _finite(lo) and _finite(hi) else ""
                           for lo, hi in zip(table["ci_low"], table["ci_high"], strict=True)])
    return regress.format_table(shown)


def write_report(table: pd.DataFrame, path: Path, **settings) -> None:
    """The verdicts as JSON (the gate's --json form, with the paired columns)."""
    counts = table["status"].value_counts().reindex(regress_rule.STATUSES, fill_value=0)
    rows = json.loads(table.astype({"status": str}).to_json(orient="records"))
    path.write_text(json.dumps({**settings, "counts": {s: int(n) for s, n in counts.items()}, "rows": rows},
                               indent=1) + "\n")
