"""Our Triton replay's pre-decayed records (``kda_impls/impls/triton/replay_token.py``).

Launchers bound once on one pool and cache, a decode's, a verify's and a commit's (as an engine binds
them), take a schedule over several ring cycles, each launch against the reference's ``replay_step`` in
float64 from the same state (the outputs, the records, the lengths, the pool, a flush's state). A decay
strong enough to carry the records' exponent past the bound mid-ring takes the exact path and its
flush. Planted kernels prove the checks: a flush that drops the records, the bound ignored, launchers
whose pre-decayed records are each their own.
"""

import dataclasses
import math

import pytest
import torch
import triton
import triton.language as tl

from kda_impls import get, make_inputs
from kda_impls.impls.triton import replay as triton_replay
from kda_impls.impls.triton import replay_token
from kda_impls.impls.triton.replay_math import DECAY_BOUND
from kda_impls.reference import log_decay
from replay_checks import launched_problems, poison_unused_records, tolerance

T = 2  # the verify's tokens


class Forms:
    """A decode (T = 1), a verify (T tokens) and a commit (T = 1 with ``num_accepted``) bound once each on
    the pool and cache of ``x`` (a T-token replay step), each with activations of its own."""

    def __init__(self, x):
        one = x.token(0)
        own = {name: getattr(one, name).clone() for name in ("q", "k", "v", "a", "b")}
        self.inputs = {
            "verify": x,
            "decode": dataclasses.replace(one, **own),
            "commit": dataclasses.replace(one, **{n: t.clone() for n, t in own.items()},
                                          num_accepted=torch.zeros(x.B, dtype=torch.int32, device=x.device)),
        }
        self.outs = {form: torch.empty(y.out_shape, dtype=y.v.dtype, device=y.device)
                     for form, y in self.inputs.items()}
        self.launchers = {form: get("triton").bind(y, self.outs[form]) for form, y in self.inputs.items()}

    def run(self, schedule, seed=0, watch=None):
        """Launch ``schedule`` (form names; a commit accepts a random 0..T of the verify's records before
        it), fresh activations each launch; the problems found, each with its launch's index. ``watch``
        is called with the form's inputs before each launch; ``flushes`` counts the slots flushed."""
        gen = torch.Generator().manual_seed(seed)
        problems, self.flushes = [], 0
        for i, form in enumerate(schedule):
            y = self.inputs[form]
            for name in ("q", "k", "v", "a", "b"):
                t = getattr(y, name)
                t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
            if form == "commit":
                y.num_accepted.copy_(torch.randint(0, T + 1, (y.B,), generator=gen, dtype=torch.int32))
            if watch is not None:
                watch(y)
            found, flushed = launched_problems(self.launchers[form], self.outs[form], y, tolerance(y))
            self.flushes += len(flushed)
            problems += [f"launch {i} ({form}): {p}" for p in found]
        return problems


def forms(case, ring, seed, monkeypatch):
    monkeypatch.setenv(triton_replay.REPLAY_CONFIG_ENV, "BV=16")  # V = 32 in two tiles: two programs a head
    x = make_inputs(3, T=T, ring=ring, seed=seed, pad_rows=1, **case)
    poison_unused_records(x)
    return x


CASE = dict(H=1, HV=2, K=16, V=32, slot_pad=3)
CASES = {"gva-padded-pool-bf16": CASE, "gva-fp32": dict(CASE, state_dtype=torch.float32, dtype=torch.float32)}
# decodes over two ring cycles and more, a verify whose records a commit takes, a verify no step commits
SCHEDULE = ["decode"] * 5 + ["verify", "commit", "decode", "verify", "commit"] + ["decode"] * 4 + \
    ["verify", "decode", "verify", "commit"] + ["decode"] * 5


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_launchers_bound_once_on_one_cache_take_every_step_right(case, monkeypatch):
    x = forms(CASES[case], 4, 41, monkeypatch)
    steps = Forms(x)
    assert steps.run(SCHEDULE) == []
    assert steps.flushes >= 2 * 2  # each live row's ring flushed twice or more


