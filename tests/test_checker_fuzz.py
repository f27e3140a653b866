"""Property-based fuzz of the contract checker against an independent oracle written from the
rules' text: check() refuses exactly the broken inputs, modifies nothing when it refuses, and
inputs it accepts decode correctly."""

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kda_impls import Capabilities, ContractError, DecodeInputs, get, verify
from kda_impls.impls.naive import NaiveTorch


class Aligned(NaiveTorch):
    name = "aligned"
    capabilities = Capabilities(devices=("cpu",), slot_stride_multiple=8, base_alignment=32)


# The rules a draw below may break. Drawing every input independently makes valid inputs rare (a
# few in a hundred), and a rule weakened only for otherwise-valid inputs then escapes a whole run;
# instead each example picks at most two rules its draws may break, and the oracle still judges
# every rule from the values drawn.
FAULTS = ("gva", "dtype", "slots", "state-inner-strides", "slot-overlap", "slot-range", "slot-duplicate",
          "scale", "pool-alignment", "requires-grad")


@st.composite
def decode_inputs(draw):
    faults = draw(st.sets(st.sampled_from(FAULTS), max_size=2))

    def pick(rule, valid, broken):
        return draw(broken if rule in faults else valid)

    B = draw(st.integers(1, 5))
    H = draw(st.integers(1, 2))
    HV = H * draw(st.integers(1, 3)) + pick("gva", st.just(0), st.just(1))
    K, V = draw(st.sampled_from([4, 8])), draw(st.sampled_from([4, 8]))
    N = B + draw(st.integers(0, 3))
    # inner layout: compact, V and K swapped, or padding inside a slot (after each V row, after each
    # head); the padded ones keep the last stride 1, so a rule checking only that is caught
    layout = pick("state-inner-strides", st.just("compact"), st.sampled_from(["swapped", "row-pad", "head-pad"]))
    row_pad = draw(st.integers(1, 8)) if layout == "row-pad" else 0
    head_pad = draw(st.integers(1, 8)) if layout == "head-pad" else 0
    inner = (V * K, 1, V) if layout == "swapped" else (V * (K + row_pad) + head_pad, K + row_pad, 1)
    per_slot = HV * inner[0]  # what one slot spans in this layout
    if "slot-overlap" in faults:
        stride = per_slot + draw(st.integers(-3, -1))
    else:
        stride = per_slot + pick("pool-alignment", st.sampled_from([0, 8]), st.integers(0, 9))
    offset = pick("pool-alignment", st.sampled_from([0, 16]), st.sampled_from([0, 1, 8, 16]))
    act, gate = torch.bfloat16, torch.float32
    if "dtype" in faults:
        act, gate = draw(st.sampled_from([(torch.float64, gate), (act, torch.bfloat16),
                                          (torch.float64, torch.bfloat16)]))
    else:
        act = draw(st.sampled_from([torch.bfloat16, torch.float32]))
    slot_dtype = pick("slots", st.just(torch.int32), st.just(torch.int64))
    if {"slot-range", "slot-duplicate"} & faults:  # any values, in range or not, repeated or not
        slots = draw(st.lists(st.integers(-2, N), min_size=B, max_size=B))
    else:  # distinct, in range, some -1
        slots = [s if draw(st.booleans()) else -1 for s in draw(st.permutations(range(N)))[:B]]
    scale = pick("scale", st.sampled_from([None, None, 0.5]), st.sampled_from([0.0, -1.0, math.nan, math.inf]))
    grad = pick("requires-grad", st.just(None), st.sampled_from(["state", "v", "dt_bias"]))

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    flat = torch.randn(offset + max(N - 1, 0) * max(stride, 1) + per_slot, generator=g).bfloat16()
    state = flat.as_strided((N, HV, V, K), (stride, *inner), offset)
    x = DecodeInputs(
        q=torch.randn(B, H, K, generator=g).to(act), k=torch.randn(B, H, K, generator=g).to(act),
        v=torch.randn(B, HV, V, generator=g).to(act), a=torch.randn(B, HV, K, generator=g).to(act),
        b=torch.randn(B, HV, generator=g).to(act), A_log=torch.randn(HV, generator=g).to(gate),
        dt_bias=torch.randn(HV, K, generator=g), state=state,
        slots=torch.tensor(slots, dtype=slot_dtype), scale=scale,
    )
    if grad == "state":
        x.state = x.state.detach().requires_grad_(True)  # a view of flat: same layout, same bytes
    elif grad is not None:
        setattr(x, grad, getattr(x, grad).detach().clone().requires_grad_(True))
    live = [s for s in slots if s >= 0]
    rules_broken = {
        "gva": HV % H != 0,
        "dtype": act == torch.float64 or gate != torch.float32,
        "slots": slot_dtype != torch.int32,
        "state-inner-strides": layout != "compact",
        "slot-overlap": N > 1 and stride < HV * V * K,
        "requires-grad": grad is not None,
        "slot-range": any(s < -1 or s >= N for s in slots),
        "slot-duplicate": len(set(live)) != len(live),
        "scale": scale is not None and not (math.isfinite(scale) and scale > 0),
        "pool-alignment": stride % 8 != 0 or (offset * 2) % 32 != 0,  # Aligned only
    }
    return x, rules_broken


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decode_inputs(), st.sampled_from(["naive", "aligned"]))
def test_checker_refuses_exactly_the_broken_inputs(case, which):
    x, rules_broken = case
    impl = get("naive") if which == "naive" else Aligned()
    if which == "naive":
        rules_broken.pop("pool-alignment")
    broken = {rule for rule, is_broken in rules_broken.items() if is_broken}
    before = {n: t.clone() for n, t in x.tensors().items()}
    pool = x.pool_span().clone()
    try:
        impl.check(x)
    except ContractError as err:
        assert broken, f"refused valid inputs: {err}"
        assert err.rule in broken, f"reported {err.rule!r}, but broken rules are {broken}: {err}"
        assert str(err).startswith(f"{impl.label} ")
        for n, t in x.tensors().items():
            assert torch.equal(t, before[n]), f"{n} modified by a refused check"
        assert torch.equal(x.pool_span().view(torch.int16), pool.view(torch.int16))
        return
    assert not broken, f"accepted inputs that break {broken}"
    verdict = verify(impl, x)
    assert verdict.ok, verdict
