"""flash-linear-attention's Triton recurrent KDA kernel (fla-core >= 0.6), updating the pool in place.

What the adapter relies on, from fla-core 0.6.0's ``fla/ops/kda/fused_recurrent.py``:

- ``fused_recurrent_kda_fwd`` is called directly: the public ``fused_recurrent_kda`` wrapper
  accepts ``ssm_state_indices`` only into ``**kwargs`` and drops it, and always passes
  ``inplace_final_state=False``, so it cannot update a pool in place.
- With ``state_v_first=True`` a slot is ``[HV, V, K]`` compact at ``slot * initial_state.stride(0)``:
  any slot stride works (it is a compile-time constant, so each new stride compiles once), and
  the compact inner strides are what the shared contract already demands.
- Value head ``hv`` reads q/k head ``hv // (HV // H)``, ``A_log[hv]`` and ``dt_bias[hv * K:(hv+1) * K]``:
  the in-kernel gate is per value head as in our contract, so GVA needs no help.
- A slot of -1 is not skipped: the kernel loads the state at ``initial_state - stride(0)`` and
  stores the updated state back there, outside the pool, and writes a non-zero output row. The
  adapter therefore never passes a -1: when a batch has -1 rows it gathers the live rows into
  compact buffers, runs those, zeroes the -1 rows' output and copies the live rows' output in.
  That extra work is inside the timed launcher.
- The rows go in packed, as serving engines call it: one sequence of B tokens ``[1, B, ...]`` with
  ``cu_seqlens = arange(B + 1)``, each token its own sequence and state slot (the varlen path:
  every program first loads its row's bounds from ``cu_seqlens``).
"""

from __future__ import annotations

import os
import sys

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from ..contract import Capabilities, Implementation, package_version
from ..inputs import DecodeInputs

_FLA_MODULE = "fla.ops.kda.fused_recurrent"


def _fused_recurrent_kda_fwd():
    # Imported on first bind, not with this module: fla's kernels are decorated at import, and on
    # the CPU that must happen after TRITON_INTERPRET=1 is set.
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    return fused_recurrent_kda_fwd


def _kernel_will_be_interpreted() -> bool:
    """Whether fla's kernel is (or, once imported, will be) the Triton interpreter's."""
    module = sys.modules.get(_FLA_MODULE)
    if module is None:
        return os.environ.get("TRITON_INTERPRET") == "1"
    kernel = module.fused_recurrent_kda_fwd_kernel  # a Heuristics wrapper around the jitted function
    return isinstance(getattr(kernel, "fn", kernel), InterpretedFunction)


class FlaKDA(Implementation):
    name = "fla"
    capabilities = Capabilities(devices=("cpu", "cuda"),
                                state_dtypes=(torch.bfloat16, torch.float16, torch.float32),
                                packages=("fla",))

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "triton": triton.__version__, "fla-core": package_version("fla-core")}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        interpreted = _kernel_will_be_interpreted()
        if inputs.device.type == "cpu" and not interpreted:
            if _FLA_MODULE in sys.modules:
                return ("on the CPU fla's Triton kernel runs only under TRITON_INTERPRET=1, which must be set "
                        "before fla is imported (fla was imported without it)")
            return "on the CPU fla's Triton kernel runs only under TRITON_INTERPRET=1 (not set)"
        if inputs.device.type == "cuda" and interpreted:
            return ("fla's kernel is built for the Triton interpreter (TRITON_INTERPRET=1): it would run on the "
                    "CPU instead of being compiled for the GPU (unset TRITON_INTERPRET before fla is imported)")
        return None

    def library_arguments(self, inputs: DecodeInputs) -> dict:
        """The keyword arguments of ``fused_recurrent_kda_fwd`` that do not depend on the live rows."""
        return dict(
            A_log=inputs.A_log,
            dt_bias=inputs.dt_bias,
            initial_state=inputs.state,
            scale=inputs.effective_scale,
            inplace_final_state=True,
            state_v_first=True,
            use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True,
        )

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        fused_recurrent_kda_fwd = _fused_recurrent_kda_fwd()
        fixed = self.library_arguments(inputs)
        # fla's names for our per-row tensors, packed as [1, rows, ...]; beta [1, rows, HV] is one
        # scalar per head
        rows = dict(q=inputs.q, k=inputs.k, v=inputs.v, g=inputs.a, beta=inputs.b)

        # Slot values were validated by bind(); resolving the live rows here keeps the host sync
        # out of the launcher.
        live_rows = torch.nonzero(inputs.slots >= 0).flatten()
        n_live = live_rows.numel()
        if n_live == 0:
            def launch_without_live_rows() -> torch.Tensor:
                out.zero_()
                return out
            return launch_without_live_rows

        cu_seqlens = torch.arange(n_live + 1, dtype=torch.int32, device=inputs.device)
        if n_live == inputs.B:
            packed = {name: t.unsqueeze(0) for name, t in rows.items()}
            packed_out = out.unsqueeze(0)

            def launch() -> torch.Tensor:
                fused_recurrent_kda_fwd(**packed, **fixed, cu_seqlens=cu_seqlens, ssm_state_indices=inputs.slots,
                                        out=packed_out)
                return out
            return launch

        dead_rows = torch.nonzero(inputs.slots < 0).flatten()
        live_slots = inputs.slots[live_rows]
        live = {name: t.new_empty((n_live, *t.shape[1:])) for name, t in rows.items()}
        live_packed = {name: t.unsqueeze(0) for name, t in live.items()}
        live_out = out.new_empty((n_live, *out.shape[1:]))
        live_out_packed = live_out.unsqueeze(0)

        def launch_live_rows() -> torch.Tensor:
            for name, t in rows.items():
                torch.index_select(t, 0, live_rows, out=live[name])
            fused_recurrent_kda_fwd(**live_packed, **fixed, cu_seqlens=cu_seqlens, ssm_state_indices=live_slots,
                                    out=live_out_packed)
            out.index_fill_(0, dead_rows, 0)
            out.index_copy_(0, live_rows, live_out)
            return out
        return launch_live_rows
