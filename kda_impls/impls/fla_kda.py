"""flash-linear-attention's Triton recurrent KDA kernel (fla-core >= 0.6), updating the pool in place,
in each of its legal calling conventions for our semantics.

Each way of calling it is its own registered implementation (a variant); the class attributes
``gate_in_kernel``, ``beta_in_kernel`` and ``packed`` say which. A variant that precomputes the
log gate or sigmoid(beta) does so inside its launcher (one Triton launch,
:mod:`kda_impls.impls.precompute`), in float32: the kernel loads ``g`` and ``beta`` in whatever
dtype they come and computes in float32, so these variants lose no accuracy.

What the adapter relies on, from fla-core 0.6.0's ``fla/ops/kda/fused_recurrent.py``:

- ``fused_recurrent_kda_fwd`` is called directly: the public ``fused_recurrent_kda`` wrapper
  accepts ``ssm_state_indices`` only into ``**kwargs`` and drops it, and always passes
  ``inplace_final_state=False``, so it cannot update a pool in place.
- With ``state_v_first=True`` a slot is ``[HV, V, K]`` compact at ``slot * initial_state.stride(0)``:
  any slot stride works (it is a compile-time constant, so each new stride compiles once), and
  the compact inner strides are what the shared contract already demands.
- Value head ``hv`` reads q/k head ``hv // (HV // H)``, ``A_log[hv]`` and ``dt_bias[hv * K:(hv+1) * K]``:
  the in-kernel gate is per value head as in our contract, so GVA needs no help.
- ``use_gate_in_kernel=False`` takes ``g`` as the log gate, ``use_beta_sigmoid_in_kernel=False``
  takes ``beta`` as sigmoid(b); both are loaded and converted to float32 in the kernel.
- A slot of -1 is not skipped: the kernel loads the state at ``initial_state - stride(0)`` and
  stores the updated state back there, outside the pool, and writes a non-zero output row. The
  adapter therefore never passes a -1. At T = 1, when a batch has -1 rows it gathers the live rows
  into compact buffers, runs those, zeroes the -1 rows' output and copies the live rows' output in.
  That extra work is inside the timed launcher.
- Multi-token decode (T > 1, every variant): the same kernel with ``ssm_state_indices`` ``[B, T]``
  (token t of row i stores at entry ``[i, t]``; the stride between tokens is ignored, so the
  indices must be contiguous, as ours are) and ``num_accepted_tokens`` (row i starts from entry
  ``[i, num_accepted[i] - 1]``; None: entry ``[i, 0]``, the same as all ones). Packed, the T
  tokens of a row are one sequence: ``[1, B*T, ...]`` with ``cu_seqlens = arange(0, B*T + 1, T)``;
  batched, ``[B, T, ...]`` without. fla stores every token's state, whatever the index: a -1
  among a live row's slots would write outside the pool, and a padding row would read there.
  The kernel addresses slot i as ``initial_state + i * stride(0)`` in int64 with no bounds, so
  memory of ours at a whole number of slot strides from the pool is a slot to it: the adapter
  allocates one such scratch slot at bind time and hands fla, in place of each -1 that it would
  read or write (every slot of a padding row, each -1 of a live row), that slot's index. fla then
  applies every token of every row as our semantics do and stores the unwanted states in the
  scratch slot (all rows race on it; nothing reads it but padding rows, whose output is zeroed
  after the call: one ``index_fill_``). Nothing is gathered and no state is copied; the
  launcher's extra work is that fill, only where there are padding rows. Where every token of
  every row stores, the call is the engines' own, ``slots`` as they are.
- Frozen verify (``update_state=False``, every variant, any T): fla has no call that reads a pool
  through indices and stores nothing: with ``ssm_state_indices`` it stores every token's state, at
  its index (``inplace_final_state=True``) or at ``bos + t`` of its own ``final_state`` buffer, which
  has one slot per sequence (written past its end at T > 1). Without indices, ``initial_state`` is
  read as compact ``[N, HV, V, K]`` at sequence n, and with neither ``inplace_final_state`` nor
  ``output_final_state`` no state is written at all. The adapter therefore gathers each row's start
  state into a compact buffer of ours (one ``index_select``: one more read and write of each row's
  state, inside the timed launcher), runs that, and zeroes the padding rows' output (they gathered
  slot 0).
- Forms: packed (``packed = True``), as serving engines call it: one sequence of B tokens
  ``[1, B, ...]`` with ``cu_seqlens = arange(B + 1)``, each token its own sequence and state slot
  (the varlen path: every program first loads its row's bounds from ``cu_seqlens``); or batched,
  ``[B, 1, ...]`` without ``cu_seqlens`` (B sequences of one token), which reaches the same pool
  through ``ssm_state_indices`` without loading any bounds.
- Serving engines do not call fla-core itself but copies of its kernels: vLLM's
  ``vllm/model_executor/layers/fla/ops/kda.py`` (packed varlen; the gate from a separate
  ``fused_kda_gate`` kernel, beta sigmoided beforehand: ``KimiDeltaAttention.forward``), and
  SGLang's Triton KDA backend its fla-derived ``fused_sigmoid_gating_delta_rule_update`` (packed
  varlen, gate and sigmoid in kernel). ``engine_call`` names the variant each corresponds to.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from ..contract import Capabilities, Implementation, package_version
from ..inputs import DecodeInputs
from . import precompute

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
    """The packed varlen call with the gate and beta sigmoid in the kernel."""

    name = "fla"
    library = "fla"
    variant = ("packed [1, B] + cu_seqlens, pool in place via ssm_state_indices (T > 1: a row's T tokens one "
               "sequence, + num_accepted_tokens); gate and sigmoid in kernel; fla never handed a -1 (it does not skip "
               "them): -1 rows gathered out first at T = 1, a scratch slot of ours in their place at T > 1; frozen "
               "verify: the start states gathered into a buffer (index_select, one more state pass) and run without "
               "indices")
    engine_call = "SGLang Triton backend (its own fla-derived kernel, same form)"
    gate_in_kernel = True  # raw a, A_log, dt_bias (use_gate_in_kernel=True); else the log gate precomputed
    beta_in_kernel = True  # the beta logit (use_beta_sigmoid_in_kernel=True); else sigmoid(b) precomputed
    packed = True  # [1, B, ...] with cu_seqlens; else [B, 1, ...] without
    capabilities = Capabilities(devices=("cpu", "cuda"),
                                state_dtypes=(torch.bfloat16, torch.float16, torch.float32),
                                packages=("fla",), max_tokens=None, frozen=True)

    def preload(self) -> None:
        _fused_recurrent_kda_fwd()

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "triton": triton.__version__, "fla-core": package_version("fla-core")}

    @property
    def precomputes(self) -> bool:
        return not (self.gate_in_kernel and self.beta_in_kernel)

    def _as_read(self, inputs: DecodeInputs) -> DecodeInputs:
        # A T = 1 step in either spelling takes the one-token call (the engines' own at T = 1).
        return inputs.one_token_spelling() if inputs.T == 1 else inputs

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        if inputs.T > 1 and inputs.N and inputs.slot_stride == 0:
            return ("the pool's slot stride is 0: every index fla is handed then addresses slot 0, so there is no "
                    "scratch slot for the tokens it must not store (give the pool a stride of HV*V*K)")
        interpreted = _kernel_will_be_interpreted()
        if inputs.device.type == "cpu" and not interpreted:
            if _FLA_MODULE in sys.modules:
                return ("on the CPU fla's Triton kernel runs only under TRITON_INTERPRET=1, which must be set "
                        "before fla is imported (fla was imported without it)")
            return "on the CPU fla's Triton kernel runs only under TRITON_INTERPRET=1 (not set)"
        if inputs.device.type == "cuda" and interpreted:
            return ("fla's kernel is built for the Triton interpreter (TRITON_INTERPRET=1): it would run on the "
                    "CPU instead of being compiled for the GPU (unset TRITON_INTERPRET before fla is imported)")
        if self.precomputes:
            return precompute.unavailable_reason(inputs.device)
        return None

    def library_arguments(self, inputs: DecodeInputs) -> dict:
        """The keyword arguments of ``fused_recurrent_kda_fwd`` that do not depend on the live rows."""
        arguments = dict(
            initial_state=inputs.state,
            scale=inputs.effective_scale,
            inplace_final_state=True,
            state_v_first=True,
            use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=self.gate_in_kernel,
            use_beta_sigmoid_in_kernel=self.beta_in_kernel,
        )
        if self.gate_in_kernel:
            arguments.update(A_log=inputs.A_log, dt_bias=inputs.dt_bias)
        return arguments

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """A per-row tensor in the form this variant passes: ``[1, rows, ...]`` or ``[rows, 1, ...]``."""
        return t.unsqueeze(0 if self.packed else 1)

    def _kernel_inputs(self, inputs: DecodeInputs) -> tuple[dict[str, torch.Tensor], Callable[[], None] | None]:
        """fla's names for our per-row tensors (beta ``[..., HV]`` is one scalar per head), in our
        spelling, and the precompute to run before each call (None: nothing to precompute)."""
        prepared = None
        if self.precomputes:
            prepared = precompute.precompute(inputs, log_gate=not self.gate_in_kernel, beta=not self.beta_in_kernel,
                                             dtype=torch.float32)
        tensors = dict(q=inputs.q, k=inputs.k, v=inputs.v,
                       g=inputs.a if self.gate_in_kernel else prepared.log_gate,
                       beta=inputs.b if self.beta_in_kernel else prepared.beta)
        return tensors, prepared.launch if prepared else None

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        if not inputs.update_state:
            return self._frozen_launcher(inputs, out)
        if inputs.T > 1:
            return self._multitoken_launcher(inputs, out)
        fused_recurrent_kda_fwd = _fused_recurrent_kda_fwd()
        fixed = self.library_arguments(inputs)
        rows, prepare = self._kernel_inputs(inputs)

        # Slot values were validated by bind(); resolving the live rows here keeps the host sync
        # out of the launcher.
        live_rows = torch.nonzero(inputs.slots >= 0).flatten()
        n_live = live_rows.numel()
        if n_live == 0:
            def launch_without_live_rows() -> torch.Tensor:
                out.zero_()
                return out
            return launch_without_live_rows

        if self.packed:
            fixed["cu_seqlens"] = torch.arange(n_live + 1, dtype=torch.int32, device=inputs.device)
        if n_live == inputs.B:
            shaped = {name: self._rows(t) for name, t in rows.items()}
            shaped_out = self._rows(out)

            def launch() -> torch.Tensor:
                if prepare is not None:
                    prepare()
                fused_recurrent_kda_fwd(**shaped, **fixed, ssm_state_indices=inputs.slots, out=shaped_out)
                return out
            return launch

        dead_rows = torch.nonzero(inputs.slots < 0).flatten()
        live_slots = inputs.slots[live_rows]
        live = {name: t.new_empty((n_live, *t.shape[1:])) for name, t in rows.items()}
        live_shaped = {name: self._rows(t) for name, t in live.items()}
        live_out = out.new_empty((n_live, *out.shape[1:]))
        live_out_shaped = self._rows(live_out)

        def launch_live_rows() -> torch.Tensor:
            if prepare is not None:
                prepare()
            for name, t in rows.items():
                torch.index_select(t, 0, live_rows, out=live[name])
            fused_recurrent_kda_fwd(**live_shaped, **fixed, ssm_state_indices=live_slots, out=live_out_shaped)
            out.index_fill_(0, dead_rows, 0)
            out.index_copy_(0, live_rows, live_out)
            return out
        return launch_live_rows

    def _tokens(self, t: torch.Tensor) -> torch.Tensor:
        """A per-token tensor ``[B, T, ...]`` in the form this variant passes: ``[1, B*T, ...]`` or as it is."""
        return t.flatten(0, 1).unsqueeze(0) if self.packed else t

    def _multitoken_launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        fused_recurrent_kda_fwd = _fused_recurrent_kda_fwd()
        # Slot values were validated by bind(); the rows and indices are resolved here, outside
        # the launcher (host syncs).
        live = inputs.live_rows()
        if not bool(live.any()):
            def launch_without_live_rows() -> torch.Tensor:
                out.zero_()
                return out
            return launch_without_live_rows

        B, T = inputs.B, inputs.T
        fixed = self.library_arguments(inputs)
        tensors, prepare = self._kernel_inputs(inputs)
        shaped = {name: self._tokens(t) for name, t in tensors.items()}
        shaped_out = self._tokens(out)
        if self.packed:  # each row's T tokens one sequence
            fixed["cu_seqlens"] = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=inputs.device)
        indices, scratch = fla_state_indices(inputs)
        fixed.update(ssm_state_indices=indices, num_accepted_tokens=inputs.num_accepted)
        dead_rows = torch.nonzero(~live).flatten() if not bool(live.all()) else None

        def launch() -> torch.Tensor:
            if prepare is not None:
                prepare()
            fused_recurrent_kda_fwd(**shaped, **fixed, out=shaped_out)
            if dead_rows is not None:
                out.index_fill_(0, dead_rows, 0)  # padding rows ran on the scratch slot
            return out
        launch.scratch = scratch  # fla writes into it: it lives as long as the launcher
        return launch


    def _frozen_launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        """Frozen verify: the start states gathered into a compact buffer, run without indices (module
        docstring); fla's kernel reads the buffer and writes only the output."""
        fused_recurrent_kda_fwd = _fused_recurrent_kda_fwd()
        x = inputs.per_token_spelling()
        live = x.live_rows()
        if not bool(live.any()):
            def launch_without_live_rows() -> torch.Tensor:
                out.zero_()
                return out
            return launch_without_live_rows

        B, T = x.B, x.T
        read_slots = x.start_slots().clamp(min=0)  # padding rows gather slot 0; their output is zeroed
        starts = x.state.new_empty(B, *x.state.shape[1:])
        fixed = self.library_arguments(x) | dict(initial_state=starts, inplace_final_state=False)
        if self.packed:  # each row's T tokens one sequence
            fixed["cu_seqlens"] = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=x.device)
        tensors, prepare = self._kernel_inputs(x)
        shaped = {name: self._tokens(t) for name, t in tensors.items()}
        shaped_out = self._tokens(out.view(x.out_shape))
        dead_rows = torch.nonzero(~live).flatten() if not bool(live.all()) else None

        def launch() -> torch.Tensor:
            if prepare is not None:
                prepare()
            torch.index_select(x.state, 0, read_slots, out=starts)
            fused_recurrent_kda_fwd(**shaped, **fixed, out=shaped_out)
            if dead_rows is not None:
                out.index_fill_(0, dead_rows, 0)
            return out
        return launch


