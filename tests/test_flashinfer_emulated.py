"""What the flashinfer adapter's arguments compute, checked on the CPU.

FlashInfer's ``recurrent_kda`` runs only on sm_90+ GPUs (tests/test_flashinfer.py runs the real one
there). On the CPU the adapter could only be checked by the arguments it builds, so a wrong but
plausible argument (``A_log`` per q/k head under GVA, ``beta_is_logit=False`` with raw logits) went
unnoticed until a GPU run. Here the library's documented semantics, for the argument combinations
the adapter uses, are stated as an executable function, rule by rule from its source, and the
adapter's own arguments are run through it and judged by ``kda_impls.verify`` against the float64
reference. Only the library is replaced: the adapter's entry-point lookup, its reasons and its
launcher run unchanged.

Sources, flashinfer-python 0.7.2.post1 (the wheel on PyPI):
  [W] flashinfer/kda_kernels/recurrent_kda.py, ``run_recurrent_kda`` (the wrapper, lines 1882-2740)
  [K] the same file: the one-warp kernel (lines 330-600) and the grouped-CTA kernel (lines 615-860)
  [T] flashinfer's tests/kda/test_recurrent_kda.py: ``naive_recurrent_kda`` and ``naive_kda_gate``
"""

import dataclasses
import importlib.machinery
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_verified_or_refuses_gva
from kda_impls import make_inputs, reference, rel_err, verify
from kda_impls.impls.flashinfer_kda import FlashInferKDA
from kda_impls.impls.flashinfer_variants import FlashInferLogGate, FlashInferLogGateSigmoid, FlashInferSigmoid


def recurrent_kda_as_documented(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                                output_final_state=False, use_qk_l2norm_in_kernel=True,
                                use_gate_in_kernel=False, lower_bound=None, cu_seqlens=None,
                                ssm_state_indices=None, output=None, beta_is_logit=False):
    """``flashinfer.recurrent_kda`` in its packed one-token-per-sequence decode form, in float32 as
    the kernels compute. Parameters the adapter never passes are absent (passing one is a TypeError);
    forms it does not use raise NotImplementedError rather than guess."""
    if cu_seqlens is None or initial_state is None or lower_bound is not None or output_final_state:
        raise NotImplementedError("stated here: the packed form (cu_seqlens) on a given pool, the softplus "
                                  "gate, no final state returned")
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    # [W] 2039-2047: K == V in {64, 128}; q, k, v, g, beta bf16; HV a multiple of H
    assert K == V and K in (64, 128), (K, V)
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, g, beta))
    assert HV % H == 0
    # [W] 2049-2055: A_log fp32, required by the in-kernel gate; dt_bias fp32
    if use_gate_in_kernel:
        assert A_log is not None and A_log.dtype == torch.float32
    assert dt_bias is None or dt_bias.dtype == torch.float32
    # [W] 2204: one packed batch row; [W] 2240: without indices sequence n uses slot n
    assert B == 1
    n_seq = cu_seqlens.numel() - 1
    slots = ssm_state_indices.view(-1).tolist() if ssm_state_indices is not None else list(range(n_seq))
    # [W] 2262-2280: the caller's output is written only if it has v's shape and q's dtype; otherwise
    # the result goes to a buffer of the library's own
    if output is not None and output.shape == v.shape and output.dtype == q.dtype and output.device == q.device:
        out = output
    else:
        out = torch.empty_like(v)
    scale = K**-0.5 if scale is None else scale  # [W] 2618
    group = HV // H
    for n in range(n_seq):
        start, end = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if end - start > 1:
            raise NotImplementedError("stated here: one token per sequence")
        if end == start:
            continue
        raw_slot = slots[n]
        read_slot = 0 if raw_slot < 0 else raw_slot  # [K] 406, 694: a -1 row reads slot 0
        active = raw_slot >= 0  # [K] 461, 783: and writes nothing
        for hv in range(HV):
            h = hv // group  # [K] 373, 649: value head hv reads q/k head hv // (HV // H)
            qh, kh = q[0, start, h].float(), k[0, start, h].float()
            if use_qk_l2norm_in_kernel:  # [K] 550-551, eps 1e-6 from [W] 2619 (and 797 in the grouped kernel)
                qh = qh * torch.rsqrt((qh * qh).sum() + 1e-6)
                kh = kh * torch.rsqrt((kh * kh).sum() + 1e-6)
            qh = qh * scale
            gate = g[0, start, hv].float()
            if use_gate_in_kernel:
                # [K] 437-439, 714-718: A_log and dt_bias are read at the q/k head h, not at hv;
                # compute_gate_value (lines 255-276): -exp(A_log) * softplus(g + dt_bias), as [T] naive_kda_gate
                if dt_bias is not None:
                    gate = gate + dt_bias.reshape(-1)[h * K:(h + 1) * K]
                gate = -torch.exp(A_log[h]) * F.softplus(gate)
            # else g is already the log gate: [K] 279 exponentiates it as is
            b = beta[0, start, hv].float()
            if beta_is_logit:  # [K] 482-485; otherwise beta is taken as already sigmoided
                b = torch.sigmoid(b)
            S = initial_state[read_slot, hv].float()  # [V, K]
            S = S * torch.exp(gate)[None, :]  # [K] 576
            S = S + (b * (v[0, start, hv].float() - S @ kh))[:, None] * kh[None, :]  # [K] 585-589
            if active:
                out[0, start, hv] = (S @ qh).to(out.dtype)  # [K] 592-594
                initial_state[raw_slot, hv] = S.to(initial_state.dtype)  # [K] 596-603
            else:
                # [K] 851 (grouped), 389 (one-warp D128) and [W] 2274 (one-warp D64 zero-fills)
                out[0, start, hv] = 0
    return out, None


