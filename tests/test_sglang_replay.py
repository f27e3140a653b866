"""SGLang's ReplaySSM decode kernel (the sglang 0.5.23 wheel's own Triton file), run for real on the CPU
under TRITON_INTERPRET=1 through the ``sglang-replayssm`` adapter: judged by ``kda_impls.verify`` over
several steps and ring flushes, its rings carried across launches of one bind, its cursor advanced in
every timed launch (SGLang's issue #38398: a benchmark that never advanced ``write_pos`` overstated
the ReplaySSM speed-up by up to 21%), and its records copied into the cache by ``sync_records`` only,
outside the timed launch.

Needs the wheel, installed without its dependencies (``python3 -m pip install --no-deps sglang==0.5.23``);
skips without it. Triton 3.9's interpreter makes ``block_mask & (scalar < n)`` an int32 mask that its
loads and stores reject (compiled Triton makes it i1); the ``interpreter_masks`` fixture hands them the
same mask as bool, so that the kernel's own code runs unchanged.
"""

import dataclasses
import os

import numpy as np
import pytest
import torch
import triton.runtime.interpreter as interpreter

from kda_impls import effective_state, get, make_inputs, rel_err, verify
from kda_impls.bench.case import _TimedFirstLaunch
from kda_impls.bench.timing import Budget, kernel_time
from kda_impls.contract import Unsupported
from kda_impls.impls import sglang_replay
from kda_impls.impls.sglang_kda import INSTALL, sglang_dir
from kda_impls.reference import replay_step
from kda_impls.replay import sync_records
from kda_impls.verify import bits

pytestmark = [pytest.mark.skipif(sglang_dir() is None, reason=f"sglang not installed ({INSTALL})"),
              pytest.mark.interpreter,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernel interpreted: "
                                 "TRITON_INTERPRET=1 (tests/conftest.py sets it where no GPU is visible)")]

CASES = {
    "gva-padded-pool-pad-row-fp32": dict(B=3, H=1, HV=2, K=32, V=16, slot_pad=8, pad_rows=1,
                                         state_dtype=torch.float32, dtype=torch.float32),
    "bf16-state": dict(B=3, H=2, HV=2, K=32, V=32, state_dtype=torch.bfloat16, dtype=torch.float32),
}


@pytest.fixture
def interpreter_masks(monkeypatch):
    store, load = interpreter._interpreter.store, interpreter._interpreter.load

    def as_bool(mask):
        return mask if mask.dtype == np.bool_ else mask.astype(np.bool_)

    monkeypatch.setattr(interpreter._interpreter, "store", lambda p, v, m: store(p, v, as_bool(m)))
    monkeypatch.setattr(interpreter._interpreter, "load", lambda p, m, o, d: load(p, as_bool(m), o, d))
    sglang_replay.interpreter_fault.cache_clear()
    yield
    sglang_replay.interpreter_fault.cache_clear()


def staggered(x, L):
    """Each live slot's ring at its own length, so that the slots flush at different steps; under GVA each
    record's key the same for the value heads of one q/k head, as the steps write them."""
    live = x.slots.long()[x.live_rows()]
    x.cache.length[live] = (torch.arange(len(live), dtype=torch.int32, device=x.device) + L - 2) % L
    group = x.HV // x.H
    x.cache.kg[..., :x.K] = x.cache.kg[:, ::group, :, :x.K].repeat_interleave(group, dim=1)
    return x


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_verified_over_steps_and_flushes(case, interpreter_masks):
    L = 4
    x = staggered(make_inputs(**CASES[case], ring=L, seed=5), L)
    verdict = verify(get("sglang-replayssm"), x, steps=2 * L + 1)  # every live ring flushes twice
    assert verdict.ok, verdict


