"""Every library's call variants: their registry entries, the gate/beta precompute they share, how
each variant wires its library (checked on the CPU without FlashInfer), fla's variants against the
float64 reference (interpreted on the CPU), and FlashInfer's on a GPU.

What a variant promises is the same step as every other implementation, only a different call of
the same kernel; so each one goes through ``kda_impls.verify`` wherever it can run, and each
refusal (GVA for a gate computed per q/k head, -1 rows and pool layouts a form cannot take) is
checked to name the library's own reason.
"""

import importlib.util
import inspect

import pytest
import torch
import torch.nn.functional as F

from helpers import DEVICE, misaligned, needs_fla
from kda_impls import Implementation, Unsupported, get, make_inputs, names, reference, rel_err, verify
from kda_impls.impls import precompute as precompute_module
from kda_impls.impls.flashinfer_kda import FORMS, recurrent_kda_entry_point
from kda_impls.impls.precompute import precompute

flashinfer_installed = importlib.util.find_spec("flashinfer") is not None

FLA = ["fla", "fla-sigmoid", "fla-loggate", "fla-loggate-sigmoid", "fla-batched"]
FLASHINFER = ["flashinfer", "flashinfer-sigmoid", "flashinfer-loggate", "flashinfer-loggate-sigmoid",
              "flashinfer-gather", "flashinfer-dense"]
GATE_IN_KERNEL = {"flashinfer", "flashinfer-sigmoid", "flashinfer-gather"}


def float64_gate_beta(x):
    """Our semantics' log gate ``[B, HV, K]`` (per value head) and sigmoid(b) ``[B, HV]`` in float64."""
    dt_bias = x.dt_bias.double().view(x.HV, x.K)
    gate = -torch.exp(x.A_log.double())[:, None] * F.softplus(x.a.double() + dt_bias)
    return gate, torch.sigmoid(x.b.double())


def max_rel(got, want):
    return ((got.double() - want) / want).abs().max().item()


# ---- the registry ------------------------------------------------------------------------------

def test_every_implementation_says_which_library_and_call_it_is():
    registered = {name: get(name) for name in names()}
    assert {n: i.library for n, i in registered.items() if n in FLA + FLASHINFER} == \
        {**dict.fromkeys(FLA, "fla"), **dict.fromkeys(FLASHINFER, "flashinfer")}
    assert registered["naive"].library == "torch" and registered["triton"].library == "kda-impls"
    for name, impl in registered.items():
        assert impl.name == name
        assert impl.variant and "\n" not in impl.variant, f"{name}: variant must be one line"
    engine_calls = {n: i.engine_call for n, i in registered.items() if i.engine_call}
    assert set(engine_calls) == {"flashinfer-sigmoid", "fla", "fla-loggate-sigmoid", "sglang-cutedsl", "sglang-triton",
                                 "sglang-replayssm"}
    assert engine_calls["flashinfer-sigmoid"].startswith("SGLang")
    assert engine_calls["fla-loggate-sigmoid"].startswith("vLLM")


