#!/usr/bin/env python3
"""Nsight Compute counters of our kernel beside a copy of the same bytes and FlashInfer's call.
The logic and its documentation: kda_impls/tools/ncu_profile.py."""

from kda_impls.tools.ncu_profile import main

if __name__ == "__main__":
    raise SystemExit(main())
