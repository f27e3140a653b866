"""SGLang's ReplaySSM decode (sglang 0.5.23, ``sglang-replayssm``) on the contract's :class:`~kda_impls.ReplayCache`.

The kernel, ``fused_recurrent_linear_replayssm_decode(..., is_kda=True)``
(``sglang/kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py``, imports torch and triton
only; ported from vLLM's ReplaySSM), is the decode of SGLang's ``triton`` KDA backend with
``--enable-linear-replayssm`` (``kda_triton.py``, ``TritonKDAKernel.packed_decode`` with the rings): one
token per row, the checkpoint read every step and written every L steps. Its rings are not the
contract's layout:

- ``d_cache`` ``[N, HV, L, V]`` in the state's dtype: ``sigmoid(b) * (v - S k^)``; the contract's
  ``cache.u``, fp32;
- ``k_cache`` ``[N, H, L, K]`` in the state's dtype: the L2-normalised key per q/k head; the contract's
  ``cache.kg[..., :K]`` holds the raw key per value head;
- ``g_cache`` ``[N, HV, L, K]`` fp32: the log decay ``-exp(A_log) softplus(a + dt_bias)``; the
  contract's ``cache.kg[..., K:]`` holds the raw gate input ``a``;
- ``write_pos`` ``[B]`` int32 per row: records ``0 .. write_pos-1`` valid; the contract's
  ``cache.length`` ``[N]`` per slot

(the memory pool allocates the d and k rings in the SSM state's dtype: ``memory_pool.py``). The row's
step (``write_pos`` = n): output from the checkpoint and records ``0..n-1``; where ``n < L - 1`` the
token's d, k, g records are stored at n; at ``n == L - 1`` (a flush) the new state is written into the
pool and no record is stored. The kernel leaves the cursor to its caller: SGLang's hybrid backend, once
per forward, gathers ``write_pos`` per row from the per-slot cursor and stores back ``0`` after a flush,
else ``write_pos + 1`` (``hybrid_linear_attn_backend.py``). That is the contract's one-token step, its
``length`` the per-slot cursor.

The adapter translates at bind time, outside the launcher: the rings from the cache's records (u in the
state's dtype, each q/k head's key normalised as the kernel normalises, eps 1e-6, the log decay in fp32).
Each launch is a step as SGLang's scheduler and backend take it, plus the contract's records:

1. ``mixed_qkv`` packed from q, k, v (one copy SGLang does not make: its conv1d writes that layout);
2. the cursor's snapshot, ``write_pos = length[slots]`` (-1 rows read slot 0, as SGLang's clamp);
3. the kernel, on the rings and ``cache.length``'s snapshot;
4. one launch of this module (:func:`_commit_kernel`, a program per row and value head): the token's ``u``
   record copied to ``cache.u`` in fp32 from ``d_cache`` (for an fp32 state ``d_cache`` is ``cache.u``
   itself, nothing to copy; none at a flush: the kernel stores no d record there), its raw key and gate
   input to ``cache.kg`` from the step's k and a (SGLang's rings keep only what the raw inputs give, not
   the inputs themselves), and the cursor advanced into ``cache.length``.

So the rings the kernel writes are what its next launch reads, and ``cache`` holds the contract's records
after every launch for a check to read; the timed step includes the copies of 1 and 4, which SGLang does
not make (the kg copy writes ``B*HV*2K`` elements and the u copy ``B*HV*V`` fp32: a few percent of the
checkpoint's read at K = V = 128). A timing over whole ring cycles (L launches) crosses every live
row's flush once, as for the contract's own replay step: the cursor advances in the launch, so it cannot
be skipped (SGLang's issue #38398: a benchmark that never advanced it overstated the speed-up by up to
21%). From the wrapper's checks and the kernel: one token per row, no commit; ``nk = 2`` K-tiles each
at least 16 wide for ``tl.dot`` (K >= 32) and value tiles at least 16 (V >= 16); the reconstruction's
``tl.dot`` takes its operands rounded to the activations' dtype (bf16 tensor cores, TF32 for fp32:
the kernel's comment), and ``sigmoid(b)`` is rounded to b's dtype before use.
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
def _commit_kernel(k_ptr, a_ptr, slots_ptr, write_pos_ptr, d_ptr, u_ptr, kg_ptr, length_ptr, HV: tl.constexpr,
                   GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
                   L: tl.constexpr, COPY_U: tl.constexpr):
    """Per live row and value head: the token's records into the contract's cache; the row's first head
    advances its slot's cursor (every program reads the cursor's snapshot, none the lengths)."""
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
        if hv == 0:
            tl.store(length_ptr + slot, tl.where(n == L - 1, 0, n + 1))


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
    """SGLang's ``d_cache``, ``k_cache``, ``g_cache`` holding the records of ``inputs.cache`` (module docstring)."""
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
               "decay fp32, a per-row write_pos) translated from the cache at bind; each launch packs mixed_qkv, "
               "snapshots write_pos = length[slots], runs the kernel, and copies the token's records into the cache "
               "and advances length (one launch of ours); reconstruction dot in the activations' dtype, sigmoid(b) "
               "rounded to b's dtype")
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
        safe_slots = inputs.slots.clamp(min=0)
        write_pos = torch.empty(inputs.B, dtype=torch.int32, device=inputs.device)
        arguments = self.library_arguments(inputs, out, mixed_qkv, rings, write_pos)
        commit = _commit_kernel[(inputs.B * inputs.HV,)]
        commit_args = (inputs.k, inputs.a, inputs.slots, write_pos, rings["d_cache"], cache.u, cache.kg, cache.length)
        sizes = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V,
                     KP=triton.next_power_of_2(inputs.K), VP=triton.next_power_of_2(inputs.V), L=cache.L,
                     COPY_U=rings["d_cache"] is not cache.u)

        def launch() -> torch.Tensor:
            pack()
            torch.index_select(cache.length, 0, safe_slots, out=write_pos)
            decode(**arguments)
            commit(*commit_args, **sizes, num_warps=1)
            return out

        return launch
