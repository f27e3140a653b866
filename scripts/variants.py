#!/usr/bin/env python3
"""What each call variant of a library costs, from a sweep directory.
The logic and its documentation: kda_impls/tools/variants.py."""

from kda_impls.tools.variants import main

if __name__ == "__main__":
    raise SystemExit(main())
