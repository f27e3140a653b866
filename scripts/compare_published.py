#!/usr/bin/env python3
"""Published timings against our sweeps: which reproduce, with which variant, under which pool layout.
The logic and its documentation: kda_impls/tools/compare_published.py."""

from kda_impls.tools.compare_published import main

if __name__ == "__main__":
    raise SystemExit(main())
