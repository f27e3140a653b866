"""What the sglang-cutedsl and sglang-triton adapters' arguments compute, checked on the CPU.

SGLang's CuTe-DSL decode needs an sm_90+ GPU, and its Triton packed decode's module imports SGLang's
serving runtime, which the wheel installed without its dependencies does not have. Here each library
call the adapters make is stated as an executable function, rule by rule from the kernel's source, put
where the adapter loads the kernel module from, and the adapter's own arguments are judged through it
by ``kda_impls.verify`` against the float64 reference. Only the kernel module is replaced: the
adapter's reasons and launcher run unchanged. The loader, the refusals and the import failures are
checked with the real wheel where it is installed.

Sources, sglang 0.5.23 (the wheel on PyPI):
  [W] sglang/kernels/ops/attention/cutedsl_kda.py, ``cutedsl_fused_sigmoid_gating_kda_update`` (lines 1385-1562)
  [K] the same file: the small-batch kernel (lines 60-262; the other three kernels do the same per row)
  [P] sglang/kernels/ops/attention/fla/fused_recurrent.py, ``fused_recurrent_kda_packed_decode`` (519-700)
      and its kernel (418-518)
"""

import dataclasses
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from kda_impls import get, make_inputs, verify
from kda_impls.impls import sglang_kda
from kda_impls.impls.sglang_kda import ATTENTION, SGLangCuteDSL, SGLangTriton, import_failure


def kda_row(q, k, v, a, b, A_log, dt_bias, S, scale):
    """One value head's step in fp32 ([K] 118-260; [P] 470-515): q/k L2-normalised (eps 1e-6), the gate
    ``exp(-exp(A_log) softplus(a + dt_bias))`` (softplus linear above 20), beta ``sigmoid(b)``."""
    q, k = (t.float() * torch.rsqrt((t.float() ** 2).sum() + 1e-6) for t in (q, k))
    x = a.float() + dt_bias.float()
    softplus = torch.where(x <= 20.0, F.softplus(x), x)
    S = S.float() * torch.exp(-torch.exp(A_log.float()) * softplus)[None, :]
    S = S + (torch.sigmoid(b.float()) * (v.float() - S @ k))[:, None] * k[None, :]
    return S @ (q * scale), S


def cutedsl_update_as_documented(A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices,
                                 cu_seqlens=None, scale=None, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
                                 softplus_threshold=20.0):
    assert use_qk_l2norm_in_kernel and softplus_beta == 1.0 and softplus_threshold == 20.0  # stated for these
    B_q, T_q, H, K = q.shape
    HV, V = v.shape[2:]
    N = initial_state_indices.shape[0]
    assert K == 128 and V % 32 == 0 and (V // 16) % 8 == 0  # [W] 1429-1439
    # [W] 1270-1285: compiled for bf16 activations; [W] 1441: the varlen form is [1, N] with N > 1
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, a, b))
    # [W] 1281 and [K] 270: dt_bias compiled as bf16, the pool stored from an fp32 tile (a bf16 pool does not compile)
    assert dt_bias.dtype == torch.bfloat16 and initial_state_source.dtype == torch.float32
    varlen = B_q == 1 and T_q == N and N > 1
    assert varlen or (B_q == N and T_q == 1)
    assert A_log.numel() == HV and dt_bias.numel() == HV * K  # [W] 1345-1356
    assert initial_state_source.stride()[1:] == (V * K, K, 1)  # [W] 1497
    for t in (q, k, v, a, b, A_log, dt_bias, initial_state_source, initial_state_indices):  # assumed_align=16
        assert t.data_ptr() % 16 == 0
    if cu_seqlens is not None:
        assert torch.equal(cu_seqlens, torch.arange(N + 1, dtype=torch.int32))
    scale = K ** -0.5 if scale is None else scale  # [W] 1442
    a = a.reshape(N, HV, K)
    b = b.reshape(N, HV)
    q, k, v = (t.reshape(N, -1, t.shape[-1]) for t in (q, k, v))
    o = torch.full((N, HV, V), float("nan"), dtype=torch.bfloat16)  # [W] 1467: new_empty, never zeroed
    for n in range(N):
        slot = int(initial_state_indices[n])
        if slot < 0:  # [K] 96: a -1 row loads, stores and outputs nothing
            continue
        for hv in range(HV):
            h = hv // (HV // H)  # [K] 92
            out, S = kda_row(q[n, h], k[n, h], v[n, hv], a[n, hv], b[n, hv], A_log.reshape(HV)[hv],
                             dt_bias.reshape(HV, K)[hv], initial_state_source[slot, hv], scale)
            o[n, hv] = out.to(torch.bfloat16)
            initial_state_source[slot, hv] = S.to(initial_state_source.dtype)
    return o.reshape(1, N, HV, V) if varlen else o.reshape(N, 1, HV, V)


