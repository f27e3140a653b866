"""scripts.profiling.ncu_profile without a GPU: ncu's raw CSV page read into the summary."""

import io

import pandas as pd

from scripts.profiling import ncu_profile

RAW = ('"ID","Kernel Name","gpu__time_duration.sum","gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",'
       '"launch__registers_per_thread"\n'
       '"","","usecond","%","register/thread"\n'
       '"0","_kda_decode_kernel","146.2","88.5","168"\n')


def test_summary_takes_the_named_metrics_with_their_units_and_leaves_absent_ones_blank():
    table = pd.read_csv(io.StringIO(RAW))
    units, raw = table.iloc[0], table.iloc[1:].assign(case="bf16-B256-table")
    summary = ncu_profile.summarise(raw, units).iloc[0]
    assert summary["case"] == "bf16-B256-table" and summary["kernel"] == "_kda_decode_kernel"
    assert summary["duration (usecond)"] == "146.2" and summary["DRAM % of peak (%)"] == "88.5"
    assert summary["regs/thread (register/thread)"] == "168"
    assert summary["stall: long scoreboard"] == ""  # not in this page


def test_every_case_names_a_registered_implementation_and_the_default_runs_ours_alone(monkeypatch):
    """A case names an implementation the registry has (a misspelt one would fail only on the GPU
    box, under ncu), our kernel's forced configs and frozen tiles parse, and the default cases need no
    other package."""
    import torch

    from kda_impls.impls.triton.frozen import FROZEN_CONFIG_ENV, frozen_tile
    from kda_impls.impls.triton.tiles import TileConfig
    from kda_impls.registry import get

    for impl, _, HV, D, B, T, config in ncu_profile.CASES.values():
        get(impl)
        if config and config.startswith("frozen"):
            monkeypatch.setenv(FROZEN_CONFIG_ENV, config.partition(":")[2])
            frozen_tile(torch.bfloat16, HV, D, D, B, T)
        elif config not in (None, "copy", "replay"):
            assert impl == "triton"
            TileConfig.parse(config, TileConfig(BV=D))
    default = ncu_profile.arguments().parse_args([]).cases.split(",")
    assert {ncu_profile.CASES[name][0] for name in default} == {"triton"}
    assert {"bf16-B256-table", "bf16-B256-copy"} <= set(default) and "bf16-B1-flashinfer" in ncu_profile.CASES
