#!/usr/bin/env python3
"""Our kernel once per tile config on a padded pool with -1 rows, for compute-sanitizer.
The logic and its documentation: kda_impls/tools/sanitize_triton.py."""

import os

if __name__ == "__main__":
    # before torch starts: every tensor its own allocation, where memcheck sees an access past it
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    from kda_impls.tools.sanitize_triton import main

    raise SystemExit(main())
