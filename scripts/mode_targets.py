#!/usr/bin/env python3
"""The decode modes' targets (frozen verify, replay) judged on a sweep directory.
The logic and its documentation: kda_impls/tools/mode_targets.py."""

from kda_impls.tools.mode_targets import main

if __name__ == "__main__":
    raise SystemExit(main())
