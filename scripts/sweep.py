#!/usr/bin/env python3
"""kda-sweep from a checkout: `python3 scripts/sweep.py --help` (kda_impls/bench/sweep.py)."""

if __name__ == "__main__":  # not on import: each worker process (multiprocessing "spawn") re-imports this file
    from kda_impls.bench.sweep import main

    main()
