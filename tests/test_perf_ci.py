"""kda-perf-ci: the pull-request job sharded over two jobs and merged by the gate step on a local
repository (a planted slowdown fails the merged gate; a shard that never reported fails it too), the
main job's gate against the history (asv stood in for by result files), and the example workflow's
YAML, which may call only these commands, with options they take."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_ab import ENV, TINY, git, repo  # noqa: F401  (repo: the three-commit repository fixture)
from test_regress import asv_file, timings

from helpers import REPO
from kda_impls.perfci import ab, ci

WORKFLOW = REPO / ".github" / "workflows" / "perf.yml"
# what the workflow's expressions stand for when its commands are checked
EXPRESSIONS = {"github.base_ref": "main", "strategy.job-index": "0"}
EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def perf_ci(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    code = "from kda_impls.perfci.ci import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=os.environ | ENV)


def test_pr_shards_merge_and_gate_as_one_run(repo, tmp_path):  # noqa: F811
    grid = [*TINY, "--B", "2,3"]  # two configurations, one per shard (the later --B wins)
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(shards):
        done = perf_ci(repo["root"], "pr", "--base", repo["plain"], "--head", repo["slow"], "--shard", f"{i}/2",
                       "--out", str(out), *grid)
        assert done.returncode == 1 and "FAIL: 1 slower" in done.stdout, done.stdout + done.stderr
    merged = perf_ci(repo["root"], "gate", str(tmp_path / "merged"), *map(str, shards))
    assert merged.returncode == 1 and "FAIL: 2 slower" in merged.stdout, merged.stdout + merged.stderr
    report = json.loads((tmp_path / "merged" / "gate.json").read_text())
    assert {row["status"] for row in report["rows"]} == {"slower"} and len(report["rows"]) == 2
    one = perf_ci(repo["root"], "gate", str(tmp_path / "one"), str(shards[1]))
    assert one.returncode == 1 and "a shard is missing" in one.stdout and not (tmp_path / "one").exists()


def test_pr_refuses_a_bad_option_before_anything_is_written(repo, tmp_path):  # noqa: F811
    done = perf_ci(repo["root"], "pr", "--base", repo["plain"], "--shard", "0/2", "--out", str(tmp_path / "x"),
                   "--B", "0")
    assert done.returncode == 2 and "--B" in done.stderr and not (tmp_path / "x").exists(), done.stderr


@pytest.fixture
def history(tmp_path, monkeypatch):
    """A repository of two commits whose asv runs are stood in for: ``runs[sha]`` is the samples
    the run of ``sha`` records (None: asv fails)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    shas = []
    for message in ("one", "two"):
        git(root, "commit", "-q", "--allow-empty", "-m", message)
        shas.append(git(root, "rev-parse", "HEAD"))
    monkeypatch.chdir(root)
    runs = {}

    def asv_run(name, sha, env):
        if runs.get(sha) is None:
            return 2
        (ci.RESULTS / name).mkdir(parents=True, exist_ok=True)
        asv_file(ci.RESULTS / name / f"{sha[:8]}-existing-py.json", {("'triton'", "64"): runs[sha]}, machine=name)
        return 0

    monkeypatch.setattr(ci, "asv_run", asv_run)
    return shas, runs


@pytest.mark.parametrize("head, status", [(1.0, 0), (1.3, 1), (None, 1)])
def test_main_gates_against_the_history(history, head, status):
    (first, second), runs = history
    args = ci.parser().parse_args(["main", "--machine", "box", "--no-publish"])
    runs[first] = timings(0)
    git(Path.cwd(), "checkout", "-q", first)
    assert ci.job_main(args) == 0  # an empty history: nothing to gate against
    runs[second] = None if head is None else timings(1, median=20e-6 * head)
    git(Path.cwd(), "checkout", "-q", second)
    assert ci.job_main(args) == status
    assert (Path("perf-ci") / "gate.json").exists() == (head is not None)


def workflow_commands() -> list[tuple[str, str]]:
    """(job, command line) of every ``run`` step, expressions replaced (a matrix's by each value)."""
    flow = yaml.safe_load(WORKFLOW.read_text())
    found = []
    for name, job in flow["jobs"].items():
        matrix = job.get("strategy", {}).get("matrix", {})
        for step in job["steps"]:
            for line in filter(None, (s.strip() for s in step.get("run", "").splitlines())):
                for values in zip(*matrix.values(), strict=True) if matrix else [()]:
                    known = EXPRESSIONS | {f"matrix.{k}": v for k, v in zip(matrix, values, strict=True)}
                    found.append((name, EXPRESSION.sub(lambda m, known=known: known[m.group(1)], line)))
    return found


def test_the_workflow_calls_only_kda_perf_ci_with_valid_options():
    commands = workflow_commands()
    assert {shlex.split(line)[1] for _, line in commands} == {"main", "pr", "gate"}
    for job, line in commands:
        argv = shlex.split(line)
        assert argv[0] == "kda-perf-ci", (job, line)
        args, rest = ci.parser().parse_known_args(argv[1:])  # a bad option exits 2
        assert args.job == job and (not rest or job == "pr"), (job, rest)
        if job == "pr":
            ab.parser().parse_args(["BASE", "HEAD", *rest, *(["--shard", args.shard] if args.shard else [])])
    flow = yaml.safe_load(WORKFLOW.read_text())
    assert flow["jobs"]["gate"]["needs"] == "pr" and "always()" in flow["jobs"]["gate"]["if"]


def test_the_gpu_proof_runs_end_to_end_on_a_tiny_grid(tmp_path):
    """kda_impls.perfci.prove (the GPU proof) on the CPU: the planted copy, 20000 times the tiny step's
    bytes (several times the step: a CPU row's threshold is 2), is slower and the A/A pair passes; the
    two sweeps are written and set side by side."""
    grid = "--B 2 --H 1 --HV 2 --K 16 --V 16 --placements 1 --max-seconds 0.02 --min-samples 4 --devices cpu"
    done = subprocess.run([sys.executable, "-m", "kda_impls.perfci.prove", str(tmp_path), "--impls", "naive",
                           "--planted", "naive", "--slowdown", "20000", "--grid", grid], capture_output=True, text=True,
                          timeout=900, env=os.environ | {"PYTHONPATH": str(REPO)}, cwd=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(summary["checks"].values()) and done.returncode == 0, done.stdout + done.stderr
    assert summary["spread"]["benchmarks"] == 1 and (tmp_path / "spread.csv").exists()
    assert {"aa", "planted", "sweep1", "sweep2"} <= {p.name for p in tmp_path.iterdir()}
