"""What a decode step could reach: the bandwidth of a large copy, measured on this device.

A decode step moves ``DecodeInputs.nbytes()`` (state rows read and written, inputs read, output
written) and does little math per byte, so its floor is that many bytes at copy bandwidth.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .l2 import as_device
from .timing import timed_runs

GPU_COPY_BYTES = 1 << 30  # far beyond any L2: every byte goes to HBM and back
CPU_COPY_BYTES = 64 << 20
COPY_REPEATS = 10


def copy_bandwidth(device) -> float:
    """Bytes per second of a device-to-device copy, read + write counted, median of several copies:
    1 GiB on a GPU, a 64 MiB memcpy on the CPU. Measured once per process and device."""
    return _copy_bandwidth(as_device(device))


def median_copy_seconds(nbytes: int, device: torch.device, repeats: int = COPY_REPEATS) -> float:
    """Seconds of an ``nbytes`` device-to-device copy: the median of ``repeats`` eager copies after one."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: first touch of the pages, lazy initialisation
    return float(np.median(timed_runs(lambda: dst.copy_(src), repeats, device)))


@functools.cache
def _copy_bandwidth(device: torch.device) -> float:
    nbytes = GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    seconds = median_copy_seconds(nbytes, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the buffers' 2 GiB back for the kernels that follow
    return 2 * nbytes / seconds
