"""``kda_impls.sweep``: a sweep run from a Python script, through the same :class:`SweepSpec`, driver,
resume and checks as ``kda-sweep``."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

import pandas as pd

from ..cli import UsageError
from .case import COLUMNS
from .results import PROVENANCE
from .spec import EmptyShard, SettingError, SweepSpec
from .sweep import draw_charts, prepare, report
from .worker import GUARD_ADVICE, UNGUARDED_EXIT

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


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    sides = [test.left, *test.comparators] if isinstance(test, ast.Compare) else []
    return (any(isinstance(n, ast.Name) and n.id == "__name__" for n in sides)
            and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in sides))


def _unguarded_script_line() -> int | None:
    """The line of the running script's top level that leads to this call outside an
    ``if __name__ == "__main__":`` block, read from the script's source; None where it is guarded or
    there is no script file to read (``python -c``, a notebook)."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals.get("__name__") == "__main__"
                                     and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    path = None if frame is None else frame.f_globals.get("__file__")
    try:
        tree = ast.parse(Path(path).read_text()) if path else None
    except (OSError, SyntaxError, ValueError):
        tree = None
    if tree is None:
        return None
    line = frame.f_lineno
    guarded = any(isinstance(node, ast.If) and _is_main_test(node.test)
                  and any(stmt.lineno <= line <= stmt.end_lineno for stmt in node.body) for node in ast.walk(tree))
    return None if guarded else line


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
    if (line := _unguarded_script_line()) is not None:  # before any directory is made
        raise UsageError(f"kda_impls.sweep is called at line {line} of the script, outside its __main__ guard, and "
                         f"the sweep's worker processes import the script again: {GUARD_ADVICE}")
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
