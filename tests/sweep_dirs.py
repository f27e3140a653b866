"""Sweep result directories for tests, written by the sweep's own writer (rows/, results.csv,
samples.json, meta.json), so that readers are tested against the real format."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from kda_impls.bench.config import Config
from kda_impls.bench.measure import COLUMNS
from kda_impls.bench.results import assemble, write_meta, write_row


def write_sweep_dir(path: Path, rows: dict[Config, list[float] | str], meta: dict) -> Path:
    """``rows`` maps a config to its kernel samples in microseconds (status "ok"), or to the status
    of a row without measurements ("unsupported", "wrong", ...)."""
    for cfg, measured in rows.items():
        row = dict.fromkeys(COLUMNS) | asdict(cfg) | {"key": cfg.key(), "kernel_samples_us": [], "call_samples_us": []}
        if isinstance(measured, str):
            row |= {"status": measured, "reason": "a test's row"}
        else:
            row |= {"status": "ok", "kernel_us_median": float(np.median(measured)), "kernel_samples_us": measured}
        write_row(path, row)
    assemble(path)
    write_meta(path, meta)
    return path
