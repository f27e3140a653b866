"""What an implementation declares it supports (:class:`Capabilities`), the rules that follow from
it, and the versions of the libraries it runs with."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib import metadata

import torch

from .dtypes import dtype_name
from .inputs import DecodeInputs


@dataclass(frozen=True)
class Capabilities:
    devices: tuple[str, ...] = ("cpu", "cuda")
    state_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
    k_values: tuple[int, ...] | None = None  # None: any K
    v_values: tuple[int, ...] | None = None  # None: any V
    k_equals_v: bool = False
    gva: bool = True  # HV may exceed H
    slot_stride_multiple: int = 1  # elements
    base_alignment: int = 1  # bytes, of the pool's base and of the out buffer
    min_compute_capability: tuple[int, int] | None = None
    packages: tuple[str, ...] = ()  # import names that must be installed
    # tokens per sequence in one step: 1 = one-token decode only (a T = 1 step in the per-token
    # spelling is handed over in the one-token spelling), None = any T (multi-token decode)
    max_tokens: int | None = 1
    # frozen verify (update_state=False): every token's output from the row's start state, nothing stored
    frozen: bool = False
    # replay (a ReplayCache): the state is a checkpoint plus cached per-token records (kda_impls/replay.py)
    replay: bool = False

    def describe(self) -> str:
        def dims(values):
            return "any" if values is None else "/".join(map(str, values))

        parts = [
            "devices " + "/".join(self.devices),
            "state " + "/".join(dtype_name(d) for d in self.state_dtypes),
            f"K {dims(self.k_values)}",
            f"V {dims(self.v_values)}" + (" (K == V)" if self.k_equals_v else ""),
            "GVA" if self.gva else "H == HV only",
            ("any T" if self.max_tokens is None else
             "T = 1 only" if self.max_tokens == 1 else f"T <= {self.max_tokens}"),
        ]
        if self.frozen:
            parts.append("frozen verify")
        if self.replay:
            parts.append("replay")
        if self.slot_stride_multiple > 1:
            parts.append(f"slot stride % {self.slot_stride_multiple}")
        if self.base_alignment > 1:
            parts.append(f"base % {self.base_alignment} B")
        if self.min_compute_capability:
            parts.append("sm_%d%d+" % self.min_compute_capability)
        return ", ".join(parts)


def capability_violations(caps: Capabilities, name: str, x: DecodeInputs):
    """Yield ``(rule, contract message, short reason)`` for each capability of ``caps`` (implementation
    ``name``'s) that ``x`` breaks."""
    if x.replay and not caps.replay:
        reason = f"cache= (replay: the state a checkpoint plus cached records) not supported by {name}"
        yield "replay", reason, reason
    if not x.update_state and not caps.frozen:
        reason = f"update_state=False (frozen verify: outputs only, no state stored) not supported by {name}"
        yield "update-state", reason, reason
    if x.state.dtype not in caps.state_dtypes:
        want = "/".join(dtype_name(d) for d in caps.state_dtypes)
        yield ("state-dtype", f"state dtype must be {want}; got {dtype_name(x.state.dtype)}",
               f"state dtype {dtype_name(x.state.dtype)} not supported (supports {want})")
    if caps.k_equals_v and x.K != x.V:
        yield "head-dims", f"needs K == V; got K={x.K}, V={x.V}", f"needs K == V; got K={x.K}, V={x.V}"
    for dim, values in (("K", caps.k_values), ("V", caps.v_values)):
        if values is not None and getattr(x, dim) not in values:
            got = getattr(x, dim)
            yield ("head-dims", f"{dim} must be one of {values}; got {dim}={got}",
                   f"{dim}={got} not supported (supports {values})")
    if x.HV != x.H and not caps.gva:
        yield ("gva", f"needs H == HV (no grouped value heads); got H={x.H}, HV={x.HV}",
               f"no GVA: needs H == HV; got H={x.H}, HV={x.HV}")
    if caps.max_tokens is not None and x.T > caps.max_tokens:
        reason = (f"T > 1 (multi-token decode) not supported by {name}" if caps.max_tokens == 1 else
                  f"T={x.T} tokens per step not supported by {name} (at most {caps.max_tokens})")
        yield "tokens", f"{reason}; got T={x.T}", reason


def package_version(distribution: str, module: str | None = None) -> str:
    """The installed version of ``distribution``; else, where ``module`` is given and importable
    (a source tree deployed without package metadata, as FlashInfer can be), its ``__version__``;
    else "not installed"."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    if module is None or importlib.util.find_spec(module) is None:
        return "not installed"
    return str(getattr(importlib.import_module(module), "__version__", "unknown"))
