"""What several test modules share.

- Running asv from tests: this interpreter as the existing environment, a throwaway HOME for the
  machine file ~/.asv-machine.json, and this checkout importable in the benchmark processes.
- Making a run once per test run (:func:`once`: the conftest's shared asv run and CPU sweeps).
- Running a command's main in this process (:func:`in_process`), or kda-sweep in its own.
- Sweep result directories written by the sweep's own writer, so that readers meet the real format.
- The check that an implementation replayed from a CUDA graph (as the harness times it) takes the
  eager call's step."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from kda_impls import ContractError, DecodeInputs, get, verify
from kda_impls.bench.case import COLUMNS
from kda_impls.bench.config import Config
from kda_impls.bench.results import assemble, write_meta, write_row

REPO = Path(__file__).resolve().parents[1]
SWEEP = [sys.executable, "-m", "kda_impls.bench.sweep"]  # kda-sweep of this checkout, in its own process
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
    import json5  # asv's reader of asv.conf.json (it has comments); only tests of asv need it

    conf = json5.loads((REPO / "asv.conf.json").read_text())
    conf.update(repo=str(REPO), benchmark_dir=str(REPO / "benchmarks"), results_dir=str(directory / "results"),
                html_dir=str(directory / "html"))
    path = directory / "asv.conf.json"
    path.write_text(json.dumps(conf))
    return path


# What the shared CPU run of the suite selects (asv --bench, searched in "name(params)"): every
# naive benchmark (one and two tokens per row), our interpreted Triton kernel's kernel time and
# bandwidth at one token, and one combination that must skip on a CPU (FlashInfer's).
CPU_RUN_IMPLS = "naive,triton,flashinfer-sigmoid"
CPU_RUN_BENCH = [r"\('naive',", r"^decode\.(KernelTime\.track_kernel|Bandwidth\.track_gbps)\('triton', .*, 1\)$",
                 r"^decode\.KernelTime\.track_kernel\('flashinfer-sigmoid', .*, 1\)$",
                 r"^decode\.Frozen(KernelTime\.track_kernel|Bandwidth\.track_gbps)\('triton',"]


@dataclass(frozen=True)
class AsvRun:
    result: Path  # the result file
    benchmarks: Path  # the run's benchmarks.json (names, params, units)
    output: str  # what asv printed (--show-stderr)
    returncode: int


def cpu_asv_run(root: Path) -> dict:
    """One real ``asv run --record-samples`` of the repository's suite on the CPU profile
    (:data:`CPU_RUN_BENCH` of it) under ``root``: what :class:`AsvRun` takes (the conftest's ``cpu_asv``
    fixture makes it once per test run and shares it)."""
    env = asv_env(root, KDA_ASV_PROFILE="cpu", KDA_ASV_IMPLS=CPU_RUN_IMPLS)
    register_machine(env)
    conf = repo_conf(root)
    # Each benchmark process forked from one that imported the suite (asv's forkserver), not spawned:
    # spawn's reason, a fresh CUDA context per combination, does not arise on the CPU, and a spawned
    # process imports torch and the suite again (a run of 54 CPU-seconds instead of 15)
    conf.write_text(json.dumps(json.loads(conf.read_text()) | {"launch_method": "forkserver"}))
    bench = [arg for regex in CPU_RUN_BENCH for arg in ("--bench", regex)]
    done = run_asv(["run", "--config", str(conf), "-E", EXISTING, "--machine", MACHINE, "--set-commit-hash", "HEAD",
                    "--record-samples", "--show-stderr", *bench], env, timeout=400)
    results = root / "results"
    found = list((results / MACHINE).glob("*-existing-*.json"))
    assert len(found) == 1, done.stdout + done.stderr
    return dict(result=str(found[0]), benchmarks=str(results / "benchmarks.json"), output=done.stdout + done.stderr,
                returncode=done.returncode)


def once(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """``make(directory)``'s (JSON) answer, made once per test run in a directory of its own: the
    pytest-xdist workers of one run share the parent of their base directories, and the first
    to ask makes it while the others wait on a lock and then read the answer."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    directory, answer = base / name, base / f"{name}.json"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not answer.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what an attempt that failed left
            directory.mkdir()
            answer.write_text(json.dumps(make(directory)))
        return json.loads(answer.read_text())


# The shared CPU sweep (conftest's cpu_sweep and cpu_shards): two rows of naive at a tiny shape, no charts
CPU_SWEEP = ["--devices", "cpu", "--impls", "naive", "--B", "1,2", "--H", "1", "--HV", "2", "--K", "16", "--V", "16",
             "--placements", "1", "--no-charts"]


