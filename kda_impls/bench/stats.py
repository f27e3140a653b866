"""Statistics the harness, the gate and the reports share, each defined once."""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

import numpy as np


def spread(values) -> float:
    """How far apart ``values`` (positive times) lie: max / min - 1 (0 when all are equal); inf
    when the smallest is not positive. Takes a list, a numpy array or a pandas Series."""
    values = np.asarray(values, dtype=float)
    low = values.min()
    return float(values.max() / low - 1) if low > 0 else float("inf")


def median_ci(samples, confidence: float) -> tuple[float, float]:
    """The distribution-free confidence interval of the samples' median from their order statistics,
    as ``scipy.stats.quantile_test(samples, p=0.5).confidence_interval(confidence)`` gives it (NaN for a
    bound the samples are too few to reach): the ranks come from the binomial CDF, summed exactly in
    integers, because importing scipy.stats costs every process that times a second."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    tail = (1 - confidence) / 2
    low, high = _binomial_half_ppf(n, tail) - 1, _binomial_half_ppf(n, 1.0 - tail)
    return (float(x[low]) if low >= 0 else math.nan), (float(x[high]) if high < n else math.nan)


@functools.lru_cache(maxsize=256)
def _binomial_half_ppf(n: int, q: float) -> int:
    """The smallest k whose Binomial(n, 1/2) CDF reaches q (scipy's ppf of a discrete distribution)."""
    counts = itertools.accumulate(math.comb(n, k) for k in range(n + 1))  # 2^n * CDF(k), k = 0..n
    return next(k for k, count in enumerate(counts) if count >= Fraction(q) * 2**n)
