"""fla's variants on multi-token steps (T tokens per row): fla-specific shapes through kda_impls.verify
(interpreted on the CPU, small shapes), the calls they make, and the scratch slot that stands in for
every -1 fla must not read or store through. Every mode at every shape class: tests/test_conformance.py.

fla-core 0.6.0 applies every token and stores every token's state at its index, -1 included (one
slot stride before the pool): the adapter hands it the index of a slot-sized buffer of its own
instead (kda_impls/impls/fla_kda.py). verify checks what that must leave alone: every slot not
stored, the padding between slots, padding rows' zero outputs.
"""


import pytest
import torch

from helpers import DEVICE, needs_fla, with_gaps
from kda_impls import get, make_inputs, verify
from kda_impls.impls.fla_kda import fla_state_indices, scratch_slot

FLA = ["fla", "fla-sigmoid", "fla-loggate", "fla-loggate-sigmoid", "fla-batched"]


def checked(name, x):
    assert get(name).unsupported(x) is None
    verdict = verify(get(name), x)
    assert verdict.ok, verdict
    return verdict


def test_every_fla_variant_declares_any_number_of_tokens():
    for name in FLA:
        assert get(name).capabilities.max_tokens is None, name


# ---- against the reference ------------------------------------------------------------------------


CASES = {
    "gva-4to1-gaps-fp16-state": dict(B=3, H=1, HV=4, K=16, V=16, T=3, slot_pad=8, pad_rows=1,
                                     state_dtype=torch.float16, gaps=True),
    "k-not-pow2-big-pool": dict(B=3, H=2, HV=2, K=48, V=32, T=2, slot_pad=24, n_slots=40),
    "last-fp32-state": dict(B=4, H=2, HV=4, K=32, V=16, T=4, checkpoints="last", state_dtype=torch.float32,
                            pad_rows=2),
    "one-row-one-slot-each": dict(B=1, H=1, HV=2, K=16, V=16, T=2, n_slots=2),
    "all-rows-padding": dict(B=2, H=1, HV=2, K=16, V=16, T=3, pad_rows=2),
    "no-padding-all-stored": dict(B=3, H=1, HV=2, K=16, V=16, T=3, slot_pad=16),
}


@needs_fla
@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_cases_match_reference(case):
    case = dict(case)
    gaps = case.pop("gaps", False)
    x = make_inputs(**case, device=DEVICE, seed=41)
    checked("fla", with_gaps(x) if gaps else x)


@needs_fla
@pytest.mark.interpreter
def test_without_num_accepted_rows_start_from_their_first_slot():
    x = make_inputs(3, 1, 2, 16, 16, T=3, pad_rows=1, device=DEVICE, seed=43)
    x.num_accepted = None
    checked("fla", x)


@needs_fla
@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["fla", "fla-batched"])
def test_rows_start_from_slot_num_accepted_minus_one(name):
    """Every token of a row stores and rows start at different tokens: a start taken from the
    wrong entry (the first, the last) gives another state, which verify would call wrong."""
    x = make_inputs(4, 1, 2, 16, 16, T=4, device=DEVICE, seed=44)
    x.num_accepted = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=DEVICE)
    verdict = checked(name, x)
    assert verdict.err_state <= 1e-2


# ---- the calls ------------------------------------------------------------------------------------

@needs_fla
@pytest.mark.interpreter
@pytest.mark.parametrize("name", FLA)
def test_calls_without_minus_one_are_the_engines(fla_calls, name):
    """Every token of every row stored: one call, the tokens of a row one sequence (packed, with
    cu_seqlens every T tokens) or a batch row of T tokens, our slots and num_accepted as they are."""
    impl = get(name)
    B, T = 3, 4
    x = make_inputs(B, 1, 2, 16, 16, T=T, slot_pad=16, device=DEVICE, seed=46)
    checked(name, x)
    kw = fla_calls[0]  # the first step's (verify runs several on the pool)
    rows = (1, B * T) if impl.packed else (B, T)
    assert kw["q"].shape == (*rows, 1, 16) and kw["g"].shape == (*rows, 2, 16) and kw["beta"].shape == (*rows, 2)
    assert kw["out"].shape == (*rows, 2, 16)
    assert ("cu_seqlens" in kw) is impl.packed
    if impl.packed:
        assert torch.equal(kw["cu_seqlens"].cpu(), torch.tensor([0, 4, 8, 12], dtype=torch.int32))
    if impl.gate_in_kernel:
        assert kw["g"].data_ptr() == x.a.data_ptr(), "a view of a, not a copy"
    assert kw["q"].data_ptr() == x.q.data_ptr() and kw["v"].data_ptr() == x.v.data_ptr()
    assert kw["ssm_state_indices"] is x.slots and kw["num_accepted_tokens"] is x.num_accepted
    assert kw["initial_state"] is x.state and kw["inplace_final_state"] and kw["state_v_first"]


