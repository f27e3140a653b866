"""Every implementation, by name. Adding one is one line here and one file beside this one.

Modules are imported on first use, so a missing optional library only affects its own entry.
"""

from __future__ import annotations

import importlib
from functools import cache

from .contract import Implementation

IMPLEMENTATIONS = {
    "naive": "kda_impls.naive:NaiveTorch",
    "fla": "kda_impls.fla_kda:FlaKDA",
    "flashinfer": "kda_impls.flashinfer_kda:FlashInferKDA",
    "triton": "kda_impls.triton_kda:TritonKDA",
}


def names() -> list[str]:
    return list(IMPLEMENTATIONS)


@cache
def get(name: str) -> Implementation:
    try:
        target = IMPLEMENTATIONS[name]
    except KeyError:
        raise KeyError(f"no implementation {name!r}; registered: {', '.join(IMPLEMENTATIONS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()
