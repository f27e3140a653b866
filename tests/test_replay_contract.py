"""Replay's contract (the cache checked as the other inputs: one line, rule, expected, actual, before any
launch), its byte model, its inputs, and the survey: every implementation runs it or says why not."""

import dataclasses

import pytest
import torch

from kda_impls import ContractError, ReplayCache, get, make_inputs, names
from kda_impls.contract import Capabilities, Implementation
from replay_checks import bits, run_steps


def replay(T=2, **changes):
    x = make_inputs(3, 1, 2, 16, 8, T=T, ring=4, seed=8)
    x.cache.length.copy_(torch.tensor([0, 1, 2, 3, 1, 0], dtype=torch.int32))
    return dataclasses.replace(x, **changes)


def cache(**changes):
    return dataclasses.replace(replay().cache, **changes)


def u_transposed():
    u = replay().cache.u
    return u.transpose(2, 3).contiguous().transpose(2, 3)  # the right shape, not contiguous


def lengths(*values):
    return cache(length=torch.tensor(values, dtype=torch.int32))


@pytest.mark.parametrize("x, rule, message", [
    (lambda: replay(cache="ring"), "cache", r"cache must be a kda_impls.ReplayCache \(replay\) or None; got str$"),
    (lambda: replay(update_state=False), "update-state",
     r"update_state must be True with a cache \(a replay step writes its records\); got False$"),
    (lambda: replay(slots=torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)), "rank",
     r"slots must be 1-D \[B\] \(replay: row i's state is slot slots\[i\]'s\)"),
    (lambda: replay(cache=ReplayCache.empty(7, 4, 1, 2, 16, 8)), "cache-shape",
     r"cache.u shape must be \(6, 2, 4, 8\) \(\[N, HV, L, V\] with N=6 the pool's slots"),
    (lambda: replay(cache=cache(kg=torch.zeros(6, 2, 4, 16, dtype=torch.bfloat16))), "cache-shape",
     r"cache.kg shape must be \(6, 2, 4, 32\)"),
    (lambda: replay(cache=cache(kg=torch.zeros(6, 2, 5, 32, dtype=torch.bfloat16))), "cache-shape",
     r"cache.kg shape must be \(6, 2, 4, 32\) .*L=4 from cache.u\); got \(6, 2, 5, 32\)"),
    (lambda: replay(cache=cache(H=2)), "cache-shape", "cache.H must be the step's H=1"),
    (lambda: replay(cache=cache(u=torch.zeros(6, 2, 4, 8, dtype=torch.bfloat16))), "cache-dtype",
     r"cache.u dtype must be float32 \(the deltas are kept in fp32\); got bfloat16"),
    (lambda: replay(cache=cache(kg=torch.zeros(6, 2, 4, 32))), "cache-dtype",
     r"cache.kg dtype must be bfloat16 \(raw keys and gate inputs: copies of the step's k and a\); got float32"),
    (lambda: replay(cache=cache(length=torch.zeros(6, dtype=torch.int64))), "cache-dtype",
     "cache.length dtype must be int32"),
    (lambda: replay(cache=cache(u=u_transposed())), "contiguous", "cache.u must be contiguous"),
    (lambda: replay(cache=cache(u=torch.zeros(6, 2, 4, 8, requires_grad=True))), "requires-grad",
     "cache.u must not require grad"),
    (lambda: replay(T=5), "ring", "T <= L\\): T=5, L=4"),
    (lambda: replay(cache=lengths(0, 1, 2, 4, 0, 0)), "cache-length",
     r"cache.length values must be in \[0, L=4\) \(a full ring is flushed\); got min 0, max 4"),
    (lambda: replay(cache=lengths(0, -1, 2, 3, 0, 0)), "cache-length", "got min -1, max 3"),
    (lambda: replay(num_accepted=torch.tensor([2, 2, 2], dtype=torch.int32)), "num-accepted",
     r"length\[slots\[i\]\] \+ num_accepted\[i\] <= L=4 .*got min 2, largest sum 5"),
    (lambda: replay(num_accepted=torch.tensor([0, -1, 0], dtype=torch.int32)), "num-accepted", "got min -1"),
    (lambda: replay(slots=torch.tensor([2, 0, 1], dtype=torch.int32), num_accepted=torch.tensor([0, 5, 0],
                                                                                               dtype=torch.int32)),
     "num-accepted", "largest sum 5"),  # slot 0 is a live row's too
    (lambda: replay(num_accepted=torch.zeros(2, dtype=torch.int32)), "shape", r"num_accepted shape must be \(3,\)"),
    (lambda: replay(slots=torch.tensor([1, 1, 2], dtype=torch.int32)), "slot-duplicate", "repeated slots"),
], ids=["not-a-cache", "frozen", "per-token-slots", "other-pool", "kg-width", "ring-sizes-differ", "other-heads",
        "u-bf16", "kg-not-activation-dtype", "length-int64", "u-strided", "grad", "T>L", "full-ring",
        "negative-length", "commit-overflows", "negative-commit", "slot-0-commit-overflows", "num-accepted-shape",
        "duplicate-slots"])
