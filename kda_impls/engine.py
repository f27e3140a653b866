"""Decode tensors as a serving engine holds them, taken as they are.

SGLang and vLLM keep a step's tensors packed over the tokens of the batch: q, k ``[1, B*T, H, K]``,
v ``[1, B*T, HV, V]``, the raw gate ``a`` ``[B*T, HV*K]``, beta ``[1, B*T, HV]``, ``A_log``
``[1, 1, HV, 1]``, ``dt_bias`` ``[HV*K]``, and the state slots ``[B]`` (or ``[B, T]`` in a
speculative verify). :func:`from_engine` reads them as views in this package's spelling (no copy,
so an implementation still updates the engine's own pool), and the contract checks the result like
any other input.
"""

from __future__ import annotations

import torch

from .contract import ContractError
from .inputs import DecodeInputs

LABEL = "engine tensors"


def _view(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if t.numel() != torch.Size(shape).numel():
        raise ContractError(LABEL, "shape", f"{name} of shape {tuple(t.shape)} holds {t.numel()} elements; "
                                            f"{shape} was expected from the slots and q, v")
    try:
        return t.view(shape)
    except RuntimeError:
        raise ContractError(LABEL, "contiguous", f"{name} of shape {tuple(t.shape)} and strides {t.stride()} cannot "
                                                 f"be viewed as {shape} without a copy; pass it contiguous") from None


def from_engine(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                scale: float | None = None, num_accepted: torch.Tensor | None = None) -> DecodeInputs:
    """One decode step from an engine's packed tensors (any leading size-1 axes, tokens flattened
    over the batch), as views. ``slots`` ``[B]`` is a one-token step; ``[B, T]`` a step of T tokens
    per row (``num_accepted`` ``[B]``, as the engines pass it). Head counts and dims come from the
    last two axes of q (H, K) and v (HV, V); every other tensor must hold exactly the elements
    those imply, and be viewable without a copy."""
    rows = tuple(slots.shape)  # (B,) or (B, T)
    H, K = q.shape[-2:]
    HV, V = v.shape[-2:]
    return DecodeInputs(
        q=_view("q", q, (*rows, H, K)), k=_view("k", k, (*rows, H, K)), v=_view("v", v, (*rows, HV, V)),
        a=_view("a", a, (*rows, HV, K)), b=_view("b", b, (*rows, HV)), A_log=_view("A_log", A_log, (HV,)),
        dt_bias=_view("dt_bias", dt_bias, (HV, K)), state=state, slots=slots, scale=scale, num_accepted=num_accepted)
