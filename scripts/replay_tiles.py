#!/usr/bin/env python3
"""Our kernel's replay tiles timed on a GPU, one sweep per tile, every row in one table.
The logic and its documentation: kda_impls/tools/replay_tiles.py."""

from kda_impls.tools.replay_tiles import main

if __name__ == "__main__":
    raise SystemExit(main())
