"""The inputs of one KDA decode step, and a generator of realistic random ones."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch


@dataclass
class DecodeInputs:
    """One decode token per sequence; the pool ``state`` is updated in place at rows ``slots``.

    q, k ``[B, H, K]``; v ``[B, HV, V]``; a (raw gate input) ``[B, HV, K]``; b (beta logit)
    ``[B, HV]``; A_log ``[HV]`` fp32; dt_bias ``[HV, K]`` or ``[HV*K]`` fp32; state
    ``[N, HV, V, K]`` (only its slot stride may be non-compact); slots ``[B]`` int32 with
    -1 marking a padding row; scale defaults to ``K ** -0.5``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    state: torch.Tensor
    slots: torch.Tensor
    scale: float | None = None

    @property
    def B(self) -> int:
        return self.q.shape[0]

    @property
    def H(self) -> int:
        return self.q.shape[1]

    @property
    def K(self) -> int:
        return self.q.shape[2]

    @property
    def HV(self) -> int:
        return self.v.shape[1]

    @property
    def V(self) -> int:
        return self.v.shape[2]

    @property
    def N(self) -> int:
        return self.state.shape[0]

    @property
    def effective_scale(self) -> float:
        return self.K**-0.5 if self.scale is None else float(self.scale)

    @property
    def slot_elements(self) -> int:
        """Elements of one slot's state, ``HV*V*K`` (the slot stride less its padding)."""
        return self.HV * self.V * self.K

    @property
    def slot_stride(self) -> int:
        """Elements between consecutive slots of the pool."""
        return self.state.stride(0)

    @property
    def device(self) -> torch.device:
        return self.state.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "scale"}

    def pool_span(self) -> torch.Tensor:
        """The pool's whole storage range (slots and the padding between them) as a 1-D view."""
        per_slot = self.state[0].numel() if self.N else 0  # the pool's own, even where it breaks the contract
        span = (self.N - 1) * self.slot_stride + per_slot if self.N else 0
        return self.state.as_strided((span,), (1,), self.state.storage_offset())

    def clone(self) -> "DecodeInputs":
        """A deep copy whose pool keeps the same layout (slot stride, padding bytes)."""
        span = self.pool_span().clone()
        state = span.as_strided(self.state.shape, self.state.stride(), 0)
        copies = {name: t.clone() for name, t in self.tensors().items() if name != "state"}
        return DecodeInputs(**copies, state=state, scale=self.scale)

    def nbytes(self) -> int:
        """Bytes a decode step must move: live state rows read and written once, every other input
        read once, the output written once."""
        live = int((self.slots >= 0).sum())
        out = self.B * self.HV * self.V * self.v.element_size()  # the output is in v's dtype
        return 2 * live * self.slot_elements * self.state.element_size() + self.bytes_besides_pool() + out

    def bytes_besides_pool(self) -> int:
        """Bytes of every input but the pool: activations, gate parameters, slots."""
        return sum(t.nbytes for name, t in self.tensors().items() if name != "state")


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


def make_inputs(
    B: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    *,
    state_dtype: torch.dtype = torch.bfloat16,
    dtype: torch.dtype = torch.bfloat16,
    slot_pad: int = 0,
    n_slots: int | None = None,
    pad_rows: int = 0,
    sorted_slots: bool = False,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> DecodeInputs:
    """Random inputs distributed as in a trained Kimi-Linear layer.

    The pool is a strided view of one flat buffer with slot stride ``HV*V*K + slot_pad``; the
    padding holds random bits too, so a kernel that writes it is caught bit-for-bit. ``slots`` is
    a random choice of ``B`` distinct slots out of ``n_slots`` (default ``2*B``, so untouched
    slots exist), in random order unless ``sorted_slots`` (as a fresh serving pool hands them out),
    with ``pad_rows`` random rows set to -1. ``dtype`` is that of q, k, v, a, b.
    """
    if not 0 <= pad_rows <= B:
        raise ValueError(f"pad_rows must be in [0, B={B}]; got {pad_rows}")
    n_slots = max(2 * B, 1) if n_slots is None else n_slots
    if n_slots < B:
        raise ValueError(f"n_slots={n_slots} must be >= B={B} (every row needs its own slot)")
    dev = torch.device(device)
    # drawn on the target device: a pool of gigabytes would take seconds on the CPU
    gen = torch.Generator(device=dev).manual_seed(seed)

    def rand(*shape, dt=torch.float32, normal=True):
        t = torch.empty(*shape, dtype=torch.float32, device=dev)
        if normal:
            t.normal_(generator=gen)
        else:
            t.uniform_(generator=gen)
        return t.to(dt)

    q, k = rand(B, H, K, dt=dtype), rand(B, H, K, dt=dtype)
    v = rand(B, HV, V, dt=dtype)
    a = rand(B, HV, K, dt=dtype)
    b = rand(B, HV, dt=dtype)
    # Mamba/KDA initialisation: A uniform in [1, 16], dt log-uniform in [1e-3, 1e-1]
    A_log = torch.log(1.0 + 15.0 * rand(HV, normal=False))
    dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * rand(HV, K, normal=False))
    dt_bias = _inverse_softplus(dt)

    per_slot = HV * V * K
    stride = per_slot + slot_pad
    flat = (rand(max(n_slots * stride, 1)) * 0.5).to(state_dtype)
    state = flat.as_strided((n_slots, HV, V, K), (stride, V * K, K, 1))

    slots = torch.randperm(n_slots, generator=gen, device=dev)[:B].to(torch.int32)
    if sorted_slots:
        slots = slots.sort().values
    slots[torch.randperm(B, generator=gen, device=dev)[:pad_rows]] = -1
    return DecodeInputs(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, slots=slots)
