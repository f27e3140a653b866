"""The maintainer tools of scripts/: each module runs as ``python3 -m`` and prints its help (argparse
formats help with %: a "1%" in a help text breaks --help), nothing edits sys.path (the tools run as
modules from the repository root), a GPU's results go to its own folder, and the GPU runner refuses
bad usage in one line."""

import os
import re
import runpy
import subprocess
import sys

import pytest

from helpers import REPO
from scripts.gpu.gpu_name import gpu_slug

SCRIPTS = REPO / "scripts"
WITHOUT_OPTIONS = {"scripts.profiling.sanitize_triton", "scripts.gpu.gpu_name"}  # they run at once


def tools() -> list:
    """The files of scripts/ a maintainer runs: a module with a main, or a shell script (the other
    modules are code the tools share)."""
    return sorted(p for p in SCRIPTS.rglob("*") if p.suffix == ".sh"
                  or (p.suffix == ".py" and re.search(r"^def main\(", p.read_text(), re.MULTILINE)))


def tool_modules() -> list[str]:
    return [".".join(p.relative_to(REPO).with_suffix("").parts) for p in tools() if p.suffix == ".py"]


def test_every_tool_prints_its_help(monkeypatch, capsys):
    """Each tool run as ``python3 -m`` runs it (as ``__main__``) with --help, in this process: one torch
    import for all of them."""
    failed = {}
    for module in tool_modules():
        if module in WITHOUT_OPTIONS:
            continue
        monkeypatch.setattr(sys, "argv", [module, "--help"])
        with pytest.raises(SystemExit) as exited:
            runpy.run_module(module, run_name="__main__")
        out = capsys.readouterr().out
        if exited.value.code not in (0, None) or "usage:" not in out:
            failed[module] = out[-200:]
    assert len(tool_modules()) >= 15 and not failed, failed


def test_no_module_edits_sys_path():
    files = [p for folder in ("kda_impls", "tests", "benchmarks", "scripts") for p in (REPO / folder).rglob("*.py")]
    editing = [str(p.relative_to(REPO)) for p in files if re.search(r"sys\.path\.(insert|append)", p.read_text())]
    assert len(files) > 20 and not editing, editing


@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
                                        ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090")])
def test_a_gpu_runs_results_go_to_its_own_folder(name, slug):
    assert gpu_slug(name) == slug


def test_gpu_checks_refuse_bad_usage_in_one_line(tmp_path):
    """Before any step runs: an unknown step, a wheelhouse that is no folder, and a step that would
    replace a folder of results, each one line and exit status 2, the folder left as it was."""
    results = tmp_path / "h200"
    (results / "cupti").mkdir(parents=True)
    (results / "cupti" / "crosscheck.md").write_text("a committed run")

    def run(*args):
        done = subprocess.run(["bash", "scripts/gpu/gpu-checks.sh", *args], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OUT": str(tmp_path / "out"), "RES": str(results)}, timeout=60)
        return done.returncode, done.stdout.strip().splitlines()

    assert run("grid", "tagrets") == (2, ["gpu-checks.sh: unknown step 'tagrets' (expected one of: install grid "
                                          "targets frozen-verify spec-step replay published ab cupti asv nvbench "
                                          "pytest-gpu)"])
    assert run("--wheelhouse", str(tmp_path / "none"), "install") == (
        2, [f"gpu-checks.sh: --wheelhouse needs a folder of wheels (got '{tmp_path / 'none'}')"])
    status, lines = run("cupti")
    assert status == 2 and len(lines) == 1 and f"would replace {results}/cupti" in lines[0], lines
    assert (results / "cupti" / "crosscheck.md").read_text() == "a committed run"
