"""The benchmark harness: configurations, timers, the copy roofline, one measured row, and the sweep
over presets (``scripts/sweep.py``, ``scripts/plot.py``; results/README.md documents the output)."""

from .config import Config
from .measure import COLUMNS, STATUSES, measure
from .roofline import copy_bandwidth
from .timing import Budget, Timing, bind_rotation, call_time, flush_l2, kernel_time, l2_bytes

__all__ = ["COLUMNS", "STATUSES", "Budget", "Config", "Timing", "bind_rotation", "call_time", "copy_bandwidth",
           "flush_l2", "kernel_time", "l2_bytes", "measure"]
