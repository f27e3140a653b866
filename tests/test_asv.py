"""The asv suite on a box without a GPU, as CI checks it: `asv check` passes; one real `asv run`
(the session-scoped fixture cpu_asv, shared with the gate's tests) runs naive and the interpreted Triton
kernel, skips exactly the combinations the implementations declare unsupported here, with their
reason, and records bandwidth from the kernel time's own measurement; asv.conf.json's
Regressions settings are the gate's thresholds.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import re
import sys
from types import SimpleNamespace

import pytest

from benchmarks import common
from helpers import (
    CPU_RUN_BENCH,
    EXISTING,
    REPO,
    AsvRun,
    asv_env,
    register_machine,
    repo_conf,
    run_asv,
)
from kda_impls import asv_machine, regress
from kda_impls.bench import results
from kda_impls.bench.case import run_case


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = asv_env(tmp_path_factory.mktemp("home"))
    env.pop("KDA_ASV_PROFILE", None)
    register_machine(env)
    return env


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    return str(repo_conf(tmp_path_factory.mktemp("asv")))


def test_asv_check(env, conf):
    done = run_asv(["check", "--config", conf, "-E", EXISTING], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No problems found" in done.stdout


def test_the_regressions_page_uses_the_gates_thresholds():
    """asv.conf.json's regression settings are the gate's table (kda_impls.regress): asv's page and
    kda-regress flag the same families at the same thresholds, and neither flags call latency."""
    import json5

    conf = json5.loads((REPO / "asv.conf.json").read_text())
    settings = regress.asv_regression_settings()
    assert {key: conf[key] for key in settings} == settings
    call = "decode.CallTime.track_call('triton', 1)"
    kernel = "decode.KernelTime.track_kernel('triton', {}, 'HV32-K128-V128', 0, 'bfloat16', 1)"
    gbps = kernel.replace("KernelTime.track_kernel", "Bandwidth.track_gbps")
    for name in (call, kernel.format(1), kernel.format(64), gbps.format(1), gbps.format(64)):
        gated = regress.threshold_for(name, regress.DEFAULT_THRESHOLD, regress.DEFAULT_THRESHOLDS)
        # asv: the largest threshold among the patterns that match at the start; a null first commit: off
        off = any(re.match(p, name) for p in conf["regressions_first_commits"])
        asv = max(t for p, t in conf["regressions_thresholds"].items() if re.match(p, name))
        assert (gated is None) == (name == call)
        assert off == (name in (call, gbps.format(1), gbps.format(64)))  # a rate: asv flags rises only
        assert gated is None or asv == gated, name


@functools.cache
def runnable_here(impl: str, B: int, heads: str = common.PROFILE["heads"][0], slot_pad: int = 0,
                  state_dtype: str = "bfloat16", T: int = 1, mode: str = "inplace") -> bool:
    """Whether the harness's correctness check (no timing) can run the combination on the CPU."""
    cfg = common.config(impl, B, heads, slot_pad, state_dtype, T, mode)
    return run_case(cfg, "cpu")["status"] != "unsupported"


def mode_of(name: str) -> str:
    """The mode a benchmark measures: decode.Frozen* the frozen-verify point, the others in place."""
    return "frozen" if name.startswith("decode.Frozen") else "inplace"


def selected(run: AsvRun) -> dict[str, list[tuple[str, tuple]]]:
    """Per benchmark the run knew (its benchmarks.json), (asv name with params, params) of each
    combination it selected."""
    found = {}
    for bench, info in json.loads(run.benchmarks.read_text()).items():
        if not isinstance(info, dict) or "params" not in info:
            continue
        shown = [(f"{bench}({', '.join(combo)})", tuple(map(ast.literal_eval, combo)))
                 for combo in itertools.product(*info["params"])]
        found[bench] = [(name, combo) for name, combo in shown if any(re.search(r, name) for r in CPU_RUN_BENCH)]
    return found


@pytest.mark.skipif(common.DEVICE != "cpu", reason="expects the CPU profile; the GPU profiles run for minutes")
def test_a_cpu_run_of_the_suite(cpu_asv):
    """naive and our interpreted Triton kernel run and record every benchmark asked of them; exactly
    the combinations the implementations declare unsupported here skip, with their reason."""
    run = cpu_asv
    assert run.returncode == 0, run.output  # asv exits 2 when any benchmark fails

    # "For parameters: 'flashinfer', 2, ...\n  asv: skipped: NotImplementedError('flashinfer: <reason>')"
    skipped = {params: reason for params, reason in re.findall(
        r"For parameters: (.+)\n(?:(?!\s*For parameters).*\n)*?\s*asv: skipped: NotImplementedError\((.+)\)",
        run.output)}
    expected_skips, expected_runs = set(), set()
    for combos in selected(run).values():
        for name, combo in combos:
            cfg_args = combo if len(combo) > 2 else (*combo, common.PROFILE["heads"][0])
            shown = ", ".join(map(repr, combo))
            (expected_runs if runnable_here(*cfg_args, mode=mode_of(name)) else expected_skips).add(shown)
    assert expected_skips and set(skipped) == expected_skips, run.output
    assert all(params.split(",")[0].strip("'") in reason for params, reason in skipped.items())
    assert any(r.startswith("'naive'") for r in expected_runs) and any(r.startswith("'triton'") for r in expected_runs)
    for impl in ("naive", "triton"):  # a time in the results table, e.g. "naive  330±90μs"
        assert re.search(rf"\b{impl}\b.*\s[\d.]+±[\d.]+[μm]?s\b", run.output), run.output


