#!/usr/bin/env python3
"""Our kernel's targets judged on a sweep directory, and the README's H200 table.
The logic and its documentation: kda_impls/tools/targets.py."""

from kda_impls.tools.targets import main

if __name__ == "__main__":
    raise SystemExit(main())