def test_contract_refuses_what_replay_does_not_define(x, rule, message):
    x = x()
    with pytest.raises(ContractError, match=message) as err:
        get("naive").check(x)
    assert err.value.rule == rule
    assert "\n" not in str(err.value)


def test_a_refused_step_launches_nothing_and_changes_nothing():
    x = replay(num_accepted=torch.tensor([2, 2, 2], dtype=torch.int32))
    pool, records = x.pool_span().clone(), x.cache.clone()
    with pytest.raises(ContractError):
        get("naive").decode(x)
    assert torch.equal(bits(x.pool_span()), bits(pool))
    for name, t in x.cache.tensors().items():
        assert torch.equal(t, records.tensors()[name]), name


def test_the_commits_the_contract_allows_run():
    x = replay(num_accepted=torch.tensor([1, 3, 0], dtype=torch.int32))  # slots 0, 1, 2 hold 0, 1, 2 records
    x.slots = torch.tensor([1, 0, 2], dtype=torch.int32)  # 1 + 1, 0 + 3, 2 + 0 are all <= L
    get("naive").check(x)
    padding = replay(slots=torch.full((3,), -1, dtype=torch.int32), num_accepted=torch.full((3,), 9, dtype=torch.int32))
    get("naive").check(padding)  # -1 rows commit nothing, whatever their num_accepted says


class InPlaceOnly(Implementation):
    name = "in-place-only"
    capabilities = Capabilities(devices=("cpu",), max_tokens=None, frozen=True)


def test_an_implementation_without_replay_refuses_it_with_its_reason():
    x = replay()
    reason = "cache= (replay: the state a checkpoint plus cached records) not supported by in-place-only"
    assert InPlaceOnly().unsupported(x) == reason
    with pytest.raises(ContractError) as err:
        InPlaceOnly().check(x)
    assert err.value.rule == "replay"
    assert InPlaceOnly().unsupported(dataclasses.replace(x, cache=None, update_state=False)) is None
    assert "replay" in get("naive").capabilities.describe()


@pytest.mark.interpreter
@pytest.mark.parametrize("name", names())
def test_every_implementation_runs_replay_or_refuses_it_with_its_reason(name):
    """The survey's answer for the mode: where an implementation says it can run here, 2L one-token
    replay steps equal in-place decode's."""
    impl = get(name)
    x = make_inputs(3, 1, 2, 16, 16, ring=2, slot_pad=16, pad_rows=1, seed=12)
    reason = impl.unsupported(x)
    if reason is not None:
        assert isinstance(reason, str) and reason and "\n" not in reason
        return
    assert run_steps(impl, x, 2 * x.cache.L) == []


# ---- bytes --------------------------------------------------------------------------------------
def test_one_token_bytes_are_the_average_over_a_ring_cycle():
    """L one-token steps take every slot through lengths 0..L-1 once and one flush: what they move,
    counted from the lengths each step meets, is L times the model's step."""
    x = make_inputs(4, 1, 2, 16, 8, ring=4, pad_rows=1, seed=13)
    L, record, slot = x.cache.L, x.cache.record_bytes(), x.slot_bytes()
    assert record == 2 * (8 * 4 + 2 * 16 * 2)
    live = x.slots.long()[x.slots >= 0]
    moved = 0
    for _ in range(L):
        n = x.cache.length.long()[live]
        moved += int(n.sum()) * record + len(live) * (record + 8) + int((n + 1 == L).sum()) * slot
        get("naive").decode(x)
    assert moved == L * x.replay_bytes()
    others = len(live) * slot + x.bytes_besides_pool() + x.B * x.HV * x.V * x.v.element_size()
    assert x.nbytes() == others + x.replay_bytes()


