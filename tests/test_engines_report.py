"""scripts.reports.engines: one fastest cell per point, the minimum of its row, from committed sweeps."""

import re

from helpers import REPO
from scripts.reports import engines


def rows_of(section: str) -> list[str]:
    return [line for line in section.splitlines() if line.startswith("| ") and "HV=" in line]


def test_each_point_marks_its_fastest_cell(tmp_path):
    out = tmp_path / "engines.md"
    assert engines.main([str(REPO / "results/h200/published"), str(REPO / "results/h200/replay"),
                         "--out", str(out)]) == 0
    text = out.read_text()
    inplace, replay = text.split("## Replay step")
    for section in (inplace, replay):
        rows = rows_of(section)
        assert rows
        for row in rows:
            times = [float(t) for t in re.findall(r"([\d.]+) us", row)]
            fastest = re.findall(r"([\d.]+) us[^|]*\*\*fastest\*\*", row)
            assert len(fastest) == 1 and float(fastest[0]) == min(times), row
    assert "kda-impls" in inplace and "triton replay L=16" in replay
