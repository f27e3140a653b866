"""The float64 reference against a brute-force loop written straight from the semantics."""

import math

import pytest
import torch

from helpers import with_gaps
from kda_impls import make_inputs, reference


def brute_force(x):
    """Row by row, head by head, element by element where it matters: no vectorised shortcut."""
    B, H, HV, K, V = x.B, x.H, x.HV, x.K, x.V
    out = torch.zeros(B, HV, V, dtype=torch.float64)
    rows = torch.zeros(B, HV, V, K, dtype=torch.float64)
    dt_bias = x.dt_bias.double().reshape(HV, K)
    for i in range(B):
        s = int(x.slots[i])
        if s < 0:
            continue
        for hv in range(HV):
            h = hv // (HV // H)
            q, k = x.q[i, h].double(), x.k[i, h].double()
            q = q / math.sqrt(float((q * q).sum()) + 1e-6) * x.effective_scale
            k = k / math.sqrt(float((k * k).sum()) + 1e-6)
            S = x.state[s, hv].double().clone()
            for kk in range(K):
                pre = float(x.a[i, hv, kk]) + float(dt_bias[hv, kk])
                g = -math.exp(float(x.A_log[hv])) * math.log1p(math.exp(pre))
                S[:, kk] *= math.exp(g)
            beta = 1 / (1 + math.exp(-float(x.b[i, hv])))
            for vv in range(V):
                u = beta * (float(x.v[i, hv, vv]) - float(S[vv] @ k))
                S[vv] += u * k
                out[i, hv, vv] = float(S[vv] @ q)
            rows[i, hv] = S
    return out, rows


@pytest.mark.parametrize(
    "shape, kw",
    [
        (dict(B=3, H=2, HV=2, K=8, V=8), {}),
        (dict(B=4, H=1, HV=4, K=8, V=16), dict(slot_pad=5, pad_rows=1)),  # GVA, K != V, padded pool
        (dict(B=2, H=2, HV=4, K=16, V=4), dict(state_dtype=torch.float32, pad_rows=2)),  # all rows padding
        (dict(B=2, H=1, HV=2, K=8, V=8), dict(scale=0.3, flat_dt_bias=True)),  # explicit scale, [HV*K] dt_bias
        # GVA with H > 1 and live rows: the only case where hv // (HV // H), hv % H and hv // H all differ
        (dict(B=3, H=2, HV=6, K=8, V=8), dict(slot_pad=2, pad_rows=1)),
    ],
)
def test_reference_matches_brute_force(shape, kw):
    scale, flat_dt_bias = kw.pop("scale", None), kw.pop("flat_dt_bias", False)
    x = make_inputs(**shape, **kw, seed=3)
    x.scale = scale
    if flat_dt_bias:
        x.dt_bias = x.dt_bias.reshape(-1).contiguous()
    out, rows = reference(x)
    want_out, want_rows = brute_force(x)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rows, want_rows, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("T", [1, 4])
def test_reference_is_pure(T):
    x = make_inputs(4, 2, 4, 16, 16, T=T, slot_pad=3, pad_rows=1, seed=5)
    if T > 1:
        x = with_gaps(x)  # tokens whose state is not stored: still nothing written
    snapshot = {n: t.clone() for n, t in x.tensors().items()}
    pool = x.pool_span().clone()
    reference(x)
    for n, t in x.tensors().items():
        assert torch.equal(t, snapshot[n]), n
    assert torch.equal(x.pool_span(), pool)


def test_make_inputs_layout():
    x = make_inputs(6, 2, 4, 16, 32, slot_pad=16, n_slots=9, pad_rows=2, seed=1)
    assert x.state.shape == (9, 4, 32, 16)
    assert x.state.stride() == (4 * 32 * 16 + 16, 32 * 16, 16, 1)
    assert x.slots.dtype == torch.int32 and (x.slots == -1).sum() == 2
    live = x.slots[x.slots >= 0]
    assert live.unique().numel() == live.numel() == 4 and int(live.max()) < 9
    # padding holds random bits, not zeros, so writes to it are detectable
    per_slot = 4 * 32 * 16
    assert x.pool_span()[per_slot:per_slot + 16].abs().sum() > 0
    with pytest.raises(ValueError, match="n_slots"):
        make_inputs(4, 1, 1, 8, 8, n_slots=3)
