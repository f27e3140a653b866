"""The contract's rules on :func:`kda_impls.make_inputs`'s arguments that need no tensor: dtypes (given
as torch dtypes or names), a device that exists here, head counts. Each broken one is a
:class:`ContractError` (the contract's error, defined here so that the inputs' module needs nothing of
the contract's) before anything is drawn."""

from __future__ import annotations

import torch

from . import dtypes


def shape_violation(B: int, H: int, HV: int, pad_rows: int = 0) -> tuple[str, str] | None:
    """The first of the contract's rules on sizes that no tensor is needed to check, broken:
    ``(rule, message)``; None where all hold."""
    if H == 0 or HV % H:
        return "gva", f"HV must be a multiple of H; got HV={HV}, H={H} (value head hv reads q/k head hv // (HV // H))"
    if not 0 <= pad_rows <= B:
        return "pad-rows", f"pad_rows must be in [0, B={B}]; got {pad_rows}"
    return None


class ContractError(ValueError):
    """Inputs that break an implementation's contract. Raised before any kernel runs."""

    def __init__(self, impl: str, rule: str, message: str):
        super().__init__(f"{impl} {message}")
        self.impl = impl
        self.rule = rule


def refuse(rule: str, message: str):
    raise ContractError("make_inputs:", rule, message)


def torch_dtype(name: str, value) -> torch.dtype:
    """``value`` (a torch dtype, or a name such as ``"bf16"`` or ``"bfloat16"``) as a torch dtype."""
    if isinstance(value, torch.dtype):
        return value
    try:
        return getattr(torch, dtypes.full(str(value)))
    except ValueError as exc:
        refuse("dtype", f"{name} must be a torch dtype or its name; {exc}")


def valid_device(value) -> torch.device:
    """``value`` as a device that exists here."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        refuse("device", f"device must be cpu, cuda or cuda:N; got {value!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            here = f"cuda:0..cuda:{count - 1} or cpu" if count else "cpu: no CUDA GPU is visible here"
            refuse("device", f"device must be one that exists here ({here}); got {value!r}")
    return device
