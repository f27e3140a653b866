#!/usr/bin/env python3
"""The perf regression gate's command line; the logic and its documentation are in
kda_impls/regress.py.

    python3 scripts/regress.py A.json B.json [--threshold 0.05] [--alpha 0.01] [--json out.json]
    python3 scripts/regress.py sweeps/main sweeps/pr

Exits 1 when B regressed against A, 0 otherwise, 2 on unusable input.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from kda_impls.regress import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
