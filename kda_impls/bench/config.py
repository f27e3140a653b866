"""One benchmark configuration: an implementation and the shape and layout of its inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..inputs import DecodeInputs, make_inputs


@dataclass(frozen=True)
class Config:
    impl: str
    B: int
    H: int
    HV: int
    K: int
    V: int
    slot_pad: int = 0  # elements of padding after each slot of the state pool
    state_dtype: str = "bfloat16"  # a torch dtype name
    pad_rows: int = 0  # batch rows with slot -1

    def key(self) -> str:
        """Stable id of this row (resume, samples.json, regression comparisons); safe as a file name."""
        return (f"{self.impl}_B{self.B}_H{self.H}_HV{self.HV}_K{self.K}_V{self.V}_slotpad{self.slot_pad}"
                f"_{self.state_dtype}_padrows{self.pad_rows}")

    @property
    def torch_state_dtype(self) -> torch.dtype:
        return getattr(torch, self.state_dtype)

    def make_inputs(self, device, seed: int = 0, n_slots: int | None = None, sorted_slots: bool = False
                    ) -> DecodeInputs:
        """Random inputs of this shape and layout (:func:`kda_impls.make_inputs`, drawn on ``device``)."""
        return make_inputs(self.B, self.H, self.HV, self.K, self.V, state_dtype=self.torch_state_dtype,
                           slot_pad=self.slot_pad, n_slots=n_slots, pad_rows=self.pad_rows,
                           sorted_slots=sorted_slots, device=device, seed=seed)

    def at_batch(self, B: int) -> "Config":
        """This configuration at batch ``B``, keeping the share of padding rows (and at least one
        padding row and one live row where the original has them)."""
        if B == self.B:
            return self
        pad_rows = math.ceil(self.pad_rows * B / self.B)
        if self.pad_rows < self.B:
            pad_rows = min(pad_rows, B - 1)
        return replace(self, B=B, pad_rows=pad_rows)
