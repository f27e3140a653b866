"""scripts.reports.compare_published: published figures against repeated sweep runs and their spread."""

from pathlib import Path

import pandas as pd

from helpers import REPO, write_sweep_dir
from kda_impls.bench.config import Config, PoolLayout
from scripts.reports import compare_published

SHAPE = dict(state_dtype="bfloat16", H=32, HV=32, K=128, V=128)
DEFAULT_LAYOUT = PoolLayout()


def sweep_dir(path: Path, medians: dict[int, float], layout: PoolLayout = DEFAULT_LAYOUT,
              slower_variant: float | None = None) -> Path:
    """A sweep directory with flashinfer rows at the batch sizes of ``medians`` in ``layout``, and
    one padded row and one wrong row that must be ignored; with ``slower_variant``, a second
    flashinfer variant that many times slower, which must lose to the first."""
    rows = {Config("flashinfer", B, **SHAPE, layout=layout): [us] for B, us in medians.items()}
    if slower_variant:
        rows |= {Config("flashinfer-slow", B, **SHAPE, layout=layout): [us * slower_variant]
                 for B, us in medians.items()}
    rows |= {Config("flashinfer", 1, **SHAPE, slot_pad=64, layout=layout): [1.0],
             Config("flashinfer", 2, **SHAPE, layout=layout): "wrong"}
    out = write_sweep_dir(path, rows, {"settings": {"method": {"entry": "clean"}}, "git": {"sha": "abc"}})
    table = pd.read_csv(out / "results.csv").assign(l2_entry="clean", library="flashinfer")
    table.to_csv(out / "results.csv", index=False)
    return out


def test_reproduced_only_within_the_run_to_run_spread(tmp_path):
    published = tmp_path / "published.csv"
    pd.DataFrame([dict(impl="flashinfer", B=1, kernel_us=103.0, **SHAPE),
                  dict(impl="flashinfer", B=16, kernel_us=50.0, **SHAPE)]).to_csv(published, index=False)
    dense = [sweep_dir(tmp_path / "a1", {1: 100.0}, slower_variant=1.5),
             sweep_dir(tmp_path / "a2", {1: 104.0})]  # spread 4%
    sparse = sweep_dir(tmp_path / "b", {1: 110.0, 16: 50.0}, PoolLayout(slots_per_row=2, slot_order="sorted"))
    out = tmp_path / "out"
    assert compare_published.main([str(published), *map(str, dense), str(sparse), "--out", str(out)]) == 0

    table = pd.read_csv(out / "comparison.csv").set_index(["layout", "B"])
    dense_1 = table.loc[("pool 1xB, random slots, L2 clean", 1)]
    assert (dense_1.ours_us, dense_1.n_runs, dense_1.best_impl) == (102.0, 2, "flashinfer")
    assert abs(dense_1.run_to_run_spread - 0.04) < 1e-12 and dense_1.reproduced  # -1.0%
    assert not table.loc[("pool 2xB, sorted slots, L2 clean", 1)].reproduced  # +6.8% > 4%
    # equal figures, but B=16 was never repeated: no spread is known, so it is not called reproduced
    sparse_16 = table.loc[("pool 2xB, sorted slots, L2 clean", 16)]
    assert sparse_16.ratio == 1.0 and pd.isna(sparse_16.run_to_run_spread) and not sparse_16.reproduced
    assert "102.00 (-1.0%) flashinfer" in (out / "comparison.md").read_text()


def test_committed_published_table_matches_its_preset():
    """Every published figure is a configuration the `published` preset measures."""
    from kda_impls.bench.presets import PRESETS

    published = pd.read_csv(REPO / "results" / "published" / "triton-issue-h200.csv")
    measured = {(c.impl, c.state_dtype, c.H, c.HV, c.K, c.V, c.B)
                for c in PRESETS["published"].configs(["flashinfer", "fla"])}
    figures = set(published[compare_published.KEY].itertuples(index=False, name=None))
    assert figures and figures <= measured
