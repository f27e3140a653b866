"""Our Triton frozen verify kernel (kda_impls/impls/triton_frozen.py: the T tokens' chain in closed form)
against the float64 reference, interpreted on the CPU on tiny shapes: every T the step allows small
(1, 2, 4, 8), GVA, K != V, a padded pool, a -1 row, bf16 and fp32 state, decays strong enough that
the naive ``exp(G_t) * exp(-G_j)`` form overflows; outputs poisoned before the run, the pool bit
for bit unchanged (through ``verify``, and directly)."""

import dataclasses

import pytest
import torch

from kda_impls import get, make_inputs, reference, rel_err, verify
from kda_impls.impls.triton_frozen import FROZEN_CONFIG_ENV, frozen_config
from kda_impls.verify import TOLERANCE, bits

pytestmark = pytest.mark.interpreter

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.fixture(autouse=True)
def two_v_tiles(monkeypatch):
    """16-row tiles (the smallest), so that the 32 rows of :func:`frozen_inputs` are two programs a head."""
    monkeypatch.setenv(FROZEN_CONFIG_ENV, "BV=16")


def frozen_inputs(T, state_dtype, seed):
    """GVA (two value heads a key head), K=16 != V=32, a padded pool, the last row padding."""
    return make_inputs(3, 1, 2, 16, 32, T=T, update_state=False, state_dtype=state_dtype, slot_pad=7, pad_rows=1,
                       seed=seed)


def run_checked(x):
    """The kernel's outputs (poisoned first) after checking the pool kept its bits and the -1 row is zeros."""
    before = bits(x.pool_span()).clone()
    out = get("triton").decode(x, torch.full(x.out_shape, float("nan"), dtype=x.v.dtype))
    assert torch.equal(bits(x.pool_span()), before), "the pool changed"
    live = x.live_rows()
    assert not live.all() and (out[~live] == 0).all(), "a -1 row must output zeros"
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_matches_the_float64_reference(T, dtype):
    x = frozen_inputs(T, DTYPES[dtype], seed=40 + T)
    verdict = verify(get("triton"), x.clone())
    assert verdict.ok, verdict
    out = run_checked(x)
    # the outputs are bf16 (the inputs' dtype): within twice its rounding, well inside verify's bound
    assert rel_err(out, reference(x)[0]) <= 2 * 2.0 ** -8


def test_state_loaded_after_the_small_inputs(monkeypatch):
    monkeypatch.setenv(FROZEN_CONFIG_ENV, "BV=16,state_first=0")
    x = frozen_inputs(4, torch.bfloat16, seed=49)
    assert rel_err(run_checked(x), reference(x)[0]) <= 2 * 2.0 ** -8


@pytest.mark.parametrize("dtype", DTYPES)
def test_strong_decays_stay_finite_and_exact(dtype):
    """Gates of about -1e3 a token on some channels (exp(-G) overflows fp32 after one token) beside weak
    ones: the kernel's exponents are differences G_t - G_j <= 0, so nothing overflows."""
    x = frozen_inputs(4, DTYPES[dtype], seed=50)
    a = x.a.clone()
    a[..., ::2] = 40.0  # softplus(40) = 40, times exp(A_log) = 25: -1000 a token on the even channels
    x = dataclasses.replace(x, a=a, A_log=torch.full_like(x.A_log, 25.0).log())
    out = run_checked(x)
    want = reference(x)[0]
    assert torch.isfinite(out).all()
    assert rel_err(out, want) <= 2 * 2.0 ** -8
    assert verify(get("triton"), x).ok


def test_config_from_the_environment(monkeypatch):
    monkeypatch.delenv(FROZEN_CONFIG_ENV)
    assert frozen_config(128) == dict(BV=64, num_warps=4, split=1, tf32x3=1, state_first=1)
    assert frozen_config(16)["BV"] == 16
    monkeypatch.setenv(FROZEN_CONFIG_ENV, "BV=128, num_warps=8,split=0,tf32x3=0,state_first=0")
    assert frozen_config(128) == dict(BV=128, num_warps=8, split=0, tf32x3=0, state_first=0)
    for bad in ("BV=8", "BV=48", "BV=256", "num_warps=3", "split=2", "state_first=2", "stages=2", "BV=x"):
        monkeypatch.setenv(FROZEN_CONFIG_ENV, bad)
        with pytest.raises(ValueError, match=FROZEN_CONFIG_ENV):
            frozen_config(128)


def test_split_products_keep_a_bf16_state_at_the_in_place_error():
    """``split=0`` (one bf16 product, FlashInfer's rounding) is within verify's bound but about twice the
    error of ``split=1``; the default must be the tighter one."""
    x = make_inputs(2, 1, 1, 128, 16, T=4, update_state=False, seed=51)
    want = reference(x)[0]
    errs = {}
    for split in (0, 1):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(FROZEN_CONFIG_ENV, f"BV=16,split={split}")
            errs[split] = rel_err(get("triton").decode(x.clone()), want)
    assert errs[1] < 0.75 * errs[0] and errs[0] <= TOLERANCE[torch.bfloat16], errs


# ---- on the GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_serving_shape_on_gpu(dtype, monkeypatch):
    """HV=32, K=V=128, T=4, B=64 (GVA from H=16, a padded pool, 8 padding rows): verify, and the
    in-place T-token step's outputs token by token."""
    x = make_inputs(64, 16, 32, 128, 128, T=4, checkpoints="last", state_dtype=DTYPES[dtype], slot_pad=64,
                    pad_rows=8, device="cuda", seed=52)
    monkeypatch.delenv(FROZEN_CONFIG_ENV)  # the default tile
    verdict = verify(get("triton"), x.as_frozen().clone())
    assert verdict.ok, verdict
    want = get("triton").decode(x.clone())
    assert rel_err(get("triton").decode(x.as_frozen().clone()), want) <= 2 * 2.0 ** -8
