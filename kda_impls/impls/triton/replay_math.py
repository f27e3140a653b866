"""What our replay kernels share: the gate and key math of a record, the committed records as register
tiles, the state the records carry (a flush), and the bound on the pre-decayed keys' exponent.

A record j's pre-decayed key is ``kt_j = k^_j * exp(-G_j)``, ``G_j`` the cumulative log decay along K
from the checkpoint through record j (``kda_impls/impls/triton/replay_token.py``). It is finite in fp32
while ``-G_j`` stays under :data:`DECAY_BOUND`; past it a kernel stores the key with its exponent
clamped there, a value no step reads (``G`` only falls along the ring, so every later step of the ring
is past the bound too and computes its terms from the raw records).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...reference import SOFTPLUS_LINEAR_ABOVE

# exp(80) = 5.5e34 and exp(-80) = 1.8e-35, both normal fp32 numbers, with 2^8 of headroom under the largest
DECAY_BOUND = 80.0
_DECAY_BOUND = tl.constexpr(DECAY_BOUND)  # a global a kernel reads must be a constexpr
_LINEAR_ABOVE = tl.constexpr(SOFTPLUS_LINEAR_ABOVE)


@triton.jit
def _log_decay(a, dt_bias, A):
    x = a + dt_bias
    return -A * tl.where(x > _LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(x)))


@triton.jit
def _normalised(x, L2_EPS: tl.constexpr):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + L2_EPS)


@triton.jit
def _pre_decayed(k, G):
    """``k^ * exp(-G)``, the exponent clamped at the bound (a key past it is never read)."""
    return k * tl.exp(tl.minimum(-G, _DECAY_BOUND))


@triton.jit
def _committed_keys(kg_ptr, records, n, dt_bias, A, offs_l, offs_k, K: tl.constexpr, L2_EPS: tl.constexpr):
    """The first ``n`` key/gate records of a slot's head as register tiles: ``(k^ [LP, K], G_j [LP, K],
    G_n [K])``, rows at and past ``n`` zero (never loaded)."""
    kept = offs_l[:, None] < n
    kg_rows = kg_ptr + (records + offs_l)[:, None] * (2 * K) + offs_k[None, :]
    in_k = kept & (offs_k[None, :] < K)
    g = tl.where(in_k, _log_decay(tl.load(kg_rows + K, mask=in_k, other=0.0).to(tl.float32), dt_bias[None, :], A), 0.0)
    k = tl.load(kg_rows, mask=in_k, other=0.0).to(tl.float32)
    k_hat = k / tl.sqrt(tl.sum(k * k, axis=1) + L2_EPS)[:, None]
    return k_hat, tl.cumsum(g, axis=0), tl.sum(g, axis=0)


@triton.jit
def _committed_deltas(u_ptr, records, n, offs_l, offs_v, V: tl.constexpr):
    """The first ``n`` delta records of a slot's head, this program's value rows: ``[LP, BV]``, rows at
    and past ``n`` zero (never loaded)."""
    in_v = (offs_l[:, None] < n) & (offs_v[None, :] < V)
    return tl.load(u_ptr + (records + offs_l)[:, None] * V + offs_v[None, :], mask=in_v, other=0.0)


@triton.jit
def _carried(S0, G, u_ptr, kg_ptr, records, count, dt_bias, A, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr,
             L2_EPS: tl.constexpr):
    """``S_0 exp(G) + sum_{j<count} u_j (k^_j exp(G - G_j))^T`` over the first ``count`` records in memory:
    the state they carry, decayed through ``G``, formed only for a flush first (one record a loop step)."""
    E = S0 * tl.exp(G)[None, :]
    G_j = tl.zeros([K], dtype=tl.float32)
    for j in range(0, count):
        kg_row = kg_ptr + (records + j) * 2 * K
        G_j += _log_decay(tl.load(kg_row + K + offs_k).to(tl.float32), dt_bias, A)
        w_j = _normalised(tl.load(kg_row + offs_k).to(tl.float32), L2_EPS) * tl.exp(G - G_j)
        E += tl.load(u_ptr + (records + j) * V + offs_v)[:, None] * w_j[None, :]
    return E