def test_bandwidth_is_the_kernel_times_measurement_in_units_asv_shows(cpu_asv):
    """Each combination's GB/s samples are the bytes one step moves (DecodeInputs.nbytes(), the
    sweeps' byte model) over its kernel-time samples of the same run, placement by placement; its
    fraction of the copy bandwidth is that over one copy bandwidth measured in the same process."""
    run = cpu_asv
    units = {name: bench["unit"] for name, bench in json.loads(run.benchmarks.read_text()).items()
             if isinstance(bench, dict) and "unit" in bench}
    assert units["decode.Bandwidth.track_gbps"] == "GB/s"
    assert units["decode.Bandwidth.track_roofline_frac"] == "fraction of copy bandwidth"
    assert units["decode.KernelTime.track_kernel"] == "seconds"
    samples = {name: m.samples for name, m in regress.load(run.result).measurements.items()}
    checked = []
    chosen = selected(run)
    for name, combo in [*chosen["decode.Bandwidth.track_gbps"], *chosen["decode.FrozenBandwidth.track_gbps"]]:
        if name not in samples:  # skipped here
            continue
        kernel = samples[name.replace("Bandwidth.track_gbps", "KernelTime.track_kernel")]
        inputs = common.config(*combo, mode=mode_of(name)).make_inputs("cpu", 1)
        assert inputs.update_state == (mode_of(name) == "inplace")
        nbytes = inputs.nbytes()
        assert len(samples[name]) == len(kernel) == common.PLACEMENTS
        moved = [gbps * seconds for gbps, seconds in zip(samples[name], kernel, strict=True)]
        assert moved == pytest.approx([nbytes / 1e9] * len(kernel))
        frac = samples.get(name.replace("track_gbps", "track_roofline_frac"))
        if frac:
            copy_gbps = [g / f for g, f in zip(samples[name], frac, strict=True)]
            assert copy_gbps == pytest.approx([copy_gbps[0]] * len(copy_gbps)) and copy_gbps[0] > 0
        checked.append(mode_of(name))
    # naive at one and two tokens and triton at one in place; triton's frozen verify
    assert checked.count("inplace") >= 3 and checked.count("frozen") == 1, checked


def test_asv_machine_name_carries_the_implementation_set():
    """Two sets on one commit file their results under two machines (asv replaces a benchmark's results
    whole within one); the same set in another order or spacing is the same machine."""
    assert asv_machine.machine_name("nvidia-h200") == "nvidia-h200"
    assert asv_machine.machine_name("nvidia-h200", "pool2", "triton, fla") == "nvidia-h200-pool2-fla+triton"
    name = functools.partial(asv_machine.machine_name, "nvidia-h200", "")
    assert name("fla,triton") == name("triton,fla") and name("triton") != name("triton,fla")


def test_asv_machine_names_the_gpu(monkeypatch, tmp_path, capsys):
    """kda_impls.asv_machine on a (faked) H200: the name and arch say which GPU it is."""
    h200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=150_754_820_096,
                           multi_processor_count=132, L2_cache_size=62_914_560,
                           uuid="2ecc6a2b-4edc-e236-72da-ed5d57520ed8")
    monkeypatch.setattr(asv_machine.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(asv_machine.torch.cuda, "get_device_properties", lambda device: h200)
    monkeypatch.setattr(results, "_command", lambda *args: None)  # no nvidia-smi: no driver field
    monkeypatch.setattr(sys, "argv", ["asv_machine.py", "--suffix", "ci"])
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KDA_ASV_IMPLS", raising=False)  # the default set: the GPU's name alone

    assert asv_machine.main() == 0
    assert capsys.readouterr().out == "nvidia-h200-ci\n"
    machine = json.loads((tmp_path / ".asv-machine.json").read_text())["nvidia-h200-ci"]
    assert machine["arch"].split(" ", 1)[1] == "NVIDIA H200 sm_90 140GiB CUDA " + str(asv_machine.torch.version.cuda)
    monkeypatch.setenv("KDA_ASV_IMPLS", "triton,fla")  # another set: another machine, registered as such
    assert asv_machine.main() == 0
    assert capsys.readouterr().out == "nvidia-h200-ci-fla+triton\n"
    assert "nvidia-h200-ci-fla+triton" in json.loads((tmp_path / ".asv-machine.json").read_text())
