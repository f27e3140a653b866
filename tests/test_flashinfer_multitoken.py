"""FlashInfer's variants on multi-token steps (T tokens per row, ``num_spec_tokens=T-1``).

FlashInfer cannot run here (it needs a GPU and its CuTe DSL), so on the CPU the adapter runs end to
end through kda_impls.verify against :func:`grouped_kernel_model`: a float64 model of what
flashinfer-python 0.7.2.post1 does with the arguments of a speculative call, written from its source
(``run_recurrent_kda``'s batched spec-decode shim and ``_grouped_kda_kernel``, the only kernel a call
with ``num_spec_tokens`` reaches): rows start from ``ssm_state_indices[n, clamp(num_accepted[n] - 1,
0, T - 1)]`` (slot 0 for -1), and a token whose index is -1 is skipped altogether (no decay, no
update, output 0). What this checks is the adapter's half: the arguments per form and T, and the
remapping that makes that reading our semantics. The ``gpu`` tests show the library's own skip of a
-1 token; tests/test_conformance.py runs every variant on the library itself.
"""

import importlib.util
import inspect
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from helpers import with_gaps
from kda_impls import Unsupported, get, make_inputs, reference, rel_err, verify
from kda_impls.impls import flashinfer_kda
from kda_impls.impls.flashinfer_kda import flashinfer_state_indices, recurrent_kda_entry_point

flashinfer_installed = importlib.util.find_spec("flashinfer") is not None
FLASHINFER = ["flashinfer", "flashinfer-sigmoid", "flashinfer-loggate", "flashinfer-loggate-sigmoid",
              "flashinfer-gather", "flashinfer-dense"]
POOL_FORMS = [n for n in FLASHINFER if get(n).form != "dense"]  # those that take our slots


def interior_gaps(x):
    """``x`` with -1 among its slots (:func:`with_gaps`) but each row's last token still stored:
    every -1 of a live row has a later store of that row, as FlashInfer's mapping needs."""
    last = x.slots[:, -1].clone()
    with_gaps(x).slots[:, -1] = last
    return x


# ---- a model of the library, from its source --------------------------------------------------------

def grouped_kernel_model(*, q, k, v, g, beta, scale, initial_state, output, use_gate_in_kernel, beta_is_logit,
                         use_qk_l2norm_in_kernel, output_final_state, num_spec_tokens, num_accepted_tokens,
                         A_log=None, dt_bias=None, cu_seqlens=None, ssm_state_indices=None):
    """``recurrent_kda`` with ``num_spec_tokens`` (T > 1) as flashinfer-python 0.7.2.post1 runs it, in
    float64 (``flashinfer/kda_kernels/recurrent_kda.py``). Updates ``initial_state`` and writes
    ``output`` in place."""
    assert use_qk_l2norm_in_kernel and not output_final_state
    T = num_spec_tokens + 1
    if cu_seqlens is None:  # the batched spec-decode shim: [B, T, ...] packed, cu_seqlens every T tokens
        B = q.shape[0]
        assert q.shape[1] == T, "q.shape[1] must equal 1+num_spec_tokens"
        q, k, v, g, beta, output = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, g, beta, output))
        cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.int32)
        if ssm_state_indices is None:
            assert initial_state.shape[0] >= B * T, "initial_state must have at least B*(1+num_spec_tokens) slots"
            ssm_state_indices = torch.arange(B * T, dtype=torch.int32).reshape(B, T)
    n_seq = cu_seqlens.numel() - 1
    assert q.shape[0] == 1 and ssm_state_indices.shape == (n_seq, T) and output.shape == (1, q.shape[1], *v.shape[2:])
    H, HV, D = q.shape[2], v.shape[2], q.shape[3]
    group = HV // H
    nat = torch.ones(n_seq, dtype=torch.int32) if num_accepted_tokens is None else num_accepted_tokens
    for n in range(n_seq):
        base, seq_len = int(cu_seqlens[n]), int(cu_seqlens[n + 1] - cu_seqlens[n])
        start = int(ssm_state_indices[n, min(max(int(nat[n]) - 1, 0), T - 1)])
        S = initial_state[max(start, 0)].double()  # [HV, V, K]
        for t in range(min(T, seq_len)):
            p, slot = base + t, int(ssm_state_indices[n, t])
            if slot < 0:  # skipped: no decay, no update, output 0
                output[0, p] = 0
                continue
            q_t = q[0, p].double().repeat_interleave(group, 0)
            k_t = k[0, p].double().repeat_interleave(group, 0)
            gate = g[0, p].double()
            if use_gate_in_kernel:  # A_log and dt_bias read at the q/k head h = hv // group
                h = torch.arange(HV) // group
                gate = -torch.exp(A_log.double()[h])[:, None] * F.softplus(gate + dt_bias.double().view(H, D)[h])
            b_t = beta[0, p].double()
            b_t = torch.sigmoid(b_t) if beta_is_logit else b_t
            k_hat = k_t / torch.sqrt((k_t * k_t).sum(-1, keepdim=True) + 1e-6)
            q_hat = q_t / torch.sqrt((q_t * q_t).sum(-1, keepdim=True) + 1e-6) * scale
            S = S * torch.exp(gate)[:, None, :]
            u = b_t[:, None] * (v[0, p].double() - torch.einsum("hvk,hk->hv", S, k_hat))
            S = S + u[..., None] * k_hat[:, None, :]
            output[0, p] = torch.einsum("hvk,hk->hv", S, q_hat).to(output.dtype)
            initial_state[slot] = S.to(initial_state.dtype)
    return output, None


