"""What every registered implementation must do or refuse: the specification the others follow.

For each implementation and each decode mode, on inputs that satisfy its declared capabilities:

- where it runs here, ``verify`` passes: the output and the stored states against the float64
  reference over several steps, every slot not stored and the padding between slots unchanged bit
  for bit, rows with slot -1 output zeros and store nothing;
- where its declared capabilities rule the mode out, ``bind`` raises ContractError naming the
  capability's rule, on any machine; where this machine cannot run it, ``bind`` raises Unsupported
  (the test then skips with that reason).

Every declared capability is enforced (one planted breach each), and the rules every contract shares
(slot range and duplicates, slot dtype, compact inner strides, grad, dtypes, shapes, an aliased
out buffer) are refused with ContractError before anything runs, for every implementation, without
its library. On a GPU the same modes run at Kimi-Linear's shapes, and a step replayed from a CUDA
graph equals the eager one.
"""

from __future__ import annotations

import pytest
import torch

from helpers import DEVICE, assert_graph_replay_takes_eager_step, with_gaps
from kda_impls import ContractError, DecodeInputs, Implementation, Unsupported, get, make_inputs, names, rel_err, verify
from kda_impls.impls.naive import NaiveTorch
from kda_impls.verify_checks import TOLERANCE

NAMES = names()


def conforming(impl: Implementation, *, large: bool = False, state_dtype: torch.dtype | None = None,
               dtype: torch.dtype = torch.bfloat16, B: int = 4, pad_rows: int = 1, gva: bool = True,
               device: str = "cpu", seed: int = 5, **mode) -> DecodeInputs:
    """Inputs every declared capability of ``impl`` allows: its first state dtype (unless given), K and
    V among its values (K != V where allowed), GVA where allowed (and ``gva``), a padded pool whose
    slot stride is a multiple of its ``slot_stride_multiple``, ``pad_rows`` rows of slot -1; ``mode``:
    T, checkpoints, update_state, ring (make_inputs' arguments)."""
    caps = impl.capabilities
    K = min(caps.k_values) if caps.k_values else (128 if large else 16)
    V = K if caps.k_equals_v else min(caps.v_values) if caps.v_values else (128 if large else 32)
    H = 16 if large else 1
    HV = 2 * H if caps.gva and gva else H
    return make_inputs(B, H, HV, K, V, state_dtype=state_dtype or caps.state_dtypes[0], dtype=dtype,
                       slot_pad=max(caps.slot_stride_multiple, 8), pad_rows=pad_rows, device=device, seed=seed, **mode)


# Each mode as make_inputs draws it, on the CPU at small shapes.
MODES = {
    "in-place": dict(),
    "in-place-fp32": dict(state_dtype=torch.float32, dtype=torch.float32),  # verify's fp32 bounds: 1e-5
    "no-live-row": dict(B=2, pad_rows=2),
    # every token stored but a third (-1 inside live rows: the token applied, not stored), num_accepted random
    "multi-token": dict(T=3, gaps=True),
    "multi-token-last": dict(T=3, checkpoints="last"),  # only the last token stored
    "per-token-T1": dict(per_token=True),  # the token axis kept at T = 1
    "frozen": dict(T=3, update_state=False),
    "replay": dict(ring=4),
    "replay-verify": dict(T=2, ring=4),
}


def mode_inputs(impl: Implementation, mode: dict, **kw) -> DecodeInputs:
    """``conforming`` inputs of one of MODES or GPU_MODES."""
    mode = {**mode, **kw}
    gaps, per_token = mode.pop("gaps", False), mode.pop("per_token", False)
    x = conforming(impl, **mode)
    return with_gaps(x) if gaps else x.per_token_spelling() if per_token else x


def refusal(impl: Implementation, x: DecodeInputs) -> tuple[type[Exception], str] | None:
    """What ``bind`` must raise for ``x``, with the rule or reason; None where it must run."""
    try:
        impl.check(x)
    except ContractError as exc:
        return ContractError, exc.rule
    reason = impl.unsupported(x)
    return (Unsupported, reason) if reason else None


