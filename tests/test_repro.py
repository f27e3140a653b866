"""The command a sweep row prints (--repro) names that row's configuration: parsed back by kda-sweep it
is a grid of that one configuration, whatever its axes."""

from __future__ import annotations

import shlex

import pytest

from kda_impls import repro
from kda_impls.bench import sweep
from kda_impls.bench.config import Config, PoolLayout

CONFIGS = [
    Config("naive", 2, 1, 2, 16, 16),
    Config("triton", 64, 16, 32, 128, 128, "float32", pad_rows=3, slot_pad=8,
           layout=PoolLayout(slots_per_row=4, slot_order="sorted", placements=9)),
    Config("naive", 4, 2, 4, 16, 16, T=4, checkpoints="last"),
    Config("naive", 4, 2, 4, 16, 16, T=2, mode="frozen"),
    Config("naive", 4, 2, 4, 16, 16, mode="replay", ring=16),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.key())
def test_a_rows_command_is_that_rows_grid(cfg):
    meta = {"settings": {"method": {"entry": "clean", "placement_processes": 3}},
            "environment": {"KDA_EXTRA_IMPLS": "x=m:C,y=m:D"}}
    line = repro.sweep_command(cfg.columns() | {"device": "cpu"}, meta)
    words = shlex.split(line)
    assert words[0] == "KDA_EXTRA_IMPLS=x=m:C,y=m:D" and words[1] == "kda-sweep"
    spec = sweep.spec_from_argv(words[2:])
    assert [c.key() for c in spec.configs()] == [cfg.key()]
    assert (spec.l2_entry, spec.placement_processes, spec.devices) == ("clean", 3, ("cpu",))
