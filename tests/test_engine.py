"""Engine tensors as they are (kda_impls.from_engine): SGLang's packed layouts become views in this
package's spelling, the contract checks them, an implementation updates the engine's own pool, and
a layout that cannot be read without a copy is refused with what to do."""

import pytest
import torch

import kda_impls
from kda_impls import ContractError, from_engine, make_inputs, verify


def engine_layout(x, T: int = 1) -> dict:
    """``x`` as SGLang holds it: tokens flattened over the batch, a leading axis of 1."""
    rows = x.B * T
    return dict(q=x.q.reshape(1, rows, x.H, x.K), k=x.k.reshape(1, rows, x.H, x.K),
                v=x.v.reshape(1, rows, x.HV, x.V), a=x.a.reshape(rows, x.HV * x.K), b=x.b.reshape(1, rows, x.HV),
                A_log=x.A_log.reshape(1, 1, x.HV, 1), dt_bias=x.dt_bias.reshape(-1), state=x.state,
                slots=x.slots, scale=x.scale, num_accepted=x.num_accepted)


@pytest.mark.parametrize("T, checkpoints", [(1, "all"), (3, "all"), (3, "last")])
def test_engine_layouts_are_read_as_views_and_decoded_in_the_engines_pool(T, checkpoints):
    x = make_inputs(5, 2, 4, 16, 8, T=T, checkpoints=checkpoints, slot_pad=8, pad_rows=1, seed=3)
    packed = engine_layout(x, T)
    y = from_engine(**packed)
    for name, t in packed.items():
        if isinstance(t, torch.Tensor):
            assert getattr(y, name).data_ptr() == t.data_ptr(), name  # a view, not a copy
    assert (y.B, y.T, y.H, y.HV, y.K, y.V) == (5, T, 2, 4, 16, 8)
    for name in ("q", "k", "v", "a", "b", "A_log", "slots"):
        assert torch.equal(getattr(y, name), getattr(x, name)), name
    assert torch.equal(y.dt_bias.flatten(), x.dt_bias.flatten())
    before = x.pool_span().clone()
    verdict = verify(kda_impls.get("naive"), y)
    assert verdict.ok, verdict
    assert not torch.equal(before, x.pool_span())  # the engine's pool itself was updated


def test_engine_tensors_that_do_not_fit_are_refused_with_the_reason():
    x = make_inputs(4, 2, 4, 16, 8, seed=1)
    packed = engine_layout(x)
    with pytest.raises(ContractError) as err:
        from_engine(**packed | {"a": packed["a"][:, :-1]})
    assert err.value.rule == "shape" and "a of shape (4, 63) holds 252 elements; (4, 4, 16)" in str(err.value)
    # the right elements in an order [B, HV, K] cannot be read without a copy
    scrambled = torch.empty(4, 4, 4, 4).transpose(2, 3)
    with pytest.raises(ContractError) as err:
        from_engine(**packed | {"a": scrambled})
    assert err.value.rule == "contiguous" and "without a copy" in str(err.value)


def test_the_contract_still_checks_what_from_engine_returns():
    x = make_inputs(4, 2, 4, 16, 8, seed=1)
    packed = engine_layout(x)
    y = from_engine(**packed | {"slots": x.slots.long()})
    with pytest.raises(ContractError, match="slots dtype must be int32"):
        kda_impls.get("naive").check(y)
