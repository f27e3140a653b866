"""The contract every implementation enforces before anything is launched, and the base class.

An implementation declares what it supports in :class:`Capabilities`; the shared rules and those
declared extras are checked by :meth:`Implementation.check` on any machine (no library, no GPU).
:meth:`Implementation.unsupported` says why valid inputs cannot run *here* (package, device,
architecture, dtype, shape). :meth:`Implementation.bind` does both, allocates everything and
returns the zero-argument launcher that benchmarks time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

import torch

from . import replay
from .dtypes import dtype_name
from .inputs import DecodeInputs

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# The per-row tensors in both spellings, by the dimension each axis carries.
_ONE_TOKEN_LAYOUTS = {"q": ("B", "H", "K"), "k": ("B", "H", "K"), "v": ("B", "HV", "V"), "a": ("B", "HV", "K"),
                      "b": ("B", "HV"), "slots": ("B",)}
_PER_TOKEN_LAYOUTS = {name: layout[:1] + ("T",) + layout[1:] for name, layout in _ONE_TOKEN_LAYOUTS.items()}
_ONE_TOKEN_RANKS = {name: len(layout) for name, layout in _ONE_TOKEN_LAYOUTS.items()}


def _spell(layout: tuple[str, ...]) -> str:
    return "[" + ", ".join(layout) + "]"


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
    :meth:`_extra_unsupported` (reasons beyond the declared capabilities), :meth:`versions` and
    :meth:`preload`.

    One library's kernel is often registered several times, once per legal way of calling it for
    our semantics (a variant), because the calling convention alone moves its time (docs/findings.md).
    ``library`` groups them (what "best per library" picks among; default ``name``), ``variant``
    says in one line how this one calls the kernel and what it costs in accuracy, and
    ``engine_call`` names the serving engines that call the library this way (empty if
    none): the configuration a reader deploying that engine gets.
    """

    name: str
    capabilities: Capabilities = Capabilities()
    variant: str = ""
    engine_call: str = ""

    @property
    def label(self) -> str:
        return self.name

    @property
    def library(self) -> str:
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

    def _check_mode(self, x: DecodeInputs) -> None:
        if not isinstance(x.update_state, bool):
            self._fail("update-state", f"update_state must be a bool (True: the pool is updated in place; False: "
                                       f"frozen verify); got {x.update_state!r}")
        if x.cache is not None and not isinstance(x.cache, replay.ReplayCache):
            self._fail("cache", f"cache must be a kda_impls.ReplayCache (replay) or None; got {type(x.cache).__name__}")
        if x.replay and not x.update_state:
            self._fail("update-state", "update_state must be True with a cache (a replay step writes its records); "
                                       "got False")
        if not x.update_state and x.num_accepted is not None:
            self._fail("num-accepted", "num_accepted must be None when update_state=False (frozen verify starts row i "
                                       f"from slots[i] and stores nothing); got a tensor of shape "
                                       f"{tuple(x.num_accepted.shape)}")

    def _check_shapes(self, x: DecodeInputs) -> None:
        self._check_mode(x)
        # The spelling (one token per row, or a token axis) is the one most of q, k, v, a, b and
        # slots use, and each dimension the value most of the tensors that carry it agree on: a
        # tensor that disagrees is then blamed itself, never a consistent one derived from it.
        # Frozen verify's and replay's slots are [B] in both spellings, so they cast no vote.
        voters = {n: r for n, r in _ONE_TOKEN_RANKS.items() if not x.one_slot_per_row or n != "slots"}
        per_token = sum(getattr(x, n).dim() == r + 1 for n, r in voters.items()) > \
            sum(getattr(x, n).dim() == r for n, r in voters.items())
        layouts = _PER_TOKEN_LAYOUTS if per_token else _ONE_TOKEN_LAYOUTS
        if x.one_slot_per_row:
            layouts = {**layouts, "slots": ("B",)}
        expected = {**layouts, "A_log": ("HV",), "state": ("N", "HV", "V", "K")}
        if x.num_accepted is not None:
            expected["num_accepted"] = ("B",)
        for name in (*layouts, "state"):
            t, layout = getattr(x, name), expected[name]
            if t.dim() != len(layout):
                mode = "replay: row i's state is slot slots[i]'s" if x.replay else \
                    "update_state=False: row i reads slot slots[i], nothing is stored"
                frozen = f" ({mode})" if name == "slots" and x.one_slot_per_row else ""
                self._fail("rank", f"{name} must be {len(layout)}-D {_spell(layout)}{frozen}; got shape "
                                   f"{tuple(t.shape)}")
        # Every tensor of the right rank votes; dt_bias as [HV, K] (its flat [HV*K] is checked below).
        votes: dict[str, list[int]] = {}
        for name, layout in {**expected, "dt_bias": ("HV", "K")}.items():
            t = getattr(x, name)
            if t.dim() == len(layout):
                for i, dim in enumerate(layout):
                    votes.setdefault(dim, []).append(t.shape[i])
        # most common first; a tie goes to the tensor listed first (q before k, v before state)
        dims = {dim: Counter(sizes).most_common(1)[0][0] for dim, sizes in votes.items()}
        agreed = ", ".join(f"{d}={dims[d]}" for d in ("B", "T", "H", "HV", "K", "V") if d in dims)
        for name, layout in expected.items():
            got = tuple(getattr(x, name).shape)
            shape = tuple(dims[d] for d in layout)
            if got != shape:
                self._fail("shape", f"{name} shape must be {shape} ({_spell(layout)} with {agreed}, as most "
                                    f"inputs agree); got {got}")
        HV, K = dims["HV"], dims["K"]
        if tuple(x.dt_bias.shape) not in ((HV, K), (HV * K,)):
            self._fail("shape", f"dt_bias shape must be [HV, K]=({HV}, {K}) or [HV*K]=({HV * K},); "
                                f"got {tuple(x.dt_bias.shape)}")
        if x.H == 0 or HV % x.H:
            self._fail("gva", f"HV must be a multiple of H; got HV={HV}, H={x.H} "
                              f"(value head hv reads q/k head hv // (HV // H))")
        if x.replay:
            for rule, message in replay.violations(x, dims):
                self._fail(rule, message)

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
        if x.num_accepted is not None and x.num_accepted.dtype != torch.int32:
            self._fail("num-accepted", f"num_accepted dtype must be int32; got {dtype_name(x.num_accepted.dtype)} "
                                       f"(.to(torch.int32))")
        for name, t in x.tensors().items():
            if t.device != x.state.device:
                self._fail("device", f"{name} must be on the state's device {x.state.device}; got {t.device}")
            # The pool is updated in place and no implementation records a graph: autograd would
            # refuse the in-place write (naive) or miss it silently (the Triton kernels).
            if t.requires_grad:
                self._fail("requires-grad", f"{name} must not require grad (decode updates the pool in place "
                                            f"and records no graph); pass {name}.detach() or run under "
                                            f"torch.no_grad()")
        for name, t in x.tensors().items():
            if name == "state":
                continue
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
        if x.replay and not caps.replay:
            reason = f"cache= (replay: the state a checkpoint plus cached records) not supported by {self.name}"
            yield "replay", reason, reason
        if not x.update_state and not caps.frozen:
            reason = f"update_state=False (frozen verify: outputs only, no state stored) not supported by {self.name}"
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
            reason = (f"T > 1 (multi-token decode) not supported by {self.name}" if caps.max_tokens == 1 else
                      f"T={x.T} tokens per step not supported by {self.name} (at most {caps.max_tokens})")
            yield "tokens", f"{reason}; got T={x.T}", reason

    def _check_capabilities(self, x: DecodeInputs) -> None:
        for rule, message, _ in self._capability_violations(x):
            self._fail(rule, message)

    def _check_slots(self, x: DecodeInputs) -> None:
        # slots (and num_accepted) are known to be contiguous int32 of the right shape on the
        # state's device here
        if x.B == 0:
            return
        bounds = [x.slots.min(), x.slots.max()]
        if x.num_accepted is not None:
            bounds += [x.num_accepted.min(), x.num_accepted.max()]
        lo, hi, *accepted = torch.stack(bounds).tolist()  # one device sync
        if lo < -1 or hi >= x.N:
            self._fail("slot-range", f"slots values must be in [-1, N={x.N}); got min {lo}, max {hi}")
        if x.replay:
            self._check_lengths(x)
        elif accepted and (accepted[0] < 1 or accepted[1] > x.T):
            self._fail("num-accepted", f"num_accepted values must be in [1, T={x.T}] (row i starts from slot "
                                       f"slots[i, num_accepted[i] - 1]); got min {accepted[0]}, max {accepted[1]}")
        named = x.slots[x.slots >= 0]
        if x.update_state and named.unique().numel() != named.numel():  # frozen verify stores nothing: no race
            dup = named.unique(return_counts=True)
            repeated = dup[0][dup[1] > 1][:4].tolist()
            self._fail("slot-duplicate",
                       f"slots must name each non-negative slot at most once, across rows and tokens (two "
                       f"stores to one slot race); got repeated slots {repeated}")

    def _check_lengths(self, x: DecodeInputs) -> None:
        L, length = x.cache.L, x.cache.length
        if x.N:  # an empty pool has no lengths to bound
            lo, hi = torch.stack([length.min(), length.max()]).tolist()
            if lo < 0 or hi >= L:
                self._fail("cache-length", f"cache.length values must be in [0, L={L}) (a full ring is flushed); "
                                           f"got min {lo}, max {hi}")
        if x.num_accepted is None:
            return
        live = x.slots >= 0
        accepted = x.num_accepted[live]
        if accepted.numel():  # no live row commits anything
            lo, hi = torch.stack([accepted.min(), (length[x.slots[live].long()] + accepted).max()]).tolist()
            if lo < 0 or hi > L:
                self._fail("num-accepted", f"num_accepted values must be >= 0 and leave length[slots[i]] + "
                                           f"num_accepted[i] <= L={L} (a commit takes the records a verify left "
                                           f"after the cached ones); got min {lo}, largest sum {hi}")

    # ---- where it can run -------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        """Versions of the libraries this implementation runs with (for results metadata)."""
        return {"torch": torch.__version__}

    def preload(self) -> None:
        """Import what the first :meth:`bind` would import (a library's kernels, decorated at
        import), so that a sweep's worker does it when it starts, beside the other workers' starts
        and before any row is timed, instead of inside its first row; a failure is left for that row
        to report."""

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        return None

    def _as_read(self, inputs: DecodeInputs) -> DecodeInputs:
        """The inputs as :meth:`_launcher` and :meth:`_extra_unsupported` see them: an
        implementation of one token per step gets a T = 1 step in the one-token spelling (views of
        the same memory), so it never meets the token axis."""
        if self.capabilities.max_tokens == 1 and inputs.per_token and inputs.T == 1:
            return inputs.one_token_spelling()
        return inputs

    def unsupported(self, inputs: DecodeInputs) -> str | None:
        """Why these inputs cannot run here, or None. Needs no kernel launch and no sync."""
        reason = self.unsupported_on(inputs.state.device)
        if reason:
            return reason
        for _, _, reason in self._capability_violations(inputs):
            return reason
        return self._extra_unsupported(self._as_read(inputs))

    def unsupported_on(self, device: torch.device) -> str | None:
        """Why no inputs on ``device`` can run here (a package missing, a device this does not run
        on), or None: what a sweep knows before it starts a worker for this implementation."""
        caps = self.capabilities
        missing = [p for p in caps.packages if importlib.util.find_spec(p) is None]
        if missing:
            return f"package not installed: {', '.join(missing)} (pip install -e .[{self.library}])"
        if device.type not in caps.devices:
            if "cuda" in caps.devices and not torch.cuda.is_available():
                return "needs a CUDA GPU; none is available"
            return f"runs on {'/'.join(caps.devices)}; inputs are on {device.type}"
        if device.type == "cuda" and caps.min_compute_capability:
            cc = torch.cuda.get_device_capability(device)
            if cc < caps.min_compute_capability:
                return "needs compute capability >= %d.%d; this GPU is %d.%d" % (*caps.min_compute_capability, *cc)
        return None

    # ---- running ------------------------------------------------------------------------------
    def bind(self, inputs: DecodeInputs, out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Check, confirm it can run, allocate; return a launcher that only launches.

        The launcher writes the output into ``out`` (allocated here if None) and the new state into
        the pool (frozen verify: no state), and returns ``out``. Slot values are validated here, once:
        the launcher assumes they do not change afterwards. A replay launcher may carry ``sync_records``
        (:func:`kda_impls.replay.sync_records`).
        """
        self.check(inputs)
        reason = self.unsupported(inputs)
        if reason:
            raise Unsupported(f"{self.label}: {reason}")
        shape = inputs.out_shape
        if out is None:
            out = torch.empty(shape, dtype=inputs.v.dtype, device=inputs.device)
        elif tuple(out.shape) != shape or out.dtype != inputs.v.dtype or out.device != inputs.device \
                or not out.is_contiguous():
            self._fail("out", f"out must be a contiguous {shape} {dtype_name(inputs.v.dtype)} tensor on "
                              f"{inputs.device}; got {tuple(out.shape)} {dtype_name(out.dtype)} on {out.device}")
        elif out.data_ptr() % self.capabilities.base_alignment:
            self._fail("out", f"out must start {self.capabilities.base_alignment}-byte aligned; its byte offset "
                              f"is {out.data_ptr() % self.capabilities.base_alignment}")
        else:
            self._check_out_alias(inputs, out)
        spelled = self._as_read(inputs)
        if spelled is inputs:
            return self._launcher(inputs, out)
        launch = self._launcher(spelled, out.view(spelled.out_shape))

        @functools.wraps(launch)  # carries its sync_records
        def launch_per_token() -> torch.Tensor:
            launch()
            return out

        return launch_per_token

    def _check_out_alias(self, inputs: DecodeInputs, out: torch.Tensor) -> None:
        # the launcher writes out while reading the inputs (and the pool): overlapping memory races
        start, end = out.data_ptr(), out.data_ptr() + out.nbytes
        cached = inputs.cache.tensors() if inputs.replay else {}
        for name, t in {**inputs.tensors(), **cached}.items():
            t_start = t.data_ptr()
            t_end = t_start + (inputs.pool_span().nbytes if name == "state" else t.nbytes)
            if t.device == out.device and start < t_end and t_start < end:
                what = "the state pool" if name == "state" else name
                self._fail("out-alias", f"out must not overlap any input; got out (bytes {start:#x}-{end:#x}) "
                                        f"overlapping {what} (bytes {t_start:#x}-{t_end:#x})")

    def decode(self, inputs: DecodeInputs, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.bind(inputs, out)()

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor) -> Callable[[], torch.Tensor]:
        raise NotImplementedError
