"""The tuning table as data: kda_impls/impls/triton_tuning.json holds exactly the entries of the
Python literal it replaces (the kernel reads the same table), and the same provenance."""

import json
from pathlib import Path

from kda_impls.impls import triton_tuning


def test_json_table_is_the_literal_table():
    data = json.loads((Path(triton_tuning.__file__).with_name("triton_tuning.json")).read_text())
    keys = ("state_dtype", "HV", "K", "V", "B", "T")
    table = {tuple(entry[k] for k in keys): entry["config"] for entry in data["entries"]}
    assert table == triton_tuning.TABLE and list(table) != []
    assert "; ".join(data["provenance"]) == triton_tuning.PROVENANCE
