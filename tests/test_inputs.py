"""DecodeInputs' byte model, pinned to numbers worked out by hand (not by calling the code under test):
every bandwidth and roofline figure of the sweeps divides by it; and what make_inputs promises."""

import math

import pytest
import torch

from kda_impls import ContractError, make_inputs

# Each case: make_inputs arguments, then the bytes a step moves, summed term by term:
#   live state rows read and written: 2 * live * HV*V*K * state bytes
#   read once: q, k (B*H*K), v (B*HV*V), a (B*HV*K), b (B*HV) in the activation dtype;
#              A_log (HV) and dt_bias (HV*K) in fp32; slots (B) in int32
#   written once: the output (B*HV*V) in v's dtype
# The pool's other slots and the padding between slots move nothing.
BYTE_CASES = [
    # B=3, H=2, HV=4, K=16, V=32, bf16 activations and state, one -1 row (2 live), padded pool of 7 slots
    (dict(B=3, H=2, HV=4, K=16, V=32, slot_pad=8, n_slots=7, pad_rows=1),
     2 * 2 * (4 * 32 * 16) * 2,                      # state: 16384
     (3 * 2 * 16 * 2) * 2 + 3 * 4 * 32 * 2 + 3 * 4 * 16 * 2 + 3 * 4 * 2  # q, k 192 each; v 768; a 384; b 24
     + 4 * 4 + 4 * 16 * 4 + 3 * 4,                   # A_log 16, dt_bias 256, slots 12: besides the pool 1844
     3 * 4 * 32 * 2),                                # out: 768
    # the same with an fp32 state: only the state term doubles
    (dict(B=3, H=2, HV=4, K=16, V=32, slot_pad=8, n_slots=7, pad_rows=1, state_dtype=torch.float32),
     32768, 1844, 768),
    # fp32 everything, no -1 row, odd slot padding
    (dict(B=2, H=1, HV=2, K=8, V=8, slot_pad=3, n_slots=5, dtype=torch.float32, state_dtype=torch.float32),
     2 * 2 * (2 * 8 * 8) * 4,                        # 2048
     2 * (2 * 1 * 8 * 4) + 2 * 2 * 8 * 4 + 2 * 2 * 8 * 4 + 2 * 2 * 4 + 2 * 4 + 2 * 8 * 4 + 2 * 4,  # 480
     2 * 2 * 8 * 4),                                 # 128
    # every row padding: no state moves, the rest still does
    (dict(B=2, H=1, HV=2, K=8, V=8, pad_rows=2), 0,
     32 + 32 + 64 + 64 + 8 + 8 + 64 + 8,            # q, k, v, a, b, A_log, dt_bias, slots: 280
     64),
]


@pytest.mark.parametrize("kw, state, besides_pool, out", BYTE_CASES)
def test_nbytes_pinned(kw, state, besides_pool, out):
    x = make_inputs(**kw, seed=4)
    assert x.bytes_besides_pool() == besides_pool
    assert x.nbytes() == state + besides_pool + out


def test_nbytes_literal():
    """The first case as one literal, in case the term-by-term sums above share a mistake."""
    x = make_inputs(3, 2, 4, 16, 32, slot_pad=8, n_slots=7, pad_rows=1, seed=4)
    assert x.nbytes() == 18996


def test_make_inputs_is_seeded():
    a = make_inputs(16, 2, 4, 16, 16, slot_pad=3, pad_rows=5)
    b = make_inputs(16, 2, 4, 16, 16, slot_pad=3, pad_rows=5, seed=0)
    c = make_inputs(16, 2, 4, 16, 16, slot_pad=3, pad_rows=5, seed=1)
    for name, t in a.tensors().items():
        same = torch.equal(t, b.tensors()[name]) if name != "state" else torch.equal(a.pool_span(), b.pool_span())
        assert same, f"{name}: the default seed is 0 and the same seed gives the same inputs"
    assert not torch.equal(a.q, c.q) and not torch.equal(a.pool_span(), c.pool_span())
    # a T-token draw takes num_accepted from the seed too, whatever the global RNG did in between
    first = make_inputs(8, 1, 2, 8, 8, T=4, seed=2).num_accepted
    torch.manual_seed(12345)
    torch.randint(0, 9, (100,))
    assert torch.equal(first, make_inputs(8, 1, 2, 8, 8, T=4, seed=2).num_accepted)


def test_make_inputs_distributions():
    """As in a trained Kimi-Linear layer: activations standard normal, A = exp(A_log) uniform in [1, 16],
    dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1] (dt_bias bf16 values, as a bf16 checkpoint holds them:
    dt moves by under 0.5% at the ends), the pool normal with standard deviation 0.5."""
    x = make_inputs(64, 4, 8, 64, 64, dtype=torch.float32, state_dtype=torch.float32, seed=2)
    for name in ("q", "k", "v", "a", "b"):
        t = getattr(x, name)
        within = 5 / math.sqrt(t.numel())  # five standard errors
        assert abs(t.mean()) < within and abs(t.std() - 1) < within, name
    gates = make_inputs(1, 1, 512, 16, 4, seed=3)  # many heads: the gate parameters' ranges are reached
    A = torch.exp(gates.A_log.double())
    assert 1 - 1e-6 <= A.min() < 1.5 and 15.5 < A.max() <= 16 + 1e-5 and abs(A.mean() - 8.5) < 0.6
    log_dt = torch.log10(torch.nn.functional.softplus(gates.dt_bias.double()))
    assert -3.002 <= log_dt.min() < -2.9 and -1.1 < log_dt.max() <= -1 + 0.002 and abs(log_dt.mean() + 2) < 0.05
    assert torch.equal(gates.dt_bias.to(torch.bfloat16).float(), gates.dt_bias)
    pool = x.pool_span()
    assert abs(pool.mean()) < 0.01 and abs(pool.std() - 0.5) < 0.01


