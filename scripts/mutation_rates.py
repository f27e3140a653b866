#!/usr/bin/env python3
"""The mutation audit's survival rates by module, from mutmut's results.
The logic and its documentation: kda_impls/tools/mutation_rates.py."""

from kda_impls.tools.mutation_rates import main

if __name__ == "__main__":
    raise SystemExit(main())