@pytest.mark.parametrize("name", ["fla-loggate", "flashinfer-dense"])
def test_a_missing_library_names_its_extra(monkeypatch, name):
    """pyproject's extras are per library, not per variant."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *a: None if module in ("fla", "flashinfer")
                        else real(module, *a))
    reason = get(name).unsupported(make_inputs(2, 2, 2, 64, 64, seed=20))
    assert reason.endswith(f"(pip install -e .[{get(name).library}])"), reason


def test_library_defaults_to_the_name():
    class Plain(Implementation):
        name = "plain"

    assert Plain().library == "plain" and Plain().variant == "" and Plain().engine_call == ""


# ---- the shared precompute ---------------------------------------------------------------------

@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, rtol", [
    (torch.float32, 1e-5),  # a + dt_bias is rounded to fp32 first: a few ulp of |x| (up to ~30 here)
    # bf16: rounding to nearest is 2**-8; Triton's interpreter truncates instead, 2**-7
    (torch.bfloat16, 2 ** -8 if DEVICE == "cuda" else 2 ** -7),
])
def test_precompute_is_our_gate_and_beta(dtype, rtol):
    x = make_inputs(7, 2, 4, 48, 16, device=DEVICE, seed=21)  # K not a power of two: masked columns
    x.a.mul_(8)  # far into softplus' tails: exp(x) ~ 1e-13 (log(1 + y) would lose it all) and x > 20
    gate, beta = float64_gate_beta(x)
    prepared = precompute(x, log_gate=True, beta=True, dtype=dtype)
    assert prepared.log_gate.shape == (7, 4, 48) and prepared.beta.shape == (7, 4)
    assert prepared.log_gate.dtype == prepared.beta.dtype == dtype
    prepared.launch()
    assert max_rel(prepared.log_gate, gate) <= rtol
    assert max_rel(prepared.beta, beta) <= rtol
    # per VALUE head: value heads 0 and 1 share q/k head 0 but not A_log and dt_bias
    assert max_rel(prepared.log_gate[:, 1], gate[:, 0]) > 0.1


@pytest.mark.interpreter
@pytest.mark.parametrize("log_gate, beta", [(True, False), (False, True)])
def test_precompute_only_what_is_asked_and_from_the_current_inputs(log_gate, beta):
    x = make_inputs(3, 1, 2, 16, 16, device=DEVICE, seed=22)
    prepared = precompute(x, log_gate=log_gate, beta=beta, dtype=torch.float32)
    assert (prepared.log_gate is None) != log_gate and (prepared.beta is None) != beta
    for _ in range(2):  # a second launch sees the inputs as they are then
        prepared.launch()
        gate, sigmoid_b = float64_gate_beta(x)
        if log_gate:
            assert max_rel(prepared.log_gate, gate) <= 1e-5
        if beta:
            assert max_rel(prepared.beta, sigmoid_b) <= 1e-6
        x.a.mul_(-1)
        x.b.mul_(-1)
    with pytest.raises(ValueError, match="precompute nothing"):
        precompute(x, log_gate=False, beta=False, dtype=torch.float32)


def test_precompute_reasons(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(precompute_module, "_gate_beta_kernel", object())  # as imported without the interpreter
    assert precompute_module.unavailable_reason(cpu).startswith(
        "the gate/beta precompute kernel (Triton) runs on the CPU only under TRITON_INTERPRET=1")
    assert precompute_module.unavailable_reason(cuda) is None
    interpreted = precompute_module.InterpretedFunction.__new__(precompute_module.InterpretedFunction)
    monkeypatch.setattr(precompute_module, "_gate_beta_kernel", interpreted)
    assert precompute_module.unavailable_reason(cpu) is None
    assert precompute_module.unavailable_reason(cuda).startswith("TRITON_INTERPRET=1 was set when")


# ---- FlashInfer: the wiring of each variant, without the library -------------------------------

def flashinfer_arguments(name, H=4, HV=4, B=3, K=64, **layout):
    x = make_inputs(B, H, HV, K, K, seed=23, **({"slot_pad": 16, "pad_rows": 1} | layout))
    out = torch.empty(B, HV, K, dtype=torch.bfloat16)
    return x, out, *get(name).library_arguments(x, out)


@pytest.mark.interpreter
@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_variant_arguments(name):
    impl = get(name)
    dense_layout = {"slot_pad": 0, "n_slots": 4, "pad_rows": 0}  # a compact pool one slot longer than B
    x, out, kw, prepare = flashinfer_arguments(name, **(dense_layout if impl.form == "dense" else {}))
    gate_in_kernel, beta_in_kernel = name in GATE_IN_KERNEL, name in {"flashinfer", "flashinfer-loggate",
                                                                     "flashinfer-gather"}
    assert (impl.gate_in_kernel, impl.beta_in_kernel) == (gate_in_kernel, beta_in_kernel)
    assert kw["use_gate_in_kernel"] is gate_in_kernel and kw["beta_is_logit"] is beta_in_kernel
    assert kw["use_qk_l2norm_in_kernel"] and not kw["output_final_state"] and kw["scale"] == x.effective_scale

    rows = (1, 3) if impl.form == "packed" else (3, 1)  # [1, B, ...] one sequence of B tokens, or [B, 1, ...]
    for arg, source in (("q", x.q), ("k", x.k), ("v", x.v), ("output", out)):
        assert kw[arg].shape == (*rows, *source.shape[1:]), arg
        assert kw[arg].data_ptr() == source.data_ptr(), f"{arg} must be a view, not a copy"
    assert kw["g"].shape == (*rows, 4, 64) and kw["beta"].shape == (*rows, 4)
    assert (kw["g"].data_ptr() == x.a.data_ptr()) is gate_in_kernel
    assert (kw["beta"].data_ptr() == x.b.data_ptr()) is beta_in_kernel
    assert ("A_log" in kw and "dt_bias" in kw) is gate_in_kernel
    if gate_in_kernel:
        assert kw["A_log"] is x.A_log and kw["dt_bias"].shape == (4 * 64,)
        assert kw["dt_bias"].data_ptr() == x.dt_bias.data_ptr()

    if impl.form == "packed":
        assert kw["initial_state"] is x.state and kw["ssm_state_indices"] is x.slots
        assert torch.equal(kw["cu_seqlens"], torch.arange(4, dtype=torch.int32))
    elif impl.form == "gather":
        assert kw["initial_state"] is x.state and kw["ssm_state_indices"] is x.slots and "cu_seqlens" not in kw
    else:
        assert "ssm_state_indices" not in kw and "cu_seqlens" not in kw
        state = kw["initial_state"]
        assert state.shape == (3, 4, 64, 64) and state.is_contiguous() and state.data_ptr() == x.state.data_ptr()

    assert (prepare is None) == (gate_in_kernel and beta_in_kernel)
    if prepare is not None:  # what the launcher runs first: our gate and sigmoid(b), in bf16
        prepare()
        gate, beta = float64_gate_beta(x)
        for arg, in_kernel, want in (("g", gate_in_kernel, gate), ("beta", beta_in_kernel, beta)):
            if not in_kernel:
                assert kw[arg].dtype == torch.bfloat16
                assert max_rel(kw[arg].reshape(want.shape), want) <= 2 ** -7  # truncated by the interpreter


@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_variants_under_gva(name):
    x = make_inputs(2, 1, 4, 64, 64, seed=24, n_slots=2)
    x.slots = torch.arange(2, dtype=torch.int32)
    reason = get(name)._extra_unsupported(x)
    if name in GATE_IN_KERNEL:
        assert reason == ("GVA (H=1, HV=4): recurrent_kda's in-kernel gate (use_gate_in_kernel=True) takes A_log [H] "
                          "and dt_bias [H*K] per q/k head, reading entry hv // (HV // H) for value head hv; ours are "
                          "per value head (precompute the gate per value head: flashinfer-loggate)")
    else:  # nothing against GVA: what is left is the library itself, missing here
        assert reason is None or reason.startswith("flashinfer does not import"), reason


@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_alignment_is_asked_of_what_the_library_reads(name):
    """The kernel is compiled for 32-byte aligned tensors: the inputs a variant hands over must be;
    those it replaces by buffers of its own (a and b when precomputed, slots in the dense form) need not."""
    impl = get(name)
    for arg in ("a", "b", "slots"):
        x = make_inputs(2, 2, 2, 64, 64, seed=25, n_slots=2)
        x.slots = torch.arange(2, dtype=torch.int32)
        if arg == "slots":  # int32: 4 bytes past the (64-byte aligned) start of an allocation
            x.slots = torch.empty(9, dtype=torch.int32)[1:3].copy_(x.slots)
        else:
            setattr(x, arg, misaligned(getattr(x, arg)))
        assert getattr(x, arg).data_ptr() % 32
        reason = impl._extra_unsupported(x) or ""
        passed = {"a": impl.gate_in_kernel, "b": impl.beta_in_kernel, "slots": impl.form != "dense"}[arg]
        assert reason.startswith(f"{arg} must start 32-byte aligned") is passed, (arg, reason)


def test_flashinfer_forms_refuse_what_they_cannot_take():
    gather, dense = get("flashinfer-gather"), get("flashinfer-dense")
    assert {gather.form, dense.form, get("flashinfer").form} == set(FORMS)
    padded = dict(slot_pad=16, n_slots=4, seed=26)
    # gather: recurrent_kda refuses a non-contiguous pool without cu_seqlens, except on its auto route
    assert gather._form_unsupported(make_inputs(2, 2, 2, 64, 64, **padded)).startswith(
        "recurrent_kda refuses a non-contiguous initial_state without cu_seqlens (slot stride 8208 != HV*V*K=8192)")
    assert gather._form_unsupported(make_inputs(2, 2, 2, 128, 128, **padded)) is None
    assert gather._form_unsupported(make_inputs(2, 2, 2, 64, 64, n_slots=4, seed=26)) is None
    # dense: the first B slots as one contiguous tensor
    assert dense._form_unsupported(make_inputs(2, 2, 2, 64, 64, **padded)) == (
        "the dense form takes the first B slots as one contiguous [B, HV, V, K] tensor: needs a slot stride "
        "of HV*V*K=8192; got 8208")
    assert dense._form_unsupported(make_inputs(1, 2, 2, 64, 64, **padded)) is None  # one slot: any stride
    x = make_inputs(3, 2, 2, 64, 64, seed=26)
    x.state, x.slots = x.state[:1], torch.tensor([-1, 0, -1], dtype=torch.int32)  # legal: two -1 rows
    get("naive").check(x)
    assert dense._form_unsupported(x) == ("the dense form updates state row i for batch row i: needs a pool of "
                                          "at least B=3 slots; got N=1")


@pytest.mark.parametrize("name, slots, refused", [
    ("flashinfer-dense", [0, 1, 2], False),
    ("flashinfer-dense", [1, 0, 2], True),
    ("flashinfer-dense", [0, 1, -1], True),
    ("flashinfer-gather", [3, 0, 5], False),
    ("flashinfer-gather", [3, -1, 5], True),
    ("flashinfer", [3, -1, 5], False),
])
def test_flashinfer_slot_values_a_form_cannot_take(name, slots, refused):
    """Read at bind time (a sync): the launcher raises Unsupported before touching the library."""
    x = make_inputs(3, 2, 2, 64, 64, n_slots=6, seed=27)
    x.slots = torch.tensor(slots, dtype=torch.int32)
    impl = get(name)
    reason = impl._slots_unsupported(x)
    assert (reason is not None) is refused
    if refused:
        with pytest.raises(Unsupported, match=f"^{name} recurrent_kda: "):
            impl._launcher(x, torch.empty(3, 2, 64, dtype=torch.bfloat16))
    if name == "flashinfer-gather" and refused:
        assert "a -1 row would overwrite slot N-1" in reason


@pytest.mark.skipif(not flashinfer_installed, reason="flashinfer is not installed")
@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_variant_arguments_bind_to_the_installed_signature(name):
    layout = {"slot_pad": 0, "n_slots": 3, "pad_rows": 0} if get(name).form == "dense" else {}
    _, _, kw, _ = flashinfer_arguments(name, **layout)
    signature = inspect.signature(recurrent_kda_entry_point())
    signature.bind(**kw)
    named = {n for n, p in signature.parameters.items() if p.kind != p.VAR_KEYWORD}
    assert set(kw) <= named, f"swallowed by **kwargs: {set(kw) - named}"


# ---- fla: every variant against the reference, and its calls --------------------------------


@needs_fla
@pytest.mark.interpreter
@pytest.mark.parametrize("name", FLA[1:])
def test_fla_variant_precompute_loses_nothing(name):
    """fla reads the precomputed gate and beta in float32: the variants agree with the in-kernel
    call to float32 rounding, on fp32 state and activations."""
    x = make_inputs(3, 1, 2, 32, 32, dtype=torch.float32, state_dtype=torch.float32, slot_pad=16, pad_rows=1,
                    device=DEVICE, seed=29)
    y = x.clone()
    out_variant, out_fla = get(name).bind(x)(), get("fla").bind(y)()
    assert rel_err(out_variant, out_fla) <= 1e-6
    assert rel_err(x.pool_span(), y.pool_span()) <= 1e-6


@needs_fla
@pytest.mark.interpreter
@pytest.mark.parametrize("pad_rows", [0, 2])
@pytest.mark.parametrize("name", FLA)
def test_fla_variant_calls(fla_calls, name, pad_rows):
    impl = get(name)
    x = make_inputs(5, 1, 2, 16, 16, slot_pad=16, pad_rows=pad_rows, device=DEVICE, seed=30)
    verdict = verify(impl, x)
    assert verdict.ok, verdict
    kw = fla_calls[0]  # the first step's (verify runs several on the pool)
    live = 5 - pad_rows
    rows = (1, live) if impl.packed else (live, 1)
    assert kw["q"].shape == (*rows, 1, 16) and kw["g"].shape == (*rows, 2, 16) and kw["beta"].shape == (*rows, 2)
    assert kw["out"].shape == (*rows, 2, 16)
    assert ("cu_seqlens" in kw) is impl.packed
    if impl.packed:
        assert torch.equal(kw["cu_seqlens"].cpu(), torch.arange(live + 1, dtype=torch.int32))
    assert torch.equal(kw["ssm_state_indices"], x.slots[x.slots >= 0])
    assert kw["initial_state"] is x.state and kw["inplace_final_state"] and kw["state_v_first"]
    assert kw["use_gate_in_kernel"] is impl.gate_in_kernel and kw["use_beta_sigmoid_in_kernel"] is impl.beta_in_kernel
    assert ("A_log" in kw and "dt_bias" in kw) is impl.gate_in_kernel
    assert kw["g"].dtype == (x.a.dtype if impl.gate_in_kernel else torch.float32)
    assert kw["beta"].dtype == (x.b.dtype if impl.beta_in_kernel else torch.float32)


@needs_fla
@pytest.mark.interpreter
def test_fla_reads_and_writes_one_slot_stride_before_the_pool_for_slot_minus_one():
    """The finding behind the adapter's live-row gather (docs/findings.md): handed a -1, fla-core
    0.6.0 loads the state at ``initial_state - stride(0)``, stores the updated state there and
    writes a non-zero output row. The pool is placed one slot into a larger buffer so that the
    slot before it is memory we own and can watch."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    B, H, HV, K = 2, 1, 2, 16
    x = make_inputs(B, H, HV, K, K, n_slots=2, device=DEVICE, seed=31)
    buffer = torch.randn(3, HV, K, K, device=DEVICE).to(x.state.dtype)  # slot "-1", then the pool
    x.state = buffer[1:]
    x.slots = torch.tensor([-1, 1], dtype=torch.int32, device=DEVICE)
    before = buffer.clone()
    out, _ = fused_recurrent_kda_fwd(
        q=x.q.unsqueeze(0), k=x.k.unsqueeze(0), v=x.v.unsqueeze(0), g=x.a.unsqueeze(0), beta=x.b.unsqueeze(0),
        A_log=x.A_log, dt_bias=x.dt_bias, initial_state=x.state, scale=x.effective_scale, inplace_final_state=True,
        state_v_first=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        cu_seqlens=torch.arange(B + 1, dtype=torch.int32, device=DEVICE), ssm_state_indices=x.slots)
    assert not torch.equal(buffer[0], before[0]), "the slot before the pool was not written"
    assert torch.equal(buffer[1], before[1]), "slot 0 is not named in slots"
    assert out[0, 0].abs().sum() > 0, "the -1 row got a zero output"
    # what it stored there is the step applied to that memory: row 0 decoded from slot "-1"
    from_before = x.clone()
    from_before.state, from_before.slots = before, torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    ref_out, ref_rows = reference(from_before)
    assert rel_err(buffer[0], ref_rows[0]) <= 1e-2 and rel_err(out[0, 0], ref_out[0]) <= 1e-2


