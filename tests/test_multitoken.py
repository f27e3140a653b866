"""Multi-token decode (T tokens per row, speculative verify): make_inputs, the contract's new rules,
the float64 reference against T one-token steps (the defining property), naive, verify against
planted bugs, the byte model, and every implementation's stance on T > 1.

Our Triton kernel's multi-token tests are in tests/test_triton_multitoken.py.
"""

import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers import expect_refusal, with_gaps
from kda_impls import Capabilities, ContractError, DecodeInputs, get, make_inputs, reference, verify
from kda_impls.impls.naive import NaiveTorch
from kda_impls.registry import BUILTIN


def multi(B=4, H=2, HV=4, K=16, V=8, **kw):
    return make_inputs(B, H, HV, K, V, **{"T": 3, "slot_pad": 5, "pad_rows": 1, "seed": 7, **kw})


# ---- make_inputs ---------------------------------------------------------------------------------

def test_make_inputs_t1_is_the_one_token_spelling():
    x = make_inputs(4, 2, 4, 16, 8, slot_pad=3, pad_rows=1, seed=2)
    same = make_inputs(4, 2, 4, 16, 8, T=1, checkpoints="last", slot_pad=3, pad_rows=1, seed=2)
    assert not x.per_token and x.T == 1 and x.num_accepted is None and x.out_shape == (4, 4, 8)
    for name, t in x.tensors().items():
        assert torch.equal(t, same.tensors()[name]), name


def test_make_inputs_all_checkpoints():
    B, T = 6, 4
    x = make_inputs(B, 2, 4, 16, 8, T=T, pad_rows=2, seed=3)
    assert x.per_token and x.T == T and x.out_shape == (B, T, 4, 8)
    assert x.q.shape == (B, T, 2, 16) and x.v.shape == (B, T, 4, 8) and x.a.shape == (B, T, 4, 16)
    assert x.b.shape == (B, T, 4) and x.slots.shape == (B, T) and x.slots.dtype == torch.int32
    assert x.N == 2 * B * T  # twice the slots stored: untouched slots exist
    pad = (x.slots == -1).all(dim=1)
    assert int(pad.sum()) == 2 and (x.slots[~pad] >= 0).all()
    named = x.slots[x.slots >= 0]
    assert named.unique().numel() == named.numel() == (B - 2) * T
    assert x.num_accepted.dtype == torch.int32 and x.num_accepted.shape == (B,)
    assert int(x.num_accepted.min()) >= 1 and int(x.num_accepted.max()) <= T
    draws = torch.stack([make_inputs(8, 1, 1, 4, 4, T=T, seed=s).num_accepted for s in range(8)])
    assert set(draws.flatten().tolist()) == set(range(1, T + 1))  # random over the whole range


def test_make_inputs_last_checkpoint_only():
    B, T = 5, 3
    x = make_inputs(B, 1, 2, 8, 8, T=T, checkpoints="last", pad_rows=1, sorted_slots=True, seed=4)
    assert (x.slots[:, :T - 1] == -1).all()
    assert (x.num_accepted == T).all()
    live = x.slots[:, T - 1] >= 0
    assert int(live.sum()) == B - 1 and x.N == 2 * B
    assert torch.equal(x.start_slots(), x.slots[:, T - 1].long())  # starts from the slot it stores into
    assert torch.equal(x.slots[live, T - 1], x.slots[live, T - 1].sort().values)


@pytest.mark.parametrize("kw, complaint", [
    (dict(B=-1), r"B must be an integer >= 0; got -1"),
    (dict(H=0), r"H must be an integer >= 1; got 0"),
    (dict(HV=0), r"HV must be an integer >= 1; got 0"),
    (dict(K=0), r"K must be an integer >= 1; got 0"),
    (dict(V=-2), r"V must be an integer >= 1; got -2"),
    (dict(T=0), r"T must be an integer >= 1; got 0"),
    (dict(T=2.0), r"T must be an integer >= 1; got 2.0"),
    (dict(slot_pad=-1), r"slot_pad must be an integer >= 0; got -1"),
    (dict(T=2, checkpoints="some"), r"checkpoints must be one of \('all', 'last'\); got 'some'"),
    (dict(pad_rows=5), r"pad_rows must be in \[0, B=4\]; got 5"),
    (dict(T=3, n_slots=11), r"n_slots=11 must be >= B\*T=12"),
    (dict(T=3, checkpoints="last", n_slots=3), r"n_slots=3 must be >= B=4"),
])
def test_make_inputs_says_what_is_wrong(kw, complaint):
    args = dict(B=4, H=1, HV=1, K=8, V=8) | kw
    with pytest.raises(ValueError, match=complaint):
        make_inputs(**args)


