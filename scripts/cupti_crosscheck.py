#!/usr/bin/env python3
"""A sweep's kernel times against a second clock (CUPTI kernel durations) on the same GPU.
The logic and its documentation: kda_impls/tools/cupti_crosscheck.py."""

from kda_impls.tools.cupti_crosscheck import main

if __name__ == "__main__":
    raise SystemExit(main())
