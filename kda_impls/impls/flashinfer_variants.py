"""FlashInfer's ``recurrent_kda`` called in its other legal ways for our semantics: each a registered
variant of :class:`~kda_impls.impls.flashinfer_kda.FlashInferKDA` (whose module docstring describes
the forms, the precomputed gate and beta, multi-token decode and frozen verify).

Replay verify (``flashinfer-recoverssm``, a replay step of T >= 2 tokens) is the frozen call with
``correction_cache`` and ``kg_cache`` (``_run_frozen_recurrent_kda``: any call with the caches goes
to ``kda_recoverssm_verify`` in ``kda_decode_wy_output_only.py``, the WY kernel in its vLLM
RecoverSSM drop-in mode; the batched ``[B, T]`` form gets ``cu_seqlens = arange(0, B*T + 1, T)``
built once per shape and ``spec_len = T``, ``null_min=0``: only a negative slot is padding, its
rows output zeros and write no record). It computes every token from the checkpoint alone and
writes token t's records at position t of the slot's ``[slots, HV, T, V]`` fp32 correction and
``[slots, HV, T, 2K]`` bf16 key/gate caches (the raw key and the raw gate input, copied before
the L2 norm, and ``sigmoid(beta) * (v - S k^)``, S the decayed state before the token): our replay
step of T tokens from a slot with no cached records and no commit (records at 0..T-1, not
committed, the pool and the lengths unwritten), and no other. It reads no record and takes no
``num_accepted``, so it refuses a commit, a T = 1 step (which commits its record) and, at bind
time, a live slot whose ``cache.length`` is not 0. The adapter hands views of our caches'
first T positions (the kernel addresses them by their strides; their shape must be
``(N, HV, T, ...)``). From its checks: H == HV (GQA raises NotImplementedError), K == V == 128,
1 <= T <= 16, bf16 activations and pool, the pool's slot stride a multiple of 8 elements (16
bytes; padding between slots taken, never copied), every tensor 16-byte aligned; beta is always a
logit there (the drop-in forces it) and the gate is the in-kernel one (so the key/gate cache holds
the raw ``a``, as ours). Its docstring: the WY form's ``exp(-G)`` factors overflow where the
softplus log decay summed over the T tokens passes about 85.
"""

from __future__ import annotations

import torch

from ..contract import Capabilities, Unsupported
from ..inputs import DecodeInputs
from .flashinfer_kda import FlashInferKDA, recurrent_kda_entry_point


class FlashInferSigmoid(FlashInferKDA):
    name = "flashinfer-sigmoid"
    variant = ("packed + ssm_state_indices as flashinfer; gate in kernel, beta pre-sigmoided (one Triton launch, "
               "rounded to bf16: beta off by up to 2^-8 relative); H == HV only; frozen verify as flashinfer")
    engine_call = "SGLang (FlashInfer KDA backend, cute-dsl decode)"
    beta_in_kernel = False


class FlashInferLogGate(FlashInferKDA):
    name = "flashinfer-loggate"
    variant = ("packed + ssm_state_indices as flashinfer; log gate precomputed per value head (one Triton launch, "
               "rounded to bf16: decay off by up to |g|*2^-8 relative), beta logit in kernel; GVA right; frozen verify "
               "as flashinfer")
    gate_in_kernel = False


class FlashInferLogGateSigmoid(FlashInferKDA):
    name = "flashinfer-loggate-sigmoid"
    variant = ("packed + ssm_state_indices as flashinfer; log gate and sigmoid(beta) precomputed in one Triton "
               "launch, both rounded to bf16 (up to 2^-8 relative each); GVA right; frozen verify as flashinfer")
    gate_in_kernel = False
    beta_in_kernel = False


class FlashInferGather(FlashInferKDA):
    name = "flashinfer-gather"
    variant = ("[B, 1] + ssm_state_indices, no cu_seqlens: the wrapper gathers and scatters the state rows in torch "
               "(two more passes); gate and sigmoid in kernel; no -1 rows, H == HV only; T > 1: [B, T] + "
               "num_spec_tokens, packed by the wrapper (a cu_seqlens arange per call; no gather, -1 rows taken)")
    form = "gather"


