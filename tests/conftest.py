"""Shared test setup and fixtures.

Triton decides whether a kernel is compiled or interpreted when the kernel is decorated, i.e. when
its module is imported, so TRITON_INTERPRET must be set before any test module imports one. Without
a CUDA GPU the Triton kernels (ours and fla's) can only run interpreted on the CPU, and tests
marked ``gpu`` skip. Plain helpers the test modules share are in tests/helpers.py.

The session-scoped fixtures below are real runs several test modules read (a process that spawns workers or
asv's benchmark processes costs seconds): each is made once per test run, across pytest-xdist
workers too (helpers.once). A test that changes one works on a copy in its own tmp_path.
"""

import os
from pathlib import Path

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
    from kda_impls.impls.triton.tiles import CONFIG_ENV

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


@pytest.fixture(scope="session")
def cpu_asv(tmp_path_factory):
    """The repository's asv suite run once on the CPU (helpers.cpu_asv_run): a helpers.AsvRun."""
    from helpers import AsvRun, cpu_asv_run, once  # imported here: after TRITON_INTERPRET is set above

    made = once(tmp_path_factory, "cpu-asv", cpu_asv_run)
    return AsvRun(Path(made["result"]), Path(made["benchmarks"]), made["output"], made["returncode"])


def _cpu_sweeps(directory: Path, shards: int) -> dict:
    from helpers import CPU_SWEEP, sweep_process

    outs = [directory / (f"shard{i}" if shards else "s") for i in range(shards or 1)]
    for i, out in enumerate(outs):
        done = sweep_process(*CPU_SWEEP, *(["--shard", f"{i}/{shards}"] if shards else []), "--out", str(out))
        assert done.returncode == 0, done.stdout + done.stderr
    return {"outs": [str(out) for out in outs]}


@pytest.fixture(scope="session")
def cpu_sweep(tmp_path_factory) -> Path:
    """A real CPU sweep of helpers.CPU_SWEEP (naive, B 1 and 2): read it, or copy it to change it."""
    from helpers import once

    return Path(once(tmp_path_factory, "cpu-sweep", lambda d: _cpu_sweeps(d, 0))["outs"][0])


@pytest.fixture(scope="session")
def cpu_shards(tmp_path_factory) -> list[Path]:
    """The two shards (--shard 0/2, 1/2) of cpu_sweep's grid, each swept in its own process: B = 1 and
    B = 2. Shard 0 beside cpu_sweep is a second sweep of one commit with a row left out."""
    from helpers import once

    return [Path(out) for out in once(tmp_path_factory, "cpu-shards", lambda d: _cpu_sweeps(d, 2))["outs"]]
