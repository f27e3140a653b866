#!/usr/bin/env python3
"""The perf regression gate's command line (``kda-regress``); the logic and its documentation are in
kda_impls/regress.py.

    python3 scripts/regress.py A.json B.json [--threshold 0.05] [--alpha 0.01] [--json out.json]
    python3 scripts/regress.py sweeps/main sweeps/pr [--allow-missing]

Exits 1 when B is broken, slower or missing benchmarks against A, 0 otherwise, 2 on unusable input.
"""

import sys

from kda_impls.regress import main

if __name__ == "__main__":
    sys.exit(main())
