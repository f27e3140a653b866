"""The contract every implementation enforces before anything is launched, and the base class.

An implementation declares what it supports in :class:`Capabilities`; the shared rules and those
declared extras are checked by :meth:`Implementation.check` on any machine (no library, no GPU):
the shape rules are in :mod:`kda_impls.contract_shapes`, the memory rules (dtypes, strides,
alignment, slots) in :mod:`kda_impls.contract_memory`, the capabilities in :mod:`kda_impls.capabilities`.
:meth:`Implementation.unsupported` says why valid inputs cannot run *here* (package, device,
architecture, dtype, shape). :meth:`Implementation.bind` does both, allocates everything and
returns the zero-argument launcher that benchmarks time.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Callable, NoReturn

import torch

from .capabilities import Capabilities, capability_violations, package_version
from .contract_memory import ACTIVATION_DTYPES, check_dtypes_devices, check_out, check_pool_layout, check_slots
from .contract_shapes import check_shapes
from .input_rules import ContractError
from .inputs import DecodeInputs

__all__ = ["ACTIVATION_DTYPES", "Capabilities", "ContractError", "Implementation", "Unsupported", "package_version"]


class Unsupported(RuntimeError):
    """Valid inputs that this implementation cannot run on this machine (package, device, arch)."""


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
    def _fail(self, rule: str, message: str) -> NoReturn:
        raise ContractError(self.label, rule, message)

    def check(self, inputs: DecodeInputs) -> None:
        """Raise :class:`ContractError` on the first broken rule; modifies nothing.

        Reads slot values, which costs a device sync on a GPU: call it outside timed code.
        """
        check_shapes(inputs, self._fail)
        check_dtypes_devices(inputs, self._fail)
        check_pool_layout(inputs, self.capabilities, self._fail)
        for rule, message, _ in capability_violations(self.capabilities, self.name, inputs):
            self._fail(rule, message)
        check_slots(inputs, self._fail)
        scale = inputs.effective_scale
        if not (math.isfinite(scale) and scale > 0):
            self._fail("scale", f"scale must be finite and > 0; got {scale} (pass scale=None for K**-0.5)")

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
        for _, _, reason in capability_violations(self.capabilities, self.name, inputs):
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
        """Check (the inputs, then ``out``), confirm it can run, allocate; return a launcher that only launches.

        The launcher writes the output into ``out`` (allocated here if None) and the new state into
        the pool (frozen verify: no state), and returns ``out``. Slot values are validated here, once:
        the launcher assumes they do not change afterwards. A replay launcher may carry ``sync_records``
        (:func:`kda_impls.replay.sync_records`).
        """
        self.check(inputs)
        if out is not None:
            check_out(inputs, out, self.capabilities, self._fail)
        reason = self.unsupported(inputs)
        if reason:
            raise Unsupported(f"{self.label}: {reason}")
        if out is None:
            out = torch.empty(inputs.out_shape, dtype=inputs.v.dtype, device=inputs.device)
        spelled = self._as_read(inputs)
        if spelled is inputs:
            return self._launcher(inputs, out)
        launch = self._launcher(spelled, out.view(spelled.out_shape))

        @functools.wraps(launch)  # carries its sync_records
        def launch_per_token() -> torch.Tensor:
            launch()
            return out

        return launch_per_token

    def decode(self, inputs: DecodeInputs, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.bind(inputs, out)()

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor) -> Callable[[], torch.Tensor]:
        raise NotImplementedError