@pytest.fixture
def modelled(monkeypatch):
    """A FlashInfer variant by name, allowed on the CPU, calling :func:`grouped_kernel_model`
    where it would call the library; what it was called with is recorded."""
    calls = []

    def model(**kw):
        calls.append(kw)
        return grouped_kernel_model(**kw)

    monkeypatch.setattr(flashinfer_kda, "recurrent_kda_entry_point", lambda: model)

    def impl(name):
        real = get(name)
        caps = replace(real.capabilities, devices=("cpu",), packages=(), min_compute_capability=None)
        # its own refusals of these inputs, minus the missing library and device
        cls = type(f"Modelled{type(real).__name__}", (type(real),),
                   {"capabilities": caps, "_extra_unsupported": lambda self, x: None})
        return cls()

    impl.calls = calls
    return impl


# ---- the CPU: the adapter against the model ----------------------------------------------------------

def test_every_variant_declares_any_number_of_tokens():
    for name in FLASHINFER:
        assert get(name).capabilities.max_tokens is None, name


STEPS = {  # a padded pool (16-element multiples), a padding row, random num_accepted with "all"
    "T2-all": dict(T=2, checkpoints="all"),
    "T3-last": dict(T=3, checkpoints="last"),
    "T4-all-interior-gaps": dict(T=4, checkpoints="all", gaps=True),
}


@pytest.mark.interpreter  # the precomputing variants' gate/beta kernel
@pytest.mark.parametrize("step", STEPS.values(), ids=STEPS.keys())
@pytest.mark.parametrize("name", POOL_FORMS)
def test_variant_is_our_semantics_under_the_library_reading(modelled, name, step):
    step = dict(step)
    gaps = step.pop("gaps", False)
    x = make_inputs(3, 2, 2, 64, 64, **step, slot_pad=16, pad_rows=1, seed=60)
    verdict = verify(modelled(name), interior_gaps(x) if gaps else x)
    assert verdict.ok, verdict


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["flashinfer-loggate", "flashinfer-loggate-sigmoid"])
def test_gva_with_the_gate_precomputed_per_value_head(modelled, name):
    x = interior_gaps(make_inputs(3, 1, 4, 64, 64, T=3, slot_pad=16, pad_rows=1, seed=61))
    verdict = verify(modelled(name), x)
    assert verdict.ok, verdict


