"""The flashinfer adapter: what it declares, its reasons on any machine, how it wires the library's
in-place pool path (checked on the CPU without calling it), and the library's -1 rows on a GPU. The
contract rules and verify in every mode: tests/test_conformance.py."""

import importlib.util
import inspect

import pytest
import torch

from helpers import misaligned
from kda_impls import get, make_inputs, verify
from kda_impls.impls.flashinfer_kda import recurrent_kda_entry_point

PACKAGES = ("flashinfer", "cutlass", "tvm_ffi")
flashinfer_installed = importlib.util.find_spec("flashinfer") is not None


def test_declares_what_it_runs_on():
    caps = get("flashinfer").capabilities
    assert caps.devices == ("cuda",)
    assert caps.min_compute_capability == (9, 0)  # documented for SM100, measured correct on the H200
    assert caps.packages == PACKAGES


@pytest.fixture
def fake_packages(monkeypatch):
    """Pretend exactly the given flashinfer packages are installed."""
    real = importlib.util.find_spec

    def install(*present):
        def find_spec(name, *args):
            if name in PACKAGES:
                return real("torch") if name in present else None
            return real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return install


def test_reason_when_packages_are_missing(fake_packages):
    x = make_inputs(2, 2, 2, 64, 64, seed=5)
    fake_packages()
    assert get("flashinfer").unsupported(x) == \
        "package not installed: flashinfer, cutlass, tvm_ffi (pip install -e .[flashinfer])"
    fake_packages("flashinfer", "tvm_ffi")
    assert get("flashinfer").unsupported(x) == "package not installed: cutlass (pip install -e .[flashinfer])"


def test_reason_off_cuda(fake_packages):
    fake_packages(*PACKAGES)
    reason = get("flashinfer").unsupported(make_inputs(2, 2, 2, 64, 64, seed=5))
    if torch.cuda.is_available():
        assert reason == "runs on cuda; inputs are on cpu"
    else:
        assert reason == "needs a CUDA GPU; none is available"


def test_reasons_beyond_the_capabilities():
    impl = get("flashinfer")
    x = make_inputs(2, 2, 2, 64, 64, dtype=torch.float16, seed=6)
    assert impl._extra_unsupported(x) == \
        "q/k/v/a/b must be bfloat16 (the kernel's only activation dtype); got float16"

    x = make_inputs(2, 2, 2, 64, 64, seed=6)
    x.q = misaligned(x.q)
    assert impl._extra_unsupported(x) == \
        "q must start 32-byte aligned (the kernel is compiled assuming it); its byte offset is 2"

    x = make_inputs(2, 2, 2, 64, 64, seed=6)
    x.a = misaligned(x.a)
    assert impl._extra_unsupported(x).startswith("a must start 32-byte aligned")

    x = make_inputs(2, 2, 2, 64, 64, seed=6)
    x.state = x.state[:0]
    x.slots.fill_(-1)
    impl.check(x)
    assert impl._extra_unsupported(x) == "the pool has no slots, and flashinfer reads slot 0 for rows with slot -1"


@pytest.mark.skipif(flashinfer_installed, reason="flashinfer is installed")
def test_reason_when_flashinfer_does_not_import():
    reason = get("flashinfer")._extra_unsupported(make_inputs(2, 2, 2, 64, 64, seed=6))
    assert reason.startswith("flashinfer does not import: ")


def test_versions():
    versions = get("flashinfer").versions()
    assert set(versions) == {"torch", "flashinfer-python", "nvidia-cutlass-dsl", "apache-tvm-ffi"}
    if not flashinfer_installed:
        assert versions["flashinfer-python"] == "not installed"


def arguments(H, HV, B=3, K=64, slot_pad=16):
    x = make_inputs(B, H, HV, K, K, slot_pad=slot_pad, pad_rows=1, seed=8)
    out = torch.empty(B, HV, K, dtype=torch.bfloat16)
    return x, out, *get("flashinfer").library_arguments(x, out)


@pytest.mark.parametrize("H, HV", [(4, 4), (1, 4)])
def test_the_library_updates_the_pool_in_place(H, HV):
    x, out, kw, _ = arguments(H, HV)
    assert kw["initial_state"] is x.state and kw["ssm_state_indices"] is x.slots
    assert torch.equal(kw["cu_seqlens"], torch.arange(4, dtype=torch.int32))
    for name, source in (("q", x.q), ("k", x.k), ("v", x.v), ("beta", x.b), ("output", out)):
        assert kw[name].shape == (1, *source.shape), name
        assert kw[name].data_ptr() == source.data_ptr(), f"{name} must be a view, not a copy"
    assert kw["beta_is_logit"] and kw["use_qk_l2norm_in_kernel"] and not kw["output_final_state"]
    assert kw["scale"] == x.effective_scale


def test_equal_heads_gate_in_kernel():
    x, _, kw, prepare = arguments(4, 4)
    assert prepare is None and kw["use_gate_in_kernel"]
    assert kw["g"].data_ptr() == x.a.data_ptr() and kw["A_log"] is x.A_log
    assert kw["dt_bias"].shape == (4 * 64,) and kw["dt_bias"].data_ptr() == x.dt_bias.data_ptr()


@pytest.mark.skipif(not flashinfer_installed, reason="flashinfer is not installed")
@pytest.mark.parametrize("H, HV", [(4, 4), (1, 4)])
def test_arguments_bind_to_the_installed_signature(H, HV):
    _, _, kw, _ = arguments(H, HV)
    signature = inspect.signature(recurrent_kda_entry_point())
    signature.bind(**kw)
    named = {n for n, p in signature.parameters.items() if p.kind != p.VAR_KEYWORD}
    assert set(kw) <= named, f"swallowed by **kwargs: {set(kw) - named}"


@pytest.mark.gpu
@pytest.mark.parametrize("K, B, HV", [(64, 4, 8), (128, 4, 8), (64, 8, 32), (128, 8, 32)])  # grouped, one-warp
def test_rows_with_slot_minus_one_leave_slot_0_alone(K, B, HV):
    """The library reads slot 0 for -1 rows; verify() checks that slot 0, untouched here, keeps its bits."""
    x = make_inputs(B, HV, HV, K, K, slot_pad=16, n_slots=2 * B, device="cuda", seed=10)
    x.slots = torch.arange(1, B + 1, dtype=torch.int32, device="cuda")
    x.slots[::2] = -1
    reason = get("flashinfer").unsupported(x)
    if reason:
        pytest.skip(reason)
    verdict = verify(get("flashinfer"), x)
    assert verdict.ok, verdict


def test_preload_imports_the_entry_point_every_variant_calls(monkeypatch):
    """A sweep worker's preload looks up the library's entry point (importing FlashInfer and its
    CuTe DSL), as every variant's first bind would."""
    from kda_impls.impls import flashinfer_kda

    looked_up = []
    monkeypatch.setattr(flashinfer_kda, "recurrent_kda_entry_point", lambda: looked_up.append(True))
    for name in ("flashinfer", "flashinfer-loggate-sigmoid"):
        get(name).preload()
    assert looked_up == [True, True]
