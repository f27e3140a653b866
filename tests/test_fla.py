"""The fla adapter's own call: the arguments it hands fla (never a slot of -1), and its reasons for
not running. What every implementation must do (verify against the reference in every mode) is
tests/test_conformance.py."""

import importlib.util
import inspect
import sys
import types

import pytest
import torch

from helpers import DEVICE, needs_fla
from kda_impls import get, make_inputs, verify


@needs_fla
@pytest.mark.interpreter
@pytest.mark.parametrize("pad_rows", [0, 2])
def test_rows_go_in_packed_one_token_per_sequence(fla_calls, pad_rows):
    """The serving engines' call: [1, rows, ...] with cu_seqlens = arange(rows + 1), the pool in
    place; only live rows, since fla 0.6.0 does not skip slot -1 (it reads and writes the state one
    slot stride before the pool); and every argument a named parameter, since the function's
    **kwargs would silently swallow a misspelt one."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    x = make_inputs(5, 1, 2, 16, 16, slot_pad=16, pad_rows=pad_rows, device=DEVICE, seed=16)
    verdict = verify(get("fla"), x)
    assert verdict.ok, verdict
    kw = fla_calls[0]  # the first step's (verify runs several on the pool)
    live = 5 - pad_rows
    assert torch.equal(kw["cu_seqlens"].cpu(), torch.arange(live + 1, dtype=torch.int32))
    assert torch.equal(kw["ssm_state_indices"], x.slots[x.slots >= 0])
    assert kw["q"].shape == (1, live, 1, 16) and kw["beta"].shape == (1, live, 2)
    assert kw["out"].shape == (1, live, 2, 16)
    assert kw["initial_state"] is x.state and kw["inplace_final_state"] and kw["state_v_first"]
    if not pad_rows:
        assert kw["q"].data_ptr() == x.q.data_ptr() and kw["ssm_state_indices"] is x.slots
    parameters = inspect.signature(fused_recurrent_kda_fwd).parameters
    named = {n for n, p in parameters.items() if p.kind != p.VAR_KEYWORD}
    assert set(kw) <= named, set(kw) - named


@pytest.fixture
def without_fla(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a))


def test_reason_when_fla_is_missing(without_fla):
    assert get("fla").unsupported(make_inputs(2, 1, 2, 16, 16, seed=17)) == \
        "package not installed: fla (pip install -e .[fla])"


@needs_fla
@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter matters on the CPU only")
def test_reasons_on_cpu_without_the_interpreter(monkeypatch):
    x = make_inputs(2, 1, 2, 16, 16, seed=17)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delitem(sys.modules, "fla.ops.kda.fused_recurrent", raising=False)
    assert get("fla").unsupported(x) == "on the CPU fla's Triton kernel runs only under TRITON_INTERPRET=1 (not set)"

    compiled_kernel = types.SimpleNamespace(fn=object())  # what fla holds when imported without the interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "fla.ops.kda.fused_recurrent",
                        types.SimpleNamespace(fused_recurrent_kda_fwd_kernel=compiled_kernel))
    assert get("fla").unsupported(x) == ("on the CPU fla's Triton kernel runs only under TRITON_INTERPRET=1, which "
                                         "must be set before fla is imported (fla was imported without it)")


@needs_fla
def test_versions():
    import fla

    versions = get("fla").versions()
    assert versions["fla-core"] == fla.__version__
    assert {"torch", "triton"} <= set(versions)