def scratch_slot(state: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A zeroed buffer of ours holding one slot of the pool ``state`` (N >= 1) as fla addresses it,
    and that slot's index: fla reaches slot i at ``state.data_ptr() + i * stride(0)`` elements (int64, no
    bounds), so the index is the buffer's distance from the pool in slot strides, negative or
    beyond N. One stride plus one slot of buffer always holds a position at a whole number of
    strides from the pool; both are element-aligned, so the distance is whole elements."""
    stride, size = state.stride(0), state.element_size()
    buffer = torch.zeros(stride + state[0].numel(), dtype=state.dtype, device=state.device)
    gap, misaligned = divmod(buffer.data_ptr() - state.data_ptr(), size)
    assert not misaligned, "tensors start on whole elements"
    offset = -gap % stride  # elements into the buffer where a slot of the pool's grid begins
    return buffer, (gap + offset) // stride


def fla_state_indices(inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``ssm_state_indices`` ``[B, T]`` for a multi-token call and the scratch slot its -1s became.

    fla stores every token's state at its index and a row starts from its index at
    ``num_accepted - 1``, both without skipping -1. Where every token of every row stores (every
    row live), that is our ``slots`` as they are (no scratch). Otherwise every entry that must not
    be stored into (a -1 in a live row, every entry of a padding row, whose start is -1) becomes
    the index of a scratch slot of ours (:func:`scratch_slot`), int64 since it may not fit int32;
    a live row still starts from its own start slot, which it stores into."""
    stored = inputs.stored()
    if bool(stored.all()):
        return inputs.slots, None
    scratch, index = scratch_slot(inputs.state)
    return torch.where(stored, inputs.token_slots().long(), index), scratch