def test_make_inputs_slots():
    x = make_inputs(16, 1, 1, 4, 4, pad_rows=3, seed=5)
    live = x.slots[x.slots >= 0]
    assert x.N == 32 and (x.slots == -1).sum() == 3 and live.unique().numel() == 13
    assert not torch.equal(live, live.sort().values), "slots come in random order by default"
    ordered = make_inputs(16, 1, 1, 4, 4, sorted_slots=True, seed=5).slots
    assert torch.equal(ordered, ordered.sort().values)
    assert make_inputs(0, 1, 1, 4, 4).N == 1  # an empty batch still gets a pool of one slot
    with pytest.raises(ContractError, match=r"^make_inputs: pad_rows must be in \[0, B=4\]; got 5$"):
        make_inputs(4, 1, 1, 8, 8, pad_rows=5)
    with pytest.raises(ValueError, match=r"^n_slots=3 must be >= B=4 \(every stored token needs its own slot\)$"):
        make_inputs(4, 1, 1, 8, 8, n_slots=3)


def test_clone_is_deep_and_keeps_the_layout():
    x = make_inputs(3, 1, 2, 8, 8, slot_pad=5, pad_rows=1, seed=6)
    x.scale = 0.25
    y = x.clone()
    assert y.scale == 0.25 and y.state.stride() == x.state.stride()
    assert torch.equal(y.pool_span().view(torch.int16), x.pool_span().view(torch.int16))  # padding bits too
    for name, t in y.tensors().items():
        assert t.data_ptr() != x.tensors()[name].data_ptr(), name
    y.state.add_(1)
    y.q.add_(1)
    assert not torch.equal(y.state, x.state) and not torch.equal(y.q, x.q)


def test_shape_properties():
    x = make_inputs(3, 2, 4, 16, 8, slot_pad=7, n_slots=5, seed=7)
    assert (x.B, x.H, x.HV, x.K, x.V, x.N) == (3, 2, 4, 16, 8, 5)
    assert (x.slot_elements, x.slot_stride) == (4 * 8 * 16, 4 * 8 * 16 + 7)
    assert x.effective_scale == 16**-0.5 and x.device == torch.device("cpu")
    x.scale = 2
    assert x.effective_scale == 2.0 and isinstance(x.effective_scale, float)
    assert math.isclose(make_inputs(1, 1, 1, 64, 8).effective_scale, 0.125)
    assert x.pool_span().numel() == 4 * (4 * 8 * 16 + 7) + 4 * 8 * 16  # N-1 strides, then the last slot
    assert make_inputs(0, 1, 1, 4, 4, n_slots=0, slot_pad=3).pool_span().numel() == 0


def test_the_smallest_axes_are_accepted():
    """Each axis's lower bound itself is a valid draw (B = 0, one head, K = V = T = 1, no padding)."""
    x = make_inputs(0, 1, 1, 1, 1, T=1, slot_pad=0)
    assert x.out_shape == (0, 1, 1) and x.K == x.V == 1


def test_the_one_token_spelling():
    """A T = 1 step with a token axis drops it (the same memory); one without is itself; T > 1 has none."""
    x = make_inputs(3, 1, 2, 8, 8, seed=1)
    assert x.one_token_spelling() is x
    p = x.per_token_spelling()
    one = p.one_token_spelling()
    assert not one.per_token and one.out_shape == x.out_shape and one.q.data_ptr() == x.q.data_ptr()
    assert torch.equal(one.slots, x.slots)
    with pytest.raises(ValueError, match=r"^a step of T=2 tokens has no one-token spelling$"):
        make_inputs(3, 1, 2, 8, 8, T=2).one_token_spelling()


def test_make_inputs_takes_dtype_names():
    x = make_inputs(2, 1, 2, 16, 16, state_dtype="bf16", dtype="float32")
    assert x.state.dtype == torch.bfloat16 and x.q.dtype == torch.float32


@pytest.mark.parametrize("arguments, rule, words", [
    (dict(state_dtype="fp8"), "dtype", "state_dtype must be a torch dtype or its name; unknown dtype 'fp8'"),
    (dict(dtype=3), "dtype", "dtype must be a torch dtype or its name; unknown dtype '3'"),
    (dict(device="tpu"), "device", "device must be cpu, cuda or cuda:N; got 'tpu'"),
    # a GPU past the last one visible: absent on every machine
    (dict(device=f"cuda:{torch.cuda.device_count()}"), "device", "device must be one that exists here"),
    (dict(H=3, HV=4), "gva", "HV must be a multiple of H; got HV=4, H=3"),
])
def test_make_inputs_refuses_what_the_contract_refuses_before_drawing(arguments, rule, words):
    shape = dict(B=2, H=1, HV=2, K=16, V=16) | {k: arguments.pop(k) for k in ("H", "HV") if k in arguments}
    with pytest.raises(ContractError) as refused:
        make_inputs(**shape, **arguments)
    assert refused.value.rule == rule and str(refused.value).startswith(f"make_inputs: {words}"), refused.value


def test_a_drawn_replay_cache_holds_one_key_per_qk_head():
    """A step writes its q/k head's key to each value head of that head (GVA), so the drawn records do;
    the gate inputs stay per value head."""
    x = make_inputs(2, 2, 4, 16, 16, ring=4, seed=3)
    keys, gates = x.cache.kg[..., :16], x.cache.kg[..., 16:]
    assert torch.equal(keys[:, 0::2], keys[:, 1::2]) and not torch.equal(keys[:, 0], keys[:, 2])
    assert not torch.equal(gates[:, 0::2], gates[:, 1::2])