def sweep_process(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``kda-sweep ARGS`` (:data:`SWEEP`: this checkout's code) in its own process."""
    return subprocess.run([*SWEEP, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else os.environ | env)


def in_process(main: Callable, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A command's ``main(args)`` run in this process as its command line runs it, ``env`` added to the
    environment meanwhile: its exit status (SystemExit's or the return value), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved, sigterm = {k: os.environ.get(k) for k in env or {}}, signal.getsignal(signal.SIGTERM)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args)) or 0
            except SystemExit as exc:
                code = exc.code or 0
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
        signal.signal(signal.SIGTERM, sigterm)  # kda-sweep's, set before it measures
    return subprocess.CompletedProcess([getattr(main, "__module__", "main"), *args], code, out.getvalue(),
                                       err.getvalue())


def write_sweep_dir(path: Path, rows: dict[Config, list[float] | str], meta: dict,
                    placements: dict[Config, list[float]] | None = None) -> Path:
    """``rows`` maps a config to its kernel samples in microseconds (status "ok"), or to the status
    of a row without measurements ("unsupported", "wrong", ...); ``placements`` a config to its
    per-placement medians."""
    for cfg, measured in rows.items():
        row = dict.fromkeys(COLUMNS) | cfg.columns() | {
            "key": cfg.key(), "kernel_samples_us": [], "call_samples_us": [],
            "kernel_placement_us": (placements or {}).get(cfg, [])}
        if isinstance(measured, str):
            row |= {"status": measured, "reason": "a test's row"}
        else:
            row |= {"status": "ok", "kernel_us_mean": float(np.median(measured)), "kernel_samples_us": measured,
                    "kernel_method": "cuda-graph"}
        write_row(path, row)
    assemble(path)
    write_meta(path, meta)
    return path


def assert_graph_replay_takes_eager_step(name: str, x: DecodeInputs) -> torch.Tensor:
    """Runs implementation ``name`` eagerly on ``x`` and from a captured CUDA graph on a clone of
    it, and asserts that the replay's output and every byte of its pool span equal the eager
    call's. The launcher is warmed up on a side stream before capture (a library compiles and
    caches on its first call) and the warm-up's step undone, so the replay takes the same step.
    Returns the eager output."""
    y = x.clone()
    eager = get(name).bind(x)()
    launch = get(name).bind(y)
    original = y.pool_span().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = launch()
    y.pool_span().copy_(original)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.equal(y.pool_span().view(torch.int16), x.pool_span().view(torch.int16))
    return eager


def assert_launch_allocates_nothing(name: str, x: DecodeInputs) -> None:
    """A bound launcher of ``name`` allocates no GPU memory when it runs (after a first launch, so
    that lazy workspaces are not counted): nothing is allocated per step."""
    launch = get(name).bind(x)
    launch()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    launch()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


# ---- decode inputs shared by the implementation tests ----------------------------------------------

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_fla = pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed")


def runnable(inputs: DecodeInputs) -> DecodeInputs:
    """``inputs``, or a skip naming why our Triton kernel cannot run them here."""
    reason = get("triton").unsupported(inputs)
    if reason:
        pytest.skip(reason)
    return inputs


def with_gaps(x: DecodeInputs) -> DecodeInputs:
    """``x`` with a third of its slots, never a row's start slot, set to -1 (on a diagonal pattern):
    tokens whose state is not stored, at the start, in the middle and at the end of rows."""
    rows, tokens = torch.arange(x.B, device=x.device).view(-1, 1), torch.arange(x.T, device=x.device).view(1, -1)
    gaps = ((rows + tokens) % 3 == 1) & (tokens != (x.accepted().long() - 1).view(-1, 1))
    x.slots = torch.where(gaps, -1, x.slots).contiguous()
    return x


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` starting 2 bytes past a 32-byte boundary."""
    buffer = torch.empty(t.numel() * t.element_size() + 32, dtype=torch.uint8)
    start = (-buffer.data_ptr()) % 32 + 2
    return buffer[start:start + t.numel() * t.element_size()].view(t.dtype).view(t.shape).copy_(t)


def expect_refusal(impl, x: DecodeInputs, rule: str, pattern: str) -> ContractError:
    """``impl.bind(x)`` raises the ContractError of ``rule``, its message matching ``pattern`` and
    naming the implementation first, and leaves every input and the whole pool as they were."""
    before = {n: t.clone() for n, t in x.tensors().items()}
    pool = x.pool_span().clone() if x.state.dim() == 4 else None
    with pytest.raises(ContractError) as err:
        impl.bind(x)
    assert err.value.rule == rule and err.value.impl == impl.label
    assert str(err.value).startswith(impl.label + " ")
    assert re.search(pattern, str(err.value)), str(err.value)
    for n, t in x.tensors().items():
        assert t.is_meta or torch.equal(t, before[n]), f"{n} was modified"
    if pool is not None:
        assert torch.equal(x.pool_span().view(torch.int16), pool.view(torch.int16))
    return err.value


def assert_verified_or_refuses_gva(impl, x: DecodeInputs) -> None:
    """``impl`` computes the reference on ``x`` (verify), or, an in-kernel gate variant given GVA, refuses
    it saying the library reads the gate parameters per q/k head."""
    reason = impl.unsupported(x)
    if x.H != x.HV and impl.gate_in_kernel:
        assert reason is not None and "per q/k head" in reason, reason
        return
    assert reason is None, reason
    verdict = verify(impl, x)
    assert verdict.ok, verdict

