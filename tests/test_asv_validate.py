"""scripts/asv_validate.py without a GPU: the committed H200 validation re-evaluates to its verdict
from the stored runs, and --max-runs stops before a run it may not start."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, asv_env

SCRIPT = REPO / "scripts" / "asv_validate.py"
H200 = REPO / "results" / "h200" / "asv-validation"
H200_COMMIT = "100bb5f5cac29928878b43003d1a349d45c49d2f"  # what asv filed the runs under (results/README.md)


def validate(out, home, *args, env_extra=None):
    env = asv_env(home, **(env_extra or {}))
    env.pop("KDA_GIT_SHA", None)
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_committed_h200_validation_re_evaluates_to_ok(tmp_path):
    has_commit = subprocess.run(["git", "cat-file", "-e", f"{H200_COMMIT}^{{commit}}"], cwd=REPO).returncode == 0
    if not has_commit:
        pytest.skip("this clone lacks the commit the H200 runs are filed under (shallow clone)")
    out = tmp_path / "asv-validation"
    shutil.copytree(H200, out, ignore=shutil.ignore_patterns("html", "scratch-repo", "device-gate"))
    done = validate(out, tmp_path, "--machine", "nvidia-h200", "--results-commit", H200_COMMIT, "--max-runs", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["aa"]["exit"] == 0 and summary["slow"]["exit"] == 1
    assert len(summary["slow"]["flagged"]) == 4 and not summary["slow"]["flagged_not_triton"]
    assert all("KernelTime" in name and "'triton'" in name for name in summary["slow"]["flagged"])
    assert (out / "html" / "index.html").exists()
    # the same verdicts as committed
    committed = json.loads((H200 / "summary.json").read_text())
    assert {k: summary[k] for k in ("aa", "slow")} == {k: committed[k] for k in ("aa", "slow")}


def test_max_runs_stops_before_a_run_it_may_not_start(tmp_path):
    done = validate(tmp_path / "out", tmp_path, "--machine", "cpu-ci", "--max-runs", "0", "--profile", "cpu")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "--max-runs 0 reached before run a1" in done.stdout
    assert not (tmp_path / "out" / "a1.log").exists()
