"""Cached-input replay: a slot's state is its checkpoint (the pool) plus a short run of per-token records.

The records follow vLLM RecoverSSM's convention for Kimi, which FlashInfer 0.7.2.post1's frozen verify
writes (``recurrent_kda(..., disable_state_update=True, correction_cache=, kg_cache=)``;
``flashinfer/kda_kernels/kda_decode_wy_output_only.py``, ``kda_recoverssm_verify``), so that an engine's
cache is read as it is: ``ReplayCache(u=correction_cache, kg=kg_cache, length=..., H=H)``. (That file's
grouped-kernel emit path stores the normalised key instead; the RecoverSSM path, which vLLM's caches
follow, stores the raw one.) The semantics of a step are in ``kda_impls/reference.py`` (``replay_step``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

import torch

from .dtypes import dtype_name


@dataclass
class ReplayCache:
    """Per slot of the pool, up to ``L`` per-token records and how many of them are the slot's state.

    - ``u`` fp32 ``[N, HV, L, V]``: record j's beta-scaled delta ``sigmoid(b) * (v - S k^)`` (S the
      decayed state before the token), RecoverSSM's ``correction_cache``. fp32 because it is a computed
      value (a rounded delta would be an error that each read of the state repeats) and vLLM and
      FlashInfer keep it in fp32.
    - ``kg`` ``[N, HV, L, 2K]`` in the activations' dtype (bf16 in serving): ``[..., :K]`` the raw,
      unnormalised key of the token's q/k head (``hv // (HV // H)``), ``[..., K:]`` its raw gate input
      ``a``, RecoverSSM's ``kg_cache``. Copies of the step's own inputs, hence exact in that dtype: the
      normalised key and the log decay are recomputed from them (with the step's ``A_log`` and
      ``dt_bias``: a cache belongs to one layer) wherever the state is read.
    - ``length`` int32 ``[N]`` in [0, L): records ``0 .. length-1`` of a slot are part of its state, in
      token order; records at and past ``length`` are never read (a speculative verify leaves its
      not-yet-accepted records there).
    - ``H`` the q/k heads of the layer the cache was made for (checked against the step's).

    A slot's effective state after ``n = length`` records is ``S_n = S_0 * exp(G_n)[None, :] +
    sum_j u_j (k^_j * exp(G_n - G_j))^T`` with ``S_0`` the checkpoint, ``G_j`` the cumulative log
    decay along K of records ``0..j``: the in-place recurrence unrolled.
    """

    u: torch.Tensor
    kg: torch.Tensor
    length: torch.Tensor
    H: int

    @classmethod
    def empty(cls, N: int, L: int, H: int, HV: int, K: int, V: int, *, dtype: torch.dtype = torch.bfloat16,
              device: str | torch.device = "cpu") -> "ReplayCache":
        """A cache of ``L`` records per slot, every slot's ``length`` 0 (its state is its checkpoint);
        ``dtype`` is the activations' (that of ``kg``)."""
        for name, value, low in (("N", N, 0), ("L", L, 1), ("H", H, 1), ("HV", HV, 1), ("K", K, 1), ("V", V, 1)):
            if not (isinstance(value, numbers.Integral) and value >= low):
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        return cls(u=torch.zeros(N, HV, L, V, dtype=torch.float32, device=device),
                   kg=torch.zeros(N, HV, L, 2 * K, dtype=dtype, device=device),
                   length=torch.zeros(N, dtype=torch.int32, device=device), H=int(H))

    @property
    def L(self) -> int:
        """Records per slot (the ring's size)."""
        return self.u.shape[2]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The cache's tensors by the name the contract's messages use."""
        return {"cache.u": self.u, "cache.kg": self.kg, "cache.length": self.length}

    def clone(self) -> "ReplayCache":
        return ReplayCache(u=self.u.clone(), kg=self.kg.clone(), length=self.length.clone(), H=self.H)

    def record_bytes(self) -> int:
        """Bytes of one token's record in one slot (every value head)."""
        return self.u[0, :, 0].nbytes + self.kg[0, :, 0].nbytes


def violations(x, dims: dict[str, int]):
    """Yield ``(rule, message)`` for each broken rule of ``x.cache``'s layout: its shapes against the
    dimensions the step's inputs agree on (``dims``), then its dtypes, devices and strides."""
    cache = x.cache
    N, L = x.state.shape[0], cache.L if cache.u.dim() == 4 else None
    HV, K, V = dims["HV"], dims["K"], dims["V"]
    for name, layout, shape in (("u", "[N, HV, L, V]", (N, HV, L, V)), ("kg", "[N, HV, L, 2K]", (N, HV, L, 2 * K)),
                                ("length", "[N]", (N,))):
        got = tuple(getattr(cache, name).shape)
        if got != shape:
            yield "cache-shape", (f"cache.{name} shape must be {shape} ({layout} with N={N} the pool's slots, "
                                  f"HV={HV}, K={K}, V={V}, L={L} from cache.u); got {got}")
            return
    if cache.H != x.H:
        yield "cache-shape", f"cache.H must be the step's H={x.H} (the cache was made for another layer); got {cache.H}"
    for name, want in (("u", torch.float32), ("kg", x.q.dtype), ("length", torch.int32)):
        t = getattr(cache, name)
        if t.dtype != want:
            why = {"u": "the deltas are kept in fp32", "kg": "raw keys and gate inputs: copies of the step's k and a",
                   "length": "record counts"}[name]
            yield "cache-dtype", f"cache.{name} dtype must be {dtype_name(want)} ({why}); got {dtype_name(t.dtype)}"
    for name, t in cache.tensors().items():
        if t.device != x.state.device:
            yield "device", f"{name} must be on the state's device {x.state.device}; got {t.device}"
        if t.requires_grad:
            yield "requires-grad", f"{name} must not require grad (replay writes it in place); pass .detach()"
        if not t.is_contiguous():
            yield "contiguous", f"{name} must be contiguous; got strides {t.stride()} for shape {tuple(t.shape)}"
    if x.T > L:
        yield "ring", (f"a replay step's T tokens must fit in the ring (T <= L): T={x.T}, L={L} "
                       f"(its records are written after a flush at the latest)")


def sync_records(launch: Callable[[], torch.Tensor]) -> None:
    """Make the cache hold the records of ``launch``'s last launch. A launcher whose kernel keeps them in a
    layout of its own carries ``sync_records``, a zero-argument callable that copies them into the
    cache: the checks call it after each launch, before they read the cache; timers never do. Others
    write the cache itself and carry none."""
    getattr(launch, "sync_records", lambda: None)()
