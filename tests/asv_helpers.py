"""Running asv from tests: this interpreter as the existing environment, a throwaway HOME for the
machine file (~/.asv-machine.json), and this checkout importable in the benchmark processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import json5  # asv's reader of asv.conf.json (it has comments)

REPO = Path(__file__).resolve().parents[1]
MACHINE = "cpu-ci"
EXISTING = f"existing:{sys.executable}"


def asv_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment for asv and (it passes os.environ on) its benchmark processes, which put
    ASV_PYTHONPATH on sys.path (they drop PYTHONPATH)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("ASV_PYTHONPATH")]))
    return {**os.environ, "HOME": str(home), "ASV_PYTHONPATH": path, **extra}


def run_asv(args: list[str], env: dict[str, str], cwd: Path = REPO, timeout: float = 150
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def register_machine(env: dict[str, str], name: str = MACHINE) -> None:
    done = run_asv(["machine", "--machine", name, "--yes"], env)
    assert done.returncode == 0, done.stdout + done.stderr


def repo_conf(directory: Path) -> Path:
    """The repository's asv.conf.json with absolute paths and results and html under ``directory``,
    so that runs from tests leave the checkout alone."""
    conf = json5.loads((REPO / "asv.conf.json").read_text())
    conf.update(repo=str(REPO), benchmark_dir=str(REPO / "benchmarks"), results_dir=str(directory / "results"),
                html_dir=str(directory / "html"))
    path = directory / "asv.conf.json"
    path.write_text(json.dumps(conf))
    return path