def packed_decode_as_documented(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                                use_qk_l2norm_in_kernel=False, lower_bound=None):
    assert use_qk_l2norm_in_kernel and lower_bound is None  # stated for these
    B = mixed_qkv.shape[0]
    HV, V, K = initial_state.shape[1:]
    H = (mixed_qkv.shape[1] - HV * V) // 2 // K  # [P] 617-633
    assert a.shape == (B, HV * K) and b.shape == (B, HV) and A_log.numel() == HV and dt_bias.numel() == HV * K
    assert out.shape == (B, 1, HV, V)
    q = mixed_qkv[:, :H * K].reshape(B, H, K)
    k = mixed_qkv[:, H * K:2 * H * K].reshape(B, H, K)
    v = mixed_qkv[:, 2 * H * K:].reshape(B, HV, V)
    for n in range(B):
        slot = int(ssm_state_indices[n])
        if slot < 0:  # [P] 461-464: zero output, nothing stored
            out[n, 0] = 0
            continue
        for hv in range(HV):
            h = hv // (HV // H)
            o, S = kda_row(q[n, h], k[n, h], v[n, hv], a[n].reshape(HV, K)[hv], b[n, hv], A_log[hv],
                           dt_bias.reshape(HV, K)[hv], initial_state[slot, hv], scale)
            out[n, 0, hv] = o.to(out.dtype)
            initial_state[slot, hv] = S.to(initial_state.dtype)
    return out, initial_state


def on_cpu(variant: type):
    """The adapter unchanged, let onto the CPU, where the emulation stands in for the kernel."""
    capabilities = dataclasses.replace(variant.capabilities, devices=("cpu",), min_compute_capability=None,
                                       packages=())
    return type(f"{variant.__name__}OnCpu", (variant,), {"capabilities": capabilities})()


@pytest.fixture
def emulated(monkeypatch):
    """SGLang's two kernel modules as their emulations (for this test only)."""
    for variant, function in ((SGLangCuteDSL, cutedsl_update_as_documented),
                              (SGLangTriton, packed_decode_as_documented)):
        module = types.ModuleType(variant.module)
        setattr(module, variant.entry, function)
        monkeypatch.setitem(sys.modules, variant.module, module)
    monkeypatch.setattr(sglang_kda, "sglang_dir", lambda: "installed")
    import_failure.cache_clear()
    yield
    import_failure.cache_clear()


CASES = [
    dict(B=3, H=2, HV=2, K=128, V=128, slot_pad=16, pad_rows=1),
    dict(B=4, H=1, HV=4, K=128, V=128, slot_pad=8, pad_rows=2, n_slots=9),  # GVA
    dict(B=1, H=2, HV=2, K=128, V=128),  # one row: the wrapper's dense form
]
FP32_POOL = dict(state_dtype=torch.float32)  # sglang-cutedsl's only pool dtype


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant, pool", [(SGLangCuteDSL, FP32_POOL), (SGLangTriton, {}), (SGLangTriton, FP32_POOL)])
def test_adapter_arguments_compute_the_reference(emulated, case, variant, pool):
    verdict = verify(on_cpu(variant), make_inputs(**case | pool, seed=21), steps=2)
    assert verdict.ok, verdict


