"""The asv suite on a box without a GPU, as CI checks it: `asv check` and `asv run --quick --dry-run`
pass; naive and the interpreted Triton kernels run, and exactly the combinations the
implementations declare unsupported here skip, with their reason.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from types import SimpleNamespace

import pytest

from helpers import EXISTING, MACHINE, asv_env, load_script, register_machine, repo_conf, run_asv
from kda_impls import get
from kda_impls.bench import results

from benchmarks import common, decode


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = asv_env(tmp_path_factory.mktemp("home"))
    env.pop("KDA_ASV_PROFILE", None)
    register_machine(env)
    return env


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    return str(repo_conf(tmp_path_factory.mktemp("asv")))


def combinations(bench) -> list[tuple]:
    return list(itertools.product(*bench.params))


def runnable_here(impl: str, B: int, heads: str = common.PROFILE["heads"][0], slot_pad: int = 0,
                  state_dtype: str = "bfloat16", T: int = 1) -> bool:
    cfg = common.config(impl, B, heads, slot_pad, state_dtype, T)
    try:
        return get(impl).unsupported(cfg.make_inputs("cpu")) is None
    except ImportError:
        return False


def test_asv_check(env, conf):
    done = run_asv(["check", "--config", conf, "-E", EXISTING], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No problems found" in done.stdout


@pytest.mark.skipif(common.DEVICE != "cpu", reason="expects the CPU profile; the GPU profiles run for minutes")
def test_asv_quick_dry_run(env, conf):
    done = run_asv(["run", "--config", conf, "-E", EXISTING, "--machine", MACHINE, "--quick", "--dry-run",
                    "--show-stderr"], env, timeout=170)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out  # asv exits 2 when any benchmark fails

    # "For parameters: 'flashinfer', 2, ...\n  asv: skipped: NotImplementedError('flashinfer: <reason>')"
    skipped = {params: reason for params, reason in re.findall(
        r"For parameters: (.+)\n(?:(?!\s*For parameters).*\n)*?\s*asv: skipped: NotImplementedError\((.+)\)", out)}
    expected_skips, expected_runs = set(), set()
    for bench in (decode.KernelTime, decode.CallTime):
        for combo in combinations(bench):
            shown = ", ".join(map(repr, combo))
            (expected_runs if runnable_here(*combo) else expected_skips).add(shown)
    assert set(skipped) == expected_skips, out
    assert all(params.split(",")[0].strip("'") in reason for params, reason in skipped.items())
    assert any(run.startswith("'naive'") for run in expected_runs)
    assert any(run.startswith("'triton'") for run in expected_runs)  # interpreted on the CPU
    for impl in ("naive", "triton"):  # a time in the results table, e.g. "naive  330±90μs"
        assert re.search(rf"\b{impl}\b.*\s[\d.]+±[\d.]+[μm]?s\b", out), out


def test_asv_machine_names_the_gpu(monkeypatch, tmp_path, capsys):
    """scripts/asv_machine.py on a (faked) H200: the name and arch say which GPU it is."""
    asv_machine = load_script("asv_machine")
    h200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=150_754_820_096,
                           multi_processor_count=132, L2_cache_size=62_914_560,
                           uuid="2ecc6a2b-4edc-e236-72da-ed5d57520ed8")
    monkeypatch.setattr(asv_machine.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(asv_machine.torch.cuda, "get_device_properties", lambda device: h200)
    monkeypatch.setattr(results, "_command", lambda *args: None)  # no nvidia-smi: no driver field
    monkeypatch.setattr(sys, "argv", ["asv_machine.py", "--suffix", "ci"])
    monkeypatch.setenv("HOME", str(tmp_path))

    assert asv_machine.main() == 0
    assert capsys.readouterr().out == "nvidia-h200-ci\n"
    machine = json.loads((tmp_path / ".asv-machine.json").read_text())["nvidia-h200-ci"]
    assert machine["arch"].split(" ", 1)[1] == "NVIDIA H200 sm_90 140GiB CUDA " + str(asv_machine.torch.version.cuda)
