"""SGLang's ReplaySSM decode (``sglang-replayssm``) on the contract's :class:`~kda_impls.ReplayCache`.

The kernel is ``fused_recurrent_linear_replayssm_decode(..., is_kda=True)`` (sglang 0.5.23,
``kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py``), the decode of SGLang's ``triton``
KDA backend with ``--enable-linear-replayssm``. Its rings, built from the cache at bind:

- ``d_cache [N, HV, L, V]``, state dtype: ``cache.u`` (the same tensor for an fp32 state);
- ``k_cache [N, H, L, K]``, state dtype: the L2-normalised key per q/k head of ``cache.kg[..., :K]``;
- ``g_cache [N, HV, L, K]`` fp32: the log decay of the raw gate input ``cache.kg[..., K:]``;
- ``write_pos [B]``: the row's snapshot of the per-slot cursor ``cache.length``.

A launch is SGLang's step: ``mixed_qkv`` packed (the kernel's input layout), the cursor's snapshot and
advance (one small launch), the kernel. The launcher's ``sync_records`` (never timed:
:func:`kda_impls.replay.sync_records`) copies the step's records into the cache.

Refused: in-place decode, a commit, T > 1, K < 32 or V < 16, a GVA cache whose value heads of one q/k
head hold different keys; on the CPU, all but fp32 activations under ``TRITON_INTERPRET=1``. Details:
docs/semantics.md, "SGLang's kernels".
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..contract import Capabilities, Unsupported
from ..inputs import DecodeInputs
from ..reference import L2_EPS, log_decay
from .sglang_kda import ATTENTION, SGLangKDA, kernel_module, packed_qkv


@triton.jit
def _cursor_kernel(slots_ptr, length_ptr, write_pos_ptr, L: tl.constexpr):
    """SGLang's scheduler's cursor step, a program per row: ``write_pos`` the slot's cursor, the cursor
    advanced (0 after the flush at L - 1). A -1 row keeps its ``write_pos`` (the kernel reads none)."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        n = tl.load(length_ptr + slot)
        tl.store(write_pos_ptr + row, n)
        tl.store(length_ptr + slot, tl.where(n == L - 1, 0, n + 1))


