"""scripts/placement_noise.py: a row's medians over fresh placements against medians re-timed on one
placement (run here on the CPU with the naive kernel, whose timings model no placement: the shape of
the study and its statistics)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers import load_script, record_settle_s
from kda_impls.bench.case import Method
from kda_impls.bench.config import Config, PoolLayout
from kda_impls.bench.timing import Budget

placement_noise = load_script("placement_noise")
TINY = Budget(min_samples=1, max_samples=2, max_seconds=0.01)


def counted_inputs(monkeypatch):
    drawn = []
    real = Config.make_inputs

    def make_inputs(self, device, seed=0, **kw):
        drawn.append(seed)
        return real(self, device, seed, **kw)

    monkeypatch.setattr(Config, "make_inputs", make_inputs)
    return drawn


def test_fresh_placements_draw_new_inputs_and_the_repeats_one_set(monkeypatch):
    drawn = counted_inputs(monkeypatch)
    cfg = Config("naive", 2, 2, 2, 16, 16, layout=PoolLayout(placements=3))
    settled = record_settle_s(monkeypatch, placement_noise)
    fresh = placement_noise.fresh_medians(cfg, "cpu", 4, TINY, Method(settle_s=0.25))
    assert len(fresh) == 4 and drawn == [1, 2, 3, 4] and settled == [0.25]  # settling as the sweeps do
    drawn.clear()
    same = placement_noise.same_medians(cfg, "cpu", 4, TINY, Method())
    assert len(same) == 4 and drawn == [1]  # one placement, timed four times


def test_reslotted_repeats_shuffle_the_slots_in_place_on_one_placement(monkeypatch):
    """Each repeat runs on the one placement's slots tensor, its values permuted among the rows: the
    set of slots stays, their order changes, and nothing is drawn anew."""
    made = []
    real_make = Config.make_inputs

    def make_inputs(self, device, seed=0, **kw):
        made.append(real_make(self, device, seed, **kw))
        return made[-1]

    seen = []
    real_time = placement_noise._time_placement

    def time_placement(launchers, device, share, entry):
        seen.append(made[-1].slots.clone())
        return real_time(launchers, device, share, entry)

    monkeypatch.setattr(Config, "make_inputs", make_inputs)
    monkeypatch.setattr(placement_noise, "_time_placement", time_placement)
    cfg = Config("naive", 8, 2, 2, 16, 16, layout=PoolLayout(placements=3))
    assert len(placement_noise.reslotted_medians(cfg, "cpu", 4, TINY, Method())) == 4 and len(made) == 1
    assert all(sorted(slots.tolist()) == sorted(seen[0].tolist()) for slots in seen)
    assert len({tuple(slots.tolist()) for slots in seen}) > 1
    seen.clear()
    placement_noise.same_medians(cfg, "cpu", 3, TINY, Method())
    assert len({tuple(slots.tolist()) for slots in seen}) == 1  # the plain repeats keep the order


def test_each_median_gets_a_sweep_placements_share_of_the_budget(monkeypatch):
    shares = []
    for name in ("fresh_medians", "same_medians", "reslotted_medians"):
        monkeypatch.setattr(placement_noise, name, lambda cfg, device, n, share, method: shares.append(share) or [1e-6] * n)
    placement_noise.study([("float32", 2, 16, 2)], ["naive"], "cpu", 2, Method())
    assert shares == [Method().kernel.share(PoolLayout().placements)] * 3 and PoolLayout().placements == 3


def test_summary_spread_and_levene_tell_placements_from_the_timer():
    def rows(fresh, same):
        return pd.DataFrame([dict(impl="x", state_dtype="bfloat16", HV=32, K=128, B=16, mode=mode, index=i, us=us)
                             for mode, values in (("fresh", fresh), ("same", same), ("reslotted", fresh))
                             for i, us in enumerate(values)])

    timer = [100.0, 100.2, 99.9, 100.1, 100.3, 99.8, 100.0, 100.2, 99.9, 100.1]
    spread_out = [100.0, 105.0, 97.0, 103.0, 98.0, 104.0, 96.0, 102.0, 99.0, 101.0]
    table = placement_noise.summary(rows(spread_out, timer))
    line = table.iloc[0]
    assert line["fresh_spread"] == pytest.approx(105.0 / 96.0 - 1) and line["same_spread"] == pytest.approx(100.3 / 99.8 - 1)
    assert line["levene_p"] < 0.01 and line["levene_p_slots"] < 0.01  # both vary more than the timer
    alike = placement_noise.summary(rows(timer, list(reversed(timer)))).iloc[0]
    assert alike["levene_p"] > 0.5 and alike["fresh_spread"] == pytest.approx(alike["same_spread"])


def test_the_script_writes_the_medians_the_report_and_meta(tmp_path):
    assert placement_noise.main(["--rows", "float32:2:16:2", "--impls", "naive", "--device", "cpu",
                                 "--placements", "3", "--settle", "0", "--out", str(tmp_path)]) == 0
    medians = pd.read_csv(tmp_path / "placement_noise.csv")
    assert sorted(medians["mode"].value_counts().items()) == [("fresh", 3), ("reslotted", 3), ("same", 3)]
    text = (tmp_path / "placement_noise.md").read_text()
    assert "levene_p" in text and "after 0 s idle" in text
    assert "placement_noise.py" in json.loads((tmp_path / "meta.json").read_text())["command"]


def test_the_repeats_start_after_the_settle(monkeypatch):
    slept = []
    monkeypatch.setattr(placement_noise.time, "sleep", slept.append)
    medians = placement_noise.study([("float32", 2, 16, 2)], ["naive"], "cpu", 2, Method(kernel=TINY), settle_s=1.5)
    assert slept == [1.5, 1.5] and list(medians["mode"]) == ["fresh"] * 2 + ["same"] * 2 + ["reslotted"] * 2


def test_a_bad_row_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exited:
        placement_noise.main(["--rows", "bf16:32:128", "--out", "x"])
    assert exited.value.code == 2 and "STATE_DTYPE:HV:K:B" in capsys.readouterr().err
