"""kda-ab end to end on the CPU, on a small git repository made here: the project's package committed,
then a commit whose planted implementation sleeps in every launch (several times its step: `slower`)
and one whose output is wrong (`broken`); an A/A pair passes; unusable input exits 2 before anything
is written. And the paired verdict itself on made-up rounds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import REPO
from kda_impls.perfci import paired, spread

PLANTED = '''from kda_impls.impls.naive import NaiveTorch
import time

DELAY_S = {delay}


class Slowpoke(NaiveTorch):
    name = "slowpoke"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)

        def step():
            if DELAY_S:
                time.sleep(DELAY_S)
            result = launch()
            {bug}
            return result

        return step
'''
TINY = ["--devices", "cpu", "--impls", "slowpoke", "--B", "2", "--H", "1", "--HV", "2", "--K", "16", "--V", "16",
        "--placements", "1", "--min-samples", "4", "--max-seconds", "0.02", "--rounds", "8"]
ENV = {"KDA_EXTRA_IMPLS": "slowpoke=slowpoke:Slowpoke", "PYTHONPATH": str(REPO)}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def commit(repo: Path, message: str, delay: float = 0.0, bug: str = "pass") -> str:
    (repo / "slowpoke.py").write_text(PLANTED.format(delay=delay, bug=bug))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> dict:
    """A repository of three commits: plain, a planted slowdown (a 5 ms sleep per launch, the step
    itself well under 1 ms), a planted bug (the output times 1.5)."""
    root = tmp_path_factory.mktemp("ab") / "repo"
    shutil.copytree(REPO / "kda_impls", root / "kda_impls", ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q")
    return {"root": root, "plain": commit(root, "plain"), "slow": commit(root, "slow", delay=0.005),
            "bug": commit(root, "bug", bug="out.mul_(1.5)")}


def kda_ab(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = "import sys; from kda_impls.perfci.ab import run; sys.exit(run(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=os.environ | ENV | (env or {}))


def statuses(out: Path) -> dict[str, str]:
    rows = json.loads((out / "gate.json").read_text())["rows"]
    return {row["benchmark"].split("_")[0]: row["status"] for row in rows}


def test_a_planted_slowdown_is_slower_and_its_sides_are_sweep_directories(repo, tmp_path):
    out = tmp_path / "ab"
    done = kda_ab(repo["root"], repo["plain"], repo["slow"], *TINY, "--out", str(out))
    assert done.returncode == 1, done.stderr
    assert statuses(out) == {"slowpoke": "slower"}
    assert "FAIL: 1 slower" in done.stdout
    for side, sha in (("base", repo["plain"]), ("head", repo["slow"])):
        table = pd.read_csv(out / side / "results.csv")
        meta = json.loads((out / side / "meta.json").read_text())
        assert list(table.status) == ["ok"] and set(table.commit) == {sha} and meta["git"]["sha"] == sha
        assert meta["ab"]["rounds"] == 8 and (out / side / "samples.json").exists()
    rounds = json.loads((out / paired.ROUNDS_FILE).read_text())
    (per_round,) = rounds.values()
    assert len(per_round["base"]) == len(per_round["head"]) == 8
    # each side in its own worktree in the repository's cache, reused by the next run
    trees = {p.name for p in (repo["root"] / ".kda-ab").iterdir() if p.is_dir()}
    assert {repo["plain"], repo["slow"]} <= trees
    assert git(repo["root"], "status", "--porcelain") == ""
    # the gate reads the two sides as sweep directories: unpaired, by the same rule and CPU threshold, slower too
    regress = subprocess.run([sys.executable, "-m", "kda_impls.regress", str(out / "base"), str(out / "head"),
                              "--repro"], capture_output=True, text=True, env=os.environ | ENV, cwd=repo["root"])
    assert regress.returncode == 1 and "FAIL: 1 slower" in regress.stdout, regress.stdout + regress.stderr
    assert f"kda-ab {repo['plain'][:12]} {repo['slow'][:12]} --impls slowpoke --B 2" in regress.stdout
    # the spread table sets the paired ratio beside the two sides' unpaired one (here: the planted move in both)
    assert spread.main([str(out), str(out / "base"), str(out / "head"), "--out", str(tmp_path / "spread")]) == 0
    summary = json.loads((tmp_path / "spread" / "spread.json").read_text())
    assert summary["benchmarks"] == 1
    assert summary["paired_largest_move"] > 1 and summary["back_to_back_largest_move"] > 1


def test_a_planted_bug_is_broken_never_a_timing(repo, tmp_path):
    out = tmp_path / "ab"
    done = kda_ab(repo["root"], repo["plain"], repo["bug"], *TINY, "--out", str(out), "--repro")
    assert done.returncode == 1, done.stderr
    (row,) = json.loads((out / "gate.json").read_text())["rows"]
    assert row["status"] == "broken" and row["test"].startswith("wrong: round 1 of 8")
    assert row["ratio"] is None
    assert f"kda-ab {repo['plain'][:12]} {repo['bug'][:12]} --impls slowpoke" in done.stdout  # --repro


def test_an_aa_pair_passes(repo, tmp_path):
    out = tmp_path / "ab"
    done = kda_ab(repo["root"], repo["plain"], "HEAD~2", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert statuses(out)["slowpoke"] == "same"  # a CPU row's threshold is 2: one commit's rounds stay within it
    assert done.stdout.rstrip().splitlines()[-1] == "pass"


def test_two_checkout_directories_compare_as_they_are(repo, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for path, sha in ((a, repo["plain"]), (b, repo["bug"])):
        git(repo["root"], "worktree", "add", "-q", "--detach", str(path), sha)
    done = kda_ab(a, str(a), str(b), *TINY[:-2], "--rounds", "1", "--out", str(tmp_path / "ab"))
    assert done.returncode == 1 and statuses(tmp_path / "ab") == {"slowpoke": "broken"}, done.stderr


def test_each_directory_side_records_the_commit_its_own_environment_names(repo, tmp_path):
    """Trees without git history (copies) are named by KDA_GIT_SHA/KDA_GIT_DIRTY: the process's for both
    sides, each side's --env-base/--env-head over it, in its rows' meta as in the gate's."""
    plain, a, b = tmp_path / "plain", tmp_path / "a", tmp_path / "b"
    git(repo["root"], "worktree", "add", "-q", "--detach", str(plain), repo["plain"])
    for path in (a, b):
        shutil.copytree(plain, path, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    out = tmp_path / "ab"
    done = kda_ab(a, str(a), str(b), *TINY, "--env-head", "KDA_GIT_SHA=" + "b" * 40,
                  "--env-head", "KDA_GIT_DIRTY=1", "--out", str(out),
                  env={"KDA_GIT_SHA": "a" * 40, "KDA_GIT_DIRTY": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    base, head = (json.loads((out / side / "meta.json").read_text())["git"] for side in ("base", "head"))
    assert (base["sha"], base["dirty"], head["sha"], head["dirty"]) == ("a" * 40, False, "b" * 40, True)


def test_an_extra_implementation_imports_only_in_the_sides_trees(repo, tmp_path):
    """The driver runs where slowpoke.py is not: each side's worker imports it from its own tree."""
    a, elsewhere = tmp_path / "a", tmp_path / "elsewhere"
    git(repo["root"], "worktree", "add", "-q", "--detach", str(a), repo["plain"])
    elsewhere.mkdir()
    done = kda_ab(elsewhere, str(a), str(a), *TINY, "--out", str(tmp_path / "ab"))
    assert done.returncode == 0 and statuses(tmp_path / "ab") == {"slowpoke": "same"}, done.stdout + done.stderr


@pytest.mark.parametrize("args, cwd, message", [
    (["no-such-rev", "HEAD"], "repo", "'no-such-rev' is neither a revision of"),
    (["HEAD", "HEAD"], "plain", "is neither a revision (no git repository here)"),
    (["HEAD", "HEAD", "--B", "0"], "repo", "--B: 0 must be a whole number >= 1"),
    (["HEAD", "HEAD", "--devices", "cpu,cpu:1"], "repo", "both sides are measured on one device"),
    (["HEAD", "HEAD", "--impls", "nope"], "repo", "unknown implementations nope"),
])
def test_unusable_input_exits_2_before_anything_is_written(repo, tmp_path, args, cwd, message):
    where = repo["root"] if cwd == "repo" else tmp_path
    cache = tmp_path / "cache"
    done = kda_ab(where, *args, "--out", str(tmp_path / "ab"), env={"KDA_AB_CACHE": str(cache)})
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not cache.exists() and not (tmp_path / "ab").exists()


def test_an_earlier_run_is_kept_unless_fresh(repo, tmp_path):
    out = tmp_path / "ab"
    (out / "base").mkdir(parents=True)
    done = kda_ab(repo["root"], "HEAD", "HEAD", *TINY, "--out", str(out))
    assert done.returncode == 2 and "pass --fresh" in done.stderr and (out / "base").is_dir()


# ---- the paired verdict on made-up rounds --------------------------------------------------------

@pytest.mark.parametrize("ratios, status", [
    ([1.2] * 8, "slower"),
    ([0.8] * 8, "faster"),
    ([1.2] * 7, "unsure"),  # seven rounds cannot reach p < 0.01
    ([1.01, 0.99] * 4, "same"),
    ([1.3, 0.9] * 4, "unsure"),  # beyond the threshold, but the rounds disagree
    ([1.2] * 7 + [0.9], "unsure"),  # one round the other way: p = 0.07
    ([1.2] * 9 + [0.9], "unsure"),  # ... of ten: p = 0.021
    ([1.2] * 11 + [0.9], "slower"),  # ... of twelve: p = 0.0063
])
def test_paired_verdict(ratios, status):
    assert paired.paired_verdict([1.0] * len(ratios), ratios, 0.05, 0.01)["status"] == status


def test_sign_test_and_min_rounds():
    assert paired.sign_test(8, 0) == pytest.approx(2 / 256)
    assert paired.sign_test(4, 4) == 1.0
    assert paired.min_rounds(0.01) == 8 and paired.min_rounds(0.05) == 6


def test_the_gpu_plant_keeps_the_output(monkeypatch):
    """tests/planted/slowed.py (the GPU proof's planted slowdown) over the naive decode: verified ok."""
    import importlib

    from kda_impls.bench import Config, run_case

    monkeypatch.setenv("KDA_PLANTED_BASE", "naive")
    slowed = importlib.import_module("planted.slowed")
    row = run_case(Config("naive", 2, 1, 2, 16, 16), "cpu", impl=importlib.reload(slowed).Slowed())
    assert row["status"] == "ok", row["reason"]


def test_a_side_whose_harness_lacks_a_setting_in_use_is_refused():
    """An older revision's Config or Method without a field: passed over at its default, refused otherwise."""
    from dataclasses import replace

    from kda_impls.bench import Budget, Config, Method
    from kda_impls.cli import UsageError
    from kda_impls.perfci.ab import check_fields
    from kda_impls.perfci.revisions import Side
    from kda_impls.perfci.sides import SideWorker

    old = SideWorker(Side("head", "old", Path("."), None, None), "cpu", {})
    old.hello = {"config_fields": ["impl", "B", "H", "HV", "K", "V", "state_dtype", "pad_rows", "T", "checkpoints",
                                   "mode", "slot_pad", "layout"],
                 "method_fields": ["entry", "kernel", "call", "extra_placements", "disjoint_placements",
                                   "placement_processes", "seed", "retime_throttled"]}
    cfg = Config("naive", 2, 1, 2, 16, 16)
    check_fields(old, [cfg], Method(kernel=Budget(min_samples=3)))
    for configs, method, field in (([replace(cfg, mode="replay", ring=16)], Method(), "axis ring"),
                                   ([cfg], Method(settle_s=0.0), "timing setting settle_s")):
        with pytest.raises(UsageError, match=field):
            check_fields(old, configs, method)


def test_unsure_fails_unless_allowed_as_in_the_unpaired_gate():
    table = pd.DataFrame({"benchmark": ["a", "b", "c"], "status": ["unsure", "same", "missing"]})
    assert paired.summary(table, allow_missing=True, allow_unsure=False) == (1, "FAIL: 1 unsure: a")
    assert paired.summary(table, allow_missing=False, allow_unsure=True) == (1, "FAIL: 1 missing: c")
    assert paired.summary(table, allow_missing=True, allow_unsure=True) == (
        0, "pass, with 1 missing and 1 unsure (--allow-missing, --allow-unsure): c, a")