def test_padding_rows_naming_slots_store_nothing(modelled):
    """A row whose start slot is -1 is padding even where it names other slots; the library
    would start it from slot 0 and store its tokens there, so it is handed all -1."""
    x = make_inputs(3, 2, 2, 64, 64, T=3, n_slots=12, seed=62)
    x.slots[1, 0] = -1  # row 1 starts at token 0: padding, though it names slots[1, 1:]
    x.num_accepted[1] = 1
    verdict = verify(modelled("flashinfer"), x)
    assert verdict.ok, verdict
    kw = modelled.calls[0]  # the first step's (verify runs several on the pool)
    assert (kw["ssm_state_indices"][1] == -1).all() and (x.slots[1, 1:] >= 0).all()


@pytest.mark.interpreter
def test_dense_form(modelled):
    """FlashInfer's benchmark layout at T > 1: every row live, token t of row i in slot i*T + t."""
    B, T = 3, 4
    x = make_inputs(B, 2, 2, 64, 64, T=T, n_slots=B * T, sorted_slots=True, seed=63)
    assert torch.equal(x.slots.flatten(), torch.arange(B * T, dtype=torch.int32))
    verdict = verify(modelled("flashinfer-dense"), x)
    assert verdict.ok, verdict
    kw = modelled.calls[0]  # the first step's (verify runs several on the pool)
    assert "ssm_state_indices" not in kw and "cu_seqlens" not in kw
    assert kw["initial_state"].shape[0] == B * T and kw["initial_state"].data_ptr() == x.state.data_ptr()


def test_without_the_remapping_the_library_reading_is_wrong(modelled, monkeypatch):
    """The finding the remapping answers: handed our slots as they are, the library's skip of a -1
    token (no decay, no update, output 0) is not our semantics (the token applied, its store
    skipped): verify calls the result wrong."""
    impl = modelled("flashinfer")
    monkeypatch.setattr(flashinfer_kda, "flashinfer_state_indices", lambda x: x.slots)
    monkeypatch.setattr(type(impl), "_slots_unsupported", lambda self, x: None)
    x = make_inputs(3, 2, 2, 64, 64, T=3, checkpoints="last", seed=64)
    verdict = verify(impl, x)
    assert not verdict.ok and "error" in str(verdict)


@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("name", FLASHINFER)
def test_arguments_per_form(name, T):
    """What each variant hands ``recurrent_kda`` at T > 1 (the precompute is not run here)."""
    impl = get(name)
    B = 3
    layout = dict(n_slots=B * T, sorted_slots=True) if impl.form == "dense" else dict(slot_pad=16)
    x = make_inputs(B, 2, 2, 64, 64, T=T, seed=65, **layout)
    out = torch.empty(x.out_shape, dtype=torch.bfloat16)
    kw, prepare = impl.library_arguments(x, out)
    assert kw["num_spec_tokens"] == T - 1 and kw["num_accepted_tokens"] is x.num_accepted
    rows = (1, B * T) if impl.form == "packed" else (B, T)
    for arg, source in (("q", x.q), ("k", x.k), ("v", x.v), ("output", out)):
        assert kw[arg].shape == (*rows, *source.shape[2:]), arg
        assert kw[arg].data_ptr() == source.data_ptr(), f"{arg} must be a view, not a copy"
    assert kw["g"].shape == (*rows, 2, 64) and kw["beta"].shape == (*rows, 2)
    assert (kw["g"].data_ptr() == x.a.data_ptr()) is impl.gate_in_kernel
    assert (prepare is None) == (impl.gate_in_kernel and impl.beta_in_kernel)
    if impl.form == "packed":
        assert torch.equal(kw["cu_seqlens"], torch.arange(0, B * T + 1, T, dtype=torch.int32))
    else:
        assert "cu_seqlens" not in kw
    if impl.form == "dense":
        assert "ssm_state_indices" not in kw and kw["initial_state"].shape[0] == B * T
    else:  # every token stored, every row live: our slots as they are
        assert kw["ssm_state_indices"] is x.slots and kw["initial_state"] is x.state


