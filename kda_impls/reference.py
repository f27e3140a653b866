"""The float64 reference of one KDA decode step: the semantics every implementation must match."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import DecodeInputs

L2_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def decode_step(inputs: DecodeInputs, S: torch.Tensor, compute_dtype: torch.dtype):
    """The math of one step on gathered state rows ``S`` ``[B, HV, V, K]`` (any slot order).

    Returns ``(out [B, HV, V], new S)`` in ``compute_dtype``; rows are not masked here.
    """
    HV, H = inputs.HV, inputs.H
    group = HV // H
    q = l2_normalize(inputs.q.to(compute_dtype)).repeat_interleave(group, dim=1) * inputs.effective_scale
    k = l2_normalize(inputs.k.to(compute_dtype)).repeat_interleave(group, dim=1)
    dt_bias = inputs.dt_bias.to(compute_dtype).reshape(HV, inputs.K)
    A = torch.exp(inputs.A_log.to(compute_dtype))[None, :, None]
    g = -A * F.softplus(inputs.a.to(compute_dtype) + dt_bias[None])  # [B, HV, K]
    beta = torch.sigmoid(inputs.b.to(compute_dtype))[..., None]  # [B, HV, 1]

    S = S.to(compute_dtype) * torch.exp(g)[:, :, None, :]  # decay along K
    u = beta * (inputs.v.to(compute_dtype) - torch.einsum("bhvk,bhk->bhv", S, k))
    S = S + u[..., None] * k[:, :, None, :]
    out = torch.einsum("bhvk,bhk->bhv", S, q)
    return out, S


def reference(inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, new_state_rows)`` in float64 on the inputs' device; pure (the inputs are not modified).

    ``out`` is ``[B, HV, V]`` with zeros on rows whose slot is -1. ``new_state_rows[i]`` is the
    state that slot ``slots[i]`` must hold after the step (``[B, HV, V, K]``, zeros on -1 rows).
    Float64 on a GPU is IEEE double as on the CPU; computing there keeps large grids fast.
    """
    live = inputs.slots >= 0
    S = inputs.state[inputs.slots.long().clamp(min=0)]
    out, S = decode_step(inputs, S, torch.float64)
    out[~live] = 0
    S[~live] = 0
    return out, S
