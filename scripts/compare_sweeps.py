#!/usr/bin/env python3
"""Two sweep directories row by row: each row's move (B / A) and what the first calls took.
The logic and its documentation: kda_impls/tools/compare_sweeps.py."""

from kda_impls.tools.compare_sweeps import main

if __name__ == "__main__":
    raise SystemExit(main())
