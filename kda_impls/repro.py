"""The one command that reproduces a sweep row or a gate line, built from the row's own settings: its
configuration's axes and pool layout, the directory's L2 entry state and placement processes, the
device, and the ``KDA_*`` variables it ran under. A gate line of two sweeps at known commits becomes a
``kda-ab`` of those commits at that one point (which measures both sides afresh, paired)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from . import dtypes
from .bench.config import AXES, Config

# axes that take their own option only where they mean something (Config's normalisation)
DEFAULT_AXES = {"checkpoints": "all", "mode": "inplace", "ring": 0, "slot_pad": 0, "pad_rows": 0, "T": 1}


def config_options(cfg: Config) -> list[str]:
    """The kda-sweep options that make ``cfg`` the one row of a grid."""
    options = ["--impls", cfg.impl]
    for axis in AXES:
        value = getattr(cfg, axis)
        if axis in DEFAULT_AXES and value == DEFAULT_AXES[axis]:
            continue
        shown = dtypes.short(value) if axis == "state_dtype" else value
        options += [f"--{axis.replace('_', '-')}", str(shown)]
    layout = cfg.layout
    return options + ["--slots-per-row", str(layout.slots_per_row), "--slot-order", layout.slot_order,
                      "--placements", str(layout.placements)]


def method_options(meta: dict) -> list[str]:
    """The timing settings of a sweep directory (meta.json) that change what a row measures."""
    method = meta.get("settings", {}).get("method", {})
    options = []
    if method.get("entry"):
        options += ["--l2-entry", method["entry"]]
    if method.get("placement_processes", 1) != 1:
        options += ["--placement-processes", str(method["placement_processes"])]
    return options


def command_line(meta: dict, words: list[str], row: dict) -> str:
    """``words`` on the row's device, as a shell line behind the ``KDA_*`` variables the run had."""
    device = row.get("device")
    words = words + (["--devices", device] if isinstance(device, str) else [])
    variables = [f"{name}={shlex.quote(value)}" for name, value in sorted(meta.get("environment", {}).items())
                 if name not in ("KDA_GIT_SHA", "KDA_GIT_DIRTY")]
    return " ".join([*variables, shlex.join(words)])


def sweep_command(row: dict, meta: dict) -> str:
    """``kda-sweep`` of one result row (a results.csv row as a dict) with its directory's settings."""
    return command_line(meta, ["kda-sweep", *config_options(Config.from_columns(row)), *method_options(meta)], row)


def ab_command(row: dict, meta_a: dict, meta_b: dict, rounds: int | None = None) -> str | None:
    """``kda-ab`` of one row's point at the two directories' commits; None where either commit is unknown
    or its tree differed from it."""
    shas = [meta.get("git", {}).get("sha") for meta in (meta_a, meta_b)]
    if not all(shas) or any(meta.get("git", {}).get("dirty") for meta in (meta_a, meta_b)):
        return None
    words = ["kda-ab", shas[0][:12], shas[1][:12], *config_options(Config.from_columns(row)), *method_options(meta_b)]
    return command_line(meta_b, words + (["--rounds", str(rounds)] if rounds else []), row)


def listing(found: list[tuple[str, str]]) -> str:
    """``name: command`` lines under a heading, as the tools print them."""
    return "\nreproduce (one command per line):\n" + "\n".join(f"{name}: {command}" for name, command in found)


def sweep_rows(table: pd.DataFrame, directory: str | Path) -> str:
    """The :func:`listing` of the rows of ``table`` from the sweep directory ``directory``."""
    from .bench.results import read_meta

    meta = read_meta(directory)
    return listing([(row["key"], sweep_command(row, meta)) for row in table.to_dict("records")])


def gate_lines(table: pd.DataFrame, a: str | Path, b: str | Path) -> str:
    """The :func:`listing` of a gate table over two sweep directories: per line ``kda-ab`` of its point
    where both commits are known, else the ``kda-sweep`` of B's row. Lines of asv result files get none
    (asv times a commit's whole suite: ``asv run`` of that commit)."""
    from .bench.results import SweepDirError, load

    try:
        sweeps = [load(a), load(b)]
    except SweepDirError:
        return listing([])
    rows = {row["key"]: row for sweep in sweeps for row in sweep.table.to_dict("records")}
    found = []
    for name in table["benchmark"]:
        if name in rows:
            command = ab_command(rows[name], sweeps[0].meta, sweeps[1].meta)
            found.append((name, command or sweep_command(rows[name], sweeps[1].meta)))
    return listing(found)
