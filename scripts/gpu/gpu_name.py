"""The folder name of a GPU's results: its device name, lower case, without the vendor.

    python3 -m scripts.gpu.gpu_name        # prints h200 on an NVIDIA H200, h100-80gb-hbm3 on an H100 SXM

scripts/gpu/gpu-checks.sh writes a run's results under ``results/<this name>/``: a run on one GPU
never lands in another GPU's folder.
"""

from __future__ import annotations

import re
import sys


def gpu_slug(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100-80gb-hbm3``; ``NVIDIA H200`` -> ``h200``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug.removeprefix("nvidia-") or "gpu"


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_name: no CUDA GPU here", file=sys.stderr)
        return 2
    print(gpu_slug(torch.cuda.get_device_name(0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
