"""Our Triton kernels' tile configs: one form of the step each, the table's choice per shape.

A :class:`TileConfig` names the tile and the form of the in-place and multi-token kernels; the
committed table (``tuning.json``, read by :mod:`.tuning`) keys one by ``(state dtype, HV, K, V, B, T)``;
:func:`choose_config` looks a shape up (nearest tabled T, then B) and :func:`heuristic_config`
covers shapes the table lacks. ``KDA_TRITON_CONFIG`` (``"BV=32,num_warps=4"``) replaces fields of the
choice for every shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from .tuning import TABLE

CONFIG_ENV = "KDA_TRITON_CONFIG"


@dataclass(frozen=True)
class TileConfig:
    """How the kernels tile one step (each field's measured effect: docs/triton-kernel.md).

    ``BV``: state rows per tile (power of two); ``num_warps``: warps per program;
    ``programs_per_sm``: 0 launches one program per tile, n > 0 the persistent form
    (:func:`.inplace._kda_decode_persistent_kernel`, one-token steps): n programs per SM walking the
    tiles; ``lookahead``: the persistent form's, 1 the next tile's loads in flight in registers, 0
    only the coming tiles' slots; ``subtiles``: consecutive ``BV``-row tiles of a head one program
    walks, the gate computed once for them and the next tile's load in flight (one-token steps,
    one program per tile); ``const_heads``: 1 compiles the head counts into the one-token kernel (a
    shorter path to the first load), 0 passes them at run time (fewer registers for some tiles; the
    persistent form and the multi-token kernel always compile them in); ``state_first``: where a
    one-tile program issues its state load: 0 after the small inputs' loads and the gate, 1 before
    them (sub-tiles, the persistent form and the multi-token kernel always), 2 between the loads and
    the gate; ``rewiden``: 1 widens the stored tile to fp32 twice (:func:`.gate._delta_rule_rewidened`),
    0 once; ``load_evict_first`` and ``store_evict_first``: 1 marks the state's loads or stores
    ``evict_first`` (the state is touched once a step), 0 leaves them unhinted; ``fast_gate``: 1
    computes the gate and norms in base 2 on MUFU's approximations (:func:`.gate._token_gate`), 0 with
    libdevice; ``tiled_inputs``: 1 loads a one-tile, one-token program's q, k, a and dt_bias as
    ``[BV, K]`` tiles in the state tile's layout and computes the gate per row, 0 as ``[K]`` vectors."""

    BV: int
    num_warps: int = 4
    programs_per_sm: int = 0
    subtiles: int = 1
    const_heads: int = 0
    state_first: int = 0
    rewiden: int = 0
    lookahead: int = 1
    load_evict_first: int = 1
    store_evict_first: int = 1
    fast_gate: int = 0
    tiled_inputs: int = 0

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    @classmethod
    def parse(cls, text: str, base: "TileConfig", source: str = CONFIG_ENV) -> "TileConfig":
        """``base`` with the fields named in ``text`` (``"BV=32,num_warps=4"``) replaced."""
        allowed = {f.name for f in fields(cls)}
        changes = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = (s.strip() for s in item.partition("="))
            if not sep or name not in allowed:
                raise ValueError(f"{source}={text!r}: {item!r} is not NAME=VALUE with NAME one of "
                                 f"{', '.join(sorted(allowed))}")
            try:
                changes[name] = int(value)
            except ValueError:
                raise ValueError(f"{source}={text!r}: {name} must be an integer; got {value!r}") from None
        config = replace(base, **changes)
        config.validate(source=f"{source}={text!r}")
        return config

    def validate(self, source: str = "tile config") -> None:
        def power_of_two(n):
            return n >= 1 and n & (n - 1) == 0

        if not (power_of_two(self.BV) and self.BV <= 256):
            raise ValueError(f"{source}: BV must be a power of two in 1..256; got {self.BV}")
        if not (power_of_two(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"{source}: num_warps must be a power of two in 1..32; got {self.num_warps}")
        if not 0 <= self.programs_per_sm <= 64:
            raise ValueError(f"{source}: programs_per_sm must be in 0..64; got {self.programs_per_sm}")
        if not (power_of_two(self.subtiles) and self.subtiles <= 64):
            raise ValueError(f"{source}: subtiles must be a power of two in 1..64; got {self.subtiles}")
        if self.state_first not in (0, 1, 2):
            raise ValueError(f"{source}: state_first must be 0, 1 or 2; got {self.state_first}")
        for flag in ("const_heads", "rewiden", "lookahead", "load_evict_first", "store_evict_first",
                     "fast_gate", "tiled_inputs"):
            if getattr(self, flag) not in (0, 1):
                raise ValueError(f"{source}: {flag} must be 0 or 1; got {getattr(self, flag)}")

    def fitted(self, V: int, T: int = 1) -> "TileConfig":
        """This config made legal for a shape: a tile no taller than V, no more sub-tiles than V holds.
        Sub-tiles, runtime head counts, the state load's place, the rewidened tile and tiled inputs are
        the one-token kernel's, the persistent form and ``lookahead`` one-token steps' only: T > 1 drops
        them; the persistent form walks whole tiles with the head counts compiled in; sub-tiles load the
        state first."""
        BV = min(self.BV, V)
        fitted = replace(self, BV=BV, subtiles=min(self.subtiles, V // BV),
                         lookahead=self.lookahead if self.programs_per_sm and T == 1 else 1)
        if T > 1:
            return replace(fitted, programs_per_sm=0, subtiles=1, const_heads=1, state_first=1, rewiden=0,
                           tiled_inputs=0)
        if fitted.programs_per_sm:
            return replace(fitted, subtiles=1, const_heads=1, state_first=1, rewiden=0, tiled_inputs=0)
        return replace(fitted, state_first=fitted.state_first or 1) if fitted.subtiles > 1 else fitted


def table_key(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int = 1) -> tuple:
    # fp16 state moves the same bytes as bf16, so it shares bf16's entries.
    dtype = "float32" if state_dtype == torch.float32 else "bfloat16"
    return (dtype, HV, K, V, B, T)


def _nearest(tabled, wanted: int) -> int:
    """The tabled value nearest ``wanted`` in log2; a tie goes to the larger."""
    log = math.log2(max(wanted, 1))
    return min(tabled, key=lambda x: (abs(math.log2(x) - log), -x))


def tile_shape(K: int, V: int, element_size: int, tile_bytes: int, bytes_per_thread: int = 64) -> tuple[int, int]:
    """``(BV, num_warps)`` of a ``[BV, K]`` state tile of about ``tile_bytes``, each thread holding
    about ``bytes_per_thread`` of it (1 to 8 warps)."""
    BV = max(1, min(V, tile_bytes // (K * element_size)))
    return BV, max(1, min(8, BV * K * element_size // (bytes_per_thread * 32)))


def heuristic_config(K: int, V: int, element_size: int, B: int) -> TileConfig:
    """The config for a shape the table lacks: 64 bytes of state per thread (four 16-byte loads in
    flight), 8 KiB tiles, halved below B=16 so that small batches still spread over the SMs."""
    BV, num_warps = tile_shape(K, V, element_size, 8192 if B >= 16 else 4096)
    return TileConfig(BV=BV, num_warps=num_warps)


def choose_config(state_dtype: torch.dtype, HV: int, K: int, V: int, B: int, T: int = 1) -> TileConfig:
    """The table's entry for this shape and state dtype at the tabled tokens per row nearest ``T``,
    then the tabled batch size nearest ``B`` (both in log2; ties go to the larger), else
    :func:`heuristic_config`. A multi-token step whose shape has only one-token entries takes those."""
    dtype = table_key(state_dtype, HV, K, V, B, T)[0]
    tabled = {key[4:]: text for key, text in TABLE.items() if key[:4] == (dtype, HV, K, V)}
    if not tabled:
        return heuristic_config(K, V, state_dtype.itemsize, B)
    tokens = _nearest({t for _, t in tabled}, T)
    batch = _nearest({b for b, t in tabled if t == tokens}, B)
    source = f"tuning.TABLE{(dtype, HV, K, V, batch, tokens)}"
    return TileConfig.parse(tabled[batch, tokens], TileConfig(BV=V), source=source)