def test_make_inputs_takes_numpy_integers():
    x = make_inputs(*np.array([4, 1, 2, 8, 8]), T=np.int64(2), seed=1)
    assert x.out_shape == (4, 2, 2, 8)


def test_make_inputs_empty_batch():
    x = make_inputs(0, 1, 2, 8, 8, T=3)
    assert x.slots.shape == (0, 3) and x.N == 1
    assert verify(get("naive"), x).ok


# ---- the contract --------------------------------------------------------------------------------

def test_valid_multi_token_inputs_pass():
    get("naive").check(with_gaps(multi()))
    get("naive").check(multi(checkpoints="last"))


def test_rank_must_agree_with_the_other_inputs():
    x = multi()
    x.k = x.k[:, 0].contiguous()
    expect_refusal(get("naive"), x, "rank", r"k must be 4-D \[B, T, H, K\]; got shape \(4, 2, 16\)")


def test_slots_must_have_a_token_axis():
    x = multi()
    x.slots = x.slots[:, 0].contiguous()
    expect_refusal(get("naive"), x, "rank", r"slots must be 2-D \[B, T\]; got shape \(4,\)")


@pytest.mark.parametrize("name, mutate, pattern", [
    ("v", lambda t: t[:, :2].contiguous(), r"v shape must be \(4, 3, 4, 8\).*got \(4, 2, 4, 8\)"),
    ("b", lambda t: t[:, :, :2].contiguous(), r"b shape must be \(4, 3, 4\).*got \(4, 3, 2\)"),
    ("slots", lambda t: torch.cat([t, t], 1), r"slots shape must be \(4, 3\).*got \(4, 6\)"),
    ("num_accepted", lambda t: t[:3].contiguous(), r"num_accepted shape must be \(4,\).*got \(3,\)"),
    ("num_accepted", lambda t: t[:, None].contiguous(), r"num_accepted shape must be \(4,\).*got \(4, 1\)"),
])
def test_per_token_shapes_must_agree(name, mutate, pattern):
    x = multi()
    setattr(x, name, mutate(getattr(x, name)))
    expect_refusal(get("naive"), x, "shape", pattern)


@pytest.mark.parametrize("T", [1, 3])
def test_a_v_with_the_wrong_hv_is_blamed_on_v(T):
    """Issue #14: HV was read from v, so a wrong v made the consistent a look wrong."""
    x = make_inputs(4, 2, 4, 16, 8, T=T, seed=1)
    x.v = torch.cat([x.v, x.v], dim=-2).contiguous()  # HV 8 where every other input says 4
    tokens = (T,) if T > 1 else ()
    expect_refusal(get("naive"), x, "shape", rf"^naive v shape must be {re.escape(str((4, *tokens, 4, 8)))} "
                                             rf"\(.*HV=4.*\); got {re.escape(str((4, *tokens, 8, 8)))}$")


def test_num_accepted_dtype():
    x = multi()
    x.num_accepted = x.num_accepted.long()
    expect_refusal(get("naive"), x, "num-accepted", r"num_accepted dtype must be int32; got int64")


def test_num_accepted_contiguous():
    x = multi()
    x.num_accepted = torch.stack([x.num_accepted, x.num_accepted], 1)[:, 0]
    expect_refusal(get("naive"), x, "contiguous", r"num_accepted must be contiguous")


def test_num_accepted_device():
    x = multi()
    x.num_accepted = torch.empty(x.num_accepted.shape, dtype=torch.int32, device="meta")
    expect_refusal(get("naive"), x, "device", r"num_accepted must be on the state's device cpu; got meta")


@pytest.mark.parametrize("bad, pattern", [(0, r"got min 0, max"), (4, r"got min \d, max 4")])
def test_num_accepted_range(bad, pattern):
    x = multi()
    x.num_accepted[1] = bad
    expect_refusal(get("naive"), x, "num-accepted", r"num_accepted values must be in \[1, T=3\] .*" + pattern)


def test_num_accepted_all_ones_in_the_one_token_spelling():
    x = make_inputs(4, 2, 4, 16, 8, pad_rows=1, seed=2)
    x.num_accepted = torch.ones(4, dtype=torch.int32)
    assert verify(get("naive"), x).ok
    x.num_accepted[0] = 2
    expect_refusal(get("naive"), x, "num-accepted", r"num_accepted values must be in \[1, T=1\]")


