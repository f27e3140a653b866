"""The contract every implementation enforces before anything is launched, and the base class.

An implementation declares what it supports in :class:`Capabilities`; the shared rules and those
declared extras are checked by :meth:`Implementation.check` on any machine (no library, no GPU).
:meth:`Implementation.unsupported` says why valid inputs cannot run *here* (package, device,
architecture, dtype, shape). :meth:`Implementation.bind` does both, allocates everything and
returns the zero-argument launcher that benchmarks time.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from importlib import metadata
from dataclasses import dataclass
from typing import Callable

import torch

from .dtypes import dtype_name
from .inputs import DecodeInputs

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class ContractError(ValueError):
    """Inputs that break an implementation's contract. Raised before any kernel runs."""

    def __init__(self, impl: str, rule: str, message: str):
        super().__init__(f"{impl} {message}")
        self.impl = impl
        self.rule = rule


class Unsupported(RuntimeError):
    """Valid inputs that this implementation cannot run on this machine (package, device, arch)."""


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

    def describe(self) -> str:
        def dims(values):
            return "any" if values is None else "/".join(map(str, values))

        parts = [
            "devices " + "/".join(self.devices),
            "state " + "/".join(dtype_name(d) for d in self.state_dtypes),
            f"K {dims(self.k_values)}",
            f"V {dims(self.v_values)}" + (" (K == V)" if self.k_equals_v else ""),
            "GVA" if self.gva else "H == HV only",
        ]
        if self.slot_stride_multiple > 1:
            parts.append(f"slot stride % {self.slot_stride_multiple}")
        if self.base_alignment > 1:
            parts.append(f"base % {self.base_alignment} B")
        if self.min_compute_capability:
            parts.append("sm_%d%d+" % self.min_compute_capability)
        return ", ".join(parts)


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


