"""The flashinfer adapter's frozen-verify call (``disable_state_update=True``), checked on the CPU.

As in tests/test_flashinfer_emulated.py: FlashInfer runs only on sm_90+ GPUs, so the library's
frozen mode, for the arguments the adapter passes, is stated here as an executable function, rule by
rule from its source, and the adapter's own arguments are run through it and judged by
``kda_impls.verify`` against the float64 reference (outputs poisoned, the pool bit for bit
unchanged). Only the library is replaced.

Sources, flashinfer-python 0.7.2.post1 (the wheel on PyPI):
  [D] flashinfer/kda_decode.py: ``_dispatch_recurrent_kda_decode`` and ``_run_frozen_recurrent_kda``
  [O] flashinfer/kda_kernels/kda_decode_wy_output_only.py: ``kda_wy_output_only`` (the wrapper) and
      ``_kda_oo_grouped_kernel`` (the register recurrence; the WY kernel computes the same outputs)
"""

import dataclasses
import importlib.machinery
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_verified_or_refuses_gva
from kda_impls import make_inputs, verify
from kda_impls.impls.flashinfer_kda import FlashInferKDA
from kda_impls.impls.flashinfer_variants import (
    FlashInferDense,
    FlashInferGather,
    FlashInferLogGate,
    FlashInferLogGateSigmoid,
    FlashInferSigmoid,
)


def frozen_recurrent_kda_as_documented(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None,
                                       output_final_state=False, use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=False, output=None, initial_state_source=None,
                                       initial_state_indices=None, beta_is_logit=False, disable_state_update=False):
    """``flashinfer.recurrent_kda(..., disable_state_update=True)`` in its batched form, in float32.
    Parameters the adapter must not pass here are absent (passing one is a TypeError)."""
    if not disable_state_update:
        raise NotImplementedError("stated here: the frozen mode only")
    assert not output_final_state  # [D] 159-164: refused in the frozen mode
    assert use_qk_l2norm_in_kernel  # [D] 900-904
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    # [O] 2106-2156: q/k/v/g/beta and the pool bf16; K == V == 128; 1 <= T <= 16; HV a multiple of H
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, g, beta, initial_state_source))
    assert K == V == 128 and 1 <= T <= 16 and HV % H == 0
    assert g.shape == (B, T, HV, K) and beta.shape == (B, T, HV)
    assert initial_state_indices.shape == (B,) and initial_state_indices.dtype == torch.int32  # [O] 2145-2150
    if use_gate_in_kernel:
        assert A_log is not None
    if dt_bias is not None:
        assert dt_bias.numel() == H * K  # [O] 2185: per q/k head
    pool = initial_state_source.contiguous()  # [O] 2190: a padded pool is copied, never written
    out = output if output is not None else torch.empty_like(v)
    assert out.shape == v.shape and out.is_contiguous()  # [O] 2199
    scale = K**-0.5 if scale is None else scale
    for n in range(B):
        slot = max(int(initial_state_indices[n]), 0)  # [O] grouped kernel: a -1 reads slot 0, output kept
        for hv in range(HV):
            h = hv // (HV // H)  # [O] grouped kernel ``h = hv // RATIO``; WY ``i_h = pid_hv // (HV // H)``
            S = pool[slot, hv].float()  # [V, K], in registers; never stored
            for t in range(T):
                qh, kh = q[n, t, h].float(), k[n, t, h].float()
                qh = qh * torch.rsqrt((qh * qh).sum() + 1e-6) * scale
                kh = kh * torch.rsqrt((kh * kh).sum() + 1e-6)
                gate = g[n, t, hv].float()
                if use_gate_in_kernel:  # A_log and dt_bias at the q/k head h
                    if dt_bias is not None:
                        gate = gate + dt_bias.reshape(-1)[h * K:(h + 1) * K]
                    gate = -torch.exp(A_log[h]) * F.softplus(gate)
                b = beta[n, t, hv].float()
                if beta_is_logit:
                    b = torch.sigmoid(b)
                S = S * torch.exp(gate)[None, :]
                S = S + (b * (v[n, t, hv].float() - S @ kh))[:, None] * kh[None, :]
                out[n, t, hv] = (S @ qh).to(out.dtype)
    return out, None


def on_cpu(variant: type) -> FlashInferKDA:
    """The adapter variant unchanged, let onto the CPU, where the emulation stands in for the library."""
    capabilities = dataclasses.replace(variant.capabilities, devices=("cpu",), min_compute_capability=None,
                                       packages=("flashinfer",))
    return type(f"{variant.__name__}OnCpu", (variant,), {"capabilities": capabilities})()


@pytest.fixture
def emulated_flashinfer(monkeypatch):
    module = types.ModuleType("flashinfer")
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    module.recurrent_kda = frozen_recurrent_kda_as_documented
    module.kda_kernels = types.SimpleNamespace(run_recurrent_kda=frozen_recurrent_kda_as_documented)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


CASES = {
    "equal-heads-padded-pool-pad-row": dict(B=3, H=2, HV=2, T=3, slot_pad=16, pad_rows=1),
    "gva-one-token": dict(B=2, H=1, HV=2, T=1, pad_rows=1),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("variant", [FlashInferKDA, FlashInferSigmoid, FlashInferLogGate, FlashInferLogGateSigmoid])
def test_frozen_call_computes_the_reference(emulated_flashinfer, case, variant):
    """Every packed variant's frozen call computes the reference, zero output on padding rows, pool
    unchanged; the in-kernel gate variants refuse GVA (the gate parameters are read per q/k head)."""
    impl = on_cpu(variant)
    x = make_inputs(**CASES[case], K=128, V=128, update_state=False, seed=21)
    assert_verified_or_refuses_gva(impl, x)  # the adapter's own reasons, with the emulation importable


def test_a_padding_row_would_output_slot_0s_outputs_without_the_adapters_fill(emulated_flashinfer):
    """The fill is needed: the library computes a -1 row from slot 0 (kept here as the emulation states it)."""
    x = make_inputs(2, 1, 1, 128, 128, T=2, update_state=False, seed=22)
    x.slots = torch.tensor([1, -1], dtype=torch.int32)
    arguments, _ = on_cpu(FlashInferKDA).library_arguments(x, torch.empty(x.out_shape, dtype=torch.bfloat16))
    assert arguments["initial_state_indices"].tolist() == [1, 0]
    out, _ = frozen_recurrent_kda_as_documented(**{**arguments, "initial_state_indices": x.slots})
    assert out[1].abs().sum() > 0
    assert verify(on_cpu(FlashInferKDA), x).ok


@pytest.mark.parametrize("variant, shape, wanted", [
    (FlashInferGather, dict(K=128, V=128, T=2), "has one form"),
    (FlashInferDense, dict(K=128, V=128, T=2), "has one form"),
    (FlashInferKDA, dict(K=64, V=64, T=2), "needs K == V == 128"),
    (FlashInferKDA, dict(K=128, V=128, T=17), "at most 16 tokens per row"),
], ids=["gather", "dense", "k64", "t17"])
def test_what_the_frozen_call_cannot_take_is_refused_with_its_reason(emulated_flashinfer, variant, shape, wanted):
    x = make_inputs(2, 1, 1, update_state=False, seed=23, **shape)
    reason = on_cpu(variant).unsupported(x)
    assert reason is not None and wanted in reason, reason
