#!/usr/bin/env python3
"""What the memory system gives a decode step's state traffic without its math.
The logic and its documentation: kda_impls/tools/memory_ceiling.py."""

from kda_impls.tools.memory_ceiling import main

if __name__ == "__main__":
    raise SystemExit(main())
