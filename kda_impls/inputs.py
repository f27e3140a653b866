"""The inputs of one KDA decode step, and a generator of realistic random ones."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace

import torch

from .input_rules import refuse, shape_violation, torch_dtype, valid_device
from .replay import ReplayCache


@dataclass
class DecodeInputs:
    """One decode step; the pool ``state`` is updated in place at the slots named in ``slots`` (unless
    ``update_state`` is False: frozen verify, below).

    One token per sequence (today's spelling): q, k ``[B, H, K]``; v ``[B, HV, V]``; a (raw gate
    input) ``[B, HV, K]``; b (beta logit) ``[B, HV]``; slots ``[B]`` int32, -1 marking a padding row.

    T tokens per sequence (multi-token decode, speculative verify; any T >= 1): q, k
    ``[B, T, H, K]``; v ``[B, T, HV, V]``; a ``[B, T, HV, K]``; b ``[B, T, HV]``; slots ``[B, T]``
    int32, the state after token t of row i stored in slot ``slots[i, t]`` (-1: not stored);
    num_accepted ``[B]`` int32 in [1, T] (None: all 1), row i starting from the state in slot
    ``slots[i, num_accepted[i] - 1]``, a row whose start slot is -1 being padding. At T = 1 this
    spelling means exactly what the first one does.

    Either way: A_log ``[HV]`` fp32; dt_bias ``[HV, K]`` or ``[HV*K]`` fp32; state
    ``[N, HV, V, K]`` (only its slot stride may be non-compact); scale defaults to ``K ** -0.5``.

    Frozen verify (``update_state=False``, either spelling, any T): slots ``[B]`` int32, row i
    starting from the state in slot ``slots[i]`` (-1: a padding row, zero output), num_accepted
    None; every token's output is computed and returned as above and no state is stored (the pool,
    its padding and every slot stay bit for bit as they were). A slot may be named by several rows:
    nothing is written, so nothing races.

    Replay (``cache`` a :class:`~kda_impls.ReplayCache`, either spelling, T <= the ring's L): slots
    ``[B]`` int32, row i's state being slot ``slots[i]``'s checkpoint plus its cached records (-1: a
    padding row, zero output, nothing read or written); num_accepted ``[B]`` int32 or None (all 0):
    how many of the records a previous verify left after the cached ones row i commits before its
    tokens. A one-token step appends its token's record and writes the pool slot only when that fills
    the ring; a T-token step (speculative verify) writes its T records without committing them.
    ``kda_impls/reference.py`` (``replay_step``) defines it exactly.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    state: torch.Tensor
    slots: torch.Tensor
    scale: float | None = None
    num_accepted: torch.Tensor | None = None
    update_state: bool = True
    cache: ReplayCache | None = None

    @property
    def replay(self) -> bool:
        """Whether this is a replay step (a :class:`~kda_impls.ReplayCache` given)."""
        return self.cache is not None

    @property
    def one_slot_per_row(self) -> bool:
        """Whether ``slots`` is ``[B]`` in either spelling (frozen verify and replay: the slot a row reads)."""
        return not self.update_state or self.replay

    @property
    def per_token(self) -> bool:
        """Whether the activations are spelled with a token axis (``[B, T, ...]``)."""
        return self.q.dim() == 4

    @property
    def B(self) -> int:
        return self.q.shape[0]

    @property
    def T(self) -> int:
        """Tokens per sequence in this step (1 in the one-token spelling)."""
        return self.q.shape[1] if self.per_token else 1

    @property
    def H(self) -> int:
        return self.q.shape[-2]

    @property
    def K(self) -> int:
        return self.q.shape[-1]

    @property
    def HV(self) -> int:
        return self.v.shape[-2]

    @property
    def V(self) -> int:
        return self.v.shape[-1]

    @property
    def N(self) -> int:
        return self.state.shape[0]

    @property
    def effective_scale(self) -> float:
        return self.K**-0.5 if self.scale is None else float(self.scale)

    @property
    def slot_elements(self) -> int:
        """Elements of one slot's state, ``HV*V*K`` (the slot stride less its padding)."""
        return self.HV * self.V * self.K

    @property
    def slot_stride(self) -> int:
        """Elements between consecutive slots of the pool."""
        return self.state.stride(0)

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def out_shape(self) -> tuple[int, ...]:
        """``[B, HV, V]`` in the one-token spelling, ``[B, T, HV, V]`` in the per-token one."""
        return (self.B, self.T, self.HV, self.V) if self.per_token else (self.B, self.HV, self.V)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by field name (``num_accepted`` only where given; the cache's are its own)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("scale", "update_state", "cache") and getattr(self, f.name) is not None}

    # ---- the per-token view of a step ----------------------------------------------------------
    def token_slots(self) -> torch.Tensor:
        """``[B, T]``: the slot each token's state is stored in (-1: not stored). ``slots`` as ``[B, T]``
        (a view) in either spelling; in frozen verify and replay all -1 (a new tensor): no token's state
        is stored (a replay step's flush is the ring's, not a token's)."""
        if self.one_slot_per_row:
            return torch.full((self.B, self.T), -1, dtype=torch.int32, device=self.slots.device)
        return self.slots.view(self.B, self.T)

    def accepted(self) -> torch.Tensor:
        """``num_accepted``, or all ones where it is None (``[B]`` int32): where rows start from in a
        multi-token step (a replay step's None commits nothing; ``replay_step`` reads it itself)."""
        if self.num_accepted is not None:
            return self.num_accepted
        return torch.ones(self.B, dtype=torch.int32, device=self.slots.device)

    def start_slots(self) -> torch.Tensor:
        """The slot each row starts from, ``slots[i, num_accepted[i] - 1]`` (frozen verify:
        ``slots[i]``; replay: ``slots[i]``) (``[B]`` int64; -1: a padding row). Assumes the contract
        holds (num_accepted in [1, T])."""
        if self.one_slot_per_row:
            return self.slots.long()
        return self.token_slots().long().gather(1, (self.accepted().long() - 1).view(self.B, 1)).view(self.B)

    def live_rows(self) -> torch.Tensor:
        """``[B]`` bool: the rows that are not padding (their start slot is >= 0)."""
        return self.start_slots() >= 0

    def stored(self) -> torch.Tensor:
        """``[B, T]`` bool: where the step stores a state (a live row's token with a slot >= 0)."""
        return self.live_rows()[:, None] & (self.token_slots() >= 0)

    def token(self, t: int) -> "DecodeInputs":
        """Token ``t`` of every row as a one-token step (views; the pool is shared): its q, k, v, a,
        b and ``slots[:, t]`` (frozen verify: ``slots``, still frozen). Where rows start from is not
        part of it: that is ``start_slots``."""
        x = self.per_token_spelling()
        slots = x.slots if x.one_slot_per_row else x.slots[:, t]
        return replace(x, q=x.q[:, t], k=x.k[:, t], v=x.v[:, t], a=x.a[:, t], b=x.b[:, t], slots=slots,
                       num_accepted=None)

    def one_token_spelling(self) -> "DecodeInputs":
        """A T = 1 step in the one-token spelling (views): what implementations without multi-token
        support are handed. num_accepted is dropped (at T = 1 it can only be all ones)."""
        if not self.per_token:
            return self
        if self.T != 1:
            raise ValueError(f"a step of T={self.T} tokens has no one-token spelling")
        return self.token(0)

    def per_token_spelling(self) -> "DecodeInputs":
        """This step with a token axis (views): a one-token step becomes a T = 1 one (frozen verify's
        slots are ``[B]`` in both spellings)."""
        if self.per_token:
            return self
        slots = self.slots if self.one_slot_per_row else self.slots[:, None]
        return replace(self, q=self.q[:, None], k=self.k[:, None], v=self.v[:, None], a=self.a[:, None],
                       b=self.b[:, None], slots=slots)

    def as_frozen(self) -> "DecodeInputs":
        """This step as a frozen verify (views; the pool is shared): every row starts from the slot it
        starts from here and applies the same tokens, and nothing is stored. Its outputs are this
        step's outputs."""
        if not self.update_state:
            return self
        if self.replay:
            raise ValueError("a replay step has no frozen spelling (its state is not one slot's)")
        return replace(self, slots=self.start_slots().to(torch.int32), num_accepted=None, update_state=False)

    # ---- the pool --------------------------------------------------------------------------------
    def pool_span(self) -> torch.Tensor:
        """The pool's whole storage range (slots and the padding between them) as a 1-D view."""
        # a slot's own elements, even where its layout breaks the contract
        span = (self.N - 1) * self.slot_stride + self.state[0].numel() if self.N else 0
        return self.state.as_strided((span,), (1,))  # at the state's own storage offset

    def clone(self) -> "DecodeInputs":
        """A deep copy whose pool keeps the same layout (slot stride, padding bytes)."""
        span = self.pool_span().clone()
        state = span.as_strided(self.state.shape, self.state.stride())
        copies = {name: t.clone() for name, t in self.tensors().items() if name != "state"}
        cache = self.cache.clone() if self.replay else None
        return DecodeInputs(**copies, state=state, scale=self.scale, update_state=self.update_state, cache=cache)

    def nbytes(self) -> int:
        """Bytes a decode step must move: one state read per live row, one state write per stored
        slot, every other input read once, the output written once (in v's dtype). At T = 1 that is
        each live row's state read and written once; in frozen verify each live row's state read once
        and nothing written; in replay each live row's checkpoint read once plus :meth:`replay_bytes`."""
        state_moves = int(self.live_rows().sum()) + int(self.stored().sum())
        out = math.prod(self.out_shape) * self.v.element_size()
        replay = self.replay_bytes() if self.replay else 0
        return state_moves * self.slot_bytes() + self.bytes_besides_pool() + out + replay

    def slot_bytes(self) -> int:
        """Bytes of one slot's state (its padding not counted)."""
        return self.slot_elements * self.state.element_size()

    def replay_bytes(self) -> int:
        """A replay step's bytes besides the checkpoint read, per live row: its cached records read,
        its T records written, its ``length`` read (and written where it changes), and the flush.

        T = 1 is a step's average over the L steps of a ring cycle, as a run of one-token steps
        moves them: (L-1)/2 records read, one written, ``length`` read and written, and the state
        write of the flush, which one step in L does, as 1/L of it. T > 1 (a verify) is this step's
        own: the records its commit leaves cached read, T written, and a state write where it
        flushes (``kda_impls/reference.py``, ``replay_step``)."""
        live = self.live_rows()
        rows, L, record = int(live.sum()), self.cache.L, self.cache.record_bytes()
        if self.T == 1:
            return round(rows * (record * (L - 1) / 2 + record + 8 + self.slot_bytes() / L))
        slots = self.slots.long().clamp(min=0)[live]
        cached = self.cache.length.long()[slots]
        if self.num_accepted is not None:
            cached = cached + self.num_accepted.long()[live]
        flushes = cached + self.T > L
        length_writes = rows if self.num_accepted is not None else int(flushes.sum())
        return (int(cached.sum()) + rows * self.T) * record + (rows + length_writes) * 4 + \
            int(flushes.sum()) * self.slot_bytes()

    def bytes_besides_pool(self) -> int:
        """Bytes of every input but the pool: activations, gate parameters, slots, num_accepted."""
        return sum(t.nbytes for name, t in self.tensors().items() if name != "state")


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


CHECKPOINTS = ("all", "last")


def make_inputs(
    B: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    *,
    T: int = 1,
    checkpoints: str = "all",
    update_state: bool = True,
    ring: int | None = None,
    state_dtype: torch.dtype | str = torch.bfloat16,
    dtype: torch.dtype | str = torch.bfloat16,
    slot_pad: int = 0,
    n_slots: int | None = None,
    pad_rows: int = 0,
    sorted_slots: bool = False,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> DecodeInputs:
    """Random inputs distributed as in a trained Kimi-Linear layer.

    The pool is a strided view of one flat buffer with slot stride ``HV*V*K + slot_pad``; the
    padding holds random bits too, so a kernel that writes it is caught bit-for-bit. ``dtype`` is
    that of q, k, v, a, b; either dtype may be named (``"bf16"``, ``"float32"``). A dtype, device or
    head count the contract refuses is a :class:`~kda_impls.ContractError` here, before anything is drawn.

    T = 1 (the one-token spelling): ``slots`` is a random choice of ``B`` distinct slots out of
    ``n_slots`` (default ``2*B``, so untouched slots exist), in random order unless ``sorted_slots``
    (as a fresh serving pool hands them out), with ``pad_rows`` random rows set to -1.

    T > 1 (the per-token spelling): with ``checkpoints="all"`` every token of a row stores into a
    slot of its own (``B*T`` distinct slots) and ``num_accepted`` is random in [1, T], as a
    speculative verify that keeps the state after every draft token; with ``"last"`` only the last
    token stores (``slots[:, :T-1] = -1``) and ``num_accepted = T``, so each row starts from and
    stores into ``slots[i, T-1]``. The slots are drawn as at T = 1 (``n_slots`` defaults to twice
    the slots stored), a row's slots consecutive in ``sorted_slots`` order; ``pad_rows`` random
    rows are all -1.

    ``update_state=False`` (frozen verify, any T): the ``"last"`` draw as :meth:`DecodeInputs.as_frozen`
    makes it, so the same tensors for a seed as ``checkpoints="last"``: ``slots`` ``[B]``, B distinct
    slots out of ``n_slots`` (default ``2*B``), ``pad_rows`` of them -1; ``checkpoints`` is not used.

    ``ring=L`` (replay, T <= L): the same tensors with a :class:`~kda_impls.ReplayCache` of L records
    per slot drawn after them (so the other tensors are those of the frozen draw): every slot's
    ``length`` uniform in [0, L), its records as a step writes them (raw keys and gate inputs drawn
    as k and a, deltas normal with standard deviation 0.5), the slots past ``length`` filled too.
    """
    for name, value, low in (("B", B, 0), ("H", H, 1), ("HV", HV, 1), ("K", K, 1), ("V", V, 1), ("T", T, 1),
                             ("slot_pad", slot_pad, 0)):
        if not (isinstance(value, numbers.Integral) and value >= low):  # numpy's integers too
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    state_dtype, dtype, dev = torch_dtype("state_dtype", state_dtype), torch_dtype("dtype", dtype), valid_device(device)
    if broken := shape_violation(B, H, HV, pad_rows):
        refuse(*broken)
    if ring is not None:
        if not update_state:
            raise ValueError("ring (replay) needs update_state=True: a replay step writes its records")
        x = make_inputs(B, H, HV, K, V, T=T, update_state=False, state_dtype=state_dtype, dtype=dtype,
                        slot_pad=slot_pad, n_slots=n_slots, pad_rows=pad_rows, sorted_slots=sorted_slots,
                        device=device, seed=seed)
        return replace(x, update_state=True, cache=_random_cache(x, ring, seed))
    if not update_state:
        return make_inputs(B, H, HV, K, V, T=T, checkpoints="last", state_dtype=state_dtype, dtype=dtype,
                           slot_pad=slot_pad, n_slots=n_slots, pad_rows=pad_rows, sorted_slots=sorted_slots,
                           device=device, seed=seed).as_frozen()
    if checkpoints not in CHECKPOINTS:
        raise ValueError(f"checkpoints must be one of {CHECKPOINTS}; got {checkpoints!r}")
    stores_per_row = T if checkpoints == "all" else 1
    stored = B * stores_per_row
    n_slots = max(2 * stored, 1) if n_slots is None else n_slots
    if n_slots < stored:
        need = "B" if stores_per_row == 1 else "B*T"
        raise ValueError(f"n_slots={n_slots} must be >= {need}={stored} (every stored token needs its own slot)")
    # drawn on the target device: a pool of gigabytes would take seconds on the CPU
    gen = torch.Generator(device=dev).manual_seed(seed)

    def rand(*shape, dt=torch.float32, fill=torch.Tensor.normal_):
        return fill(torch.empty(*shape, dtype=torch.float32, device=dev), generator=gen).to(dt)

    rows = (B,) if T == 1 else (B, T)  # T = 1 keeps the one-token spelling and its random stream
    q, k = rand(*rows, H, K, dt=dtype), rand(*rows, H, K, dt=dtype)
    v = rand(*rows, HV, V, dt=dtype)
    a = rand(*rows, HV, K, dt=dtype)
    b = rand(*rows, HV, dt=dtype)
    # Mamba/KDA initialisation: A uniform in [1, 16], dt log-uniform in [1e-3, 1e-1]
    A_log = torch.log(1.0 + 15.0 * rand(HV, fill=torch.Tensor.uniform_))
    dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * rand(HV, K, fill=torch.Tensor.uniform_))
    # rounded to bf16 values, as a checkpoint stored in bf16 gives them: exact in a kernel compiled for a
    # bf16 dt_bias (SGLang's CuTe DSL decode), the same fp32 numbers to every other one
    dt_bias = _inverse_softplus(dt).to(torch.bfloat16).float()

    per_slot = HV * V * K
    stride = per_slot + slot_pad
    flat = (rand(max(n_slots * stride, 1)) * 0.5).to(state_dtype)
    state = flat.as_strided((n_slots, HV, V, K), (stride, V * K, K, 1))

    slots = torch.randperm(n_slots, generator=gen, device=dev)[:stored].to(torch.int32)
    if sorted_slots:
        slots = slots.sort().values
    num_accepted = None
    if T > 1:
        if checkpoints == "all":
            slots = slots.view(B, T)
            num_accepted = torch.randint(1, T + 1, (B,), generator=gen, device=dev, dtype=torch.int32)
        else:
            slots = torch.cat([torch.full((B, T - 1), -1, dtype=torch.int32, device=dev), slots.view(B, 1)], dim=1)
            num_accepted = torch.full((B,), T, dtype=torch.int32, device=dev)
    slots[torch.randperm(B, generator=gen, device=dev)[:pad_rows]] = -1
    return DecodeInputs(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, slots=slots,
                        num_accepted=num_accepted)


def _random_cache(x: DecodeInputs, L: int, seed: int) -> ReplayCache:
    cache = ReplayCache.empty(x.N, L, x.H, x.HV, x.K, x.V, dtype=x.q.dtype, device=x.device)
    gen = torch.Generator(device=x.device).manual_seed(seed + 7919)  # its own stream: the step's tensors unchanged
    cache.length.copy_(torch.randint(L, (x.N,), generator=gen, device=x.device))  # copy_ converts
    cache.u.normal_(generator=gen).mul_(0.5)
    cache.kg.copy_(torch.randn(cache.kg.shape, generator=gen, device=x.device, dtype=torch.float32))  # rounded as .to()
    # a step writes its q/k head's key to each of that head's value heads (GVA): so do the drawn records
    keys = cache.kg[..., : x.K]
    keys.copy_(keys[:, :: x.HV // x.H].repeat_interleave(x.HV // x.H, dim=1))
    return cache