def on_cpu(variant: type) -> FlashInferKDA:
    """The adapter variant unchanged, let onto the CPU, where the emulation stands in for the library."""
    capabilities = dataclasses.replace(variant.capabilities, devices=("cpu",), min_compute_capability=None,
                                       packages=("flashinfer",))
    return type(f"{variant.__name__}OnCpu", (variant,), {"capabilities": capabilities})()


FlashInferOnCpu = type(on_cpu(FlashInferKDA))


@pytest.fixture
def emulated_flashinfer(monkeypatch):
    """A ``flashinfer`` module whose ``recurrent_kda`` is the emulation (for this test only)."""
    module = types.ModuleType("flashinfer")
    module.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    module.recurrent_kda = recurrent_kda_as_documented
    module.kda_kernels = types.SimpleNamespace(run_recurrent_kda=recurrent_kda_as_documented)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


CASES = [
    dict(B=3, H=4, HV=4, K=64, V=64, slot_pad=16, pad_rows=1),  # equal heads: the gate in the kernel
    dict(B=3, H=1, HV=4, K=64, V=64, slot_pad=16, pad_rows=1),  # GVA: the adapter's per-value-head log gate
    dict(B=4, H=2, HV=4, K=128, V=128, slot_pad=32, pad_rows=2, n_slots=9),  # GVA with H > 1, K = 128
    dict(B=2, H=2, HV=2, K=128, V=128, pad_rows=0, scale=0.3),  # unpadded pool, every row live, a given scale
    dict(B=2, H=1, HV=2, K=64, V=64, pad_rows=0, scale=0.3),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", [FlashInferKDA, FlashInferSigmoid, FlashInferLogGate, FlashInferLogGateSigmoid])
def test_adapter_arguments_compute_the_reference(emulated_flashinfer, case, variant):
    """Every packed variant's arguments compute the reference where the variant runs; the in-kernel
    gate variants refuse GVA (the library reads the gate parameters per q/k head)."""
    impl = on_cpu(variant)
    case = dict(case)
    scale = case.pop("scale", None)
    x = make_inputs(**case, seed=12)
    x.scale = scale
    assert_verified_or_refuses_gva(impl, x)  # the adapter's own reasons, with the emulation importable


def test_padding_rows_read_slot_0_and_leave_it_alone(emulated_flashinfer):
    """The library reads slot 0 for -1 rows; verify checks that slot 0, named by no row, keeps its bits."""
    x = make_inputs(4, 2, 2, 64, 64, slot_pad=16, n_slots=6, seed=13)
    x.slots = torch.tensor([3, -1, 1, -1], dtype=torch.int32)
    verdict = verify(FlashInferOnCpu(), x)
    assert verdict.ok, verdict


def test_the_emulation_reads_gate_parameters_at_the_qk_head(emulated_flashinfer):
    """The rule the GVA adapter exists for, checked in the emulation itself: with the in-kernel gate,
    value head hv gets A_log and dt_bias of q/k head hv // (HV // H) ([K] 437-439)."""
    x = make_inputs(3, 2, 4, 64, 64, slot_pad=16, pad_rows=1, seed=14)
    group = x.HV // x.H
    per_qk_head = x.clone()
    per_qk_head.A_log = x.A_log[::group].repeat_interleave(group).contiguous()
    per_qk_head.dt_bias = x.dt_bias[::group].repeat_interleave(group, dim=0).contiguous()
    want_out, want_rows = reference(per_qk_head)

    out = torch.empty(1, x.B, x.HV, x.V, dtype=torch.bfloat16)
    recurrent_kda_as_documented(
        q=x.q[None], k=x.k[None], v=x.v[None], g=x.a[None], beta=x.b[None], A_log=x.A_log[::group].contiguous(),
        dt_bias=x.dt_bias[::group].reshape(-1).contiguous(), initial_state=x.state, use_gate_in_kernel=True,
        beta_is_logit=True, cu_seqlens=torch.arange(x.B + 1, dtype=torch.int32), ssm_state_indices=x.slots,
        output=out)
    live = x.slots >= 0
    assert rel_err(out[0][live], want_out[live]) < 1e-2
    assert rel_err(x.state[x.slots[live].long()], want_rows[live]) < 1e-2
    assert (out[0][~live] == 0).all()
