"""Statistics the harness, the gate and the reports share, each defined once."""

from __future__ import annotations

import numpy as np


def spread(values) -> float:
    """How far apart ``values`` (positive times) lie: max / min - 1 (0 when all are equal); inf
    when the smallest is not positive. Takes a list, a numpy array or a pandas Series."""
    values = np.asarray(values, dtype=float)
    low = values.min()
    return float(values.max() / low - 1) if low > 0 else float("inf")
