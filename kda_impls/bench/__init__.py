"""The benchmark harness: configurations and pool layouts, the case runner, timers, the copy
roofline, clocks, and the sweep over presets (``kda-sweep``, ``kda-plot``;
docs/results-format.md documents the output)."""

from .case import COLUMNS, STATUSES, Method, run_case
from .config import Config, PoolLayout
from .l2 import DEFAULT_ENTRY, ENTRY_STATES, l2_bytes
from .roofline import copy_bandwidth
from .timing import Budget, Timing, call_time, kernel_time

__all__ = ["COLUMNS", "DEFAULT_ENTRY", "ENTRY_STATES", "STATUSES", "Budget", "Config", "Method", "PoolLayout",
           "Timing", "call_time", "copy_bandwidth", "kernel_time", "l2_bytes", "run_case"]
