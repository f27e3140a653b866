"""The maintainer tools of scripts/: each prints its help (argparse formats help with %: a "1%" in a
help text broke triton_tune.py's --help), each is listed in scripts/README.md, and no module of the
package or the tests edits sys.path (the package is installed; a script is a command over its logic)."""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

SCRIPTS = REPO / "scripts"
TAKES_NO_ARGUMENTS = {"sanitize_triton.py"}  # it runs the kernels for compute-sanitizer at once


def command_module(script: Path) -> str | None:
    """The package module whose ``main`` a thin command runs (``from kda_impls.x import main``)."""
    found = re.search(r"^\s*from (kda_impls[\w.]*) import main\b", script.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def test_every_script_prints_its_help(monkeypatch, capsys):
    """A thin command's main runs here with --help (one process: importing torch once a script made
    this the slowest test); a script with logic of its own runs as a process, side by side."""
    scripts = sorted(p for p in SCRIPTS.glob("*.py") if p.name not in TAKES_NO_ARGUMENTS)
    running = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
               for p in scripts if command_module(p) is None}
    failed = {}
    for script in scripts:
        if (module := command_module(script)) is None:
            continue
        monkeypatch.setattr(sys, "argv", [str(script), "--help"])
        with pytest.raises(SystemExit) as exited:
            importlib.import_module(module).main()
        out = capsys.readouterr().out
        if exited.value.code not in (0, None) or "usage:" not in out:
            failed[script.name] = out[-200:]
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        if process.returncode != 0 or "usage:" not in out:
            failed[name] = err.strip().splitlines()[-1:]
    assert len(scripts) >= 10 and not failed, failed


def test_every_script_is_in_the_readme_table():
    listed = set(re.findall(r"^\| `(?:scripts/)?([\w.-]+)`", (SCRIPTS / "README.md").read_text(), re.MULTILINE))
    present = {p.name for p in SCRIPTS.iterdir() if p.name != "README.md"}
    assert present <= listed, f"scripts/README.md does not list {sorted(present - listed)}"


def test_no_module_edits_sys_path():
    files = [p for folder in ("kda_impls", "tests", "benchmarks") for p in (REPO / folder).rglob("*.py")]
    editing = [str(p.relative_to(REPO)) for p in files if re.search(r"sys\.path\.(insert|append)", p.read_text())]
    assert len(files) > 20 and not editing, editing


def test_gpu_checks_refuse_a_bad_step_and_a_checkout_run_in_one_line(tmp_path):
    """Before any step runs: an unknown step, and (in a checkout with its history, where results/h200/
    holds committed runs) a step that would replace one, each one line and exit status 2."""
    results = tmp_path / "h200"
    (results / "cupti").mkdir(parents=True)
    (results / "cupti" / "crosscheck.md").write_text("a committed run")

    def run(*steps):
        done = subprocess.run(["bash", "scripts/gpu-checks.sh", *steps], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OUT": str(tmp_path / "out"), "RES": str(results)}, timeout=60)
        return done.returncode, done.stdout.strip().splitlines()

    assert run("grid", "tagrets") == (2, ["gpu-checks.sh: unknown step 'tagrets' (expected one of: install grid "
                                          "targets cupti asv nvbench pytest-gpu)"])
    status, lines = run("cupti")
    assert status == 2 and len(lines) == 1 and f"would replace {results}/cupti of this checkout" in lines[0], lines
    assert (results / "cupti" / "crosscheck.md").read_text() == "a committed run"  # left as it was