@pytest.mark.parametrize("where", [(0, 2), (1, 1), (3, 1)], ids=["same row", "across rows", "padding row"])
def test_no_slot_twice_across_rows_and_tokens(where):
    x = multi(pad_rows=0)
    x.slots = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8], [-1, -1, -1]], dtype=torch.int32)
    x.num_accepted = torch.tensor([1, 2, 3, 1], dtype=torch.int32)
    get("naive").check(x)
    x.slots[where] = 0  # row 0 stores into slot 0 after its first token
    expect_refusal(get("naive"), x, "slot-duplicate", r"across rows and tokens .*got repeated slots \[0\]")


def test_slot_range_across_tokens():
    x = multi()
    x.slots[2, 2] = x.N
    expect_refusal(get("naive"), x, "slot-range", rf"slots values must be in \[-1, N={x.N}\); got min -1, max {x.N}")


def test_a_row_may_store_into_the_slot_it_starts_from():
    x = multi(pad_rows=0)
    x.num_accepted[:] = torch.tensor([1, 2, 3, 3], dtype=torch.int32)  # every row stores into its start slot
    verdict = verify(get("naive"), x)
    assert verdict.ok, verdict


def test_out_buffer_has_the_token_axis():
    x = multi()
    with pytest.raises(ContractError, match=r"out must be a contiguous \(4, 3, 4, 8\) bfloat16 tensor") as err:
        get("naive").bind(x, out=torch.empty(4, 4, 8, dtype=torch.bfloat16))
    assert err.value.rule == "out"


class OneToken(NaiveTorch):
    """The naive math declared one-token only (as fla's and FlashInfer's adapters are), recording
    the spelling it is handed."""

    name = "one-token"
    capabilities = Capabilities(devices=("cpu",), max_tokens=1)
    seen: list

    def __init__(self):
        self.seen = []

    def _extra_unsupported(self, inputs):
        self.seen.append(("unsupported", inputs.q.dim()))
        return None

    def _launcher(self, inputs, out):
        self.seen.append(("launcher", inputs.q.dim(), tuple(out.shape)))
        return super()._launcher(inputs, out)


def test_one_token_implementations_refuse_t_above_one():
    impl = OneToken()
    x = multi()
    assert impl.unsupported(x) == "T > 1 (multi-token decode) not supported by one-token"
    expect_refusal(impl, x, "tokens", r"T > 1 \(multi-token decode\) not supported by one-token; got T=3")
    with pytest.raises(ContractError):
        verify(impl, x)
    assert impl.seen == []  # refused before anything of the implementation ran


def test_at_most_max_tokens():
    class UpToTwo(NaiveTorch):
        name = "up-to-two"
        capabilities = Capabilities(max_tokens=2)

    assert UpToTwo().unsupported(multi(T=3)) == "T=3 tokens per step not supported by up-to-two (at most 2)"
    assert UpToTwo().unsupported(multi(T=2)) is None
    assert "T <= 2" in UpToTwo.capabilities.describe() and "T = 1 only" in Capabilities().describe()


def test_one_token_implementations_get_a_t1_step_in_their_spelling():
    impl = OneToken()
    x = make_inputs(4, 2, 4, 16, 8, slot_pad=3, pad_rows=1, seed=5).per_token_spelling()
    assert x.per_token and x.T == 1
    verdict = verify(impl, x)
    assert verdict.ok, verdict
    assert ("launcher", 3, (4, 4, 8)) in impl.seen and ("unsupported", 3) in impl.seen
    out = impl.decode(x.clone())
    assert out.shape == (4, 1, 4, 8)  # the caller gets the output in its own spelling
    # an implementation of any T is handed the step as it was called, token axis and all
    any_t = OneToken()
    any_t.capabilities = replace(OneToken.capabilities, max_tokens=None)
    any_t.decode(x.clone())
    assert ("launcher", 4, (4, 1, 4, 8)) in any_t.seen and ("unsupported", 4) in any_t.seen


def test_every_built_in_implementation_takes_multi_token_steps():
    """Each checks its T > 1 calls in its own tests (tests/test_*_multitoken.py)."""
    for name in BUILTIN:
        caps = get(name).capabilities
        if get(name).library == "sglang":  # its backends' decode calls take one token per row
            continue
        if name == "flashinfer-recoverssm":  # its one call takes 1..16 tokens (kda_recoverssm_verify)
            assert caps.max_tokens == 16 and "T <= 16" in caps.describe()
            continue
        assert caps.max_tokens is None, name
        assert "any T" in caps.describe()


