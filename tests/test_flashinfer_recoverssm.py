"""The flashinfer-recoverssm adapter (``recurrent_kda(..., disable_state_update=True, correction_cache=,
kg_cache=)``): its arguments checked on the CPU against an emulation, the real kernel on the GPU.

As in tests/test_frozen_flashinfer_emulated.py: the library's verify-with-records call, for the arguments
the adapter passes, is stated here as an executable function, rule by rule from its source, and the
adapter's own arguments are run through it and judged against the reference's replay step (outputs
poisoned, every record, length and pool byte). Only the library is replaced.

Sources, flashinfer-python 0.7.2.post1 (the wheel on PyPI):
  [D] flashinfer/kda_decode.py: ``_dispatch_recurrent_kda_decode``, ``_run_frozen_recurrent_kda``
  [R] flashinfer/kda_kernels/kda_decode_wy_output_only.py: ``kda_recoverssm_verify`` (its checks) and
      ``KdaDecodeWyOutputOnlyKernel`` in ``vllm_dropin`` mode (the records it writes)
"""

import dataclasses
import importlib.machinery
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from kda_impls import Unsupported, get, make_inputs
from kda_impls.impls.flashinfer_variants import FlashInferRecoverSSM
from replay_checks import poison_unused_records, step_problems, tolerance


def verify_with_records_as_documented(q, k, v, g, beta, A_log, dt_bias, scale, output_final_state,
                                      use_qk_l2norm_in_kernel, use_gate_in_kernel, beta_is_logit, output,
                                      initial_state_source, initial_state_indices, disable_state_update,
                                      correction_cache, kg_cache):
    """``flashinfer.recurrent_kda`` with the verify caches, in its batched ``[B, T]`` form, in float32.
    Parameters the adapter must not pass here are absent (passing one is a TypeError)."""
    assert disable_state_update and not output_final_state and use_qk_l2norm_in_kernel  # [D] 147-168, 900
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    if H != HV:
        raise NotImplementedError("GQA (HV != H) is not supported by the packed frozen-verify path")  # [D] 948
    pool, N = initial_state_source, initial_state_source.shape[0]
    # [R] kda_recoverssm_verify's checks, spec_len = T ([D] 969)
    assert K == V == 128 and 1 <= T <= 16
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, g, beta, pool))
    assert pool.stride()[1:] == (V * K, K, 1) and pool.stride(0) % 8 == 0
    assert correction_cache.shape == (N, H, T, V) and correction_cache.dtype == torch.float32
    assert kg_cache.shape == (N, H, T, 2 * K) and kg_cache.dtype == torch.bfloat16
    assert correction_cache.stride(3) == 1 and kg_cache.stride(3) == 1
    assert all(s % 4 == 0 for s in correction_cache.stride()[:3])
    assert A_log.shape == (H,) and dt_bias.numel() == H * K and A_log.is_contiguous() and dt_bias.is_contiguous()
    assert initial_state_indices.shape == (B,) and output.shape == v.shape and output.dtype == v.dtype
    dt_bias = dt_bias.reshape(H, K)
    scale = K**-0.5 if scale is None else scale  # [R]
    for n in range(B):
        slot = int(initial_state_indices[n])
        if slot < 0:  # [D] 1034 null_min=0: only a negative slot is null; [R] its rows zero, no record
            output[n] = 0
            continue
        for h in range(H):
            S = pool[slot, h].float()  # never stored
            for t in range(T):
                kg_cache[slot, h, t, :K] = k[n, t, h]  # [R] the raw key and raw gate, before the L2 norm
                kg_cache[slot, h, t, K:] = g[n, t, h]
                qh, kh = q[n, t, h].float(), k[n, t, h].float()
                qh = qh * torch.rsqrt((qh * qh).sum() + 1e-6) * scale
                kh = kh * torch.rsqrt((kh * kh).sum() + 1e-6)
                gate = g[n, t, h].float()
                if use_gate_in_kernel:  # GATE_SOFTPLUS with dt_bias (lower_bound None)
                    gate = -torch.exp(A_log[h]) * F.softplus(gate + dt_bias[h])
                b = torch.sigmoid(beta[n, t, h].float())  # [R] the drop-in forces beta_is_logit
                S = S * torch.exp(gate)[None, :]
                u = b * (v[n, t, h].float() - S @ kh)
                correction_cache[slot, h, t] = u  # fp32, position t of the slot's cache
                S = S + u[:, None] * kh[None, :]
                output[n, t, h] = (S @ qh).to(output.dtype)
    return output, None


