#!/usr/bin/env python3
"""Prove the regression gate on a GPU box (A/A runs and a planted slowdown, asv and sweep forms); the
logic and its documentation are in kda_impls/validate_gate.py.

    python3 scripts/validate_gate.py planted
    python3 scripts/validate_gate.py asv OUT [--profile gate] [--impls triton,fla] [--max-runs N]
    python3 scripts/validate_gate.py sweep OUT A1 A2 A3 SLOW
"""

import sys

from kda_impls.validate_gate import main

if __name__ == "__main__":
    sys.exit(main())
