"""The one table of dtype names: torch's full names (what results store), the short ones (what
tables, charts and the command line show), and the conversion from either."""

from __future__ import annotations

SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
FULL = {short: full for full, short in SHORT.items()}


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (torch's own name, without importing torch)."""
    return str(dtype).removeprefix("torch.")


def short(name: str) -> str:
    """``"bfloat16"`` -> ``"bf16"``; a name without a short form is returned as it is."""
    return SHORT.get(name, name)


def full(name: str) -> str:
    """``"bf16"`` or ``"bfloat16"`` -> ``"bfloat16"``; a ValueError names the accepted ones."""
    name = name.strip()
    if name in SHORT:
        return name
    if name in FULL:
        return FULL[name]
    raise ValueError(f"unknown dtype {name!r}; one of {', '.join(f'{s} ({f})' for f, s in SHORT.items())}")
