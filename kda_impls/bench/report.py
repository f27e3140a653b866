"""What a sweep prints: the summary table (at most 120 columns wide), the rows that were not ok, each
lane's share, the verdict that sets the exit status, and the estimate of a run's time (``--dry-run``)."""

from __future__ import annotations

import importlib.util
import textwrap
from collections import Counter
from pathlib import Path

import pandas as pd

from .. import dtypes, registry
from .case import STATUSES, Method
from .config import CONFIG_COLUMNS, Config
from .schedule import group_key

WIDTH = 120
FAILURES = ("wrong", "error", "crashed")  # a row in one of these fails the sweep; unsupported is reported
FAILED = 1  # the exit status of a sweep with a failed row (2 is refused input)
# A CPU run's estimate: a row's seconds ~ a fixed cost plus a cost per state element of the step (the
# smoke preset's rows on a 2-core machine), where the kernels are interpreted (TRITON_INTERPRET=1)
# and where they are not (torch's own CPU kernels)
CPU_ROW_S = {"interpreted": (1.5, 2e-4), "compiled": (0.1, 2e-8)}
GPU_FIRST_CALL_S = 5.0  # a compile group's first call (JIT compilation) on a GPU, about
WARN_CPU_ABOVE_S = 600.0


def lane_summary(table: pd.DataFrame) -> str:
    """Per device: rows, the seconds its rows took, and the seconds of their first calls (the
    compilation a library leaves to them): where a sweep over several GPUs did not divide."""
    lanes = table.groupby("device").agg(rows=("key", "size"), busy=("row_s", "sum"),
                                        first=("first_call_ms", lambda ms: ms.sum() / 1e3))
    return "; ".join(f"{r.Index} {r.rows}, {r.busy:.1f} s, {r.first:.1f} s" for r in lanes.itertuples())


def _cell(row) -> str:
    if row.status not in ("ok", "wrong"):
        return row.status
    gbps = f"{row.gbps:.0f}" if row.gbps >= 100 else f"{row.gbps:.2g}"
    text = f"{row.kernel_us_mean:.1f}us {gbps}GB/s {row.roofline_frac:.0%}"
    return text + (" WRONG" if row.status == "wrong" else "")


def summary_table(table: pd.DataFrame) -> str:
    """Kernel time, bandwidth and share of the copy roofline per configuration (rows) and
    implementation (columns); the status where nothing was timed. The configuration columns that
    take one value in the table are said once above it, and the columns wrap at :data:`WIDTH`."""
    shown = table.assign(cell=table.apply(_cell, axis=1), state_dtype=table.state_dtype.map(dtypes.short),
                         checkpoints=table.checkpoints.where(table["mode"] == "inplace", "none"))  # no token's store
    axes = [c for c in CONFIG_COLUMNS if c not in ("impl", "B")] + ["B"]
    varying = [c for c in axes if shown[c].nunique() > 1 or c == "B"]
    fixed = " ".join(f"{c}={shown[c].iloc[0]}" for c in axes if c not in varying)
    pivot = shown.pivot(index=varying, columns="impl", values="cell")
    return "\n".join([*textwrap.wrap(fixed, WIDTH), pivot.fillna("").to_string(line_width=WIDTH)])


def replay_speedup_table(table: pd.DataFrame) -> str:
    """Each ok replay row's speedup per step over the ok in-place row of the same implementation and
    configuration (in-place kernel time / replay's, a replay row's being its mean over whole ring
    cycles, flush included): a column per batch, a row per implementation, shape, state dtype and ring
    (those that vary); empty where no pair is ok."""
    ok = table[(table.status == "ok") & table.kernel_us_mean.notna()]
    same = [c for c in CONFIG_COLUMNS if c not in ("mode", "ring", "checkpoints")]
    inplace = ok[(ok["mode"] == "inplace") & (ok["T"] == 1)][[*same, "kernel_us_mean"]]
    pairs = ok[ok["mode"] == "replay"].merge(inplace, on=same, suffixes=("", "_inplace"))
    if pairs.empty:
        return ""
    pairs = pairs.assign(speedup=pairs.kernel_us_mean_inplace / pairs.kernel_us_mean,
                         state_dtype=pairs.state_dtype.map(dtypes.short))
    index = [c for c in [*same, "ring"] if c != "B" and (pairs[c].nunique() > 1 or c in ("impl", "ring"))]
    grid = pairs.pivot_table(index=index, columns="B", values="speedup")
    return grid.apply(lambda col: col.map(lambda x: "" if pd.isna(x) else f"{x:.2f}x")).to_string(line_width=WIDTH)


def problems_table(table: pd.DataFrame) -> str:
    """Why rows were not ok: implementation, status, reason (cut to fit) and how many rows share them."""
    bad = table[table.status != "ok"]
    if bad.empty:
        return ""
    counts = bad.groupby(["impl", "status", "reason"], dropna=False).size().rename("rows").reset_index()
    room = WIDTH - 2 - max(len(s) for s in counts.impl) - len("unsupported") - len("rows") - 4
    counts["reason"] = [r if len(str(r)) <= room else str(r)[:room - 3] + "..." for r in counts.reason]
    return counts.to_string(index=False, justify="left")


def verdict(table: pd.DataFrame) -> tuple[int, str]:
    """(exit status, one line): :data:`FAILED` when any row is wrong, error or crashed, or none is ok;
    0 otherwise. Unsupported rows are counted, not failures."""
    counts = Counter(table.status)
    line = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    failed = sum(counts[s] for s in FAILURES)
    if failed:
        return FAILED, f"{failed} of {len(table)} rows failed ({line}); their reasons are above"
    if not counts["ok"]:
        return FAILED, f"no row ran ({line}); their reasons are above"
    return 0, f"rows: {line}" + (" (unsupported: not run here, not a failure)" if counts["unsupported"] else "")


def _interpreted(impl: str) -> bool:
    """Whether ``impl``'s module launches Triton kernels, which a CPU runs interpreted."""
    spec = importlib.util.find_spec(registry.implementations()[impl].partition(":")[0])
    return bool(spec and spec.origin) and b"import triton" in Path(spec.origin).read_bytes()


def estimate_seconds(configs: list[Config], method: Method, device_type: str) -> float:
    """A rough wall time for measuring ``configs``: on a GPU the timers' budgets and a first call per
    compile group; on the CPU a cost growing with the step's state elements (:data:`CPU_ROW_S`)."""
    if device_type == "cuda":
        per_row = method.kernel.max_seconds + (method.call.max_seconds if method.call else 0) + 0.2
        groups = {group_key(c) for c in configs}
        return len(configs) * per_row * method.placement_processes + len(groups) * GPU_FIRST_CALL_S
    total = 0.0
    for cfg in configs:
        fixed, per_element = CPU_ROW_S["interpreted" if _interpreted(cfg.impl) else "compiled"]
        total += fixed + per_element * cfg.B * cfg.T * cfg.HV * cfg.K * cfg.V * cfg.layout.placements / 3
    return total


def duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3.5 h``, ``9 days``."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.2g} {unit}"
    return f"{seconds:.0f} s"


def dry_run_table(configs: list[Config]) -> str:
    """The rows a run would measure: per implementation and shape, how many and their batch sizes."""
    frame = pd.DataFrame([c.columns() for c in configs])
    shape = [c for c in CONFIG_COLUMNS if c != "B" and frame[c].nunique() > 1] or ["impl"]
    grouped = frame.groupby(shape, sort=False).B.agg(rows="size", B=lambda b: ",".join(map(str, sorted(set(b)))))
    return grouped.reset_index().to_string(index=False, line_width=WIDTH)
