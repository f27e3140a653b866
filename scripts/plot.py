#!/usr/bin/env python3
"""Charts of a sweep directory, as ``kda-plot`` draws them; see kda_impls/bench/plots.py."""

from kda_impls.bench.plots import main

if __name__ == "__main__":
    main()
