"""SGLang's own KDA decode kernels (sglang 0.5.23, installed with ``--no-deps``), in the calls its decode
backends make.

- :func:`kernel_module` loads a kernel file from the installed package without running sglang's
  ``__init__``s (they import its serving runtime): the parent packages are empty stand-ins over the
  real directories, so the file's imports of its siblings resolve.
- ``sglang-cutedsl``: ``cutedsl_fused_sigmoid_gating_kda_update`` (the ``cutedsl`` backend), q/k/v
  ``[1, B, ...]`` with ``cu_seqlens``; its own bf16 output copied into ``out``, -1 rows zeroed; dt_bias
  passed as the bf16 tensor the wrapper compiles for (a copy made at bind, exact where dt_bias holds
  bf16 values).
- ``sglang-triton``: ``fused_recurrent_kda_packed_decode`` (the ``triton`` backend), q|k|v packed into
  ``mixed_qkv``.
- ``sglang-replayssm``: the ReplaySSM decode (:mod:`kda_impls.impls.sglang_replay`).

Refused with its reason: a kernel whose imports fail (``sglang-triton`` without SGLang's serving
dependencies); for ``sglang-cutedsl`` all but bf16 activations, an fp32 pool, a dt_bias of bf16
values, K = 128, V % 128 == 0, the default scale, 16-byte aligned tensors, sm_90+. What each call
relies on: docs/semantics.md, "SGLang's kernels".
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable

import torch

from ..contract import Capabilities, Implementation, package_version
from ..dtypes import dtype_name
from ..inputs import DecodeInputs

SGLANG_VERSION = "0.5.23"
INSTALL = f"python3 -m pip install --no-deps sglang=={SGLANG_VERSION}"
ATTENTION = "sglang.kernels.ops.attention"
TENSOR_ALIGNMENT = 16  # bytes: assumed_align of every tensor the CuTe-DSL kernel takes


def sglang_dir() -> Path | None:
    """The installed ``sglang`` package's directory (found, not imported), or None."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def kernel_module(name: str) -> types.ModuleType:
    """SGLang's module ``name`` (``sglang.x.y``) executed from its file, its parent packages stand-ins
    where none is imported (module docstring); an ImportError where sglang is not installed or the
    file's own imports fail."""
    if name in sys.modules:
        return sys.modules[name]
    root = sglang_dir()
    if root is None:
        raise ImportError(f"sglang is not installed ({INSTALL})")
    parts = name.split(".")
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        if parent not in sys.modules:
            stub = types.ModuleType(parent)
            stub.__spec__ = importlib.machinery.ModuleSpec(parent, None, is_package=True)
            stub.__path__ = stub.__spec__.submodule_search_locations = [str(root.joinpath(*parts[1:depth]))]
            sys.modules[parent] = stub
    spec = importlib.util.spec_from_file_location(name, root.joinpath(*parts[1:]).with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
    return module


@functools.cache
def import_failure(name: str) -> str | None:
    """Why SGLang's module ``name`` cannot be loaded here (its error, one line), or None."""
    try:
        kernel_module(name)
    except Exception as exc:  # a kernel file's import-time failure of any kind is the reason, not a crash
        text = " ".join(str(exc).split())
        return f"{name.replace('.', '/')}.py does not import here: {type(exc).__name__}: {text}"
    return None


class SGLangKDA(Implementation):
    """Shared by the SGLang adapters: the kernel module, its availability and versions."""

    module: str  # the kernel file, dotted
    entry: str  # the function the backend calls

    @property
    def library(self) -> str:
        return "sglang"

    @property
    def label(self) -> str:
        return f"{self.name} {self.entry}"

    def kernel(self) -> Callable:
        return getattr(kernel_module(self.module), self.entry)

    def preload(self) -> None:
        self.kernel()

    def unsupported_on(self, device: torch.device) -> str | None:
        if sglang_dir() is None:
            return f"package not installed: sglang (its kernels only: {INSTALL})"
        return super().unsupported_on(device)

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "sglang": package_version("sglang")}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        return import_failure(self.module)


def packed_qkv(inputs: DecodeInputs) -> tuple[torch.Tensor, Callable[[], None]]:
    """``mixed_qkv`` ``[B, 2*H*K + HV*V]`` (q | k | v per row, the layout of SGLang's conv1d output) and
    the copy that fills it from the step's q, k, v (one launch)."""
    B = inputs.B
    parts = (inputs.q.view(B, -1), inputs.k.view(B, -1), inputs.v.view(B, -1))
    mixed = torch.empty(B, sum(p.shape[1] for p in parts), dtype=inputs.q.dtype, device=inputs.device)

    def pack() -> None:
        torch.cat(parts, dim=1, out=mixed)

    return mixed, pack