def test_padding_rows_are_zeroed_after_the_cutedsl_call(emulated):
    """The wrapper's output rows for slot -1 are never written (NaN in the emulation): the adapter zeroes them."""
    x = make_inputs(4, 2, 2, 128, 128, pad_rows=2, seed=22, **FP32_POOL)
    out = on_cpu(SGLangCuteDSL).decode(x)
    assert (out[~x.live_rows()] == 0).all() and not out.isnan().any()


@pytest.mark.parametrize("change, reason", [
    (dict(dtype=torch.float32), "must be bfloat16"),
    (dict(V=64), "V must be a multiple of 128"),
    (dict(K=64, V=128), "K=64 not supported"),
    (dict(state_dtype=torch.bfloat16), "state dtype bfloat16 not supported"),
])
def test_cutedsl_refusals_say_why(emulated, change, reason):
    x = make_inputs(**(dict(B=2, H=2, HV=2, K=128, V=128) | FP32_POOL | change), seed=23)
    assert reason in on_cpu(SGLangCuteDSL).unsupported(x)


def test_cutedsl_refuses_a_dt_bias_that_bf16_would_round(emulated):
    x = make_inputs(2, 2, 2, 128, 128, seed=26, **FP32_POOL)
    assert on_cpu(SGLangCuteDSL).unsupported(x) is None  # drawn as bf16 values, as a bf16 checkpoint gives
    x.dt_bias = x.dt_bias * (1 + 2.0**-12)
    assert "dt_bias must hold bf16 values" in on_cpu(SGLangCuteDSL).unsupported(x)


def test_cutedsl_refuses_a_scale_the_backend_cannot_pass(emulated):
    x = make_inputs(2, 2, 2, 128, 128, seed=24, **FP32_POOL)
    x.scale = 0.3
    assert "passes no scale" in on_cpu(SGLangCuteDSL).unsupported(x)


def test_cutedsl_refuses_a_tensor_off_its_assumed_alignment(emulated):
    x = make_inputs(2, 2, 2, 128, 128, seed=25, **FP32_POOL)
    x.v = torch.empty(x.v.numel() + 1, dtype=x.v.dtype)[1:].view(x.v.shape).copy_(x.v)
    assert "v must start 16-byte aligned" in on_cpu(SGLangCuteDSL).unsupported(x)


needs_wheel = pytest.mark.skipif(sglang_kda.sglang_dir() is None, reason=f"sglang not installed ({sglang_kda.INSTALL})")


@needs_wheel
def test_the_kernel_files_load_without_sglangs_package_init():
    module = sglang_kda.kernel_module(f"{ATTENTION}.linear.fused_recurrent_linear_replayssm")
    assert callable(module.fused_recurrent_linear_replayssm_decode)
    assert not hasattr(sys.modules["sglang"], "Runtime")  # sglang/__init__.py's public API: not executed


@needs_wheel
def test_a_kernel_whose_imports_are_missing_is_refused_with_the_import_error():
    missing = [name for name in ("psutil", "cutlass") if sglang_kda.importlib.util.find_spec(name) is None]
    if not missing:
        pytest.skip("sglang's serving dependencies and the CuTe DSL are both installed here")
    reasons = [import_failure(SGLangTriton.module), import_failure(SGLangCuteDSL.module)]
    assert any(reason and "does not import here: ModuleNotFoundError" in reason for reason in reasons)


def test_without_the_wheel_the_reason_is_the_install_command(monkeypatch):
    monkeypatch.setattr(sglang_kda, "sglang_dir", lambda: None)
    reason = get("sglang-replayssm").unsupported(make_inputs(2, 2, 2, 32, 16, ring=4, dtype=torch.float32))
    assert "--no-deps sglang==0.5.23" in reason