class FlashInferDense(FlashInferKDA):
    name = "flashinfer-dense"
    variant = ("FlashInfer's own benchmark: dense [B, 1], no indices, state[:B] in place; log gate and sigmoid(beta) "
               "precomputed (one Triton launch, bf16 as loggate-sigmoid); needs slots == arange(B), compact pool; "
               "T > 1: [B, T] + num_spec_tokens, indices arange(B*T) built by the wrapper per call (slots must be "
               "them)")
    gate_in_kernel = False
    beta_in_kernel = False
    form = "dense"


class FlashInferRecoverSSM(FlashInferKDA):
    """FlashInfer's verify-with-records call (module docstring, "Replay verify")."""

    name = "flashinfer-recoverssm"
    variant = ("replay verify only: [B, T] + disable_state_update=True with correction_cache/kg_cache (vLLM "
               "RecoverSSM's records, views of the cache's first T positions), initial_state_indices [B]; from the "
               "checkpoint (every live slot's length 0, no commit), 2 <= T <= 16, H == HV; gate and sigmoid in kernel")
    capabilities = Capabilities(devices=("cuda",), state_dtypes=(torch.bfloat16,), k_values=(128,), v_values=(128,),
                                k_equals_v=True, gva=False, slot_stride_multiple=8, base_alignment=16,
                                min_compute_capability=(9, 0), packages=("flashinfer", "cutlass", "tvm_ffi"),
                                max_tokens=16, replay=True)  # T = 1: _form_unsupported says why

    def _as_read(self, inputs: DecodeInputs) -> DecodeInputs:
        return inputs  # the [B, T] call only; a T = 1 step is refused in either spelling

    def _tensors_passed(self, inputs: DecodeInputs) -> dict[str, torch.Tensor]:
        passed = dict(q=inputs.q, k=inputs.k, v=inputs.v, a=inputs.a, b=inputs.b, slots=inputs.slots,
                      A_log=inputs.A_log, dt_bias=inputs.dt_bias)  # the pool's and out's base: the contract's
        return passed | ({"cache.u": inputs.cache.u, "cache.kg": inputs.cache.kg} if inputs.replay else {})

    def _form_unsupported(self, inputs: DecodeInputs) -> str | None:
        if not inputs.replay:
            return ("this variant is recurrent_kda's verify with RecoverSSM records (replay, cache= given) only; "
                    "in-place decode and frozen verify are the flashinfer variants' calls")
        if inputs.T == 1:
            return ("a one-token replay step commits its record (length 0 -> 1), which recurrent_kda's verify leaves "
                    "to a commit kernel: T >= 2 only")
        if inputs.num_accepted is not None:
            return ("recurrent_kda's verify takes no num_accepted (it reads no cached record and commits none): "
                    "num_accepted must be None")
        return None

    def _lengths_unsupported(self, inputs: DecodeInputs) -> str | None:
        """What the cache's lengths rule out (read once, at bind time)."""
        cached = inputs.cache.length[inputs.slots[inputs.slots >= 0].long()]
        if bool((cached != 0).any()):
            return (f"recurrent_kda's verify computes from the checkpoint alone and writes its records from position "
                    f"0: every live slot's cache.length must be 0; got {int((cached != 0).sum())} with cached records "
                    f"(up to {int(cached.max())})")
        return None

    def library_arguments(self, inputs: DecodeInputs, out: torch.Tensor) -> tuple[dict, None]:
        T = inputs.T
        return dict(q=inputs.q, k=inputs.k, v=inputs.v, g=inputs.a, beta=inputs.b, A_log=inputs.A_log,
                    dt_bias=inputs.dt_bias.reshape(-1), scale=inputs.effective_scale, output_final_state=False,
                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, beta_is_logit=True, output=out,
                    initial_state_source=inputs.state, initial_state_indices=inputs.slots, disable_state_update=True,
                    correction_cache=inputs.cache.u[:, :, :T], kg_cache=inputs.cache.kg[:, :, :T]), None

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        reason = self._lengths_unsupported(inputs)  # bind() validated the lengths' range; this reads them once more
        if reason:
            raise Unsupported(f"{self.label}: {reason}")
        recurrent_kda = recurrent_kda_entry_point()
        arguments, _ = self.library_arguments(inputs, out)

        def launch() -> torch.Tensor:
            recurrent_kda(**arguments)
            return out

        return launch