# ---- FlashInfer on the GPU ---------------------------------------------------------------------

def runnable(name, x):
    reason = get(name).unsupported(x)
    if reason:
        pytest.skip(f"{name}: {reason}")
    return x


DENSE_CASES = {  # what FlashInfer's benchmark passes: state[i] for batch row i, every row live
    "one-warp-d128": dict(B=64, H=32, HV=32, K=128, V=128),
    "one-warp-d64-gva": dict(B=16, H=8, HV=16, K=64, V=64),
    "grouped-d128": dict(B=2, H=16, HV=16, K=128, V=128),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", DENSE_CASES.values(), ids=DENSE_CASES.keys())
def test_flashinfer_dense_on_gpu(case):
    x = make_inputs(**case, n_slots=case["B"], sorted_slots=True, device="cuda", seed=33)
    assert torch.equal(x.slots.cpu(), torch.arange(case["B"], dtype=torch.int32))
    verdict = verify(get("flashinfer-dense"), runnable("flashinfer-dense", x))
    assert verdict.ok, verdict
    # any other order is refused at bind, with the reason
    y = make_inputs(**case, n_slots=case["B"], sorted_slots=True, device="cuda", seed=33)
    y.slots = y.slots.flip(0).contiguous()
    with pytest.raises(Unsupported, match="needs slots == arange"):
        get("flashinfer-dense").bind(y)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    dict(B=64, H=32, HV=32, K=128, V=128, slot_pad=64),  # padded pool: the auto route takes it
    dict(B=8, H=16, HV=16, K=64, V=64),  # compact pool
    dict(B=4, H=8, HV=8, K=128, V=128, n_slots=9),  # grouped kernel
], ids=["d128-padded", "d64-compact", "grouped"])
def test_flashinfer_gather_on_gpu(case):
    x = make_inputs(**case, device="cuda", seed=34)
    verdict = verify(get("flashinfer-gather"), runnable("flashinfer-gather", x))
    assert verdict.ok, verdict
    y = make_inputs(**case, pad_rows=1, device="cuda", seed=34)
    with pytest.raises(Unsupported, match="a -1 row would overwrite slot N-1"):
        get("flashinfer-gather").bind(y)


