"""Implementations with one property planted, kept outside the package as a user's would be: each
joins through $KDA_EXTRA_IMPLS (kda_impls/registry.py) with tests/ on PYTHONPATH, so that a sweep's
worker processes import it too. Each check of a verdict is proven by the one it must catch:

- ``planted-correct``: the naive decode under another name (passes everywhere);
- ``planted-drift``: its state comes out 0.5% too large each step (one step under the bf16
  tolerance, caught by the steps that follow);
- ``planted-decay``: forgets the decay on key channel 0 (wrong);
- ``planted-slower``: the naive decode plus real extra work, about 10% slower (for the gate);
- ``planted-noflush``, ``planted-record-decay``, ``planted-replay-drift``: the naive replay step that
  never writes the pool at a flush, that reads record 0 without its decay, that drifts 0.5% per step
  (``planted/replay.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

IMPLS = {
    "planted-correct": "planted.correct:Correct",
    "planted-drift": "planted.drift:Drift",
    "planted-decay": "planted.decay:ForgetsDecay",
    "planted-slower": "planted.slower:Slower",
    "planted-noflush": "planted.replay:NoFlush",
    "planted-record-decay": "planted.replay:DropsRecordDecay",
    "planted-replay-drift": "planted.replay:ReplayDrift",
}


def extra_impls(*names: str) -> str:
    """The $KDA_EXTRA_IMPLS value that registers ``names`` (all of them by default)."""
    return ",".join(f"{name}={IMPLS[name]}" for name in names or IMPLS)


def environment(*names: str) -> dict[str, str]:
    """os.environ with ``names`` registered and tests/ importable, for a subprocess (a sweep, asv)."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "KDA_EXTRA_IMPLS": extra_impls(*names), "PYTHONPATH": path}