# ---- the reference: one T-token step is T one-token steps, each storing its state -----------------

def stepwise(x: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, T, HV, V], pool [N, HV, V, K])`` in float64 from T one-token reference steps.

    Each live row carries its running state in a scratch slot of its own, appended to a copy of the
    pool: token t reads and updates that slot, and its state is then copied to ``slots[i, t]``
    where that is >= 0. The pool returned is the copy after all T steps."""
    x = x.per_token_spelling()
    B, T, N = x.B, x.T, x.N
    start = [int(x.slots[i, int(x.accepted()[i]) - 1]) for i in range(B)]
    pool = torch.cat([x.state.double(), torch.zeros(B, x.HV, x.V, x.K, dtype=torch.float64)])
    for i in range(B):
        if start[i] >= 0:
            pool[N + i] = pool[start[i]]
    scratch = torch.tensor([N + i if start[i] >= 0 else -1 for i in range(B)], dtype=torch.int32)
    out = torch.zeros(B, T, x.HV, x.V, dtype=torch.float64)
    for t in range(T):
        step = DecodeInputs(q=x.q[:, t], k=x.k[:, t], v=x.v[:, t], a=x.a[:, t], b=x.b[:, t], A_log=x.A_log,
                            dt_bias=x.dt_bias, state=pool, slots=scratch, scale=x.scale)
        out[:, t], after = reference(step)
        for i in range(B):
            if start[i] >= 0:
                pool[N + i] = after[i]
                if int(x.slots[i, t]) >= 0:
                    pool[int(x.slots[i, t])] = after[i]
    return out, pool[:N]


PROPERTY_CASES = {
    "T1-one-token-spelling": dict(B=4, H=2, HV=4, K=8, V=8, T=1, pad_rows=1),
    "T1-per-token-spelling": dict(B=4, H=2, HV=4, K=8, V=8, T=1, pad_rows=1, per_token=True),
    "T2-all": dict(B=5, H=1, HV=2, K=8, V=4, T=2, pad_rows=1),
    "T3-all-gaps-gva-padded": dict(B=6, H=1, HV=4, K=8, V=8, T=3, pad_rows=2, slot_pad=5, gaps=True),
    "T4-last": dict(B=4, H=2, HV=2, K=4, V=8, T=4, checkpoints="last", pad_rows=1, slot_pad=3),
    "T4-all-gaps-fp32": dict(B=5, H=2, HV=4, K=8, V=8, T=4, pad_rows=1, gaps=True, state_dtype=torch.float32),
    "T3-no-live-rows": dict(B=2, H=1, HV=1, K=4, V=4, T=3, pad_rows=2),
}


@pytest.mark.parametrize("case", PROPERTY_CASES.values(), ids=PROPERTY_CASES.keys())
def test_reference_is_t_one_token_steps(case):
    case = dict(case)
    per_token, gaps = case.pop("per_token", False), case.pop("gaps", False)
    x = make_inputs(**case, seed=11)
    if per_token:
        x = x.per_token_spelling()
    if gaps:
        x = with_gaps(x)
    x.scale = 0.4
    out, states = reference(x)
    want_out, want_pool = stepwise(x)
    assert out.shape == x.out_shape and states.shape == (*x.out_shape, x.K)
    torch.testing.assert_close(out.view(x.B, x.T, x.HV, x.V), want_out, rtol=1e-10, atol=1e-12)
    # the pool after the step: every stored slot holds its token's state, every other slot is as it was
    pool = x.state.double().clone()
    stored = x.stored()
    pool[x.token_slots().long()[stored]] = states.view(x.B, x.T, x.HV, x.V, x.K)[stored]
    torch.testing.assert_close(pool, want_pool, rtol=1e-10, atol=1e-12)


def test_reference_padding_rows_are_zero_and_gaps_still_output():
    x = with_gaps(multi(T=4, pad_rows=1))
    out, states = reference(x)
    live = x.live_rows()
    assert (out[~live] == 0).all() and (states[~live] == 0).all()
    gap = (x.slots == -1) & live[:, None]
    assert gap.any()
    assert (out[gap].abs().sum(dim=(-1, -2)) > 0).all()  # a token whose state is not stored still outputs


# ---- naive and verify --------------------------------------------------------------------------------


class StartsFromFirstSlot(NaiveTorch):
    name = "bug-ignores-num-accepted"

    def _launcher(self, inputs, out):
        return super()._launcher(DecodeInputs(**{**inputs.tensors(), "num_accepted": None}, scale=inputs.scale), out)


class SkipsUnstoredTokens(NaiveTorch):
    """FlashInfer's grouped kernel's reading of a -1 in a live row: that token is not applied
    (no decay, no update) and outputs zeros."""

    name = "bug-skips-unstored-tokens"

    def _launcher(self, inputs, out):
        skipped = inputs.slots < 0
        a, b = inputs.a.clone(), inputs.b.clone()
        a[skipped] = -math.inf  # softplus 0: no decay
        b[skipped] = -math.inf  # beta 0: no update
        launch = super()._launcher(replace(inputs, a=a, b=b), out)

        def run():
            launch()
            out[skipped] = 0
            return out

        return run


class StoresLastTokenOnly(NaiveTorch):
    """Keeps only each row's final state: the earlier tokens' checkpoints are never written."""

    name = "bug-stores-only-the-last-token"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        earlier = inputs.token_slots()[:, :-1]
        earlier = earlier[earlier >= 0].long()

        def run():
            kept = inputs.state[earlier].clone()
            launch()
            inputs.state[earlier] = kept
            return out

        return run


class StoresForPaddingRows(NaiveTorch):
    """Stores a padding row's states into the slots it names (as if it started from slot 0)."""

    name = "bug-stores-padding-rows"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        pad = torch.nonzero(~inputs.live_rows()).flatten()

        def run():
            launch()
            for i in pad.tolist():
                for s in inputs.slots[i][inputs.slots[i] >= 0].tolist():
                    inputs.state[s] = inputs.state[0]
            return out

        return run


