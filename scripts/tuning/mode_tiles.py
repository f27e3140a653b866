"""Our kernel's replay or frozen-verify tiles timed on a GPU: one sweep per tile (``KDA_TRITON_REPLAY_CONFIG``
or ``KDA_TRITON_FROZEN_CONFIG``, by ``--mode``), every row in one table.

    python3 -m scripts.tuning.mode_tiles --mode replay --out results/h200/replay-step-tiles \\
        --tiles "BV=16,num_warps=1" "BV=32,num_warps=2,terms_warps=8" \\
        -- --preset replay --impls triton --ring 16 --mode replay --B 64,256 --HV 32 --no-charts
    python3 -m scripts.tuning.mode_tiles --mode frozen --out DIR --tiles "BV=64,num_warps=4" "recurrence=1" \\
        -- --preset frozen-verify --impls triton --mode frozen --T 2,4,8 --B 16,64,256 --HV 32 --no-charts

Each tile's sweep (the arguments after ``--``, given to ``kda-sweep``) runs in a process of its own, as the
tile is read where a step is bound, into a temporary directory. OUT/tiles.csv holds every row with its
``tile`` first, sorted by point and time; OUT/meta.json each run's meta.json (its command, commit and
device) under its tile. A directory that already holds a tiles.csv is refused (exit 2), not overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from kda_impls.bench.config import CONFIG_COLUMNS
from kda_impls.bench.results import load, write_meta
from kda_impls.cli import fail
from kda_impls.impls.triton.frozen import FROZEN_CONFIG_ENV
from kda_impls.impls.triton.replay import REPLAY_CONFIG_ENV

PROG = "mode_tiles.py"
TILE_ENV = {"replay": REPLAY_CONFIG_ENV, "frozen": FROZEN_CONFIG_ENV}  # --mode: the variable a tile is
POINT = [c for c in CONFIG_COLUMNS if c not in ("impl", "placements")]  # what one row measures, the tile aside


def tile_table(runs: dict[str, Path]) -> tuple[pd.DataFrame, dict]:
    """(every row of the sweep directories ``runs`` (tile -> directory) with its ``tile`` first, sorted by
    point then kernel time; each directory's meta.json by tile)."""
    sweeps = {tile: load(path) for tile, path in runs.items()}
    table = pd.concat([s.table.assign(tile=tile) for tile, s in sweeps.items()], ignore_index=True)
    table = table[["tile", *(c for c in table.columns if c != "tile")]]
    point = [c for c in POINT if c in table]
    return table.sort_values([*point, "kernel_us_mean"], ignore_index=True), \
        {tile: s.meta for tile, s in sweeps.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, sweep_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for tiles.csv and meta.json")
    parser.add_argument("--mode", choices=TILE_ENV, required=True, help="the kernel whose tiles are timed")
    parser.add_argument("--tiles", nargs="+", required=True, help="values of the mode's variable, one per sweep")
    args = parser.parse_args(ours)
    env = TILE_ENV[args.mode]
    if (args.out / "tiles.csv").exists():
        fail(PROG, f"{args.out}/tiles.csv exists; expected a new directory (remove it to time the tiles again)")
    if "--out" in sweep_args:
        fail(PROG, "the sweep's --out is this tool's to choose; expected no --out after --, got one")
    with tempfile.TemporaryDirectory() as scratch:
        runs = {}
        for i, tile in enumerate(args.tiles):
            runs[tile] = Path(scratch) / str(i)
            command = [sys.executable, "-c", "from kda_impls.bench.sweep import main; main()", *sweep_args,
                       "--out", str(runs[tile])]
            done = subprocess.run(command, env={**os.environ, env: tile})
            if done.returncode:
                print(f"{PROG}: the sweep of tile {tile!r} exited {done.returncode}", file=sys.stderr)
                return done.returncode
        table, metas = tile_table(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "tiles.csv", index=False)
    write_meta(args.out, {"what": f"one sweep per tile ({env}), their rows in tiles.csv",
                          "command": " ".join([PROG, *argv]), "runs": metas})
    best = table.groupby([c for c in POINT if c in table], sort=False, dropna=False).head(1)
    print(json.dumps(best[["tile", *(c for c in POINT if c in best), "kernel_us_mean"]].to_dict("records"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