def on_cpu() -> FlashInferRecoverSSM:
    """The variant unchanged, let onto the CPU, where the emulation stands in for the library."""
    capabilities = dataclasses.replace(FlashInferRecoverSSM.capabilities, devices=("cpu",),
                                       min_compute_capability=None, packages=("flashinfer",))
    return type("FlashInferRecoverSSMOnCpu", (FlashInferRecoverSSM,), {"capabilities": capabilities})()


@pytest.fixture
def emulated_flashinfer(monkeypatch):
    module = types.ModuleType("flashinfer")
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    module.recurrent_kda = verify_with_records_as_documented
    module.kda_kernels = types.SimpleNamespace(run_recurrent_kda=verify_with_records_as_documented)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


def from_the_checkpoint(x):
    """``x`` with every live slot's ring empty (the other slots keep their records), unused records NaN."""
    x.cache.length[x.slots[x.slots >= 0].long()] = 0
    poison_unused_records(x)
    return x


@pytest.mark.parametrize("T, L, scale", [(3, 4, 0.3), (2, 2, None)], ids=["views-of-a-longer-ring", "ring-of-T"])
def test_the_verify_call_is_a_replay_step_from_the_checkpoint(emulated_flashinfer, T, L, scale):
    """Outputs, the records at 0..T-1 of each live slot, nothing else written (other records, lengths,
    the padded pool, the padding row's slot 0): the reference's replay step."""
    x = from_the_checkpoint(make_inputs(3, 2, 2, 128, 128, T=T, ring=L, slot_pad=16, pad_rows=1, seed=41))
    x.scale = scale
    impl = on_cpu()
    assert impl.unsupported(x) is None
    problems, flushed = step_problems(impl, x, tolerance(x))
    assert problems == [] and flushed == []


def test_what_the_verify_call_cannot_take_is_refused_with_its_reason(emulated_flashinfer):
    impl = on_cpu()
    x = from_the_checkpoint(make_inputs(2, 1, 1, 128, 128, T=2, ring=4, seed=42))
    refused = {
        "T = 1": (x.token(0), "commits its record"),
        "commit": (dataclasses.replace(x, num_accepted=torch.zeros(2, dtype=torch.int32)), "takes no num_accepted"),
        "in place": (dataclasses.replace(x, cache=None, slots=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)),
                     "replay, cache= given) only"),
        "GVA": (make_inputs(2, 1, 2, 128, 128, T=2, ring=4, seed=43), "no GVA"),
        "K=64": (make_inputs(2, 1, 1, 64, 64, T=2, ring=4, seed=43), "K=64 not supported"),
        "T=17": (make_inputs(1, 1, 1, 128, 128, T=17, ring=17, seed=43), "at most 16"),
        "fp32 state": (make_inputs(2, 1, 1, 128, 128, T=2, ring=4, state_dtype=torch.float32, seed=43), "state dtype"),
    }
    for case, (y, wanted) in refused.items():
        reason = impl.unsupported(y)
        assert reason is not None and wanted in reason and "\n" not in reason, (case, reason)
    x.cache.length[int(x.slots[1])] = 1  # a cached record: a value only bind reads
    assert impl.unsupported(x) is None
    with pytest.raises(Unsupported, match="every live slot's cache.length must be 0; got 1 with cached records"):
        impl.bind(x)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4])
def test_the_verify_call_on_gpu(T):
    """The real kernel at a serving shape (padded pool, -1 rows, L = 8): the reference's replay step."""
    x = from_the_checkpoint(make_inputs(32, 16, 16, 128, 128, T=T, ring=8, slot_pad=64, pad_rows=4, device="cuda",
                                        seed=44))
    impl = get("flashinfer-recoverssm")
    reason = impl.unsupported(x)
    if reason:
        pytest.skip(reason)
    problems, flushed = step_problems(impl, x, tolerance(x))
    assert problems == [] and flushed == []
