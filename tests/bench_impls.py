"""An implementation that misbehaves on purpose, for tests/test_bench.py. A sweep registers it through
$KDA_EXTRA_IMPLS with this directory on PYTHONPATH, so that its worker processes can import it."""

import ctypes

import torch

from kda_impls.contract import Capabilities
from kda_impls.impls.naive import NaiveTorch


class Misbehaves(NaiveTorch):
    """Naive on bf16 state only (fp32 rows: unsupported), with its output scaled by 1.5 (wrong), and
    a launch on a pool with padding between slots reads address 0 (the worker dies of SIGSEGV)."""

    name = "misbehaves"
    capabilities = Capabilities(state_dtypes=(torch.bfloat16,))

    def _launcher(self, inputs, out):
        if inputs.slot_stride != inputs.HV * inputs.V * inputs.K:
            return lambda: ctypes.string_at(0)
        launch = super()._launcher(inputs, out)
        return lambda: launch().mul_(1.5)
