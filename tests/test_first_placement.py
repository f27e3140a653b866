"""scripts/first_placement.py: one row's kernel time after each condition, its first placement
against the rest (run here on the CPU, whose timings model no placement: the shape of the report)."""

from __future__ import annotations

from helpers import load_script, record_settle_s
from kda_impls.bench.config import Config, PoolLayout
from kda_impls.bench.timing import Budget

first_placement = load_script("first_placement")


def test_each_condition_times_every_placement(monkeypatch):
    ran = []
    cfg = Config("naive", 2, 2, 2, 16, 16, layout=PoolLayout(placements=3))
    real = first_placement.conditions

    def recorded(cfg, device, impl, idles):
        return {name: (lambda name=name, run=run: (ran.append(name), run()))
                for name, run in real(cfg, device, impl, idles).items()}

    slept, settled = [], record_settle_s(monkeypatch, first_placement)
    monkeypatch.setattr(first_placement, "conditions", recorded)
    monkeypatch.setattr(first_placement.time, "sleep", slept.append)
    table = first_placement.study(cfg, "cpu", 3, Budget(min_samples=1, max_samples=2, max_seconds=0.01), (0.05, 1.0),
                                  settle_s=0.03)
    assert ran == list(table["before"]) == ["after the check", "straight after", "after 0.05 s idle", "after 1 s idle",
                                            "after the check again", "after the check's inputs, unused"]
    assert slept == [0.05, 1.0]  # each idle in turn, as long as it says
    assert settled == [0.03] * len(ran)  # --settle reaches every kernel time
    assert all(len(p.split()) == 3 for p in table["placements (us)"]) and (table["first / others"] > 0).all()
