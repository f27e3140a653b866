"""Tile configs of the Triton KDA decode kernel by (state dtype, HV, K, V, B, T), read from
``tuning.json`` beside this file; see kda_impls.impls.triton.tiles.choose_config (nearest tabled
T, then B; fp16 state uses the bfloat16 rows).

The JSON is data written by the tuner (``python3 -m scripts.tuning.triton_tune --write-table ...``; its
``command`` field is the call that wrote it): regenerate it rather than edit it. This module owns the
file's format, read (:func:`parse`) and written (:func:`dumps`).
"""

from __future__ import annotations

import json
from importlib import resources

KEY = ("state_dtype", "HV", "K", "V", "B", "T")
FILE = "tuning.json"


def parse(text: str) -> tuple[list[str], dict[tuple, str]]:
    """The provenance (one line per tune run) and ``{(state dtype, HV, K, V, B, T): config}`` of a table's JSON."""
    data = json.loads(text)
    return data["provenance"], {tuple(entry[k] for k in KEY): entry["config"] for entry in data["entries"]}


def dumps(provenance: list[str], entries: dict[tuple, tuple[str, str]], command: list[str]) -> str:
    """The JSON of a table: ``entries`` maps a key (:data:`KEY`) to (config, note: what the tune measured);
    ``command``: the arguments that wrote it. One entry a line, sorted by T, dtype, K, V, HV, B: a
    regenerated table differs from the last one only where an entry changed."""
    order = sorted(entries, key=lambda k: (k[5], k[0], k[2], k[3], k[1], k[4]))
    lines = [json.dumps(dict(zip(KEY, key, strict=True), config=config, note=note))
             for key in order for config, note in [entries[key]]]
    return ('{\n  "provenance": ' + json.dumps(provenance, indent=4).replace("\n]", "\n  ]")
            + ',\n  "command": ' + json.dumps(command)
            + ',\n  "entries": [\n    ' + ",\n    ".join(lines) + "\n  ]\n}\n")


PROVENANCE_LINES, TABLE = parse(resources.files(__package__).joinpath(FILE).read_text())
PROVENANCE = "; ".join(PROVENANCE_LINES)
