"""``kda_impls.sweep``: a sweep run from a Python script, through the same :class:`SweepSpec`, driver,
resume and checks as ``kda-sweep``."""

from __future__ import annotations

import sys
import time

import pandas as pd

from .case import COLUMNS
from .results import PROVENANCE
from .spec import EmptyShard, SettingError, SweepSpec
from .sweep import draw_charts, prepare, report
from .worker import UNGUARDED_EXIT

__all__ = ["SweepSpec", "sweep"]


def _in_a_workers_reimport() -> bool:
    """Whether this call comes from the top level of a script that a spawned process is importing
    anew (as ``__mp_main__``): the script's sweep call lacks its ``__main__`` guard."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def sweep(preset: str | None = None, *, charts: bool = False, **settings) -> pd.DataFrame:
    """Run a sweep and return its results table (one row per implementation x configuration, the
    columns of results.csv; rows that are not ok carry their status and reason).

    ``settings`` are :class:`SweepSpec`'s fields: ``impls=["naive"]``, ``devices="cpu"``, axes as a
    value or a list (``B=[1, 2]``, ``state_dtype=torch.bfloat16`` or ``"bf16"``), ``placements=1``,
    ``max_seconds=0.01``, ``out="sweeps/mine"`` (default: a directory named by the settings under
    ./sweeps, resumed when it exists), ``fresh=True``. A refused setting raises
    :class:`kda_impls.cli.UsageError` before anything runs. Worker processes start with "spawn",
    which imports the calling script again: call this under ``if __name__ == "__main__":``."""
    if _in_a_workers_reimport():
        raise SystemExit(UNGUARDED_EXIT)  # the sweep that started this process says why
    spec = SweepSpec(preset=preset, charts=charts, **settings)
    if spec.dry_run:
        raise SettingError("dry_run", "kda_impls.sweep measures; `kda-sweep --dry-run` lists what it would measure")
    started = time.perf_counter()
    given = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    try:
        run = prepare(spec, f"kda_impls.sweep({given})")
    except EmptyShard as exc:
        print(f"kda_impls.sweep: {exc}; nothing to measure")
        return pd.DataFrame(columns=[*COLUMNS, *PROVENANCE])
    table = run.sweep.run()
    ours = report(run, table, started)
    if charts:
        draw_charts(run)
    return ours.reset_index(drop=True)
