#!/usr/bin/env python3
"""Time our kernel's tile configs on this GPU, and write the tuning table from tune runs.
The logic and its documentation: kda_impls/tools/triton_tune.py."""

from kda_impls.tools.triton_tune import main

if __name__ == "__main__":
    raise SystemExit(main())
