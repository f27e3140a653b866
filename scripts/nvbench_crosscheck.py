#!/usr/bin/env python3
"""Cross-check a sweep's kernel times with NVIDIA's nvbench (cuda-bench); see kda_impls/bench/nvbench_crosscheck.py.

    python3 scripts/nvbench_crosscheck.py SWEEP_DIR [SWEEP_DIR ...] --out DIR [--impls ...] [--B ...]
"""

import sys

from kda_impls.bench.nvbench_crosscheck import main

if __name__ == "__main__":
    sys.exit(main())