def test_rings_the_kernel_writes_are_what_its_next_launches_read(interpreter_masks):
    """One bind, L + 2 launches on fresh activations written into the bound tensors: every output as the
    reference's steps give it, and the effective state at the end, so the d, k and g records the kernel
    stores (not re-translated from the cache between launches) and its flush carry the state."""
    L = 4
    x = staggered(make_inputs(**CASES["gva-padded-pool-pad-row-fp32"], ring=L, seed=6), L)
    ref = x.clone()
    launch = get("sglang-replayssm").bind(x)
    gen = torch.Generator().manual_seed(0)
    live = x.live_rows()
    for _ in range(L + 2):
        for name in ("q", "k", "v", "a", "b"):
            fresh = torch.randn(getattr(x, name).shape, generator=gen)
            getattr(x, name).copy_(fresh)
            getattr(ref, name).copy_(fresh)
        out = launch().clone()
        sync_records(launch)
        want, _ = replay_step(ref, torch.float64)
        assert rel_err(out[live], want[live, 0]) <= 1e-5 and (out[~live] == 0).all()
    assert torch.equal(x.cache.length, ref.cache.length)
    slots = x.slots.long()[live]
    assert rel_err(effective_state(x)[slots], effective_state(ref)[slots]) <= 1e-5


def flushes_as_timed(impl, x) -> bool:
    """Whether, over the launches the bench's own timer makes of ``impl`` on ``x`` on the CPU (a warm-up,
    then whole ring cycles; a GPU's timer replays a CUDA graph: test_sglang_gpu.py counts those), each
    live slot's pool block was written exactly at the launches where its ring fills: ``(length +
    launches) // L`` times from its length before the first."""
    slots = x.slots.long()[x.live_rows()]
    start = x.cache.length[slots].long().cpu()
    writes = torch.zeros(len(slots), dtype=torch.int64)
    calls = []

    def bind(inputs):
        launch = impl.bind(inputs)

        def counted():
            before = inputs.state[slots].clone()
            result = launch()
            writes.add_((bits(inputs.state[slots]) != bits(before)).flatten(1).any(dim=1).long().cpu())
            calls.append(1)
            return result

        return counted

    kernel_time(lambda _: x, bind, "cpu", Budget(min_samples=1, max_samples=2, max_seconds=0.01))
    assert len(calls) > x.cache.L
    return torch.equal(writes, (start + len(calls)) // x.cache.L)


def test_every_timed_launch_advances_the_cursor(interpreter_masks):
    L = 4
    x = staggered(make_inputs(**CASES["bf16-state"], ring=L, seed=7), L)
    assert flushes_as_timed(get("sglang-replayssm"), x)


def test_the_cycle_check_catches_a_launcher_that_never_advances_write_pos(interpreter_masks, monkeypatch):
    """SGLang #38398, planted: the cursor snapshotted, never advanced."""
    L = 4
    x = staggered(make_inputs(**CASES["bf16-state"], ring=L, seed=7), L)
    frozen = x.cache.length.clone()
    monkeypatch.setattr(sglang_replay, "_cursor_kernel", Planted(sglang_replay._cursor_kernel,
                                                                 after=lambda: x.cache.length.copy_(frozen)))
    assert not flushes_as_timed(get("sglang-replayssm"), x)


class Planted:
    """Stands in for a Triton kernel of the adapter: launches it, counts the launches, then runs ``after``."""

    def __init__(self, kernel, after=lambda: None):
        self.kernel, self.after, self.launches = kernel, after, 0

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.kernel[grid](*args, **kwargs)
            self.launches += 1
            self.after()

        return run


def test_a_timed_launch_is_the_cursor_and_the_kernel_and_never_the_records_copy(interpreter_masks, monkeypatch):
    L = 4
    x = staggered(make_inputs(**CASES["bf16-state"], ring=L, seed=7), L)
    impl = get("sglang-replayssm")
    cursor, records = Planted(sglang_replay._cursor_kernel), Planted(sglang_replay._records_kernel)
    monkeypatch.setattr(sglang_replay, "_cursor_kernel", cursor)
    monkeypatch.setattr(sglang_replay, "_records_kernel", records)
    decode, decodes = impl.kernel(), []
    monkeypatch.setattr(type(impl), "kernel", lambda self: lambda **kw: (decodes.append(1), decode(**kw)))
    assert flushes_as_timed(impl, x)
    assert cursor.launches == len(decodes) > L and records.launches == 0


def test_a_check_that_never_syncs_the_records_finds_the_cache_stale(interpreter_masks, monkeypatch):
    """Planted: a launcher whose ``sync_records`` does nothing leaves the cache's records behind the rings;
    verify, which binds each step anew from the cache, finds them."""
    L = 4
    x = staggered(make_inputs(**CASES["bf16-state"], ring=L, seed=5), L)
    launcher = sglang_replay.SGLangReplaySSM._launcher

    def never_synced(self, inputs, out):
        launch = launcher(self, inputs, out)
        launch.sync_records = lambda: None
        return launch

    monkeypatch.setattr(sglang_replay.SGLangReplaySSM, "_launcher", never_synced)
    verdict = verify(get("sglang-replayssm"), x, steps=2)
    assert not verdict.ok and any("cache.kg records differ" in p for p in verdict.problems), verdict


def test_the_harness_wrappers_carry_sync_records(interpreter_masks):
    """The per-token spelling's launcher (contract) and the sweep's first-launch timer (bench) wrap the
    adapter's launcher; verify through both still syncs the records."""
    L = 4
    x = staggered(make_inputs(**CASES["bf16-state"], ring=L, seed=5), L).per_token_spelling()
    assert verify(_TimedFirstLaunch(get("sglang-replayssm")), x, steps=L + 1).ok


def test_refusals_say_why(interpreter_masks):
    impl = get("sglang-replayssm")
    x = make_inputs(**CASES["bf16-state"], ring=4, seed=8)
    assert "replay steps only" in impl.unsupported(dataclasses.replace(x, cache=None))
    commit = dataclasses.replace(x, num_accepted=torch.zeros(x.B, dtype=torch.int32))
    assert "num_accepted must be None" in impl.unsupported(commit)
    assert "K >= 32" in impl.unsupported(make_inputs(3, 2, 2, 16, 16, ring=4, dtype=torch.float32))
    assert "fp32 activations only" in impl.unsupported(make_inputs(3, 2, 2, 32, 16, ring=4))
    assert "T > 1" in impl.unsupported(make_inputs(3, 2, 2, 32, 16, T=2, ring=4, dtype=torch.float32))


def test_a_cache_whose_grouped_value_heads_hold_different_keys_is_refused_at_bind(interpreter_masks):
    x = staggered(make_inputs(**CASES["gva-padded-pool-pad-row-fp32"], ring=4, seed=9), 4)
    slot = int(x.slots[x.live_rows()][0])
    x.cache.length[slot] = 1
    x.cache.kg[slot, 1, 0, 0] += 1  # value head 1's key, q/k head 0's second value head
    with pytest.raises(Unsupported, match="one key per q/k head, and 1 committed records"):
        get("sglang-replayssm").bind(x)


def test_without_the_mask_fix_the_interpreter_is_refused_with_its_reason(monkeypatch):
    store = interpreter._interpreter.store

    def strict(p, v, m):  # Triton 3.9's own check, as where the fixture's fix is absent
        if m.dtype != np.bool_:
            raise ValueError("mask has unsupported dtype")
        return store(p, v, m)

    monkeypatch.setattr(interpreter._interpreter, "store", strict)
    sglang_replay.interpreter_fault.cache_clear()
    try:
        reason = get("sglang-replayssm").unsupported(make_inputs(3, 2, 2, 32, 16, ring=4, dtype=torch.float32))
    finally:
        sglang_replay.interpreter_fault.cache_clear()
    assert "interpreter rejects the kernel's masked stores" in reason and "mask has unsupported dtype" in reason
