"""DecodeInputs' byte model, pinned to numbers worked out by hand (not by calling the code under test):
every bandwidth and roofline figure of the sweeps divides by it."""

import pytest
import torch

from kda_impls import make_inputs


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