@pytest.mark.gpu
@pytest.mark.parametrize("B, HV", [(64, 32), (4, 8)], ids=["one-warp", "grouped"])
def test_flashinfer_gather_form_overwrites_the_last_slot_for_minus_one(B, HV):
    """The finding behind flashinfer-gather's refusal of -1 rows (docs/findings.md): called on the
    library itself, the [B, 1] form with ssm_state_indices turns a -1 into Python's last slot: slot
    N-1, named by no row, is overwritten and the padding row's output is not zero."""
    x = make_inputs(B, HV, HV, 128, 128, n_slots=2 * B, device="cuda", seed=38)
    x.slots = torch.arange(B, dtype=torch.int32, device="cuda")  # slot N-1 = 2B-1 belongs to no row
    x.slots[1] = -1
    out = torch.zeros(B, HV, 128, dtype=torch.bfloat16, device="cuda")
    arguments, _ = get("flashinfer-gather").library_arguments(x, out)
    last = x.state[-1].clone()
    recurrent_kda_entry_point()(**arguments)
    torch.cuda.synchronize()
    assert not torch.equal(x.state[-1], last), "slot N-1 kept its state"
    assert out[1].abs().sum() > 0, "the -1 row got a zero output"


@pytest.mark.gpu
def test_flashinfer_in_kernel_gate_is_per_qk_head_under_gva():
    """The finding behind the GVA refusal (docs/findings.md): with use_gate_in_kernel=True under
    GVA, recurrent_kda takes A_log and dt_bias per q/k head: handed our per-value-head [HV] ones it
    uses entry hv // (HV // H) for value head hv, i.e. only the first H, with no error. Its result
    is the reference's for those parameters, not for ours. B*HV = 64: the grouped kernel; 256: the
    one-warp kernel."""
    for B in (8, 32):
        _check_gate_per_qk_head(make_inputs(B, 2, 8, 128, 128, slot_pad=16, pad_rows=1, device="cuda", seed=36))


