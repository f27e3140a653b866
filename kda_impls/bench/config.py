"""One benchmark configuration: an implementation, the shape of its inputs (every field an axis of a
sweep, slot padding included), and how its state pools lie in memory (:class:`PoolLayout`, one for a
whole run). The axes, the result columns and the sort order are derived from these dataclasses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import torch

from ..inputs import DecodeInputs, make_inputs

SLOT_ORDERS = ("random", "sorted")
CHECKPOINTS = ("all", "last")
# inplace: the pool updated in place; frozen: frozen verify (update_state=False), every token's output
# from the row's start state, nothing stored; replay: cached-input replay (a ReplayCache of `ring` records
# per slot), the pool slot written only when a step fills the ring
MODES = ("inplace", "frozen", "replay")


@dataclass(frozen=True)
class PoolLayout:
    """Where a row's state lives: part of its configuration, recorded in every row and its key.

    ``slots_per_row``: timed pools hold ``slots_per_row`` times the slots the rows store (B, or B*T
    with a checkpoint per token), the rows' drawn among them (1: every slot live, the least memory
    for the same bytes moved; a serving pool holds more).
    ``slot_order``: the rows name their slots in ``random`` order (a pool in use) or ``sorted``
    (a fresh pool's order; with one slot per row that is ``arange(B)``, the dense layout of the
    simplest benchmarks).
    ``placements``: independent allocations a row is timed on (fresh pools behind a spacer of
    random size, so that their pages differ); the kernel time is the mean over them, their
    spread a column of its own. Where a pool lands moved one kernel by up to 6% on the H200.
    """

    slots_per_row: int = 1
    slot_order: str = "random"
    placements: int = 3

    def __post_init__(self):
        if self.slots_per_row < 1:
            raise ValueError(f"slots_per_row must be >= 1; got {self.slots_per_row}")
        if self.slot_order not in SLOT_ORDERS:
            raise ValueError(f"slot_order must be one of {', '.join(SLOT_ORDERS)}; got {self.slot_order!r}")
        if self.placements < 1:
            raise ValueError(f"placements must be >= 1; got {self.placements}")

    def key(self) -> str:
        return f"spr{self.slots_per_row}_{self.slot_order}_pl{self.placements}"


@dataclass(frozen=True)
class Config:
    impl: str
    B: int
    H: int
    HV: int
    K: int
    V: int
    state_dtype: str = "bfloat16"  # a torch dtype name
    pad_rows: int = 0  # batch rows with slot -1
    T: int = 1  # tokens per row (speculative verify: T > 1)
    checkpoints: str = "all"  # T > 1: the state stored after every token, or after the last only
    mode: str = "inplace"  # one of MODES
    ring: int = 0  # replay: records per slot (the ring's L); 0: no ring (the other modes)
    slot_pad: int = 0  # elements of padding after each state slot (slot stride HV*V*K + slot_pad)
    layout: PoolLayout = field(default_factory=PoolLayout)

    def __post_init__(self):
        if self.slot_pad < 0:
            raise ValueError(f"slot_pad must be >= 0; got {self.slot_pad}")
        if self.checkpoints not in CHECKPOINTS:
            raise ValueError(f"checkpoints must be one of {', '.join(CHECKPOINTS)}; got {self.checkpoints!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.mode != "replay" and self.ring:
            raise ValueError(f"ring is the record ring of mode replay only; got ring={self.ring} with mode {self.mode}")
        if self.mode == "replay" and self.ring < self.T:
            raise ValueError(f"mode replay needs ring >= T (a step's records must fit in the ring; --ring L): "
                             f"got ring={self.ring}, T={self.T}")
        if self.mode == "replay" and self.T != 1:
            # a verify leaves its records uncommitted: of repeated timed steps only the first would flush,
            # so the bytes counted (each step's own) would not be the ones timed
            raise ValueError(f"mode replay times one-token decode steps: T must be 1 (a T > 1 replay step is a "
                             f"verify whose records wait for a commit); got T={self.T}")
        # one token: both store it; frozen verify and replay: neither stores. One spelling, one key.
        if (self.T == 1 or self.mode != "inplace") and self.checkpoints != "all":
            object.__setattr__(self, "checkpoints", "all")

    def key(self) -> str:
        """Stable id of this row (resume, samples.json, regression comparisons); safe as a file name."""
        tokens = (f"T{self.T}frozen" if self.mode == "frozen" else f"T{self.T}ring{self.ring}" if self.mode == "replay"
                  else "T1" if self.T == 1 else f"T{self.T}{self.checkpoints}")
        return (f"{self.impl}_B{self.B}_H{self.H}_HV{self.HV}_K{self.K}_V{self.V}_{tokens}_{self.state_dtype}"
                f"_padrows{self.pad_rows}_slotpad{self.slot_pad}_{self.layout.key()}")

    def columns(self) -> dict:
        """The configuration as flat result columns (the layout's fields beside the shape's)."""
        flat = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "layout"}
        return flat | asdict(self.layout)

    @classmethod
    def from_columns(cls, row: dict) -> "Config":
        """The configuration a result row (:meth:`columns`, plus any other columns) was measured on; an
        axis the row lacks (measured before the axis existed) takes its default."""
        layout = PoolLayout(**{f.name: _plain(row[f.name]) for f in fields(PoolLayout)})
        return cls(**{f.name: _plain(row[f.name]) for f in fields(cls) if f.name != "layout" and f.name in row},
                   layout=layout)

    @property
    def torch_state_dtype(self) -> torch.dtype:
        return getattr(torch, self.state_dtype)

    def make_inputs(self, device, seed: int = 0, *, timed: bool = True) -> DecodeInputs:
        """Random inputs of this shape (:func:`kda_impls.make_inputs`, drawn on ``device``): laid out
        as the layout says when ``timed``; for the correctness check (``timed=False``), in a pool of
        twice the slots the rows need, so that untouched slots exist to be checked. A replay row's cache
        has ``ring`` records per slot, each slot's length drawn in [0, ring)."""
        stored = self.B * (self.T if self.checkpoints == "all" and self.mode == "inplace" else 1)
        n_slots = self.layout.slots_per_row * stored if timed else None
        return make_inputs(self.B, self.H, self.HV, self.K, self.V, T=self.T, checkpoints=self.checkpoints,
                           state_dtype=self.torch_state_dtype, slot_pad=self.slot_pad, n_slots=n_slots,
                           pad_rows=self.pad_rows, sorted_slots=self.layout.slot_order == "sorted", device=device,
                           seed=seed, update_state=self.mode != "frozen", ring=self.ring or None)


def _plain(value):
    """A value read back from a CSV or JSON row as the plain Python type a Config holds."""
    return value.item() if hasattr(value, "item") else value


# The sweep's axes (every field of a Config but the implementation and the run-wide layout), the result
# columns that name a configuration, and the order rows are sorted in: by shape, batch size last.
AXES = tuple(f.name for f in fields(Config) if f.name not in ("impl", "layout"))
CONFIG_COLUMNS = ["impl", *AXES, *(f.name for f in fields(PoolLayout))]
SORT_COLUMNS = [c for c in CONFIG_COLUMNS if c != "B"] + ["B"]