class OutputsPaddingRows(NaiveTorch):
    name = "bug-outputs-padding-rows"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        pad = torch.nonzero(~inputs.live_rows()).flatten()

        def run():
            launch()
            out[pad] = 1.0
            return out

        return run


@pytest.mark.parametrize("bug, expect", [
    (StartsFromFirstSlot, "error"),
    (SkipsUnstoredTokens, "error"),
    (StoresLastTokenOnly, "state error"),
    (StoresForPaddingRows, "not in `slots` were written"),
    (OutputsPaddingRows, "rows with slot -1 must output zeros"),
])
def test_verify_catches_multi_token_bugs(bug, expect):
    x = make_inputs(6, 2, 4, 16, 16, T=4, slot_pad=8, pad_rows=0, state_dtype=torch.float32, seed=21)
    x.num_accepted = torch.tensor([2, 3, 4, 1, 2, 3], dtype=torch.int32)
    x.slots[1, 3] = x.slots[2, 0] = -1  # a stored token's gap in two live rows
    x.slots[5, 2] = -1  # the padding row's start slot (num_accepted 3): it names slots it must not store
    verdict = verify(bug(), x)
    assert not verdict.ok
    assert any(expect in p for p in verdict.problems), verdict.problems


# ---- the byte model ----------------------------------------------------------------------------------

def test_nbytes_one_token_is_a_read_and_a_write_per_live_row():
    x = make_inputs(5, 2, 4, 16, 8, slot_pad=3, pad_rows=2, seed=1)
    slot_bytes = 4 * 8 * 16 * 2
    others = sum(t.nbytes for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.slots))
    assert x.nbytes() == 2 * 3 * slot_bytes + others + 5 * 4 * 8 * 2


def test_nbytes_multi_token_reads_once_per_live_row_and_writes_once_per_stored_slot():
    x = make_inputs(3, 1, 2, 8, 4, T=3, state_dtype=torch.float32, dtype=torch.float16, pad_rows=0, seed=2)
    x.slots[0, 1] = -1  # row 0 stores 2 states
    x.slots[1] = torch.tensor([-1, -1, x.slots[1, 2]])  # row 1 stores 1
    x.num_accepted = torch.tensor([1, 3, 2], dtype=torch.int32)
    x.slots[2, 1] = -1  # row 2 starts from -1: padding, reads and stores nothing
    slot_bytes = 2 * 4 * 8 * 4
    others = sum(t.nbytes for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.slots, x.num_accepted))
    out = 3 * 3 * 2 * 4 * 2  # [B, T, HV, V] in v's fp16
    assert x.nbytes() == (2 + 3) * slot_bytes + others + out


def test_clone_keeps_num_accepted_and_the_pool_layout():
    x = multi()
    y = x.clone()
    assert torch.equal(y.num_accepted, x.num_accepted) and y.num_accepted.data_ptr() != x.num_accepted.data_ptr()
    assert y.state.stride() == x.state.stride() and torch.equal(y.pool_span(), x.pool_span())
    assert math.isclose(y.nbytes(), x.nbytes())
