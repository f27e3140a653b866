"""FlashInfer's CuTe-DSL recurrent KDA decode (flashinfer-python >= 0.7.2), in each of its legal
calling conventions for our semantics.

One kernel, several calls: on the H200 the same ``recurrent_kda`` launch takes longer with the gate
and the beta sigmoid in the kernel than with both precomputed, for identical results, at large
batches (``results/h200/published/variants-flashinfer.md``; shorter at small ones, where the
precompute launch costs more than it saves). Each way of calling it is therefore its own
registered implementation (a variant); the class attributes ``gate_in_kernel``, ``beta_in_kernel``
and ``form`` say which. Work a variant does before the library call (precomputing the gate or
sigmoid(beta): one Triton launch, :mod:`kda_impls.impls.precompute`) is inside its launcher, so
every variant is timed on the whole step from the same raw inputs.

What the adapter relies on, from flashinfer-python 0.7.2.post1's source:

- Entry point: ``flashinfer.recurrent_kda`` (``flashinfer/kda.py``); 0.7.2 deprecates
  ``flashinfer.kda_decode.recurrent_kda`` in its favour with the same arguments (the one
  SGLang and FlashInfer's own benchmark call), and releases without the top-level name only have
  the latter. On sm_90 both reach ``run_recurrent_kda`` (``flashinfer/kda_kernels/recurrent_kda.py``)
  and its CuTe-DSL kernels: the Cake routes ``backend="auto"`` may pick exist for sm_100/sm_103 only.
- Forms (``form``):
  ``"packed"``: q/k/v/g/beta as ``[1, B, ...]`` with ``cu_seqlens = arange(B + 1)``; the pool and
  ``ssm_state_indices`` go straight to the kernel (``state = initial_state``), which updates the
  slots in place, any slot stride the contract allows. Prefill and the Cake decode routes all
  decline a packed call with one token per sequence. SGLang's call.
  ``"gather"``: ``[B, 1, ...]`` with ``ssm_state_indices`` and no ``cu_seqlens``: the wrapper
  gathers ``initial_state[ssm_state_indices]`` into a new contiguous tensor, runs the kernel on it
  and scatters it back with ``initial_state[ssm_state_indices] = state``: two more passes over the
  state, in torch. A -1 index there is Python's last slot: the -1 row reads slot N-1, the scatter
  overwrites slot N-1 with it and the kernel writes the row's output, so this form is legal only
  without -1 rows. A pool with padding between slots (not contiguous) is refused
  ("non-contiguous initial_state requires cu_seqlens") except on the ``backend="auto"`` route for
  H == HV, K = V = 128 with the gate in the kernel.
  ``"dense"``: ``[B, 1, ...]``, no indices: batch row i updates ``initial_state[i]`` in place, which
  must be contiguous. FlashInfer's own benchmark (``benchmarks/bench_recurrent_kda.py``: dense
  ``[B, HV, V, K]`` state, no indices, log gate and beta precomputed outside the timing). Legal
  for our semantics only when ``slots == arange(B)`` and the first B slots are contiguous: the
  adapter passes ``state[:B]``.
- Pool: bf16 ``[N, HV, V, K]`` with compact ``[HV, V, K]`` blocks, compiled for a slot stride
  divisible by 16 elements and 32-byte alignment (``_make_compile_inputs``); K == V in {64, 128}.
  Every other tensor is compiled as compact and 32-byte aligned; q/k/v/g/beta must be bfloat16,
  so a precomputed log gate and sigmoid(beta) go in rounded to bf16, each element off by up to
  2**-8 relative: the decay exp(g) by up to |g| * 2**-8 (in the kernel both are computed from the
  inputs in fp32; ``verify`` reports what it costs).
- Packed rows with slot -1 read slot 0, write no state, and get a zero output row (the one-warp
  kernel zero-fills padded rows for D128, the wrapper zero-fills the whole output with a separate
  ``output.zero_()`` launch for D64 when B*HV >= 128, the grouped kernel stores zeros for inactive
  rows). So -1 rows need no extra work, but the pool needs a slot 0.
- GVA: value head ``hv`` reads q/k head ``hv // (HV // H)`` as in our contract, but the in-kernel
  gate takes ``A_log`` ``[H]`` and ``dt_bias`` ``[H*K]`` per q/k head (its docstring) and reads them
  at that q/k head, not at ``hv`` (``recurrent_kda_decode_kernel``: ``gALog[query_head_idx]``,
  ``h_K_offset = query_head_idx * HEAD_DIM``; ``_grouped_kda_kernel``: ``a_log[h]``,
  ``dt_bias[h * D + ...]``); their shapes are not checked, so our ``[HV]`` parameters are accepted
  and only their first H entries used. With HV != H that is another gate than ours, so the
  gate-in-kernel variants do not run under GVA; the precomputed log gate is per value head (our
  gate, rounded to bf16). beta is read per value head in both modes.
- Multi-token decode (T > 1, every variant): ``num_spec_tokens=T-1``, ``num_accepted_tokens`` (None:
  ones) and ``ssm_state_indices`` ``[B, T]``. In each form that is one call of the grouped-CTA
  kernel (``run_recurrent_kda``: the one-warp kernel takes ``NUM_TOKENS == 1`` only, the Cake routes
  ``num_spec_tokens=None`` or an explicit ``backend="cake"``, and ``flashinfer.recurrent_kda`` routes
  no call with ``num_spec_tokens`` to prefill), whatever the GPU the CuTe DSL targets. ``"packed"``:
  ``[1, B*T, ...]`` with ``cu_seqlens = arange(0, B*T + 1, T)`` (SGLang's and vLLM's form).
  ``"gather"``: ``[B, T, ...]`` without ``cu_seqlens``: the wrapper's batched spec-decode shim
  reshapes to the packed form and builds ``cu_seqlens`` with a ``torch.arange`` on every call; it
  gathers nothing (the pool goes to the kernel as it is), so a padded pool and -1 rows are taken.
  ``"dense"``: ``[B, T, ...]`` and no indices: the shim builds ``arange(B*T).view(B, T)`` on every
  call (token t of row i in slot ``i*T + t``), legal only for exactly those slots.
  The kernel starts row n from ``ssm_state_indices[n, clamp(num_accepted[n] - 1, 0, T - 1)]``
  (slot 0 where that is -1), then per token: an index of -1 skips the token altogether (no decay,
  no update, output 0), any other is applied, output and stored. A padding row is therefore
  handed all -1 (zero output, nothing stored, slot 0 read). A -1 inside a live row must apply the
  token and store nothing, so the adapter hands, in its place, the next slot the row stores into:
  one thread stores the same elements for every token of a row (a CTA owns a row's value
  columns), so that slot is written again afterwards with its own token's state. Each such token
  costs one state store that its -1 would not. A -1 after a row's last stored token has no later
  store to absorb it and is refused (engines never send one: they store every token, or the last).
- Frozen verify (``update_state=False``, any T; the variants of the packed form): ``disable_state_update=True``
  with ``[B, T, ...]`` tensors, no ``cu_seqlens``, the pool as ``initial_state_source`` and one slot per
  row as ``initial_state_indices`` ``[B]`` (``_run_frozen_recurrent_kda`` in ``flashinfer/kda_decode.py``:
  its batched form, which refuses ``num_accepted_tokens`` and writes no state; the ``cu_seqlens`` form
  requires the RecoverSSM caches). It runs ``kda_wy_output_only``
  (``flashinfer/kda_kernels/kda_decode_wy_output_only.py``): the grouped register recurrence where
  ``B*HV`` is small (at most 48 at T <= 4 with the log gate given, 24 with the gate in the kernel),
  else the WY-form tensor-core kernel; K == V == 128 and 1 <= T <= 16 only (asserted), bf16 state,
  the gate parameters read at the q/k head as above. The wrapper makes the pool ``.contiguous()``, so
  a pool with padding between slots is copied whole on every call (inside the timed launcher). A -1
  there is no padding row: the grouped kernel reads slot 0 for it, the WY kernel hands it to its TMA
  load as it is (a box before the pool, which TMA fills with zeros), and both output what that gives, so
  the adapter hands slot 0 in its place and zeroes those rows' output after the call (one
  ``index_fill_``, only where there are padding rows). The other forms refuse frozen verify: the call
  has this one form.
- Replay verify (``flashinfer-recoverssm``): :mod:`kda_impls.impls.flashinfer_variants`.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..contract import Capabilities, Implementation, Unsupported, package_version
from ..dtypes import dtype_name
from ..inputs import DecodeInputs
from . import precompute

# Byte alignment the kernel is compiled to assume for every tensor it takes.
TENSOR_ALIGNMENT = 32
FORMS = ("packed", "gather", "dense")


def recurrent_kda_entry_point() -> Callable:
    import flashinfer

    entry = getattr(flashinfer, "recurrent_kda", None)
    if entry is None:
        from flashinfer.kda_decode import recurrent_kda as entry
    return entry


class FlashInferKDA(Implementation):
    """The suite's original call: packed pool path, gate and beta sigmoid in the kernel."""

    name = "flashinfer"
    library = "flashinfer"
    variant = ("packed [1, B] + cu_seqlens, pool in place via ssm_state_indices (T > 1: [1, B*T], num_spec_tokens, "
               "num_accepted_tokens; a -1 inside a row handed as the row's next stored slot); gate "
               "(use_gate_in_kernel) and sigmoid (beta_is_logit) in kernel; H == HV only (the in-kernel gate reads "
               "A_log/dt_bias per q/k head); frozen verify: [B, T] + disable_state_update=True, "
               "initial_state_indices [B], -1 rows as slot 0 then zeroed")
    gate_in_kernel = True  # raw a, A_log, dt_bias (use_gate_in_kernel=True); else the log gate precomputed
    beta_in_kernel = True  # the beta logit (beta_is_logit=True); else sigmoid(b) precomputed
    form = "packed"  # one of FORMS (module docstring)
    capabilities = Capabilities(devices=("cuda",), state_dtypes=(torch.bfloat16,), k_values=(64, 128),
                                v_values=(64, 128), k_equals_v=True, slot_stride_multiple=16,
                                base_alignment=TENSOR_ALIGNMENT, min_compute_capability=(9, 0),
                                packages=("flashinfer", "cutlass", "tvm_ffi"), max_tokens=None, frozen=True)

    @property
    def label(self) -> str:
        return f"{self.name} recurrent_kda"

    def preload(self) -> None:
        recurrent_kda_entry_point()

    def versions(self) -> dict[str, str]:
        return {**super().versions(),
                "flashinfer-python": package_version("flashinfer-python", "flashinfer"),
                "nvidia-cutlass-dsl": package_version("nvidia-cutlass-dsl", "cutlass"),
                "apache-tvm-ffi": package_version("apache-tvm-ffi", "tvm_ffi")}

    @property
    def precomputes(self) -> bool:
        return not (self.gate_in_kernel and self.beta_in_kernel)

    def _as_read(self, inputs: DecodeInputs) -> DecodeInputs:
        # A T = 1 step in either spelling takes the one-token call (the engines' own at T = 1); frozen
        # verify has only the [B, T] call.
        if not inputs.update_state:
            return inputs.per_token_spelling()
        return inputs.one_token_spelling() if inputs.T == 1 else inputs

    def _tensors_passed(self, inputs: DecodeInputs) -> dict[str, torch.Tensor]:
        """The inputs handed to the library as they are (the rest go through buffers of ours)."""
        passed = dict(q=inputs.q, k=inputs.k, v=inputs.v)
        if self.form != "dense" and inputs.update_state:  # frozen verify hands a copy of them
            passed["slots"] = inputs.slots  # at T > 1 where nothing is remapped
        if inputs.T > 1 and inputs.num_accepted is not None:
            passed["num_accepted"] = inputs.num_accepted
        if self.gate_in_kernel:
            passed.update(a=inputs.a, A_log=inputs.A_log, dt_bias=inputs.dt_bias)
        if self.beta_in_kernel:
            passed["b"] = inputs.b
        return passed

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        if inputs.q.dtype != torch.bfloat16:
            return f"q/k/v/a/b must be bfloat16 (the kernel's only activation dtype); got {dtype_name(inputs.q.dtype)}"
        if self.gate_in_kernel and inputs.H != inputs.HV:
            return (f"GVA (H={inputs.H}, HV={inputs.HV}): recurrent_kda's in-kernel gate (use_gate_in_kernel=True) "
                    f"takes A_log [H] and dt_bias [H*K] per q/k head, reading entry hv // (HV // H) for value head "
                    f"hv; ours are per value head (precompute the gate per value head: flashinfer-loggate)")
        if (self.form == "packed" or inputs.T > 1 and self.form == "gather") and inputs.B and inputs.N == 0:
            return "the pool has no slots, and flashinfer reads slot 0 for rows with slot -1"
        reason = self._frozen_unsupported(inputs) if not inputs.update_state else self._form_unsupported(inputs)
        if reason:
            return reason
        for name, t in self._tensors_passed(inputs).items():
            alignment = self.capabilities.base_alignment
            if t.data_ptr() % alignment:
                return (f"{name} must start {alignment}-byte aligned (the kernel is compiled assuming "
                        f"it); its byte offset is {t.data_ptr() % alignment}")
        if self.precomputes:
            reason = precompute.unavailable_reason(inputs.device)
            if reason:
                return reason
        try:
            recurrent_kda_entry_point()
            from flashinfer import kda_kernels
        except ImportError as exc:
            return f"flashinfer does not import: {exc}"
        # flashinfer/kda_kernels/__init__.py sets it to None when the CuTe DSL is missing or cannot target this GPU
        if hasattr(kda_kernels, "run_recurrent_kda") and kda_kernels.run_recurrent_kda is None:
            return "flashinfer's CuTe-DSL recurrent KDA backend did not load for this GPU"
        return None

    def _frozen_unsupported(self, inputs: DecodeInputs) -> str | None:
        """What frozen verify's one call (module docstring) rules out from shapes alone."""
        if self.form != "packed":
            return ("frozen verify (disable_state_update=True) has one form, the batched [B, T] call with "
                    "initial_state_indices, which the packed variants make (flashinfer, flashinfer-sigmoid, "
                    "flashinfer-loggate, flashinfer-loggate-sigmoid)")
        if not inputs.K == inputs.V == 128:
            return (f"frozen verify (disable_state_update=True) needs K == V == 128 (kda_wy_output_only); got "
                    f"K={inputs.K}, V={inputs.V}")
        if inputs.T > 16:
            return f"frozen verify (disable_state_update=True) takes at most 16 tokens per row; got T={inputs.T}"
        return None

    def _form_unsupported(self, inputs: DecodeInputs) -> str | None:
        """What the form rules out from shapes and layout alone (no slot values: no sync)."""
        if inputs.T > 1:  # the spec-decode shim packs [B, T] and takes the pool as it is
            if self.form == "dense" and inputs.N < inputs.B * inputs.T:
                return (f"the dense form (num_spec_tokens, no ssm_state_indices) stores token t of row i in slot "
                        f"i*T + t: needs a pool of at least B*T={inputs.B * inputs.T} slots; got N={inputs.N}")
            return None
        if self.form == "dense":
            if inputs.N < inputs.B:
                return (f"the dense form updates state row i for batch row i: needs a pool of at least B={inputs.B} "
                        f"slots; got N={inputs.N}")
            if not inputs.state[:inputs.B].is_contiguous():
                return (f"the dense form takes the first B slots as one contiguous [B, HV, V, K] tensor: needs a slot "
                        f"stride of HV*V*K={inputs.slot_elements}; got {inputs.slot_stride}")
        if self.form == "gather" and not inputs.state.is_contiguous() and not self._auto_takes_strided_pool(inputs):
            return (f"recurrent_kda refuses a non-contiguous initial_state without cu_seqlens (slot stride "
                    f"{inputs.slot_stride} != HV*V*K={inputs.slot_elements}) in the [B, 1] form with "
                    f"ssm_state_indices, except for H == HV, K = V = 128 with the gate in the kernel")
        return None

    def _auto_takes_strided_pool(self, inputs: DecodeInputs) -> bool:
        # run_recurrent_kda's auto_unbounded_softplus_candidate, the one exemption from its check
        return self.gate_in_kernel and inputs.H == inputs.HV and inputs.K == inputs.V == 128

    def _slots_unsupported(self, inputs: DecodeInputs) -> str | None:
        """What the form rules out from the slot values (read once, at bind time)."""
        if inputs.T > 1:
            if self.form == "dense":
                identity = torch.arange(inputs.B * inputs.T, dtype=inputs.slots.dtype, device=inputs.device)
                if not torch.equal(inputs.slots.flatten(), identity):
                    return ("the dense form (num_spec_tokens, no ssm_state_indices) stores token t of row i in slot "
                            "i*T + t: needs slots == arange(B*T).view(B, T), no -1")
            if bool((inputs.live_rows()[:, None] & (flashinfer_state_indices(inputs) < 0)).any()):
                return ("a -1 after the last slot a row stores into: recurrent_kda skips a token whose "
                        "ssm_state_indices entry is -1 (no decay, no update, output 0), and the adapter applies "
                        "such a token by pointing its store at a later slot of the row, of which there is none")
            return None
        if self.form == "dense":
            identity = torch.arange(inputs.B, dtype=inputs.slots.dtype, device=inputs.device)
            if not torch.equal(inputs.slots, identity):
                return ("the dense form (no ssm_state_indices) updates state row i for batch row i: needs "
                        "slots == arange(B), no -1 rows (a sorted pool of exactly B slots)")
        if self.form == "gather" and bool((inputs.slots < 0).any()):
            return ("in the [B, 1] form the wrapper gathers initial_state[ssm_state_indices] in torch, where -1 is "
                    "the last slot: a -1 row would overwrite slot N-1 and get a non-zero output")
        return None

    def library_arguments(self, inputs: DecodeInputs, out: torch.Tensor
                          ) -> tuple[dict, Callable[[], None] | None]:
        """The keyword arguments of ``recurrent_kda`` for these inputs, and the work to run before
        each call (the precomputed log gate and/or sigmoid(beta); None when there is none)."""
        prepared = None
        if self.precomputes:
            prepared = precompute.precompute(inputs, log_gate=not self.gate_in_kernel, beta=not self.beta_in_kernel,
                                             dtype=torch.bfloat16)  # the only dtype the kernel takes
        g = inputs.a if self.gate_in_kernel else prepared.log_gate
        beta = inputs.b if self.beta_in_kernel else prepared.beta
        if not inputs.update_state:  # [B, T] tensors, one read slot per row, -1 as slot 0 (module docstring)
            def rows(t):
                return t
            placement = dict(initial_state_source=inputs.state, initial_state_indices=inputs.slots.clamp(min=0),
                             disable_state_update=True)
        elif inputs.T > 1:
            rows, placement = self._multitoken_placement(inputs)
        elif self.form == "packed":
            def rows(t):
                return t.unsqueeze(0)  # [1, B, ...]: one sequence of B tokens
            placement = dict(initial_state=inputs.state, ssm_state_indices=inputs.slots,
                             cu_seqlens=torch.arange(inputs.B + 1, dtype=torch.int32, device=inputs.device))
        else:
            def rows(t):
                return t.unsqueeze(1)  # [B, 1, ...]: B sequences of one token
            placement = (dict(initial_state=inputs.state, ssm_state_indices=inputs.slots) if self.form == "gather"
                         else dict(initial_state=inputs.state[:inputs.B]))
        arguments = dict(
            q=rows(inputs.q), k=rows(inputs.k), v=rows(inputs.v), g=rows(g), beta=rows(beta),
            beta_is_logit=self.beta_in_kernel, use_gate_in_kernel=self.gate_in_kernel,
            scale=inputs.effective_scale, output_final_state=False, use_qk_l2norm_in_kernel=True,
            output=rows(out), **placement,
        )
        if self.gate_in_kernel:
            arguments.update(A_log=inputs.A_log, dt_bias=inputs.dt_bias.reshape(-1))
        return arguments, prepared.launch if prepared else None

    def _multitoken_placement(self, inputs: DecodeInputs) -> tuple[Callable, dict]:
        """How a T > 1 call shapes the per-token tensors, and where its rows start and store."""
        B, T = inputs.B, inputs.T
        spec = dict(num_spec_tokens=T - 1, num_accepted_tokens=inputs.num_accepted)
        if self.form == "dense":  # the shim's own indices: token t of row i in slot i*T + t
            return (lambda t: t), dict(initial_state=inputs.state[:B * T], **spec)
        spec.update(initial_state=inputs.state, ssm_state_indices=flashinfer_state_indices(inputs))
        if self.form == "gather":  # [B, T, ...]: the shim packs it itself
            return (lambda t: t), spec
        cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=inputs.device)
        return (lambda t: t.flatten(0, 1).unsqueeze(0)), dict(cu_seqlens=cu_seqlens, **spec)  # a row one sequence

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        if not inputs.update_state:
            return self._frozen_launcher(inputs, out)
        reason = self._slots_unsupported(inputs)  # bind() validated the slots; this reads them once more
        if reason:
            raise Unsupported(f"{self.label}: {reason}")
        recurrent_kda = recurrent_kda_entry_point()
        arguments, prepare = self.library_arguments(inputs, out)

        if prepare is None:
            def launch() -> torch.Tensor:
                recurrent_kda(**arguments)
                return out

            return launch

        def launch_with_precompute() -> torch.Tensor:
            prepare()
            recurrent_kda(**arguments)
            return out

        return launch_with_precompute


    def _frozen_launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        """Frozen verify: the one call, then the padding rows' output zeroed (they read slot 0)."""
        recurrent_kda = recurrent_kda_entry_point()
        arguments, prepare = self.library_arguments(inputs, out)
        live = inputs.live_rows()  # bind() validated the slots; resolved here, outside the launcher
        dead_rows = torch.nonzero(~live).flatten() if not bool(live.all()) else None

        def launch() -> torch.Tensor:
            if prepare is not None:
                prepare()
            recurrent_kda(**arguments)
            if dead_rows is not None:
                out.index_fill_(0, dead_rows, 0)
            return out

        return launch


def flashinfer_state_indices(inputs: DecodeInputs) -> torch.Tensor:
    """``ssm_state_indices`` ``[B, T]`` int32 for a multi-token call: each stored token's slot; in a
    live row, for each -1 the next slot that row stores into (the token is then applied and its
    store overwritten by a later one of the same row), -1 where there is none (a -1 after the
    row's last store: refused); every entry of a padding row -1. Our ``slots`` themselves where
    that is what they already are."""
    slots, stored = inputs.token_slots(), inputs.stored()
    live = inputs.live_rows()
    indices = torch.empty_like(slots)
    following = torch.full_like(slots[:, 0], -1)  # the next slot each row stores into, from token t on
    for t in reversed(range(inputs.T)):
        following = torch.where(stored[:, t], slots[:, t], following)
        indices[:, t] = torch.where(live, following, -1)
    return inputs.slots if torch.equal(indices, slots) else indices
