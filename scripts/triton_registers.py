#!/usr/bin/env python3
"""Registers, spills and SASS counts of our kernel per tile config, compiled for sm_90 (no GPU).
The logic and its documentation: kda_impls/tools/triton_registers.py."""

import os

if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # before the kernels are defined: compile, not interpret
    from kda_impls.tools.triton_registers import main

    raise SystemExit(main())