def test_verify_bytes_are_its_own_records_and_flushes():
    x = replay(T=3)
    x.slots = torch.tensor([3, 0, 1], dtype=torch.int32)  # 3 + 3 > 4 flushes first; 0 and 1 cached fit
    record, slot = x.cache.record_bytes(), x.slot_bytes()
    assert x.replay_bytes() == (3 + 0 + 1 + 3 * 3) * record + 3 * 4 + 1 * 4 + slot
    x.num_accepted = torch.tensor([0, 1, 0], dtype=torch.int32)  # every length written; 1 + 3 = 4 still fits
    assert x.replay_bytes() == (3 + 1 + 1 + 3 * 3) * record + 3 * 8 + slot


# ---- inputs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 3])
def test_make_inputs_ring_is_the_frozen_draw_with_a_cache(T):
    a = make_inputs(5, 2, 4, 16, 8, T=T, ring=4, pad_rows=2, seed=10)
    b = make_inputs(5, 2, 4, 16, 8, T=T, update_state=False, pad_rows=2, seed=10)
    assert a.update_state and a.replay and a.num_accepted is None and a.slots.shape == (5,)
    for name, t in b.tensors().items():
        assert torch.equal(getattr(a, name), t), name
    assert a.cache.u.shape == (a.N, 4, 4, 8) and a.cache.kg.shape == (a.N, 4, 4, 32) and a.cache.H == 2
    assert ((a.cache.length >= 0) & (a.cache.length < 4)).all() and a.cache.kg.dtype == a.q.dtype
    c = a.clone()
    assert c.cache is not a.cache and all(torch.equal(t, a.cache.tensors()[n]) for n, t in c.cache.tensors().items())
    assert not a.stored().any() and torch.equal(a.start_slots(), a.slots.long())
    refusal = r"^ring \(replay\) needs update_state=True: a replay step writes its records$"
    with pytest.raises(ValueError, match=refusal):
        make_inputs(5, 2, 4, 16, 8, ring=4, update_state=False)
    with pytest.raises(ValueError, match="L must be an integer >= 1"):
        ReplayCache.empty(4, 0, 1, 1, 16, 16)
    with pytest.raises(ValueError, match=r"^a replay step has no frozen spelling \(its state is not one slot's\)$"):
        a.as_frozen()


def test_make_inputs_draws_the_cache_from_its_seed_alone():
    """The same seed gives the same records and lengths whatever the global RNG did in between, and the
    lengths span the whole ring, an empty one (0) included."""
    first = make_inputs(64, 1, 2, 16, 8, ring=4, seed=3)
    torch.rand(7)  # the global generator moved on
    again = make_inputs(64, 1, 2, 16, 8, ring=4, seed=3)
    for name, t in first.cache.tensors().items():
        assert torch.equal(t, again.cache.tensors()[name]), name
    assert set(first.cache.length.tolist()) == {0, 1, 2, 3}


def test_the_draws_keep_their_pool_and_slot_order_and_an_empty_pool_passes():
    """The frozen and replay draws build on the in-place one: they keep ``n_slots`` and ``sorted_slots``;
    the records' deltas are drawn with standard deviation 0.5; an empty pool (no lengths to bound) with a
    ring of one record, every row padding, passes the contract."""
    for kw in (dict(update_state=False), dict(ring=4)):
        x = make_inputs(6, 1, 2, 8, 8, n_slots=9, sorted_slots=True, seed=2, **kw)
        live = x.slots[x.slots >= 0]
        assert x.N == 9 and torch.equal(live, live.sort().values), kw
    u = make_inputs(8, 2, 4, 16, 32, ring=8, seed=3).cache.u
    assert 0.45 < float(u.std()) < 0.55
    padding = make_inputs(2, 1, 1, 4, 4, pad_rows=2, ring=1)
    empty = dataclasses.replace(padding, state=padding.state[:0],
                                cache=ReplayCache.empty(0, 1, 1, 1, 4, 4, dtype=padding.q.dtype))
    assert empty.N == 0 and (empty.slots == -1).all()
    get("naive").check(empty)
