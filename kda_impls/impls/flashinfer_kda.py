"""FlashInfer's CuTe-DSL recurrent KDA decode (flashinfer-python >= 0.7.2), updating the pool in place.

What the adapter relies on, from flashinfer-python 0.7.2.post1's source:

- Entry point: ``flashinfer.recurrent_kda`` (``flashinfer/kda.py``); 0.7.2 deprecates
  ``flashinfer.kda_decode.recurrent_kda`` in its favour with the same arguments, and releases
  without the top-level name only have the latter.
- Packed form: q/k/v/g/beta as ``[1, B, ...]`` with ``cu_seqlens = arange(B + 1)``. That branch of
  ``run_recurrent_kda`` (``flashinfer/kda_kernels/recurrent_kda.py``) hands the pool and
  ``ssm_state_indices`` straight to the kernel (``state = initial_state``); the dense ``[B, 1, ...]``
  form instead gathers ``initial_state[ssm_state_indices]`` and scatters it back. Prefill and the
  Cake decode routes all decline a packed call with one token per sequence.
- Pool: bf16 ``[N, HV, V, K]`` with compact ``[HV, V, K]`` blocks, compiled for a slot stride
  divisible by 16 elements and 32-byte alignment (``_make_compile_inputs``); K == V in {64, 128}.
  Every other tensor is compiled as compact and 32-byte aligned.
- Rows with slot -1 read slot 0, write no state, and get a zero output row (the one-warp kernel
  zero-fills padded rows for D128, the wrapper zero-fills the output for D64, the grouped kernel
  stores zeros for inactive rows). So -1 rows need no extra work, but the pool needs a slot 0.
- GVA: value head ``hv`` reads q/k head ``hv // (HV // H)`` as in our contract, but the in-kernel
  gate reads ``A_log`` and ``dt_bias`` at that q/k head, not at ``hv``. With HV != H the adapter
  computes the log gate per value head itself before each launch (three elementwise ops inside
  the timed launcher) and passes it with ``use_gate_in_kernel=False``; the log gate goes to the
  kernel in bf16, the only dtype it takes, which costs ~3e-4 relative error on the decayed state.
  beta is read per value head, so its sigmoid stays in the kernel (``beta_is_logit=True``).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..contract import Capabilities, Implementation, package_version
from ..dtypes import dtype_name
from ..inputs import DecodeInputs

# Byte alignment the kernel is compiled to assume for every tensor it takes.
TENSOR_ALIGNMENT = 32


def recurrent_kda_entry_point() -> Callable:
    import flashinfer

    entry = getattr(flashinfer, "recurrent_kda", None)
    if entry is None:
        from flashinfer.kda_decode import recurrent_kda as entry
    return entry


def per_value_head_log_gate(inputs: DecodeInputs) -> tuple[torch.Tensor, Callable[[], None]]:
    """A bf16 ``[B, HV, K]`` buffer and the function that fills it with
    ``-exp(A_log[hv]) * softplus(a + dt_bias[hv])`` from the current ``inputs.a``."""
    B, HV, K = inputs.B, inputs.HV, inputs.K
    neg_decay_rate = -torch.exp(inputs.A_log).unsqueeze(1)  # [HV, 1]: a parameter, derived once
    dt_bias = inputs.dt_bias.view(HV, K)
    biased = torch.empty((B, HV, K), dtype=torch.float32, device=inputs.device)
    zero = torch.zeros((), dtype=torch.float32, device=inputs.device)
    log_gate = torch.empty((B, HV, K), dtype=torch.bfloat16, device=inputs.device)

    def compute() -> None:
        torch.add(inputs.a, dt_bias, out=biased)
        torch.logaddexp(biased, zero, out=biased)  # softplus, without allocating
        torch.mul(biased, neg_decay_rate, out=log_gate)

    return log_gate, compute


class FlashInferKDA(Implementation):
    name = "flashinfer"
    label = "flashinfer recurrent_kda"
    capabilities = Capabilities(devices=("cuda",), state_dtypes=(torch.bfloat16,), k_values=(64, 128),
                                v_values=(64, 128), k_equals_v=True, slot_stride_multiple=16,
                                base_alignment=TENSOR_ALIGNMENT, min_compute_capability=(9, 0),
                                packages=("flashinfer", "cutlass", "tvm_ffi"))

    def versions(self) -> dict[str, str]:
        return {**super().versions(),
                "flashinfer-python": package_version("flashinfer-python", "flashinfer"),
                "nvidia-cutlass-dsl": package_version("nvidia-cutlass-dsl", "cutlass"),
                "apache-tvm-ffi": package_version("apache-tvm-ffi", "tvm_ffi")}

    @staticmethod
    def _tensors_passed(inputs: DecodeInputs) -> dict[str, torch.Tensor]:
        passed = dict(q=inputs.q, k=inputs.k, v=inputs.v, b=inputs.b, slots=inputs.slots)
        if inputs.H == inputs.HV:
            passed.update(a=inputs.a, A_log=inputs.A_log, dt_bias=inputs.dt_bias)
        return passed

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        if inputs.q.dtype != torch.bfloat16:
            return f"q/k/v/a/b must be bfloat16 (the kernel's only activation dtype); got {dtype_name(inputs.q.dtype)}"
        if inputs.B and inputs.N == 0:
            return "the pool has no slots, and flashinfer reads slot 0 for rows with slot -1"
        for name, t in self._tensors_passed(inputs).items():
            if t.data_ptr() % TENSOR_ALIGNMENT:
                return (f"{name} must start {TENSOR_ALIGNMENT}-byte aligned (the kernel is compiled assuming "
                        f"it); its byte offset is {t.data_ptr() % TENSOR_ALIGNMENT}")
        try:
            recurrent_kda_entry_point()
            from flashinfer import kda_kernels
        except ImportError as exc:
            return f"flashinfer does not import: {exc}"
        # flashinfer/kda_kernels/__init__.py sets it to None when the CuTe DSL is missing or cannot target this GPU
        if hasattr(kda_kernels, "run_recurrent_kda") and kda_kernels.run_recurrent_kda is None:
            return "flashinfer's CuTe-DSL recurrent KDA backend did not load for this GPU"
        return None

    def library_arguments(self, inputs: DecodeInputs, out: torch.Tensor
                          ) -> tuple[dict, Callable[[], None] | None]:
        """The keyword arguments of ``recurrent_kda`` for these inputs, and the work to run before
        each call (the per-value-head gate under GVA; None otherwise)."""
        packed = dict(
            q=inputs.q.unsqueeze(0),
            k=inputs.k.unsqueeze(0),
            v=inputs.v.unsqueeze(0),
            beta=inputs.b.unsqueeze(0),
            beta_is_logit=True,
            scale=inputs.effective_scale,
            initial_state=inputs.state,
            output_final_state=False,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(inputs.B + 1, dtype=torch.int32, device=inputs.device),
            ssm_state_indices=inputs.slots,
            output=out.unsqueeze(0),
        )
        if inputs.H == inputs.HV:
            return dict(packed, g=inputs.a.unsqueeze(0), A_log=inputs.A_log, dt_bias=inputs.dt_bias.reshape(-1),
                        use_gate_in_kernel=True), None
        log_gate, compute_log_gate = per_value_head_log_gate(inputs)
        return dict(packed, g=log_gate.unsqueeze(0), use_gate_in_kernel=False), compute_log_gate

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        recurrent_kda = recurrent_kda_entry_point()
        arguments, prepare = self.library_arguments(inputs, out)

        if prepare is None:
            def launch() -> torch.Tensor:
                recurrent_kda(**arguments)
                return out

            return launch

        def launch_with_gate() -> torch.Tensor:
            prepare()
            recurrent_kda(**arguments)
            return out

        return launch_with_gate
