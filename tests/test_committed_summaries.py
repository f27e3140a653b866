"""Figures that committed summaries quote are the data's: each is derived here from the run's rows, so a
number typed in by hand (or left behind by a rerun) fails."""

import re

import pandas as pd

from helpers import REPO

CLOSED_FORM = REPO / "results/h100-80gb-hbm3/frozen-closed-form"
COLUMNS = {"BV=128": "bf16-BV128", "BV=32": "bf16-BV32", "BV=64 (default)": "bf16-default",
           "recurrence": "bf16-recurrence"}


def markdown_table(text: str) -> pd.DataFrame:
    lines = [line for line in text.splitlines() if line.startswith("|") and "---" not in line]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    header = cells[0]
    return pd.DataFrame([dict(zip(header, row, strict=True)) for row in cells[1:] if row[0].isdigit()])


def test_the_closed_form_summary_is_its_runs():
    runs = pd.read_csv(CLOSED_FORM / "runs.csv")
    frozen = runs[runs["mode"] == "frozen"].pivot_table(index=["T", "B"], columns="run", values="kernel_us_mean")
    text = (CLOSED_FORM / "summary.md").read_text()
    table = markdown_table(text.split("Kernel time")[1])
    assert len(table) == len(frozen) == 9
    for row in table.itertuples(index=False):
        row = dict(zip(table.columns, row, strict=True))
        measured = frozen.loc[(int(row["T"]), int(row["B"]))]
        for column, run in COLUMNS.items():
            assert float(row[column]) == round(measured[run], 2), (row, column)
        ratio = measured["bf16-recurrence"] / measured["bf16-default"]
        assert float(row["recurrence / default"]) == round(ratio, 2)
    default = runs[runs.run == "bf16-default"].roofline_frac
    low, high = map(int, re.search(r"reaches (\d+)-(\d+)% of the copy", text).groups())
    assert (low, high) == (round(default.min() * 100), round(default.max() * 100))