def conforms(impl: Implementation, x, what: str) -> None:
    """Runs ``impl`` on ``x`` through verify where it can run, else asserts that ``bind`` refuses it
    (ContractError, or Unsupported: then skips) and that nothing ran. Unsupported may also come from
    ``bind`` alone, for a reason only the slot values give (read once, at bind time)."""
    refused = refusal(impl, x)
    if refused is None:
        before = x.pool_span().clone()
        try:
            verdict = verify(impl, x)
        except Unsupported as exc:  # a reason only the slot values give, found by bind
            assert torch.equal(x.pool_span(), before)  # nothing ran
            pytest.skip(f"{impl.name} cannot run {what} here: {exc}")
        assert verdict.ok, verdict
        return
    error, why = refused
    before = x.pool_span().clone()
    with pytest.raises(error):
        impl.bind(x)
    assert torch.equal(x.pool_span(), before)  # nothing ran
    if error is Unsupported:
        pytest.skip(f"{impl.name} cannot run {what} here: {why}")


@pytest.mark.interpreter
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_each_mode_runs_correctly_or_is_refused_before_anything_runs(name, mode):
    impl = get(name)
    conforms(impl, mode_inputs(impl, MODES[mode], device=DEVICE), mode)


@pytest.mark.interpreter
@pytest.mark.parametrize("name", NAMES)
def test_a_launcher_reads_the_inputs_as_they_are_at_each_launch(name):
    """What benchmarks rely on: one launcher, launched again after the activations changed in place,
    takes the new step (as the naive step bound to a copy does)."""
    impl = get(name)
    x = conforming(impl, device=DEVICE)
    if (reason := impl.unsupported(x)) is not None:
        pytest.skip(reason)
    y = x.clone()
    launch, naive = impl.bind(x), get("naive").bind(y)
    tol = TOLERANCE[x.state.dtype]
    for step in range(2):
        assert rel_err(launch(), naive()) <= tol, step
        for t in (x.q, x.v, x.a, y.q, y.v, y.a):
            t.mul_(-1)
    assert rel_err(x.pool_span(), y.pool_span()) <= tol


class WritesThePadding(NaiveTorch):
    """A planted bug: every step also writes the padding after the first slot."""

    name = "planted-writes-padding"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)

        def run():
            inputs.pool_span()[inputs.slot_elements] += 1
            return launch()

        return run


@pytest.mark.parametrize("mode", ["in-place", "multi-token", "replay"])
def test_the_suite_fails_a_planted_bug(mode):
    impl = WritesThePadding()
    with pytest.raises(AssertionError, match="padding between slots was written"):
        conforms(impl, mode_inputs(impl, MODES[mode]), mode)


def declared_breaches(impl: Implementation) -> dict[str, tuple[str, object]]:
    """For each capability ``impl`` declares narrower than the contract: (the rule, inputs that break
    only it)."""
    caps = impl.capabilities
    breaches = {}
    if not caps.replay:
        breaches["replay"] = ("replay", conforming(impl, ring=4))
    if not caps.frozen:
        breaches["frozen"] = ("update-state", conforming(impl, T=2, update_state=False))
    if caps.max_tokens is not None:
        breaches["tokens"] = ("tokens", conforming(impl, T=caps.max_tokens + 1))
    other = next((d for d in (torch.float32, torch.bfloat16, torch.float16) if d not in caps.state_dtypes), None)
    if other is not None:
        breaches["state dtype"] = ("state-dtype", conforming(impl, state_dtype=other))
    if not caps.gva:
        x = conforming(impl)
        breaches["gva"] = ("gva", make_inputs(2, x.HV, 2 * x.HV, x.K, x.V, state_dtype=x.state.dtype,
                                              slot_pad=max(caps.slot_stride_multiple, 8)))
    if caps.k_values:
        K = max(caps.k_values) * 2
        breaches["K"] = ("head-dims", make_inputs(2, 1, 1, K, K, state_dtype=caps.state_dtypes[0], slot_pad=16))
    if caps.k_equals_v:
        x = conforming(impl)
        values = caps.v_values or (x.K * 2,)
        V = next((v for v in values if v != x.K), None)
        if V is not None:
            breaches["K == V"] = ("head-dims", make_inputs(2, 1, 1, x.K, V, state_dtype=x.state.dtype,
                                                           slot_pad=max(caps.slot_stride_multiple, 8)))
    if caps.slot_stride_multiple > 1:
        x = conforming(impl)
        breaches["slot stride"] = ("pool-alignment", make_inputs(2, x.H, x.HV, x.K, x.V, state_dtype=x.state.dtype,
                                                                 slot_pad=1))
    if caps.base_alignment > 1:
        x = conforming(impl)
        flat = x.pool_span()
        buffer = torch.empty(flat.numel() + 1, dtype=flat.dtype)
        buffer[1:].copy_(flat)
        x.state = buffer.as_strided(x.state.shape, x.state.stride(), 1)  # one element past the allocation's start
        breaches["base alignment"] = ("pool-alignment", x)
    return breaches