@pytest.mark.parametrize("slots, num_accepted, expected", [
    ([[4, 5, 6]], [2], [[4, 5, 6]]),  # every token stored: unchanged
    ([[-1, -1, 6]], [3], [[6, 6, 6]]),  # checkpoints "last"
    ([[4, -1, 6], [-1, 7, -1], [-1, 2, 3]], [1, 2, 3], [[4, 6, 6], [7, 7, -1], [2, 2, 3]]),  # a trailing -1 stays
    ([[-1, 5, 6]], [1], [[-1, -1, -1]]),  # a padding row: start -1
])
def test_state_indices(slots, num_accepted, expected):
    x = make_inputs(len(slots), 1, 1, 4, 4, T=3, n_slots=12, seed=66)
    x.slots = torch.tensor(slots, dtype=torch.int32)
    x.num_accepted = torch.tensor(num_accepted, dtype=torch.int32)
    indices = flashinfer_state_indices(x)
    assert indices.dtype == torch.int32 and indices.tolist() == expected
    assert (indices is x.slots) == (expected == slots)


@pytest.mark.parametrize("name", POOL_FORMS)
def test_a_minus_one_after_a_rows_last_store_is_refused(name):
    x = make_inputs(2, 2, 2, 64, 64, T=3, n_slots=8, seed=67)
    x.slots = torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32)
    x.num_accepted = torch.tensor([3, 1], dtype=torch.int32)
    impl = get(name)
    impl.check(x)  # legal for our contract
    reason = impl._slots_unsupported(x)
    assert reason.startswith("a -1 after the last slot a row stores into: recurrent_kda skips a token whose "
                             "ssm_state_indices entry is -1 (no decay, no update, output 0)"), reason
    with pytest.raises(Unsupported, match=f"^{name} recurrent_kda: a -1 after the last slot"):
        impl._launcher(x, torch.empty(x.out_shape, dtype=torch.bfloat16))
    x.slots[1, 2] = 5  # stored: taken
    assert impl._slots_unsupported(x) is None


def test_forms_at_t_above_one():
    gather, dense = get("flashinfer-gather"), get("flashinfer-dense")
    padded = make_inputs(2, 2, 2, 64, 64, T=2, slot_pad=16, pad_rows=1, seed=68)
    # the shim takes the pool as it is: no contiguity asked, -1 rows taken
    assert gather._form_unsupported(padded) is None and gather._slots_unsupported(padded) is None
    assert dense._form_unsupported(make_inputs(2, 2, 2, 64, 64, T=2, n_slots=4, slot_pad=16, seed=68)) is None
    assert dense._form_unsupported(make_inputs(2, 2, 2, 64, 64, T=3, n_slots=6, seed=68)) is None
    short = make_inputs(2, 2, 2, 64, 64, T=3, checkpoints="last", seed=68)
    assert dense._form_unsupported(short) == ("the dense form (num_spec_tokens, no ssm_state_indices) stores token t "
                                              "of row i in slot i*T + t: needs a pool of at least B*T=6 slots; got N=4")
    shuffled = make_inputs(2, 2, 2, 64, 64, T=2, n_slots=4, seed=68)
    assert dense._slots_unsupported(shuffled).endswith("needs slots == arange(B*T).view(B, T), no -1")
    empty_pool = make_inputs(2, 2, 2, 64, 64, T=2, pad_rows=2, seed=68)
    empty_pool.state = empty_pool.state[:0]
    assert gather._extra_unsupported(empty_pool) == ("the pool has no slots, and flashinfer reads slot 0 for rows "
                                                     "with slot -1")


def test_num_accepted_handed_over_must_be_aligned():
    x = make_inputs(2, 2, 2, 64, 64, T=2, seed=69)
    x.num_accepted = torch.empty(9, dtype=torch.int32)[1:3].copy_(x.num_accepted)
    assert get("flashinfer-loggate")._extra_unsupported(x).startswith("num_accepted must start 32-byte aligned")


