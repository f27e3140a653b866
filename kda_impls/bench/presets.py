"""Named sweeps, and ad-hoc grids from the command line: which configurations, and how long to time
each.

A preset is a union of grids (each a cartesian product over the axes it names; unnamed axes take
:class:`Config`'s defaults) crossed with the implementations, plus the timing budgets. Axes given on
the command line narrow a preset to the values they list, or, without a preset, are the grid
(:func:`adhoc_configs`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .config import AXES, SORT_COLUMNS, Config, PoolLayout
from .timing import Budget

POW2_TO_512 = tuple(1 << i for i in range(10))
BF16_FP32 = ("bfloat16", "float32")
DEFAULT_LAYOUT = PoolLayout()

# A preset's budgets: kernel sampling, call sampling, and in how many worker processes a GPU sweep
# times each row (Method.placement_processes; the CPU's rows, not ranked, always in one).
# kimi-linear-48b is 60 configurations x every implementation and must finish in about a minute on
# the H200, compilation included: ~40 ms of kernel sampling (over all placements) and ~15 ms of call
# sampling per row at most (rows that converge stop sooner), one process a row. The other presets buy
# tighter medians with more time, and three processes a row: on the H200 one of fla's kernels sat
# 2.7% higher in one process's 27 placements than in two others' (Kruskal-Wallis p = 0.007), and with
# three processes a row three runs of the published preset kept every row at B >= 16 within 2% (1.74%)
# (docs/timing.md, "Three runs of the `published` preset"), at 280-312 s a run against 183-240 s.
FAST = (Budget(min_samples=12, max_samples=600, max_seconds=0.04),
        Budget(min_samples=10, max_samples=300, max_seconds=0.015), 1)
THOROUGH = (Budget(min_samples=30, max_samples=3000, max_seconds=0.25),
            Budget(min_samples=20, max_samples=1000, max_seconds=0.1), 3)
CPU_SIZED = (Budget(min_samples=2, max_samples=30, max_seconds=0.02),
             Budget(min_samples=2, max_samples=30, max_seconds=0.01), 1)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    grids: tuple[dict, ...]
    kernel: Budget
    call: Budget
    placement_processes: int  # on a GPU

    def configs(self, impls: list[str], layout: PoolLayout = DEFAULT_LAYOUT, only: dict | None = None
                ) -> list[Config]:
        """Every configuration of every grid for each implementation, without duplicates, skipping
        combinations with more padding rows than rows, each with ``layout``. ``only`` ({axis: values})
        keeps the configurations whose axes take one of the listed values. Grouped by implementation, shape-major."""
        configs = {}
        for grid in self.grids:
            unknown = set(grid) - set(AXES)
            if unknown:
                raise ValueError(f"preset {self.name}: unknown axes {sorted(unknown)}")
            for values in itertools.product(*grid.values()):
                axes = dict(zip(grid, values, strict=True))
                if axes.get("pad_rows", 0) > axes["B"]:
                    continue  # more padding rows than rows
                if axes.get("mode") != "replay":
                    axes.pop("ring", None)  # a ring is replay's: the grid's other modes have none
                for impl in impls:  # one key for what Config spells one way (T = 1 or frozen: checkpoints all)
                    cfg = Config(impl=impl, **axes, layout=layout)
                    configs[cfg.key()] = cfg
        kept = [c for c in configs.values() if _matches(c, only or {})]
        return sorted(kept, key=lambda c: (impls.index(c.impl), *(c.columns()[k] for k in SORT_COLUMNS[1:])))


def _matches(cfg: Config, only: dict) -> bool:
    columns = cfg.columns()  # rings narrow the replay rows only: the rows beside them have none
    return all(columns[axis] in values or (axis == "ring" and cfg.mode != "replay") for axis, values in only.items())


def adhoc_configs(impls: list[str], axes: dict, layout: PoolLayout = DEFAULT_LAYOUT) -> list[Config]:
    """The grid of the axes given on the command line alone (``{axis: values}``), in a preset's
    order: Kimi-Linear's layer for what is not given (B 1, 16, 64, 256; HV 32; K 128; bf16 state;
    no slot padding, no padding rows), with H = HV and V = K unless given."""
    grid = {"B": (1, 16, 64, 256), "H": (None,), "HV": (32,), "K": (128,), "V": (None,)} | axes
    points = []
    for values in itertools.product(*grid.values()):
        point = dict(zip(grid, values, strict=True))
        point["H"] = point["H"] or point["HV"]
        point["V"] = point["V"] or point["K"]
        points.append({axis: (value,) for axis, value in point.items()})
    return Preset("adhoc", "the command line's axes", tuple(points), *THOROUGH).configs(impls, layout)


def _kimi_grid():
    return dict(B=POW2_TO_512, H=(32,), HV=(32,), K=(128,), V=(128,), slot_pad=(0, 16, 64), state_dtype=BF16_FP32)


def _gva_grids():
    # value heads shared by 2, 4 and 8 q/k heads (Qwen3-Next's gated delta net is H=16, HV=32)
    return tuple(dict(B=(1, 8, 64, 256), H=(h,), HV=(hv,), K=(128,), V=(128,), state_dtype=BF16_FP32)
                 for h, hv in ((16, 32), (8, 32), (4, 32), (32, 64), (16, 64)))


def _shapes_grids():
    return tuple(dict(B=(1, 32, 256), H=(hv,), HV=(hv,), K=(64, 128, 256), V=(64, 128, 256)) for hv in (16, 32, 64))


def _targets_grids():
    # the Triton kernel's targets: K = V = 64 and 128, H = HV 16-64, bf16 and fp32 state, padded or not
    return tuple(dict(B=(1, 16, 64, 256), H=(hv,), HV=(hv,), K=(d,), V=(d,), slot_pad=(0, 64), state_dtype=BF16_FP32)
                 for hv in (16, 32, 64) for d in (64, 128))


def _published_grids():
    # the shapes of the FlashInfer / fla-core timing table in the Triton issue (H = HV)
    return (dict(B=(1, 16, 64, 256), H=(32,), HV=(32,), K=(128,), V=(128,), state_dtype=BF16_FP32),
            dict(B=(256,), H=(64,), HV=(64,), K=(128,), V=(128,), state_dtype=BF16_FP32),
            dict(B=(256,), H=(32,), HV=(32,), K=(64,), V=(64,), state_dtype=BF16_FP32))


def _spec_decode_grids():
    # speculative verify at Kimi-Linear's layer: T tokens per row, the state stored after each or
    # after the last only (T = 1 is the ordinary step, for reference)
    return (dict(B=(1, 8, 32, 128), H=(32,), HV=(32,), K=(128,), V=(128,), T=(1, 2, 4, 8),
                 checkpoints=("all", "last"), state_dtype=BF16_FP32),)


def _frozen_verify_grids():
    # frozen verify beside an in-place step of the same T tokens storing the last state only (what a
    # verify that commits afterwards writes), at Kimi-Linear's layer and twice its heads
    return tuple(dict(B=(1, 16, 32, 64, 128, 256), H=(hv,), HV=(hv,), K=(128,), V=(128,), T=(1, 2, 4, 8),
                      checkpoints=("last",), mode=("inplace", "frozen")) for hv in (32, 64))


def _replay_grids():
    # replay beside our in-place kernel per step (averaged over the ring's L steps, flush included): the
    # issue's target shapes (T = 1, HV 32/64, K = V = 128, bf16 and fp32 state), rings of 8, 16 and 32
    return tuple(dict(B=(1, 16, 32, 64, 128, 256), H=(hv,), HV=(hv,), K=(128,), V=(128,), state_dtype=BF16_FP32,
                      mode=("inplace", "replay"), ring=(8, 16, 32)) for hv in (32, 64))


def _spec_step_grids():
    # a speculative step of T draft tokens done both ways (bench/spec_step.py sets them side by side):
    # a checkpointing verify (in place, the state stored after every token), or a frozen verify and then
    # the commit of the a accepted tokens (in place, the last state stored: T = a for a in 1..T)
    shape = dict(B=(1, 16, 32, 64, 128, 256), H=(32,), HV=(32,), K=(128,), V=(128,))
    return (shape | dict(T=(2, 4, 8), checkpoints=("all",)), shape | dict(T=(2, 4, 8), mode=("frozen",)),
            shape | dict(T=tuple(range(1, 9)), checkpoints=("last",)))


def _tiny(**axes):
    return dict(B=(4,), H=(2,), HV=(2,), K=(16,), V=(16,)) | {k: (v,) for k, v in axes.items()}


PRESETS = {
    p.name: p
    for p in (
        # seven rows an implementation: a batch axis, slot padding beside its unpadded row (the padding
        # chart), grouped value heads with an fp32 state and a padding row, both multi-token forms and
        # frozen verify
        Preset("smoke", "CPU-sized: tiny shapes touching every axis; seconds, Triton under TRITON_INTERPRET=1",
               (_tiny() | {"B": (1, 4)}, _tiny(slot_pad=8), _tiny(H=1, HV=2, K=32, V=16, state_dtype="float32",
                                                                 pad_rows=1),
                _tiny(T=2), _tiny(T=3, checkpoints="last"), _tiny(T=2, mode="frozen")),
               *CPU_SIZED),
        Preset("kimi-linear-48b", "Kimi-Linear-48B-A3B's KDA layer: H = HV = 32, K = V = 128, B 1..512, "
               "slot padding 0/16/64, bf16 and fp32 state", (_kimi_grid(),), *FAST),
        Preset("targets", "the Triton issue's targets: H = HV 16/32/64, K = V 64/128, B 1/16/64/256, slot_pad "
               "0/64, bf16 and fp32 state (scripts.reports.targets reports them)", _targets_grids(), *FAST),
        Preset("published", "the shapes of the published FlashInfer / fla-core table (results/published/; "
               "scripts.reports.compare_published compares)", _published_grids(), *THOROUGH),
        Preset("gva", "grouped value heads (H < HV), K = V = 128", _gva_grids(), *THOROUGH),
        Preset("spec-decode", "speculative verify at Kimi-Linear's layer: T 1/2/4/8 tokens per row, B 1/8/32/128, "
               "the state stored after every token or the last, bf16 and fp32 state", _spec_decode_grids(), *FAST),
        Preset("frozen-verify", "frozen verify (update_state=False) beside in-place decode of the same T 1/2/4/8 "
               "tokens storing the last state, H = HV 32/64, K = V = 128, B 1..256, bf16 state",
               _frozen_verify_grids(), *THOROUGH),
        Preset("replay", "cached-input replay (T = 1, rings of 8/16/32 records) beside in-place decode, per step "
               "over the ring's steps, flush included: H = HV 32/64, K = V = 128, B 1..256, bf16 and fp32 state",
               _replay_grids(), *THOROUGH),
        Preset("spec-step", "a speculative step both ways: checkpointing verify of T 2/4/8 tokens, frozen verify and "
               "the commit of 1..T accepted tokens (kda-spec-step DIR); H = HV = 32, K = V = 128, B 1..256, bf16",
               _spec_step_grids(), *THOROUGH),
        Preset("shapes", "HV 16/32/64 x K, V in 64/128/256, bf16 state", _shapes_grids(), *THOROUGH),
        Preset("full", "kimi-linear-48b, gva and shapes, plus padding rows (CUDA-graph batch padding)",
               (_kimi_grid(), *_gva_grids(), *_shapes_grids(),
                dict(B=(8, 64, 512), H=(32,), HV=(32,), K=(128,), V=(128,), pad_rows=(1, 7), state_dtype=BF16_FP32)),
               *THOROUGH),
    )
}
