"""Shared test setup and fixtures.

Triton decides whether a kernel is compiled or interpreted when the kernel is decorated, i.e. when
its module is imported, so TRITON_INTERPRET must be set before any test module imports one. Without
a CUDA GPU the Triton kernels (ours and fla's) can only run interpreted on the CPU, and tests
marked ``gpu`` skip. Plain helpers the test modules share are in tests/helpers.py.
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


@pytest.fixture
def no_config_override(monkeypatch):
    """Our Triton kernel under no tile config the caller's environment forces (the Triton test
    modules use it for every test)."""
    from kda_impls.impls.triton_kda import CONFIG_ENV

    monkeypatch.delenv(CONFIG_ENV, raising=False)


@pytest.fixture
def fla_calls(monkeypatch):
    """The keyword arguments of every call the adapter makes to fla (which then runs)."""
    from kda_impls.impls import fla_kda

    real = fla_kda._fused_recurrent_kda_fwd()
    seen = []

    def spy(**kw):
        seen.append(kw)
        return real(**kw)

    monkeypatch.setattr(fla_kda, "_fused_recurrent_kda_fwd", lambda: spy)
    return seen
