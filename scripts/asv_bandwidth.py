#!/usr/bin/env python3
"""The asv suite's bandwidth of our kernel at B = 256 beside a sweep's GB/s at the same points, on a
GPU box; the logic and its documentation are in kda_impls/asv_bandwidth.py.

    python3 scripts/asv_bandwidth.py OUT [--impl triton] [--sweep DIR]
"""

import sys

from kda_impls.asv_bandwidth import main

if __name__ == "__main__":
    sys.exit(main())
