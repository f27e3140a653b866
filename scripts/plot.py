#!/usr/bin/env python3
"""Charts of a sweep directory (PNG and SVG beside its results.csv); see kda_impls/bench/plots.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout runs without `pip install -e .`

from kda_impls.bench.plots import main  # noqa: E402

if __name__ == "__main__":
    main()