@triton.jit
def _records_kernel(k_ptr, a_ptr, slots_ptr, write_pos_ptr, d_ptr, u_ptr, kg_ptr, HV: tl.constexpr,
                    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
                    L: tl.constexpr, COPY_U: tl.constexpr):
    """Per live row and value head, the step's record at its ``write_pos`` into the contract's cache: the raw
    key and gate input from the step's k and a, ``u`` from ``d_cache`` in fp32."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // HV
    hv = pid % HV
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        n = tl.load(write_pos_ptr + row)
        at = (slot.to(tl.int64) * HV + hv) * L + n
        offs_k = tl.arange(0, KP)
        in_k = offs_k < K
        tl.store(kg_ptr + at * 2 * K + offs_k, tl.load(k_ptr + (row * (HV // GROUP) + hv // GROUP) * K + offs_k,
                                                       mask=in_k), mask=in_k)
        tl.store(kg_ptr + at * 2 * K + K + offs_k, tl.load(a_ptr + pid * K + offs_k, mask=in_k), mask=in_k)
        if COPY_U and n < L - 1:  # a flushing step stores no d record
            offs_v = tl.arange(0, VP)
            tl.store(u_ptr + at * V + offs_v, tl.load(d_ptr + at * V + offs_v, mask=offs_v < V).to(tl.float32),
                     mask=offs_v < V)


@triton.jit
def _mask_probe(x_ptr, n_ptr):
    n = tl.load(n_ptr).to(tl.int64)
    offs = tl.arange(0, 2)
    tl.store(x_ptr + offs, offs.to(tl.float32), mask=(offs < 2) & (n < 1))


@functools.cache
def interpreter_fault() -> str | None:
    """Why Triton's interpreter cannot run SGLang's ReplaySSM kernel, or None: the kernel's stores are
    masked by a block mask and-ed with a scalar comparison, which Triton 3.9's interpreter makes an
    int32 mask that its store rejects (compiled Triton makes it i1)."""
    if not isinstance(_mask_probe, InterpretedFunction):
        return None  # compiled: i1 masks
    try:
        _mask_probe[(1,)](torch.zeros(2), torch.zeros(1, dtype=torch.int32))
    except Exception as exc:  # the interpreter's error, whatever its type, is the reason
        return (f"Triton {triton.__version__}'s interpreter rejects the kernel's masked stores (a block mask and-ed "
                f"with a scalar comparison: {' '.join(str(exc).split())})")
    return None


def sglang_rings(inputs: DecodeInputs) -> dict[str, torch.Tensor]:
    """SGLang's ``d_cache``, ``k_cache``, ``g_cache`` holding the records of ``inputs.cache`` (module
    docstring); each key normalised as the kernel normalises it (eps 1e-6)."""
    cache, K = inputs.cache, inputs.K
    group = inputs.HV // inputs.H
    key = cache.kg[:, ::group, :, :K].float()  # [N, H, L, K]: the value heads of a q/k head hold its one key
    return dict(d_cache=cache.u.to(inputs.state.dtype),  # cache.u itself for an fp32 state (no copy)
                k_cache=(key / torch.sqrt((key * key).sum(-1, keepdim=True) + L2_EPS)).to(inputs.state.dtype),
                g_cache=log_decay(inputs, cache.kg[..., K:], torch.float32).contiguous())


class SGLangReplaySSM(SGLangKDA):
    """SGLang's ReplaySSM decode on the contract's replay step (module docstring)."""

    name = "sglang-replayssm"
    module = f"{ATTENTION}.linear.fused_recurrent_linear_replayssm"
    entry = "fused_recurrent_linear_replayssm_decode"
    variant = ("replay decode only (T = 1, no commit): SGLang's rings (d and normalised k in the state's dtype, log "
               "decay fp32) translated from the cache at bind; each launch packs mixed_qkv, snapshots and advances "
               "the cursor (write_pos = length[slots]; one launch of ours), runs the kernel; the records copied into "
               "the cache untimed (sync_records); reconstruction dot in the activations' dtype, sigmoid(b) rounded "
               "to b's dtype")
    engine_call = "SGLang (--linear-attn-decode-backend triton --enable-linear-replayssm)"
    capabilities = Capabilities(replay=True, min_compute_capability=(8, 0), packages=("triton",))  # bf16 tl.dot

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "triton": triton.__version__}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        if not inputs.replay:
            return ("this is SGLang's ReplaySSM decode: replay steps only (cache=); in-place decode is "
                    "sglang-triton's and sglang-cutedsl's call")
        if inputs.num_accepted is not None:
            return ("the ReplaySSM decode commits no records (num_accepted): SGLang's speculative verify writes "
                    "its ring through another path; num_accepted must be None")
        if inputs.K < 32 or inputs.V < 16:
            return (f"needs K >= 32 and V >= 16 (tl.dot tiles of at least 16: two K-tiles and a value tile); got "
                    f"K={inputs.K}, V={inputs.V}")
        if inputs.B and inputs.N == 0:
            return "the pool has no slots, and the cursor's snapshot reads slot 0 for rows with slot -1"
        reason = super()._extra_unsupported(inputs)
        if reason:
            return reason
        kernel = kernel_module(self.module).fused_recurrent_linear_replayssm_decode_kernel
        interpreted = isinstance(kernel, InterpretedFunction)
        if inputs.device.type == "cpu":
            if not interpreted:
                return ("SGLang's ReplaySSM kernel (Triton) runs on the CPU only under TRITON_INTERPRET=1, set before "
                        "it is loaded")
            if inputs.q.dtype != torch.float32:
                return ("on the CPU fp32 activations only: the kernel's reconstruction tl.dot takes its operands in "
                        "the activations' dtype, which Triton's interpreter multiplies wrongly for bf16/fp16")
            return interpreter_fault()
        if interpreted:
            return ("TRITON_INTERPRET=1 was set when SGLang's ReplaySSM kernel was loaded: it would be interpreted "
                    "on the CPU, not compiled for the GPU")
        return None

    def library_arguments(self, inputs: DecodeInputs, out: torch.Tensor, mixed_qkv: torch.Tensor,
                          rings: dict[str, torch.Tensor], write_pos: torch.Tensor) -> dict:
        """The keyword arguments, as ``TritonKDAKernel.packed_decode`` passes them with the rings."""
        B, HV, K = inputs.B, inputs.HV, inputs.K
        return dict(mixed_qkv=mixed_qkv, a=inputs.a.reshape(B, HV, K), b=inputs.b.reshape(B, HV),
                    A_log=inputs.A_log.reshape(-1), dt_bias=inputs.dt_bias.reshape(HV, K), scale=inputs.effective_scale,
                    initial_state=inputs.state, **rings, out=out.view(B, 1, HV, inputs.V),
                    ssm_state_indices=inputs.slots, write_pos=write_pos, force_flush=None,
                    use_qk_l2norm_in_kernel=True, is_kda=True)

    def _keys_unsupported(self, inputs: DecodeInputs) -> str | None:
        """Under GVA, what the cached keys rule out (read once, at bind time): SGLang's k ring holds one key
        per q/k head, so the value heads of one q/k head must hold the same key in every committed record."""
        group = inputs.HV // inputs.H
        if group == 1:
            return None
        cache, K = inputs.cache, inputs.K
        committed = torch.arange(cache.L, device=inputs.device)[None, :] < cache.length[:, None]  # [N, L]
        keys = cache.kg[..., :K].unflatten(1, (inputs.H, group))  # [N, H, group, L, K]
        differ = (keys != keys[:, :, :1]).any(dim=-1).any(dim=1).any(dim=1) & committed
        if bool(differ.any()):
            return (f"SGLang's k ring holds one key per q/k head, and {int(differ.sum())} committed records hold "
                    f"different keys for the value heads of one q/k head (GVA: a step writes its q/k head's key to "
                    f"each of them)")
        return None

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        reason = self._keys_unsupported(inputs)
        if reason:
            raise Unsupported(f"{self.label}: {reason}")
        decode = self.kernel()
        cache = inputs.cache
        rings = sglang_rings(inputs)
        mixed_qkv, pack = packed_qkv(inputs)
        write_pos = torch.zeros(inputs.B, dtype=torch.int32, device=inputs.device)
        arguments = self.library_arguments(inputs, out, mixed_qkv, rings, write_pos)
        cursor = _cursor_kernel[(inputs.B,)]
        records = _records_kernel[(inputs.B * inputs.HV,)]
        record_args = (inputs.k, inputs.a, inputs.slots, write_pos, rings["d_cache"], cache.u, cache.kg)
        sizes = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V,
                     KP=triton.next_power_of_2(inputs.K), VP=triton.next_power_of_2(inputs.V), L=cache.L,
                     COPY_U=rings["d_cache"] is not cache.u)

        def launch() -> torch.Tensor:
            pack()
            cursor(inputs.slots, cache.length, write_pos, L=cache.L, num_warps=1)
            decode(**arguments)
            return out

        def sync_records() -> None:
            """The last launch's records into the cache, from its rings, write_pos and inputs (not timed)."""
            records(*record_args, **sizes, num_warps=1)

        launch.sync_records = sync_records
        return launch
