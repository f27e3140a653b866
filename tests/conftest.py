"""Shared test setup.

Triton decides whether a kernel is compiled or interpreted when the kernel is decorated, i.e. when
its module is imported, so TRITON_INTERPRET must be set before any test module imports one. Without
a CUDA GPU the Triton kernels (ours and fla's) can only run interpreted on the CPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
