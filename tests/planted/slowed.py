"""A registered implementation slowed by extra device work in every launch, for proving kda-ab on a GPU:
``KDA_EXTRA_IMPLS=planted=planted.slowed:Slowed`` (tests/ on PYTHONPATH) registers ``planted``, the
kernel of ``KDA_PLANTED_BASE`` (default triton) plus a copy of ``KDA_PLANTED_SLOWDOWN`` (default 0.05)
of the bytes its step moves, inside the same launch (so inside the CUDA graph the kernel time
replays). At a bandwidth-bound step that is about that share of its time, plus the extra kernel's own
launch; the output is the kernel's, unchanged. At ``KDA_PLANTED_SLOWDOWN=0`` it is the kernel alone:
the base side of a pair whose head alone is slowed. (An extra implementation takes a name of its own:
the registry never runs one in a built-in's place.)"""

import importlib
import os

import torch

from kda_impls.registry import BUILTIN

SHARE = float(os.environ.get("KDA_PLANTED_SLOWDOWN", "0.05"))
_module, _class = BUILTIN[os.environ.get("KDA_PLANTED_BASE", "triton")].split(":")
Base = getattr(importlib.import_module(_module), _class)


class Slowed(Base):
    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        if not SHARE:
            return launch
        src = torch.zeros(max(1, int(SHARE * inputs.nbytes() / 8)), device=inputs.device)  # fp32: read + write
        dst = torch.empty_like(src)

        def slowed():
            dst.copy_(src)
            return launch()

        return slowed