class SGLangCuteDSL(SGLangKDA):
    name = "sglang-cutedsl"
    module = f"{ATTENTION}.cutedsl_kda"
    entry = "cutedsl_fused_sigmoid_gating_kda_update"
    variant = ("SGLang's cutedsl decode backend: [1, B] + cu_seqlens, fp32 pool in place via initial_state_indices; "
               "gate and sigmoid in kernel (fp32 from bf16 inputs, dt_bias as bf16); the wrapper's own bf16 output "
               "copied into out, -1 rows zeroed after the call; K = 128, V % 128 == 0, default scale only")
    engine_call = "SGLang (--linear-attn-decode-backend cutedsl)"
    # the kernel stores its fp32 shared-memory tile into the pool: compiling it for a bf16 pool fails
    capabilities = Capabilities(devices=("cuda",), state_dtypes=(torch.float32,), k_values=(128,),
                                base_alignment=TENSOR_ALIGNMENT, min_compute_capability=(9, 0),
                                packages=("cutlass", "cuda"))

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "nvidia-cutlass-dsl": package_version("nvidia-cutlass-dsl", "cutlass"),
                "cuda-bindings": package_version("cuda-bindings")}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        if inputs.q.dtype != torch.bfloat16:
            return (f"q/k/v/a/b must be bfloat16 (the kernel is compiled for bf16 activations and output); got "
                    f"{dtype_name(inputs.q.dtype)}")
        if inputs.V % 128:
            return (f"V must be a multiple of 128 (the wrapper asserts V % 32, V % 16 and (V / 16) % 8); got "
                    f"V={inputs.V}")
        if not torch.equal(inputs.dt_bias.to(torch.bfloat16).float(), inputs.dt_bias):
            return ("dt_bias must hold bf16 values (the wrapper compiles the kernel for a bf16 dt_bias, and reads "
                    "the bytes of an fp32 one as bf16); got values bf16 rounds")
        if inputs.scale is not None and inputs.effective_scale != inputs.K ** -0.5:
            return (f"the backend passes no scale (K**-0.5={inputs.K ** -0.5:g} in the wrapper); got scale="
                    f"{inputs.scale}")
        for name, t in dict(q=inputs.q, k=inputs.k, v=inputs.v, a=inputs.a, b=inputs.b, A_log=inputs.A_log,
                            dt_bias=inputs.dt_bias, slots=inputs.slots).items():
            if t.data_ptr() % TENSOR_ALIGNMENT:
                return (f"{name} must start {TENSOR_ALIGNMENT}-byte aligned (every tensor goes to the kernel with "
                        f"assumed_align=16); its byte offset is {t.data_ptr() % TENSOR_ALIGNMENT}")
        return super()._extra_unsupported(inputs)

    def library_arguments(self, inputs: DecodeInputs) -> dict:
        """The keyword arguments of the wrapper, as ``CuteDSLKDAKernel.decode`` passes them, dt_bias in the
        dtype the wrapper compiles for (bf16; lossless where :meth:`_extra_unsupported` lets it run)."""
        return dict(A_log=inputs.A_log, dt_bias=inputs.dt_bias.to(torch.bfloat16), q=inputs.q.unsqueeze(0),
                    k=inputs.k.unsqueeze(0), v=inputs.v.unsqueeze(0), a=inputs.a, b=inputs.b,
                    initial_state_source=inputs.state, initial_state_indices=inputs.slots,
                    cu_seqlens=torch.arange(inputs.B + 1, dtype=torch.int32, device=inputs.device),
                    use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        update = self.kernel()
        arguments = self.library_arguments(inputs)
        live = inputs.live_rows()  # bind() validated the slots; resolved here, outside the launcher
        dead_rows = torch.nonzero(~live).flatten() if not bool(live.all()) else None

        def launch() -> torch.Tensor:
            out.copy_(update(**arguments).view(out.shape))
            if dead_rows is not None:
                out.index_fill_(0, dead_rows, 0)
            return out

        return launch


class SGLangTriton(SGLangKDA):
    name = "sglang-triton"
    module = f"{ATTENTION}.fla.fused_recurrent"
    entry = "fused_recurrent_kda_packed_decode"
    variant = ("SGLang's triton decode backend on CUDA (packed_decode): q|k|v packed into mixed_qkv [B, 2HK + HV*V] "
               "(one copy in the step; SGLang's conv1d writes it), a [B, HV*K], pool in place via ssm_state_indices; "
               "gate and sigmoid in kernel")
    engine_call = "SGLang (--linear-attn-decode-backend triton)"
    capabilities = Capabilities(devices=("cuda",), min_compute_capability=(8, 0), packages=("triton",))

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "triton": package_version("triton")}

    def library_arguments(self, inputs: DecodeInputs, out: torch.Tensor, mixed_qkv: torch.Tensor) -> dict:
        """The keyword arguments, as ``TritonKDAKernel.packed_decode`` passes them."""
        return dict(mixed_qkv=mixed_qkv, a=inputs.a.view(inputs.B, -1), b=inputs.b, A_log=inputs.A_log.reshape(-1),
                    dt_bias=inputs.dt_bias.reshape(-1), scale=inputs.effective_scale, initial_state=inputs.state,
                    out=out.view(inputs.B, 1, inputs.HV, inputs.V), ssm_state_indices=inputs.slots,
                    use_qk_l2norm_in_kernel=True, lower_bound=None)

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        decode = self.kernel()
        mixed_qkv, pack = packed_qkv(inputs)
        arguments = self.library_arguments(inputs, out, mixed_qkv)

        def launch() -> torch.Tensor:
            pack()
            decode(**arguments)
            return out

        return launch
