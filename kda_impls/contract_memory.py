"""The contract's memory rules: dtypes and devices, the pool's strides and alignment, slot values, and
the output buffer."""

from __future__ import annotations

import torch

from .capabilities import Capabilities
from .contract_shapes import Fail
from .dtypes import dtype_name
from .inputs import DecodeInputs

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_dtypes_devices(x: DecodeInputs, fail: Fail) -> None:
    """Activation and parameter dtypes, int32 slots, one device, no grad, contiguous per-row tensors."""
    for name in ("q", "k", "v", "a", "b"):
        t = getattr(x, name)
        if t.dtype not in ACTIVATION_DTYPES:
            fail("dtype", f"{name} dtype must be one of bf16/fp16/fp32; got {dtype_name(t.dtype)}")
        if t.dtype != x.q.dtype:
            fail("dtype", f"{name} dtype must match q's {dtype_name(x.q.dtype)}; got {dtype_name(t.dtype)}")
    for name in ("A_log", "dt_bias"):
        t = getattr(x, name)
        if t.dtype != torch.float32:
            fail("dtype", f"{name} dtype must be float32; got {dtype_name(t.dtype)} (keep gate "
                          f"parameters in fp32: .float())")
    if x.slots.dtype != torch.int32:
        fail("slots", f"slots dtype must be int32; got {dtype_name(x.slots.dtype)} (.to(torch.int32))")
    if x.num_accepted is not None and x.num_accepted.dtype != torch.int32:
        fail("num-accepted", f"num_accepted dtype must be int32; got {dtype_name(x.num_accepted.dtype)} "
                             f"(.to(torch.int32))")
    for name, t in x.tensors().items():
        if t.device != x.state.device:
            fail("device", f"{name} must be on the state's device {x.state.device}; got {t.device}")
        # The pool is updated in place and no implementation records a graph: autograd would
        # refuse the in-place write (naive) or miss it silently (the Triton kernels).
        if t.requires_grad:
            fail("requires-grad", f"{name} must not require grad (decode updates the pool in place "
                                  f"and records no graph); pass {name}.detach() or run under "
                                  f"torch.no_grad()")
    for name, t in x.tensors().items():
        if name == "state":
            continue
        if not t.is_contiguous():
            fail("contiguous", f"{name} must be contiguous; got strides {t.stride()} for shape "
                               f"{tuple(t.shape)} (.contiguous())")


def check_pool_layout(x: DecodeInputs, caps: Capabilities, fail: Fail) -> None:
    """The pool's inner strides compact, slots apart, stride and base aligned as ``caps`` declare."""
    HV, V, K = x.HV, x.V, x.K
    compact = (V * K, K, 1)
    got = tuple(x.state.stride()[1:])
    if got != compact:
        fail("state-inner-strides",
             f"state inner strides must be compact (V*K, K, 1)={compact}; got {got} "
             f"(only the slot stride may be non-compact)")
    per_slot = HV * V * K
    if x.N > 1 and x.slot_stride < per_slot:
        fail("slot-overlap",
             f"state slot stride must be >= HV*V*K={per_slot} elements or slots overlap; "
             f"got {x.slot_stride}")
    byte_offset = x.state.data_ptr() % max(caps.base_alignment, 1)
    if x.slot_stride % caps.slot_stride_multiple or byte_offset:
        fail("pool-alignment",
             f"state slot stride {x.slot_stride} elements must be a multiple of "
             f"{caps.slot_stride_multiple} and the base byte offset {byte_offset} a multiple of "
             f"{caps.base_alignment} (pad each slot to a multiple of {caps.slot_stride_multiple} "
             f"elements and allocate the pool {caps.base_alignment}-byte aligned)")


def check_slots(x: DecodeInputs, fail: Fail) -> None:
    """Slot values in range, named once where stored; num_accepted and a cache's lengths in range.
    Called after the shape and dtype rules: slots are contiguous int32 of the right shape here."""
    if x.B == 0:
        return
    bounds = [x.slots.min(), x.slots.max()]
    if x.num_accepted is not None:
        bounds += [x.num_accepted.min(), x.num_accepted.max()]
    lo, hi, *accepted = torch.stack(bounds).tolist()  # one device sync
    if lo < -1 or hi >= x.N:
        fail("slot-range", f"slots values must be in [-1, N={x.N}); got min {lo}, max {hi}")
    if x.replay:
        _check_lengths(x, fail)
    elif accepted and (accepted[0] < 1 or accepted[1] > x.T):
        fail("num-accepted", f"num_accepted values must be in [1, T={x.T}] (row i starts from slot "
                             f"slots[i, num_accepted[i] - 1]); got min {accepted[0]}, max {accepted[1]}")
    named = x.slots[x.slots >= 0]
    if x.update_state and named.unique().numel() != named.numel():  # frozen verify stores nothing: no race
        dup = named.unique(return_counts=True)
        repeated = dup[0][dup[1] > 1][:4].tolist()
        fail("slot-duplicate",
             f"slots must name each non-negative slot at most once, across rows and tokens (two "
             f"stores to one slot race); got repeated slots {repeated}")

def _check_lengths(x: DecodeInputs, fail: Fail) -> None:
    L, length = x.cache.L, x.cache.length
    if x.N:  # an empty pool has no lengths to bound
        lo, hi = torch.stack([length.min(), length.max()]).tolist()
        if lo < 0 or hi >= L:
            fail("cache-length", f"cache.length values must be in [0, L={L}) (a full ring is flushed); "
                                 f"got min {lo}, max {hi}")
    if x.num_accepted is None:
        return
    live = x.slots >= 0
    accepted = x.num_accepted[live]
    if accepted.numel():  # no live row commits anything
        lo, hi = torch.stack([accepted.min(), (length[x.slots[live].long()] + accepted).max()]).tolist()
        if lo < 0 or hi > L:
            fail("num-accepted", f"num_accepted values must be >= 0 and leave length[slots[i]] + "
                                 f"num_accepted[i] <= L={L} (a commit takes the records a verify left "
                                 f"after the cached ones); got min {lo}, largest sum {hi}")


def check_out(inputs: DecodeInputs, out: torch.Tensor, caps: Capabilities, fail: Fail) -> None:
    """A given output buffer: contiguous, of the output's shape, dtype and device, aligned as ``caps``
    declare, and over no input (the launcher writes it while reading them: overlap races)."""
    shape = inputs.out_shape
    if tuple(out.shape) != shape or out.dtype != inputs.v.dtype or out.device != inputs.device \
            or not out.is_contiguous():
        fail("out", f"out must be a contiguous {shape} {dtype_name(inputs.v.dtype)} tensor on "
                    f"{inputs.device}; got {tuple(out.shape)} {dtype_name(out.dtype)} on {out.device}")
    if out.data_ptr() % caps.base_alignment:
        fail("out", f"out must start {caps.base_alignment}-byte aligned; its byte offset "
                    f"is {out.data_ptr() % caps.base_alignment}")
    start, end = out.data_ptr(), out.data_ptr() + out.nbytes
    cached = inputs.cache.tensors() if inputs.replay else {}
    for name, t in {**inputs.tensors(), **cached}.items():
        t_start = t.data_ptr()
        t_end = t_start + (inputs.pool_span().nbytes if name == "state" else t.nbytes)
        if t.device == out.device and start < t_end and t_start < end:
            what = "the state pool" if name == "state" else name
            fail("out-alias", f"out must not overlap any input; got out (bytes {start:#x}-{end:#x}) "
                              f"overlapping {what} (bytes {t_start:#x}-{t_end:#x})")
