#!/usr/bin/env python3
"""The GPU correctness grid: every implementation against the float64 reference on real shapes, in each mode.
The logic and its documentation: kda_impls/tools/gpu_correctness.py."""

import sys

from kda_impls.tools.gpu_correctness import main

if __name__ == "__main__":
    sys.exit(main())