class Implementation:
    """Base class: subclasses set ``name``, ``capabilities`` and implement :meth:`_launcher`.

    Optional overrides: ``label`` (the prefix of error messages, default ``name``),
    :meth:`_extra_unsupported` (reasons beyond the declared capabilities) and :meth:`versions`.
    """

    name: str
    capabilities: Capabilities = Capabilities()

    @property
    def label(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<kda implementation {self.name!r}: {self.capabilities.describe()}>"

    # ---- the contract ---------------------------------------------------------------------
    def _fail(self, rule: str, message: str):
        raise ContractError(self.label, rule, message)

    def check(self, inputs: DecodeInputs) -> None:
        """Raise :class:`ContractError` on the first broken rule; modifies nothing.

        Reads slot values, which costs a device sync on a GPU: call it outside timed code.
        """
        self._check_shapes(inputs)
        self._check_dtypes_devices(inputs)
        self._check_pool_layout(inputs)
        self._check_capabilities(inputs)
        self._check_slots(inputs)
        scale = inputs.effective_scale
        if not (math.isfinite(scale) and scale > 0):
            self._fail("scale", f"scale must be finite and > 0; got {scale} (pass scale=None for K**-0.5)")

    def _check_shapes(self, x: DecodeInputs) -> None:
        for name in ("q", "k", "v", "a", "b", "state"):
            want = {"q": 3, "k": 3, "v": 3, "a": 3, "b": 2, "state": 4}[name]
            t = getattr(x, name)
            if t.dim() != want:
                shape = {"q": "[B, H, K]", "k": "[B, H, K]", "v": "[B, HV, V]", "a": "[B, HV, K]",
                         "b": "[B, HV]", "state": "[N, HV, V, K]"}[name]
                self._fail("rank", f"{name} must be {want}-D {shape}; got shape {tuple(t.shape)}")
        B, H, K = x.q.shape
        HV, V = x.v.shape[1:]
        expected = {
            "k": (B, H, K),
            "v": (B, HV, V),
            "a": (B, HV, K),
            "b": (B, HV),
            "A_log": (HV,),
            "state": (x.state.shape[0], HV, V, K),
            "slots": (B,),
        }
        for name, shape in expected.items():
            got = tuple(getattr(x, name).shape)
            if got != shape:
                self._fail("shape", f"{name} shape must be {shape} (from q [B, H, K]={tuple(x.q.shape)}, "
                                    f"v [B, HV, V]={tuple(x.v.shape)}); got {got}")
        if tuple(x.dt_bias.shape) not in ((HV, K), (HV * K,)):
            self._fail("shape", f"dt_bias shape must be [HV, K]=({HV}, {K}) or [HV*K]=({HV * K},); "
                                f"got {tuple(x.dt_bias.shape)}")
        if H == 0 or HV % H:
            self._fail("gva", f"HV must be a multiple of H; got HV={HV}, H={H} "
                              f"(value head hv reads q/k head hv // (HV // H))")

    def _check_dtypes_devices(self, x: DecodeInputs) -> None:
        for name in ("q", "k", "v", "a", "b"):
            t = getattr(x, name)
            if t.dtype not in ACTIVATION_DTYPES:
                self._fail("dtype", f"{name} dtype must be one of bf16/fp16/fp32; got {dtype_name(t.dtype)}")
            if t.dtype != x.q.dtype:
                self._fail("dtype", f"{name} dtype must match q's {dtype_name(x.q.dtype)}; got {dtype_name(t.dtype)}")
        for name in ("A_log", "dt_bias"):
            t = getattr(x, name)
            if t.dtype != torch.float32:
                self._fail("dtype", f"{name} dtype must be float32; got {dtype_name(t.dtype)} (keep gate "
                                    f"parameters in fp32: .float())")
        if x.slots.dtype != torch.int32:
            self._fail("slots", f"slots dtype must be int32; got {dtype_name(x.slots.dtype)} (.to(torch.int32))")
        for name, t in x.tensors().items():
            if t.device != x.state.device:
                self._fail("device", f"{name} must be on the state's device {x.state.device}; got {t.device}")
            # The pool is updated in place and no implementation records a graph: autograd would
            # refuse the in-place write (naive) or miss it silently (the Triton kernels).
            if t.requires_grad:
                self._fail("requires-grad", f"{name} must not require grad (decode updates the pool in place "
                                            f"and records no graph); pass {name}.detach() or run under "
                                            f"torch.no_grad()")
        for name in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "slots"):
            t = getattr(x, name)
            if not t.is_contiguous():
                self._fail("contiguous", f"{name} must be contiguous; got strides {t.stride()} for shape "
                                         f"{tuple(t.shape)} (.contiguous())")

    def _check_pool_layout(self, x: DecodeInputs) -> None:
        HV, V, K = x.HV, x.V, x.K
        compact = (V * K, K, 1)
        got = tuple(x.state.stride()[1:])
        if got != compact:
            self._fail("state-inner-strides",
                       f"state inner strides must be compact (V*K, K, 1)={compact}; got {got} "
                       f"(only the slot stride may be non-compact)")
        per_slot = HV * V * K
        if x.N > 1 and x.slot_stride < per_slot:
            self._fail("slot-overlap",
                       f"state slot stride must be >= HV*V*K={per_slot} elements or slots overlap; "
                       f"got {x.slot_stride}")
        caps = self.capabilities
        byte_offset = x.state.data_ptr() % max(caps.base_alignment, 1)
        if x.slot_stride % caps.slot_stride_multiple or byte_offset:
            self._fail("pool-alignment",
                       f"state slot stride {x.slot_stride} elements must be a multiple of "
                       f"{caps.slot_stride_multiple} and the base byte offset {byte_offset} a multiple of "
                       f"{caps.base_alignment} (pad each slot to a multiple of {caps.slot_stride_multiple} "
                       f"elements and allocate the pool {caps.base_alignment}-byte aligned)")

    def _capability_violations(self, x: DecodeInputs):
        """Yield ``(rule, contract message, short reason)`` for each declared capability broken."""
        caps = self.capabilities
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

    def _check_capabilities(self, x: DecodeInputs) -> None:
        for rule, message, _ in self._capability_violations(x):
            self._fail(rule, message)

    def _check_slots(self, x: DecodeInputs) -> None:
        # slots are known to be 1-D contiguous int32 of length B on the state's device here
        if x.B == 0:
            return
        lo, hi = int(x.slots.min()), int(x.slots.max())  # one device sync
        if lo < -1 or hi >= x.N:
            self._fail("slot-range", f"slots values must be in [-1, N={x.N}); got min {lo}, max {hi}")
        live = x.slots[x.slots >= 0]
        if live.unique().numel() != live.numel():
            dup = live.unique(return_counts=True)
            repeated = dup[0][dup[1] > 1][:4].tolist()
            self._fail("slot-duplicate",
                       f"slots must name each non-negative slot at most once (two rows writing one slot "
                       f"race); got repeated slots {repeated}")

    # ---- where it can run -------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        """Versions of the libraries this implementation runs with (for results metadata)."""
        return {"torch": torch.__version__}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        return None

    def unsupported(self, inputs: DecodeInputs) -> str | None:
        """Why these inputs cannot run here, or None. Needs no kernel launch and no sync."""
        caps = self.capabilities
        missing = [p for p in caps.packages if importlib.util.find_spec(p) is None]
        if missing:
            return f"package not installed: {', '.join(missing)} (pip install -e .[{self.name}])"
        device = inputs.state.device
        if device.type not in caps.devices:
            if "cuda" in caps.devices and not torch.cuda.is_available():
                return "needs a CUDA GPU; none is available"
            return f"runs on {'/'.join(caps.devices)}; inputs are on {device.type}"
        if device.type == "cuda" and caps.min_compute_capability:
            cc = torch.cuda.get_device_capability(device)
            if cc < caps.min_compute_capability:
                return "needs compute capability >= %d.%d; this GPU is %d.%d" % (*caps.min_compute_capability, *cc)
        for _, _, reason in self._capability_violations(inputs):
            return reason
        return self._extra_unsupported(inputs)

    # ---- running ------------------------------------------------------------------------------
    def bind(self, inputs: DecodeInputs, out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Check, confirm it can run, allocate; return a launcher that only launches.

        The launcher writes the output into ``out`` (allocated here if None) and the new state into
        the pool, and returns ``out``. Slot values are validated here, once: the launcher assumes
        they do not change afterwards.
        """
        self.check(inputs)
        reason = self.unsupported(inputs)
        if reason:
            raise Unsupported(f"{self.label}: {reason}")
        shape = (inputs.B, inputs.HV, inputs.V)
        if out is None:
            out = torch.empty(shape, dtype=inputs.v.dtype, device=inputs.device)
        elif tuple(out.shape) != shape or out.dtype != inputs.v.dtype or out.device != inputs.device \
                or not out.is_contiguous():
            self._fail("out", f"out must be a contiguous {shape} {dtype_name(inputs.v.dtype)} tensor on "
                              f"{inputs.device}; got {tuple(out.shape)} {dtype_name(out.dtype)} on {out.device}")
        elif out.data_ptr() % self.capabilities.base_alignment:
            self._fail("out", f"out must start {self.capabilities.base_alignment}-byte aligned; its byte offset "
                              f"is {out.data_ptr() % self.capabilities.base_alignment}")
        return self._launcher(inputs, out)

    def decode(self, inputs: DecodeInputs, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.bind(inputs, out)()

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor) -> Callable[[], torch.Tensor]:
        raise NotImplementedError
