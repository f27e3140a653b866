"""The registry's names: an implementation joined through $KDA_EXTRA_IMPLS under a built-in name is
refused by every entry point that reads the registry, in one line, before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import CPU_SWEEP, REPO
from kda_impls import registry

ENTRY_POINTS = {"kda-sweep": ["-m", "kda_impls.bench.sweep", *CPU_SWEEP],
                "kda-survey": ["-m", "kda_impls", "--device", "cpu"]}


@pytest.mark.parametrize("builtin", ["naive", "triton"])
@pytest.mark.parametrize("command", list(ENTRY_POINTS))
def test_an_extra_implementation_under_a_built_in_name_is_refused(tmp_path, command, builtin):
    """``naive=...`` and ``triton=...`` (a correct implementation of the user's, importable): exit 2,
    one line naming the entry and the name, no traceback, no import of the user's module (whose
    errors, circular imports among them, must not stand in for the refusal), nothing written."""
    tests = str(REPO / "tests")
    env = {**os.environ, "KDA_EXTRA_IMPLS": f"{builtin}=planted.correct:Correct",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "out"
    args = ENTRY_POINTS[command] + (["--out", str(out)] if command == "kda-sweep" else [])
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{command}: error: KDA_EXTRA_IMPLS: '{builtin}=planted.correct:Correct' takes the "
                           f"built-in implementation's name '{builtin}'; give yours a name of its own"), line
    assert not out.exists()


def test_the_registry_refuses_a_built_in_name_and_keeps_the_others(monkeypatch):
    monkeypatch.setenv("KDA_EXTRA_IMPLS", "mine=planted.correct:Correct,fla=planted.correct:Correct")
    for read in (registry.extra_impls, registry.names, lambda: registry.get("naive")):
        with pytest.raises(ValueError, match=r"'fla=planted.correct:Correct' takes the built-in implementation's "
                                             r"name 'fla'"):
            read()
    monkeypatch.setenv("KDA_EXTRA_IMPLS", "mine=planted.correct:Correct")
    assert registry.names()[-1] == "mine" and registry.implementations()["naive"] == registry.BUILTIN["naive"]
