#!/usr/bin/env python3
"""A speculative step done both ways, from a sweep directory, as ``kda-spec-step`` prints it; see
kda_impls/bench/spec_step.py."""

from kda_impls.bench.spec_step import main

if __name__ == "__main__":
    main()