CAPABILITY_BREACHES = [(name, what) for name in NAMES for what in declared_breaches(get(name))]


@pytest.mark.parametrize("name, what", CAPABILITY_BREACHES, ids=[f"{n}-{w}" for n, w in CAPABILITY_BREACHES])
def test_each_declared_capability_is_enforced(name, what):
    impl = get(name)
    rule, x = declared_breaches(impl)[what]
    with pytest.raises(ContractError) as refused:
        impl.bind(x)
    assert refused.value.rule == rule and refused.value.impl == impl.label, refused.value


def test_narrower_capabilities_are_checked_for_every_kind():
    """The breaches above cover every kind of declared capability some implementation narrows."""
    kinds = {what for _, what in CAPABILITY_BREACHES}
    expected = {"replay", "frozen", "tokens", "state dtype", "gva", "K", "K == V", "slot stride", "base alignment"}
    assert expected <= kinds, expected - kinds


def plant(x, rule: str):
    """``x`` with one breach of a rule every contract shares; (inputs, out or None)."""
    out = None
    if rule == "slot-range":
        x.slots[0] = x.N
    elif rule == "slot-duplicate":
        live = torch.nonzero(x.slots >= 0).flatten()
        x.slots[live[1]] = x.slots[live[0]]
    elif rule == "slots":
        x.slots = x.slots.long()
    elif rule == "state-inner-strides":
        slot_stride, _, _, _ = x.state.stride()
        x.state = x.state.as_strided(x.state.shape, (slot_stride, x.V * x.K, 1, x.V))  # each slot [K, V] in memory
    elif rule == "requires-grad":
        x.q.requires_grad_(True)
    elif rule == "dtype":
        x.q = x.q.double()
    elif rule == "shape":
        x.v = x.v[:, :, :-1].contiguous()
    elif rule == "out-alias":
        out = x.v  # the output buffer over an input the launcher reads
    return x, out


SHARED_RULES = ["slot-range", "slot-duplicate", "slots", "state-inner-strides", "requires-grad", "dtype", "shape",
                "out-alias"]


@pytest.mark.parametrize("rule", SHARED_RULES)
@pytest.mark.parametrize("name", NAMES)
def test_the_shared_rules_are_refused_before_anything_runs(name, rule):
    impl = get(name)
    x = conforming(impl, B=3)
    impl.check(x)  # the inputs conform before the breach is planted
    x, out = plant(x, rule)
    before = x.pool_span().clone()
    with pytest.raises(ContractError) as refused:
        impl.bind(x, out)
    assert refused.value.rule == rule, refused.value
    assert str(refused.value).startswith(impl.label) and torch.equal(x.pool_span(), before)


@pytest.mark.parametrize("name", NAMES)
def test_unsupported_answers_without_raising_and_bind_returns_the_out_buffer(name):
    impl = get(name)
    x = conforming(impl, device=DEVICE)
    reason = impl.unsupported(x)
    assert reason is None or (isinstance(reason, str) and reason)
    if reason is not None:
        pytest.skip(reason)
    out = torch.empty(x.out_shape, dtype=x.v.dtype, device=x.device)
    assert impl.bind(x, out)() is out


# ---- on a GPU: Kimi-Linear's shapes -------------------------------------------------------------

GPU_MODES = {
    "B1": dict(B=1, pad_rows=0),
    "B64": dict(B=64, pad_rows=4),
    "B64-fp32": dict(B=64, state_dtype=torch.float32),
    "multi-token-T4": dict(B=16, T=4),
    "multi-token-T8-gaps": dict(B=64, T=8, gaps=True),
    "frozen-T4": dict(B=16, T=4, update_state=False),
    "replay-ring8": dict(B=16, ring=8),
    "replay-verify-T4": dict(B=16, T=4, ring=8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("gva", [True, False], ids=["HV=2H", "HV=H"])
@pytest.mark.parametrize("mode", GPU_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_each_mode_at_real_shapes_on_gpu(name, mode, gva):
    impl = get(name)
    conforms(impl, mode_inputs(impl, GPU_MODES[mode], large=True, gva=gva, device="cuda"), mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["B64", "multi-token-T8-gaps"])
@pytest.mark.parametrize("name", NAMES)
def test_a_cuda_graph_replay_takes_the_eager_step(name, mode):
    impl = get(name)
    x = mode_inputs(impl, GPU_MODES[mode], large=True, gva=False, device="cuda")
    if (reason := impl.unsupported(x)) is not None:
        pytest.skip(reason)
    assert_graph_replay_takes_eager_step(name, x)