class FlaSigmoid(FlaKDA):
    name = "fla-sigmoid"
    variant = "packed as fla; gate in kernel, beta pre-sigmoided (one Triton launch, fp32: exact)"
    engine_call = ""
    beta_in_kernel = False


class FlaLogGate(FlaKDA):
    name = "fla-loggate"
    variant = ("packed as fla; log gate precomputed per value head (one Triton launch, fp32: exact), beta logit "
               "in kernel")
    engine_call = ""
    gate_in_kernel = False


class FlaLogGateSigmoid(FlaKDA):
    name = "fla-loggate-sigmoid"
    variant = "packed as fla; log gate and sigmoid(beta) precomputed in one Triton launch (fp32: exact)"
    engine_call = "vLLM (its own copy of fla's kernel; gate by a separate fused_kda_gate kernel)"
    gate_in_kernel = False
    beta_in_kernel = False


class FlaBatched(FlaKDA):
    name = "fla-batched"
    variant = ("batched [B, 1] (T > 1: [B, T] + num_accepted_tokens), no cu_seqlens, pool in place via "
               "ssm_state_indices; gate and sigmoid in kernel; -1 as fla (gathered out at T = 1, a scratch slot at "
               "T > 1); frozen verify as fla (start states gathered, no indices)")
    engine_call = ""
    packed = False
