#!/usr/bin/env python3
"""Sweep KDA decode implementations over a preset; see kda_impls/bench/sweep.py and docs/results-format.md."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout runs without `pip install -e .`

if __name__ == "__main__":
    # imported here, not above: each worker process re-runs this file (multiprocessing "spawn") and
    # needs none of the driver's modules
    from kda_impls.bench.sweep import main

    main()
