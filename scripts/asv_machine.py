#!/usr/bin/env python3
"""Register this GPU box with asv and print its machine name (the only line on stdout); the logic
and its documentation are in kda_impls/asv_machine.py.

    MACHINE=$(python3 scripts/asv_machine.py [--suffix POOL])
"""

import sys

from kda_impls.asv_machine import main

if __name__ == "__main__":
    sys.exit(main())