@needs_fla
@pytest.mark.interpreter
def test_calls_with_minus_one_name_the_scratch_slot(fla_calls):
    """Padding rows stay in the call (no gather): every entry of theirs, and each -1 of a live row,
    is the scratch slot's index; every other entry is our slot."""
    x = with_gaps(make_inputs(4, 1, 2, 16, 16, T=3, slot_pad=16, pad_rows=1, device=DEVICE, seed=47))
    launch = get("fla").bind(x)
    launch()
    (kw,) = fla_calls
    assert kw["q"].shape == (1, 12, 1, 16)
    indices, stored = kw["ssm_state_indices"], x.stored()
    assert indices.shape == (4, 3) and indices.dtype == torch.int64
    assert torch.equal(indices[stored], x.slots[stored].long())
    scratch = launch.scratch
    entry = x.state.data_ptr() + int(indices[~stored][0]) * x.slot_stride * x.state.element_size()
    end = entry + x.slot_elements * x.state.element_size()
    assert scratch.data_ptr() <= entry and end <= scratch.data_ptr() + scratch.nbytes
    assert (indices[~stored] == indices[~stored][0]).all()
    assert not ((0 <= indices[~stored]) & (indices[~stored] < x.N)).any(), "a pool slot stands in for -1"
    assert not (scratch == 0).all(), "fla stored nothing into the scratch slot"


@needs_fla
@pytest.mark.interpreter
def test_t1_in_either_spelling_is_the_one_token_call(fla_calls):
    """A T = 1 step takes the call fla made before it ran T > 1: -1 rows gathered out, one token a
    sequence, no num_accepted_tokens; the per-token spelling gets its output in its own shape."""
    one = make_inputs(4, 1, 2, 16, 16, slot_pad=16, pad_rows=1, device=DEVICE, seed=48)
    for x in (one.clone(), one.clone().per_token_spelling()):
        first = len(fla_calls)
        verdict = checked("fla", x)
        kw = fla_calls[first]  # the first step's (verify runs several on the pool)
        assert kw["q"].shape == (1, 3, 1, 16) and "num_accepted_tokens" not in kw
        assert torch.equal(kw["ssm_state_indices"], x.slots.view(-1)[x.slots.view(-1) >= 0])
        assert verdict.ok
    assert get("fla").decode(one.clone().per_token_spelling()).shape == (4, 1, 2, 16)


@needs_fla
@pytest.mark.interpreter
def test_fla_ignores_the_token_stride_of_its_indices():
    """The finding behind handing fla contiguous indices only (docs/findings.md, fla-core 3): fla
    finds entry [n, t] at ``n * stride(0) + t``. Handed the view ``[[0, 2], [1, 3]]`` of a
    transposed table (strides (1, 2)), it reads entries 0, 1 for row 0 and 1, 2 for row 1, the
    table's storage order: slot 3, row 1's last token's slot in the view, is never written."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    x = make_inputs(2, 1, 2, 16, 16, T=2, n_slots=4, device=DEVICE, seed=53)
    x.num_accepted = None
    transposed = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE).t()  # [[0, 2], [1, 3]]
    assert transposed.stride() == (1, 2)
    before = x.state.clone()
    fused_recurrent_kda_fwd(
        q=x.q.flatten(0, 1)[None], k=x.k.flatten(0, 1)[None], v=x.v.flatten(0, 1)[None], g=x.a.flatten(0, 1)[None],
        beta=x.b.flatten(0, 1)[None], A_log=x.A_log, dt_bias=x.dt_bias, initial_state=x.state,
        scale=x.effective_scale, inplace_final_state=True, state_v_first=True, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE), ssm_state_indices=transposed)
    assert not torch.equal(x.state[1], before[1]) and not torch.equal(x.state[2], before[2])
    assert torch.equal(x.state[3], before[3]), "slot 3 was written: fla read the token stride"


# ---- the scratch slot -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("slot_pad", [0, 5, 64])
def test_scratch_slot_is_a_whole_number_of_slot_strides_from_the_pool(dtype, slot_pad):
    x = make_inputs(3, 1, 2, 8, 4, state_dtype=dtype, slot_pad=slot_pad, seed=49)
    for _ in range(3):  # allocations land anywhere
        buffer, index = scratch_slot(x.state)
        slot_bytes = x.slot_stride * x.state.element_size()
        start = x.state.data_ptr() + index * slot_bytes
        assert buffer.data_ptr() <= start
        assert start + x.slot_elements * x.state.element_size() <= buffer.data_ptr() + buffer.nbytes
        assert not 0 <= index < x.N
        assert buffer.dtype == dtype and (buffer == 0).all()


def test_state_indices_keep_what_is_stored_and_start_live_rows_on_their_own_slot():
    x = with_gaps(make_inputs(5, 1, 2, 8, 8, T=4, pad_rows=2, seed=50))
    indices, scratch = fla_state_indices(x)
    stored = x.stored()
    assert scratch is not None and torch.equal(indices[stored], x.slots[stored].long())
    index = int(indices[~stored][0])
    assert (indices[~stored] == index).all()
    starts = indices.gather(1, (x.accepted().long() - 1).view(-1, 1)).view(-1)
    live = x.live_rows()
    assert torch.equal(starts[live], x.start_slots()[live]) and (starts[~live] == index).all()
    everything_stored = make_inputs(3, 1, 2, 8, 8, T=2, seed=50)
    assert fla_state_indices(everything_stored) == (everything_stored.slots, None)


def test_zero_slot_stride_has_no_scratch_slot():
    x = make_inputs(1, 1, 2, 8, 8, T=2, n_slots=2, seed=51)
    x.state = x.state[:1].as_strided(x.state[:1].shape, (0, *x.state.stride()[1:]))
    x.slots = torch.tensor([[0, -1]], dtype=torch.int32)
    x.num_accepted = torch.ones(1, dtype=torch.int32)
    get("fla").check(x)  # a one-slot pool may have any slot stride
    assert get("fla")._extra_unsupported(x).startswith("the pool's slot stride is 0")
    assert get("fla")._extra_unsupported(x.token(0)) is None  # T = 1 needs no scratch slot


# ---- on the GPU -----------------------------------------------------------------------------------