def _check_gate_per_qk_head(x):
    group = x.HV // x.H
    per_qk_head = x.clone()
    per_qk_head.A_log = x.A_log[:x.H].repeat_interleave(group).contiguous()
    per_qk_head.dt_bias = x.dt_bias.view(x.HV, x.K)[:x.H].repeat_interleave(group, dim=0).contiguous()
    out = torch.empty(x.B, x.HV, x.V, dtype=torch.bfloat16, device="cuda")
    arguments, _ = get("flashinfer").library_arguments(x, out)  # the gate-in-kernel call, GVA or not
    ours, _ = reference(x)
    as_qk_head, rows_as_qk_head = reference(per_qk_head)
    recurrent_kda_entry_point()(**arguments)
    torch.cuda.synchronize()
    live = x.slots >= 0
    assert rel_err(out[live], as_qk_head[live]) <= 1e-2
    assert rel_err(out[live], ours[live]) > 1e-2  # what verify() would call wrong
    assert rel_err(x.state[x.slots[live].long()], rows_as_qk_head[live]) <= 1e-2


@pytest.mark.gpu
def test_precompute_rounds_to_nearest_on_gpu():
    x = make_inputs(64, 4, 8, 128, 128, device="cuda", seed=37)
    gate, beta = float64_gate_beta(x)
    prepared = precompute(x, log_gate=True, beta=True, dtype=torch.bfloat16)
    prepared.launch()
    assert max_rel(prepared.log_gate, gate) <= 2 ** -8 and max_rel(prepared.beta, beta) <= 2 ** -8
