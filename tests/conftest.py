"""Shared test setup.

Triton decides whether a kernel is compiled or interpreted when the kernel is decorated, i.e. when
its module is imported, so TRITON_INTERPRET must be set before any test module imports one. Without
a CUDA GPU the Triton kernels (ours and fla's) can only run interpreted on the CPU, and tests
marked ``gpu`` skip.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
