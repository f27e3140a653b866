"""Every implementation, by name. Adding one is one line here and one file in ``impls/``.

Modules are imported on first use, so a missing optional library only affects its own entry.
Implementations kept outside this repository join through the environment, without an edit here:
``KDA_EXTRA_IMPLS="name=module:Class,other=module:Class"`` (each module importable where the name
is used: a sweep's worker processes inherit the environment). Every entry point (the survey, the
sweeps, the correctness grid, the asv suite) reads the registry, so every one sees them. A name is
one implementation everywhere: an extra entry under a built-in name is refused, never run in its
place (rows and charts labelled ``triton`` are always ours).
"""

from __future__ import annotations

import importlib
import os
from functools import cache

from .contract import Implementation

EXTRA_IMPLS_ENV = "KDA_EXTRA_IMPLS"

BUILTIN = {
    "naive": "kda_impls.impls.naive:NaiveTorch",
    "fla": "kda_impls.impls.fla_kda:FlaKDA",
    "fla-sigmoid": "kda_impls.impls.fla_kda:FlaSigmoid",
    "fla-loggate": "kda_impls.impls.fla_kda:FlaLogGate",
    "fla-loggate-sigmoid": "kda_impls.impls.fla_kda:FlaLogGateSigmoid",
    "fla-batched": "kda_impls.impls.fla_kda:FlaBatched",
    "flashinfer": "kda_impls.impls.flashinfer_kda:FlashInferKDA",
    "flashinfer-sigmoid": "kda_impls.impls.flashinfer_variants:FlashInferSigmoid",
    "flashinfer-loggate": "kda_impls.impls.flashinfer_variants:FlashInferLogGate",
    "flashinfer-loggate-sigmoid": "kda_impls.impls.flashinfer_variants:FlashInferLogGateSigmoid",
    "flashinfer-gather": "kda_impls.impls.flashinfer_variants:FlashInferGather",
    "flashinfer-dense": "kda_impls.impls.flashinfer_variants:FlashInferDense",
    "flashinfer-recoverssm": "kda_impls.impls.flashinfer_variants:FlashInferRecoverSSM",
    "triton": "kda_impls.impls.triton.kernel:TritonKDA",
    "sglang-cutedsl": "kda_impls.impls.sglang_kda:SGLangCuteDSL",
    "sglang-triton": "kda_impls.impls.sglang_kda:SGLangTriton",
    "sglang-replayssm": "kda_impls.impls.sglang_replay:SGLangReplaySSM",
}


def interpret_triton_on(device) -> None:
    """Triton kernels (ours, fla's) run on CPU tensors only interpreted, and Triton fixes that when a
    kernel's module is imported: a run on the CPU sets TRITON_INTERPRET=1 before any is, so that
    every entry point (the survey, the sweeps, the asv suite, the tests) runs the same set on a CPU."""
    if str(device).startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def extra_impls() -> dict[str, str]:
    """The entries of $KDA_EXTRA_IMPLS; a malformed one, or one under a built-in name, is a ValueError
    naming it."""
    extra = {}
    for entry in filter(None, (part.strip() for part in os.environ.get(EXTRA_IMPLS_ENV, "").split(","))):
        name, sep, target = (s.strip() for s in entry.partition("="))
        module, colon, cls = target.partition(":")
        if not (sep and name and module and colon and cls):
            raise ValueError(f"{EXTRA_IMPLS_ENV}: {entry!r} is not name=module:Class")
        if name in BUILTIN:
            raise ValueError(f"{EXTRA_IMPLS_ENV}: {entry!r} takes the built-in implementation's name {name!r}; "
                             f"give yours a name of its own (e.g. my-{name}={target})")
        extra[name] = target
    return extra


def implementations() -> dict[str, str]:
    """Name -> ``module:Class``: the built-in ones, then those of $KDA_EXTRA_IMPLS (read now)."""
    return BUILTIN | extra_impls()


def names() -> list[str]:
    return list(implementations())


def get(name: str) -> Implementation:
    target = implementations().get(name)
    if target is None:
        raise KeyError(f"no implementation {name!r}; registered: {', '.join(implementations())}")
    return _instance(target)


@cache
def _instance(target: str) -> Implementation:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()