class NotShared(dict):
    """Planted: every launcher's pre-decayed records its own (a verify's records unseen by the decode's)."""

    def get(self, key, default=None):
        return default

    def __setitem__(self, key, value):
        pass


@triton.jit
def _flushed_without_records(tile, decay, u, k, W, u_ptr, records, n, offs_l, offs_v, V: tl.constexpr):
    return tl.load(tile).to(tl.float32) * decay[None, :] + u[:, None] * k[None, :]


PLANTS = {"records-not-shared": ("_DECAYED", NotShared(), "output error"),
          "flush-drops-the-records": ("_flushed", _flushed_without_records, "flushed slot holds error")}


@pytest.mark.interpreter
@pytest.mark.parametrize("plant", PLANTS, ids=list(PLANTS))
def test_the_schedule_catches(plant, monkeypatch):
    name, value, found = PLANTS[plant]
    x = forms(CASES["gva-fp32"], 4, 41, monkeypatch)
    monkeypatch.setattr(replay_token, name, value)
    problems = Forms(x).run(SCHEDULE)
    assert any(found in p for p in problems), problems


def largest_exponent(y):
    """Per live row of the step ``y`` (its commit taken), ``max over heads and K of -G'``: the decay from the
    checkpoint through the token, the exponent of its pre-decayed key; and whether the step flushes."""
    rows = torch.nonzero(y.live_rows()).flatten()
    found = []
    for i in rows.tolist():
        s = int(y.slots[i])
        n = int(y.cache.length[s]) + (int(y.num_accepted[i]) if y.num_accepted is not None else 0)
        records = log_decay(y, y.cache.kg[s:s + 1, :, :n, y.K:], torch.float64)[0].sum(dim=1)  # [HV, K]
        token = log_decay(y, y.a[i:i + 1], torch.float64)[0]
        found.append((float((-(records + token)).max()), n + 1 == y.cache.L))
    return found


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_decay_past_the_bound_mid_ring_takes_the_exact_path(case, monkeypatch):
    """Gates about -5 to -20 a token: each ring crosses the bound after a few records, so the steps before
    read the pre-decayed keys and the later ones, the flush included, the raw records; the pre-decayed
    records stay finite. The bound ignored (every step reading the clamped keys) is caught."""
    x = forms(CASES[case], 8, 43, monkeypatch)
    x.A_log.fill_(math.log(10.0))
    x.dt_bias.zero_()
    seen = []
    schedule = ["decode"] * 12 + ["verify", "commit"] + ["decode"] * 6
    assert Forms(x).run(schedule, watch=lambda y: seen.extend(largest_exponent(y))) == []
    assert any(e <= DECAY_BOUND for e, _ in seen) and any(e > DECAY_BOUND and flush for e, flush in seen), seen
    decayed = replay_token.decayed_records(x)  # the launchers' own, refilled from the cache
    assert torch.isfinite(decayed).all()

    y = forms(CASES[case], 8, 43, monkeypatch)
    y.A_log.fill_(math.log(10.0))
    y.dt_bias.zero_()
    monkeypatch.setattr(replay_token, "_DECAY_BOUND", tl.constexpr(float("inf")))
    assert Forms(y).run(schedule) != []


# ---- on the GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_launchers_bound_once_on_gpu(state_dtype):
    """Serving shapes (GVA, padded pool, -1 rows, K = V = 128, ring 16): the schedule over two ring cycles and
    more, the default tile."""
    x = make_inputs(32, 16, 32, 128, 128, T=T, ring=16, state_dtype=state_dtype, slot_pad=64, pad_rows=4,
                    device="cuda", seed=45)
    poison_unused_records(x)
    schedule = (["decode"] * 6 + ["verify", "commit"]) * 5
    assert Forms(x).run(schedule) == []