@pytest.mark.skipif(not flashinfer_installed, reason="flashinfer is not installed")
@pytest.mark.parametrize("name", FLASHINFER)
def test_arguments_bind_to_the_installed_signature(name):
    layout = dict(n_slots=6, sorted_slots=True) if get(name).form == "dense" else {}
    x = make_inputs(2, 2, 2, 64, 64, T=3, seed=70, **layout)
    kw, _ = get(name).library_arguments(x, torch.empty(x.out_shape, dtype=torch.bfloat16))
    signature = inspect.signature(recurrent_kda_entry_point())
    signature.bind(**kw)
    assert set(kw) <= {n for n, p in signature.parameters.items() if p.kind != p.VAR_KEYWORD}


# ---- the H200: the library itself ------------------------------------------------------------------

def runnable(name, x):
    reason = get(name).unsupported(x)
    if reason:
        pytest.skip(f"{name}: {reason}")
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["flashinfer-loggate", "flashinfer-loggate-sigmoid"])
@pytest.mark.parametrize("K", [64, 128])
def test_gva_on_gpu(name, K):
    x = interior_gaps(make_inputs(8, 8, 32, K, K, T=4, slot_pad=16, pad_rows=1, device="cuda", seed=71))
    verdict = verify(get(name), runnable(name, x))
    assert verdict.ok, verdict


@pytest.mark.gpu
@pytest.mark.parametrize("T, B", [(2, 1), (4, 8), (8, 64)])
def test_dense_on_gpu(T, B):
    x = make_inputs(B, 32, 32, 128, 128, T=T, n_slots=B * T, sorted_slots=True, device="cuda", seed=72)
    verdict = verify(get("flashinfer-dense"), runnable("flashinfer-dense", x))
    assert verdict.ok, verdict


@pytest.mark.gpu
@pytest.mark.parametrize("T", [16, 32])
def test_many_tokens_on_gpu(T):
    """No limit on T is declared (none is in the source; T is a compile-time constant of the
    grouped kernel, whose shared memory grows with it): a wrong claim fails here."""
    x = make_inputs(8, 32, 32, 128, 128, T=T, slot_pad=64, pad_rows=1, device="cuda", seed=73)
    verdict = verify(get("flashinfer"), runnable("flashinfer", x))
    assert verdict.ok, verdict


@pytest.mark.gpu
def test_trailing_minus_one_is_refused_on_gpu():
    x = make_inputs(8, 32, 32, 128, 128, T=3, slot_pad=64, device="cuda", seed=74)
    x.slots[0, 2] = -1
    x.num_accepted[0] = 1
    with pytest.raises(Unsupported, match="a -1 after the last slot a row stores into"):
        get("flashinfer").bind(x)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [4, 64])
def test_library_skips_a_token_whose_index_is_minus_one(B):
    """The finding behind the remapping (docs/findings.md): called on the library itself with our
    slots of a "last" step (-1 for all tokens but the last), recurrent_kda outputs zeros for the
    -1 tokens and stores, for each row, the state after applying the last token alone to the start
    state: those tokens are skipped, not applied."""
    x = make_inputs(B, 32, 32, 128, 128, T=3, checkpoints="last", slot_pad=64, device="cuda", seed=75)
    out = torch.full(x.out_shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    kw, _ = get("flashinfer").library_arguments(x, out)
    kw["ssm_state_indices"] = x.slots  # as they are, not remapped
    last_only = replace(x.token(2), slots=x.slots[:, 2].contiguous())  # the last token from the start slot
    ref_out, ref_states = reference(last_only)
    recurrent_kda_entry_point()(**kw)
    torch.cuda.synchronize()
    assert (out[:, :2] == 0).all()
    assert rel_err(out[:, 2], ref_out) <= 1e-2
    assert rel_err(x.state[x.slots[:, 2].long()], ref_states) <= 1e-2


