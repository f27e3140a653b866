"""The command-line tools as a user meets them, one process per behaviour on tiny grids: bad input gets
one line saying what is wrong and what to do (exit 2, no traceback, nothing written), Ctrl-C saves what
is done, a sweep that measured nothing fails, a directory of other settings names the fields that
differ, shards merge into one result and a merge never relabels a target measured otherwise."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers import REPO, SWEEP, in_process, once

TINY = ["--devices", "cpu", "--impls", "naive", "--B", "2", "--H", "1", "--HV", "2", "--K", "16", "--V", "16",
        "--placements", "1", "--no-charts"]


MAINS = {"sweep": "kda_impls.bench.sweep:main", "merge": "kda_impls.bench.merge:main",
         "plot": "kda_impls.bench.plots:main", "regress": "kda_impls.regress:main", "survey": "kda_impls.__main__:main",
         "spec-step": "kda_impls.bench.spec_step:main"}
def run(tool: str, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    path, func = MAINS[tool].split(":")
    code = f"import sys; from {path} import {func} as main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else os.environ | env)


def call(tool: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The tool's main(args) in this process (helpers.in_process): for a behaviour that starts no worker,
    where a process of its own would cost only its start-up (each command also has a test that runs it
    in its own process: here, tests/test_regress.py and tests/test_plots.py)."""
    path, func = MAINS[tool].split(":")
    return in_process(getattr(importlib.import_module(path), func), *args, env=env)


def run_each(cases: list[tuple[str, list[str]]]) -> list[subprocess.CompletedProcess]:
    """Each (tool, argv) through :func:`call`, in turn: many flags of one behaviour."""
    return [call(tool, *argv) for tool, argv in cases]


@pytest.fixture
def tiny(cpu_sweep) -> Path:
    """One tiny sweep directory (two rows: the session-scoped cpu_sweep) that tests copy rather than measure again."""
    return cpu_sweep


def copy_of(directory: Path, to: Path, **settings) -> Path:
    """A copy of a sweep directory, its meta.json's method settings changed as given."""
    shutil.copytree(directory, to)
    meta = json.loads((to / "meta.json").read_text())
    meta["settings"]["method"] |= settings
    (to / "meta.json").write_text(json.dumps(meta))
    return to


def files_of(directory: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(("kda-sweep: error:", "kda-merge: error:", "kda-plot: error:", "kda-regress: error:",
                                "kda-survey: error:")), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_every_command_prints_its_help():
    """argparse formats help strings with %: a literal one (a "2%" in a help text) broke kda-sweep --help."""
    for done in run_each([(tool, ["--help"]) for tool in MAINS]):
        assert done.returncode == 0 and "usage:" in done.stdout and not done.stderr, (done.args, done.stderr)


BAD_SWEEP_ARGUMENTS = [
    (["--row-timeout", "0"], ["--row-timeout", "must be a number > 0"]),
    (["--row-timeout", "-5"], ["--row-timeout"]),
    (["--impls", ""], ["--impls", "not a comma-separated list"]),
    (["--impls", "nope"], ["unknown implementations nope", "registered:"]),
    (["--B", "0"], ["--B", "must be a whole number >= 1"]),
    (["--out", "/proc/kda-sweep-test"], ["--out /proc/kda-sweep-test: cannot write there"]),
    (["--B", "1,x"], ["--B", "'x' is not a whole number"]),
    (["--state-dtype", "fp8"], ["unknown dtype 'fp8'"]),
    (["--shard", "2/2"], ["--shard", "0 <= i < n"]),
    (["--mode", "inplace,verify"], ["--mode", "'verify' is not one of inplace, frozen, replay"]),
    (["--mode", "inplace,replay"], ["mode replay needs ring >= T", "--ring L", "got ring=0, T=1"]),
    (["--ring", "16"], ["--ring 16: no replay row of adhoc has that ring", "add --mode replay"]),
    (["--mode", "replay", "--ring", "4", "--T", "2"], ["mode replay times one-token decode steps: T must be 1"]),
    (["--mode", "replay", "--ring", "0"], ["--ring", "must be a whole number >= 1"]),
    (["--devices", "cuda:7"], ["--devices"]),
    (["--preset", "kimi-linear-48b", "--HV", "7"], ["leave no configuration of preset kimi-linear-48b"]),
    (["--baseline", "triton"], ["--baseline triton is not among this run's implementations (naive)"]),
    (["--H", "3", "--HV", "2"], ["HV must be a multiple of H; got HV=2, H=3", "rule 'gva'"]),
    (["--HV", "2,4", "--H", "1,3"], ["HV must be a multiple of H; got HV=2, H=3"]),
]


# dry runs of the ring axis, in the refusals' process: ad hoc rows, and the replay preset narrowed to a ring
RING_DRY_RUNS = [[*TINY, "--mode", "inplace,replay", "--ring", "4,8", "--dry-run"],
                 ["--preset", "replay", "--devices", "cpu", "--impls", "naive", "--ring", "16", "--HV", "32",
                  "--state-dtype", "bf16", "--dry-run"]]


def test_sweep_refuses_bad_arguments_in_one_line(tmp_path):
    target = tmp_path / "results.csv"
    target.write_text("")
    cases = [*BAD_SWEEP_ARGUMENTS, (["--out", str(target)], [f"--out {target} is a file"])]
    default_dirs = set((REPO / "sweeps").glob("*"))
    *refused, adhoc, preset = run_each([("sweep", [*TINY, *args]) for args, _ in cases] +
                                       [("sweep", args) for args in RING_DRY_RUNS])
    for done, (_, fragments) in zip(refused, cases, strict=True):
        one_line_error(done, *fragments)
    assert target.read_text() == "" and set((REPO / "sweeps").glob("*")) == default_dirs  # nothing written
    ring_axis_lists_replay_rows_beside_in_place_ones_and_narrows_a_preset_to_its_rings(adhoc, preset)


def ring_axis_lists_replay_rows_beside_in_place_ones_and_narrows_a_preset_to_its_rings(adhoc, preset):
    """--mode inplace,replay --ring 4,8: one in-place row and a replay row per ring; --ring on the
    replay preset keeps its in-place rows and the replay rows of that ring."""
    assert adhoc.returncode == 0 and "3 to measure (3 new)" in adhoc.stdout, adhoc.stdout + adhoc.stderr
    listed = [line.split()[:3] for line in adhoc.stdout.splitlines()]
    assert ["inplace", "0", "1"] in listed and ["replay", "4", "1"] in listed and ["replay", "8", "1"] in listed
    assert preset.returncode == 0 and "12 to measure" in preset.stdout, preset.stdout + preset.stderr
    listed = [line.split() for line in preset.stdout.splitlines()]
    batches = "1,16,32,64,128,256"
    assert ["inplace", "0", "6", batches] in listed and ["replay", "16", "6", batches] in listed


def test_a_sweep_in_which_no_row_succeeded_fails(tmp_path):
    done = run("sweep", "--devices", "cpu", "--impls", "flashinfer", "--B", "2", "--HV", "2", "--K", "64",
               "--placements", "1", "--no-charts", "--out", str(tmp_path / "none"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "kda-sweep: no row ran (1 unsupported); their reasons are above"


def test_a_read_only_out_is_refused_before_anything_runs(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    (tmp_path / "ro").mkdir(mode=0o555)
    one_line_error(call("sweep", *TINY, "--out", str(tmp_path / "ro")), "cannot write there")
    assert not list((tmp_path / "ro").iterdir())


@pytest.mark.parametrize("extra, fragments", [
    ("bad", ["KDA_EXTRA_IMPLS: 'bad' is not name=module:Class", "unset it"]),
    ("mine=no_such_module:Mine", ["mine=no_such_module:Mine does not import here", "leave mine out"]),
])
def test_a_mistyped_extra_implementation_is_one_line_and_writes_nothing(tmp_path, extra, fragments):
    impls = "naive,mine" if "mine" in extra else "naive"
    one_line_error(call("sweep", *TINY, "--impls", impls, "--out", str(tmp_path / "s"),
                        env={"KDA_EXTRA_IMPLS": extra}), *fragments)
    assert not (tmp_path / "s").exists()


def test_survey_refuses_a_device_it_cannot_measure_on():
    one_line_error(call("survey", "--device", "tpu"), "--device", "'tpu' is not a device")


def test_reusing_out_with_other_settings_names_the_fields_that_differ(tiny, tmp_path):
    out = copy_of(tiny, tmp_path / "s")
    before = files_of(out)
    done = call("sweep", *TINY, "--out", str(out), "--l2-entry", "dirty", "--max-seconds", "0.5")
    one_line_error(done, "method.entry: 'previous-step' -> 'dirty'", "method.kernel.max_seconds")
    assert "device_type" not in done.stderr and "{" not in done.stderr  # the differences, not two whole dicts
    assert files_of(out) == before


def test_dry_run_lists_the_rows_and_warns_of_a_cpu_days_long_grid(tmp_path):
    done = call("sweep", "--devices", "cpu", "--preset", "kimi-linear-48b", "--impls", "naive,triton", "--dry-run",
                "--out", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    assert "120 rows in" in done.stdout and "0 kept, 120 to measure (120 new)" in done.stdout
    assert "1,2,4,8,16,32,64,128,256,512" in done.stdout and "on the CPU, kernels interpreted" in done.stdout
    assert " days " in done.stdout.splitlines()[-1] and not (tmp_path / "s").exists()


def test_a_failing_chart_writer_says_where_the_rows_are(tmp_path):
    out = tmp_path / "s"
    for chart in ("latency.png", "latency.svg"):  # a directory where a chart goes: the write fails
        (out / chart).mkdir(parents=True)
    done = run("sweep", *TINY[:-1], "--B", "1,2", "--out", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kda-sweep: error: writing ") and f"the 2 rows measured are saved in {out}/rows" in last
    assert len(list((out / "rows").glob("*.json"))) == 2


def test_default_out_is_named_by_the_grid_and_settings(tmp_path):
    from kda_impls.bench import sweep

    def out_of(*argv):
        spec = sweep.spec_from_argv(["--devices", "cpu", *argv])
        settings = sweep.settings_of(["cpu"], spec.method())
        return sweep.default_out(spec, spec.configs(), settings).relative_to(Path.cwd())

    assert out_of() == out_of("--preset", "smoke") == Path("sweeps/smoke-cpu")
    grids = {out_of("--B", "1"), out_of("--B", "2"), out_of("--B", "1", "--l2-entry", "dirty"),
             out_of("--preset", "smoke", "--impls", "naive"), out_of("--preset", "smoke", "--no-charts")}
    assert len(grids) == 5 and all(p.name.startswith(("adhoc-cpu-", "smoke-cpu")) for p in grids)
    assert out_of("--B", "1") == out_of("--B", "1", "--fresh", "--no-charts")  # the same rows, the same directory


def test_ctrl_c_saves_the_rows_done_and_says_how_to_resume(tmp_path):
    out = tmp_path / "interrupted"
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    sweep = subprocess.Popen([*SWEEP, "--devices", "cpu", "--impls", "naive", "--B",
                              "1,2,3,4,5,6,7,8", "--HV", "2", "--K", "16", "--state-dtype", "bf16,fp32",
                              "--max-seconds", "0.3", "--out", str(out), "--no-charts"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.monotonic() + 90
    while not list((out / "rows").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(sweep.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    stdout, stderr = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr, stderr
    saved = len(list((out / "rows").glob("*.json")))
    assert saved >= 1 and f"interrupted: {saved} rows saved in {out}; run the same command again" in stderr
    assert len(pd.read_csv(out / "results.csv")) == saved  # assembled from what was done


def test_shards_merge_into_the_whole_sweep(tmp_path, cpu_shards):
    from kda_impls.bench.config import PoolLayout
    from kda_impls.bench.presets import adhoc_configs

    keys = [set(pd.read_csv(shard / "results.csv").key) for shard in cpu_shards]  # --shard 0/2, 1/2
    axes = {"B": (1, 2), "H": (1,), "HV": (2,), "K": (16,), "V": (16,), "state_dtype": ("bfloat16",)}
    whole = {c.key() for c in adhoc_configs(["naive"], axes, PoolLayout(placements=1))}
    assert keys[0] and keys[1] and not keys[0] & keys[1] and keys[0] | keys[1] == whole
    merged = run("merge", str(tmp_path / "merged"), *map(str, cpu_shards))
    assert merged.returncode == 0, merged.stderr
    assert set(pd.read_csv(tmp_path / "merged" / "results.csv").key) == keys[0] | keys[1]
    meta = json.loads((tmp_path / "merged" / "meta.json").read_text())
    assert len(meta["runs"]) == 2 and len(meta["merged_from"]) == 2
    again = call("merge", str(tmp_path / "twice"), str(cpu_shards[0]), str(cpu_shards[0]))
    one_line_error(again, "is in two of the directories")


def test_merge_refuses_directories_measured_otherwise(tiny, tmp_path):
    default, dirty = copy_of(tiny, tmp_path / "default"), copy_of(tiny, tmp_path / "dirty", entry="dirty")
    one_line_error(call("merge", str(tmp_path / "m"), str(default), str(dirty)),
                   "method.entry: 'previous-step' -> 'dirty'")
    assert not (tmp_path / "m").exists()
    before = files_of(dirty)  # a target of other settings is neither relabelled nor joined
    one_line_error(call("merge", str(dirty), str(default)), f"{dirty} was measured otherwise", "nothing was changed")
    assert files_of(dirty) == before


def test_plot_errors_are_one_line(tmp_path):
    one_line_error(call("plot", str(tmp_path / "missing")), "no such directory")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "results.csv").write_text("")
    one_line_error(call("plot", str(tmp_path / "empty")), "results.csv: empty or cut short")


def test_plot_refuses_a_baseline_not_in_the_run(tiny):
    one_line_error(call("plot", str(tiny), "--baseline", "flashinfer"), "--baseline flashinfer is not in")


def test_regress_refuses_bad_thresholds_in_one_line(tmp_path):
    cases = [(["--threshold-for", "bad"], ["'bad' is not REGEX=VALUE"]),
             (["--threshold-for", "(unclosed=0.1"], ["not a valid regular expression"]),
             (["--threshold-for", "x=-1"], ["must be a number >= 0 or 'none'"])]
    runs = run_each([("regress", [str(tmp_path), str(tmp_path), *args]) for args, _ in cases])
    for done, (_, fragments) in zip(runs, cases, strict=True):
        one_line_error(done, *fragments)


def test_regress_names_an_unreadable_result_file(tmp_path):
    empty, cut = tmp_path / "empty.json", tmp_path / "cut.json"
    empty.write_text("")
    cut.write_text('{"result_columns": ["result"], "results": {"x": [')
    one_line_error(call("regress", str(empty), str(empty)), f"{empty}: not valid JSON")
    one_line_error(call("regress", str(cut), str(cut)), f"{cut}: not valid JSON")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "results.csv").write_text("impl,key,status\nnaive,k,o")
    one_line_error(call("regress", str(sweep_dir), str(sweep_dir)), "results.csv: not a sweep's results")


# naive and the interpreted Triton kernels in each mode, at two tokens per row (in place storing the last state)
MODES = [*TINY, "--impls", "naive,triton,fla", "--T", "2", "--checkpoints", "last", "--mode", "inplace,frozen"]


@pytest.fixture(scope="session")
def modes(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One sweep of :data:`MODES` (helpers.once; its directory and process), run as a user would:
    without TRITON_INTERPRET, which kda-sweep sets for the CPU itself."""
    def make(directory: Path) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        done = subprocess.run([*SWEEP, *MODES, "--out", str(directory / "s")], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
        return {"out": str(directory / "s"), "returncode": done.returncode, "stdout": done.stdout,
                "stderr": done.stderr}

    made = once(tmp_path_factory, "modes-sweep", make)
    return Path(made["out"]), subprocess.CompletedProcess(MODES, made["returncode"], made["stdout"], made["stderr"])


def test_survey_and_sweep_agree_on_what_runs_on_a_cpu(modes):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    survey = subprocess.run([sys.executable, "-m", "kda_impls"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert survey.returncode == 0, survey.stderr
    lines = {tuple(line.split()[:2]): line for line in survey.stdout.splitlines()[2:] if line.strip()}
    table = pd.read_csv(modes[0] / "results.csv")
    for impl in ("naive", "triton", "fla"):
        rows = table[table.impl == impl]
        assert sorted(rows["mode"]) == ["frozen", "inplace"] and (rows.status == "ok").all(), (impl, modes[1].stderr)
        assert all(" ok " in lines[impl, mode] for mode in ("inplace", "frozen")), survey.stdout  # each mode a row
    assert " unsupported " in lines["flashinfer", "frozen"], survey.stdout  # not here: said with its reason


def test_a_time_limits_sigterm_saves_like_ctrl_c(tmp_path):
    out = tmp_path / "terminated"
    sweep = subprocess.Popen([*SWEEP, "--devices", "cpu", "--impls", "naive", "--B",
                              "1,2,3,4,5,6,7,8", "--HV", "2", "--K", "16", "--max-seconds", "0.3", "--out", str(out),
                              "--no-charts"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not list((out / "rows").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    sweep.terminate()  # SIGTERM to the driver alone, as `timeout` sends it
    _, stderr = sweep.communicate(timeout=60)
    assert sweep.returncode == 130 and "Traceback" not in stderr, stderr
    saved = len(list((out / "rows").glob("*.json")))
    assert len(pd.read_csv(out / "results.csv")) == saved
    assert json.loads((out / "meta.json").read_text())["runs"][-1]["rows_measured"] == saved


def test_a_burst_of_sigterms_to_the_process_group_still_saves_everything(tmp_path):
    """`timeout` signals the driver and then its whole process group, and a batch system may signal
    again: interrupts after the first must not cut the cleanup short (results.csv and the run in
    meta.json written), nor kill a worker with a traceback of its own."""
    out = tmp_path / "terminated"
    sweep = subprocess.Popen([*SWEEP, "--devices", "cpu", "--impls", "naive", "--B",
                              "1,2,3,4,5,6,7,8", "--HV", "2", "--K", "16", "--max-seconds", "0.3", "--out", str(out),
                              "--no-charts"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.monotonic() + 90
    while not list((out / "rows").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    for _ in range(40):  # SIGTERM to the whole group every 10 ms for 0.4 s, through the cleanup
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sweep.pid, signal.SIGTERM)
        time.sleep(0.01)
    _, stderr = sweep.communicate(timeout=60)
    assert sweep.returncode == 130 and "Traceback" not in stderr, stderr
    saved = len(list((out / "rows").glob("*.json")))
    assert len(pd.read_csv(out / "results.csv")) == saved
    assert json.loads((out / "meta.json").read_text())["runs"][-1]["rows_measured"] == saved


def test_compile_groups_keep_an_implementations_shape_on_one_lane_in_order():
    from kda_impls.bench.config import Config
    from kda_impls.bench.schedule import compile_groups

    configs = [Config(impl, B, 32, 32, 128, 128, state_dtype=dtype, slot_pad=pad)
               for dtype in ("bfloat16", "float32") for impl in ("triton", "fla") for B in (1, 64) for pad in (0, 64)]
    configs += [Config("triton", 8, 32, 32, 128, 128, T=2), Config("triton", 8, 32, 32, 128, 128, T=2, mode="frozen")]
    groups = compile_groups(configs)
    assert [len(g) for g in groups] == [4, 4, 4, 4, 1, 1]
    assert [(g[0].impl, g[0].state_dtype, g[0].T, g[0].mode) for g in groups] == [
        ("triton", "bfloat16", 1, "inplace"), ("fla", "bfloat16", 1, "inplace"), ("triton", "float32", 1, "inplace"),
        ("fla", "float32", 1, "inplace"), ("triton", "bfloat16", 2, "inplace"), ("triton", "bfloat16", 2, "frozen")]
    assert sorted((c.key() for g in groups for c in g)) == sorted(c.key() for c in configs)


def test_a_lane_keeps_to_the_implementations_it_started():
    """Two lanes: each takes a whole implementation, the one with most rows first, and takes groups
    of the other lane's implementation only when no implementation is left unstarted, from its end."""
    from kda_impls.bench.config import Config
    from kda_impls.bench.schedule import GroupScheduler, compile_groups

    configs = [Config(impl, B, HV, HV, 64, 64) for impl, heads in (("naive", (16,)), ("triton", (16, 32, 64)),
                                                                    ("fla", (16, 32))) for HV in heads for B in (1, 64)]
    todo = GroupScheduler(compile_groups(configs))
    taken = [(lane, todo.next(lane)) for lane in ("a", "b", "a", "b", "a", "b", "b")]
    assert [(lane, g[0].impl, g[0].HV) for lane, g in taken[:6]] == [
        ("a", "triton", 16), ("b", "fla", 16), ("a", "triton", 32), ("b", "fla", 32), ("a", "triton", 64),
        ("b", "naive", 16)]
    assert taken[6][1] is None and todo.next("a") is None
    assert sorted(c.key() for _, g in taken[:6] for c in g) == sorted(c.key() for c in configs)

    todo = GroupScheduler(compile_groups(configs))
    assert todo.next("a")[0].HV == 16 and todo.next("b")[0].impl == "fla" and todo.next("b")[0].impl == "fla"
    assert todo.next("b")[0].impl == "naive"
    stolen = todo.next("b")  # nothing unstarted is left: the end of lane a's implementation
    assert (stolen[0].impl, stolen[0].HV) == ("triton", 64)
    assert todo.next("a")[0].HV == 32 and todo.next("a") is None and todo.next("b") is None


def test_a_worker_is_stopped_once():
    """On Ctrl-C the driver and a lane may both stop one worker: the second stop does nothing
    (closing its pipe twice from two threads raced into EBADF and a traceback)."""
    from kda_impls.bench.case import Method
    from kda_impls.bench.driver import Worker

    worker = Worker("naive", "cpu", Method())
    worker.stop(now=True)
    assert not worker.process.is_alive()

    class ClosedPipe:
        def close(self):
            raise OSError(9, "Bad file descriptor")

    worker.conn = ClosedPipe()
    worker.stop(now=True)  # must not touch the pipe again


def test_lane_summary_adds_up_each_devices_rows():
    """The line a sweep over several GPUs prints: rows, seconds busy and first-call seconds per lane."""
    from kda_impls.bench.report import lane_summary

    table = pd.DataFrame({"key": list("abcde"), "device": ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:1"],
                          "row_s": [1.0, 2.0, 3.5, 0.25, 0.25], "first_call_ms": [500.0, 0.0, 250.0, 1000.0, None]})
    assert lane_summary(table) == "cuda:0 2, 4.5 s, 0.8 s; cuda:1 3, 2.5 s, 1.0 s"


def test_a_python_script_runs_a_sweep_and_gets_its_table(tmp_path):
    """kda_impls.sweep: the command's rows, resume and checks from Python values (a torch dtype, lists);
    a refused argument raises, naming the setting."""
    code = f"""
import torch
import kda_impls
from kda_impls.cli import UsageError
if __name__ == "__main__":
    grid = dict(impls=["naive"], devices="cpu", B=[1, 2], H=1, HV=2, K=16, V=16, placements=1,
                state_dtype=torch.bfloat16, out={str(tmp_path / "s")!r})
    table = kda_impls.sweep(**grid)
    assert list(table.status) == ["ok", "ok"] and list(table.B) == [1, 2] and (table.kernel_us_mean > 0).all()
    again = kda_impls.sweep(**grid)
    assert again.started_utc.tolist() == table.started_utc.tolist()  # resumed: nothing measured again
    try:
        kda_impls.sweep(**grid | dict(B=0))
    except UsageError as exc:
        print("refused:", exc)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 to measure" in done.stdout
    assert "refused: B: 0 must be a whole number >= 1" in done.stdout


def test_a_cpu_run_of_a_gpu_sized_grid_warns_with_its_estimate(tmp_path):
    """Interpreted on a CPU, one Kimi-Linear-sized Triton row takes hours: the run says so before it
    starts (here the row is then cut short by its timeout)."""
    done = run("sweep", "--devices", "cpu", "--impls", "triton", "--B", "256", "--placements", "1", "--row-timeout",
               "0.5", "--no-charts", "--out", str(tmp_path / "s"))
    warning = [line for line in done.stderr.splitlines() if line.startswith("kda-sweep: warning:")]
    assert len(warning) == 1 and "1 rows to measure: about" in warning[0] and " h on the CPU" in warning[0], done.stderr
    assert done.returncode == 1 and "1 crashed" in done.stderr.splitlines()[-1]


def test_mode_axis_measures_frozen_verify_beside_in_place(modes):
    """--mode inplace,frozen: a row per mode (frozen verify its own key, its checkpoints one spelling),
    both checked against the reference (Triton interpreted), the summary naming the mode."""
    done = modes[1]
    assert done.returncode == 0, done.stdout + done.stderr
    table = pd.read_csv(modes[0] / "results.csv")
    assert (table.status == "ok").all(), table[["key", "status", "reason"]]
    assert sorted(k.split("_")[6] for k in table.key) == 3 * ["T2frozen"] + 3 * ["T2last"]
    assert set(zip(table["mode"], table.checkpoints, strict=True)) == {("frozen", "all"), ("inplace", "last")}
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["checkpoints", "mode", "B"] in lines  # the summary's index: what varies (the rest said above it)
    assert {("none", "frozen"), ("last", "inplace")} <= {tuple(line[:2]) for line in lines}


def planted_package(directory: Path) -> Path:
    """tests/planted/helped.py and its helper copied as a package ``mine`` of ``directory``, as a user's
    implementation kept outside the repository (the tests edit the copy)."""
    package = directory / "mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("helped.py", "helper.py"):
        shutil.copy(REPO / "tests" / "planted" / name, package / name)
    return directory


def test_resume_measures_again_what_other_code_or_settings_measured_and_says_why(tmp_path):
    """A row is kept only where the code and settings that measured it are those of now: an edit of a
    helper module the implementation imports, a switch of KDA_EXTRA_IMPLS to another class of the same
    file, and a KDA_* setting that changes the kernel each make the row be measured again, named in a
    line, and the planted bug each brings is then caught (exit 1). Unchanged, the row is kept."""
    root = planted_package(tmp_path / "user")
    env = {"PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "KDA_EXTRA_IMPLS": "mine=mine.helped:Helped"}
    argv = [*TINY, "--impls", "mine"]
    first = run("sweep", *argv, "--out", str(tmp_path / "ok"), env=env)
    assert first.returncode == 0 and "0 kept, 1 to measure (1 new)" in first.stdout, first.stdout + first.stderr
    again = run("sweep", *argv, "--out", str(tmp_path / "ok"), env=env)
    assert again.returncode == 0 and "1 kept, 0 to measure," in again.stdout, again.stdout + again.stderr
    changes = [("class", {"KDA_EXTRA_IMPLS": "mine=mine.helped:Doubled"},
                "other code: mine.helped:Helped -> mine.helped:Doubled"),
               ("setting", {"KDA_PLANTED_FACTOR": "2"}, "other settings: KDA_PLANTED_FACTOR set"),
               ("helper", {}, "other code: helper.py changed")]
    for name, change, words in changes:
        out = shutil.copytree(tmp_path / "ok", tmp_path / name)
        if name == "helper":
            (root / "mine" / "helper.py").write_text("def finish(out):\n    return out.mul_(3)\n")
        done = run("sweep", *argv, "--out", str(out), env=env | change)
        kind = words.split(":")[0]
        assert f"0 kept, 1 to measure (1 {kind})" in done.stdout, (name, done.stdout + done.stderr)
        assert f"measured again, {words}: mine_B2" in done.stdout, (name, done.stdout)
        assert done.returncode == 1 and "1 wrong" in done.stderr.splitlines()[-1], (name, done.stderr)


def test_an_empty_shard_is_one_line_and_leaves_no_directory(tmp_path):
    out = tmp_path / "s"
    done = call("sweep", *TINY, "--shard", "1/2", "--out", str(out))
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert done.stdout.splitlines() == ["kda-sweep: shard 1/2 of this grid holds no rows; nothing to measure"]
    assert not out.exists()


def test_survey_takes_dtype_names_as_the_sweep_does(monkeypatch):
    import kda_impls.__main__ as survey_cli

    asked = []
    monkeypatch.setattr(survey_cli, "survey", lambda device, state_dtype: asked.append(state_dtype) or pd.DataFrame())
    done = call("survey", "--device", "cpu", "--state-dtype", "bf16")
    assert done.returncode == 0 and asked == ["bfloat16"], done.stderr
    one_line_error(call("survey", "--device", "cpu", "--state-dtype", "fp8"), "unknown dtype 'fp8'")


def test_a_second_sweep_into_a_directory_in_use_is_refused_naming_the_first(tmp_path):
    """One writer per directory: while another process holds the directory, a sweep into it is one
    line naming that process and writes nothing; once that process is killed (a crash), the lock is
    free and the sweep runs, removing the lock file as it ends."""
    out = tmp_path / "s"
    out.mkdir()
    hold = ("import sys; from kda_impls.bench.lock import Lock\n"
            "with Lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = files_of(out)
        refused = call("sweep", *TINY, "--out", str(out))
        one_line_error(refused, f"{out} is being written by another sweep (pid {holder.pid} on ",
                       "wait for it to end, or pass another --out")
        assert files_of(out) == before
    finally:
        holder.kill()
        holder.wait()
    assert (out / ".kda-sweep.lock").exists()  # what the killed holder left
    done = run("sweep", *TINY, "--out", str(out))
    assert done.returncode == 0 and "0 kept, 1 to measure" in done.stdout, done.stdout + done.stderr
    assert not (out / ".kda-sweep.lock").exists()


def test_a_script_without_its_main_guard_fails_at_once_saying_so(tmp_path):
    """Worker processes start with "spawn", which imports the calling script again: a sweep called from a
    script's top level outside ``if __name__ == "__main__":`` is refused before any directory is made,
    with the line that says to add the guard."""
    script = tmp_path / "unguarded.py"
    call = (f"kda_impls.sweep(impls='naive', devices='cpu', B=1, H=1, HV=2, K=16, V=16, placements=1, "
            f"out={str(tmp_path / 's')!r})\n")
    script.write_text("import kda_impls\n\n\ndef main():\n    " + call + "\n\nmain()\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "line 8 of the script" in last and last.endswith(
        'put the call under `if __name__ == "__main__":` in the script'), done.stderr
    assert not (tmp_path / "s").exists()


def test_the_guard_check_reads_where_the_script_calls_from(tmp_path, monkeypatch):
    """The check follows the call to the script's top level: a call inside a function that the guarded
    block calls passes, the same function called outside the guard, or under another test, does not."""
    from kda_impls.bench import api

    def calls_from(source: str) -> int | None:
        path = tmp_path / "script.py"
        path.write_text(source)
        scope = {"__name__": "__main__", "__file__": str(path), "api": api, "found": []}
        exec(compile(source, str(path), "exec"), scope)
        return scope["found"][0]

    body = "def run():\n    found.append(api._unguarded_script_line())\n\n\n"
    assert calls_from(body + 'if __name__ == "__main__":\n    run()\n') is None
    assert calls_from(body + 'if "__main__" == __name__:\n    run()\n') is None
    assert calls_from(body + "run()\n") == 5
    assert calls_from(body + "if True:\n    run()\n") == 6


def test_import_kda_impls_leaves_the_harness_out():
    """The contract, inputs and implementations load with the package; pandas, matplotlib and the sweep's
    harness only when a sweep is asked for (``kda_impls.sweep``)."""
    code = ("import sys, torch; before = set(sys.modules); import kda_impls; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('pandas', 'matplotlib', 'tqdm') "
            "or m.startswith('kda_impls.bench'))); kda_impls.SweepSpec; print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[:2] == ["[]", "True"], done.stdout + done.stderr


def test_a_sweep_spec_takes_python_values_and_refuses_with_the_settings_name():
    import torch

    from kda_impls.bench.spec import SettingError, SweepSpec

    spec = SweepSpec(devices="cpu", impls="naive", B=[1, 2, 2], HV=4, state_dtype=[torch.bfloat16, "fp32", "bf16"],
                     shard="1/2", mode="inplace")
    assert (spec.impls, spec.B, spec.HV, spec.state_dtype) == (("naive",), (1, 2), (4,), ("bfloat16", "float32"))
    assert spec.shard == (1, 2) and spec.mode == ("inplace",) and spec.devices == ("cpu",)
    assert SweepSpec(devices=["cpu"], B="1,2").B == (1, 2) and SweepSpec(devices="cpu").name == "smoke"
    for settings, message in [(dict(B=0), "B: 0 must be a whole number >= 1"), (dict(B=1.5), "B: 1.5 is not"),
                              (dict(state_dtype=torch.int8), "state_dtype: unknown dtype 'int8'"),
                              (dict(mode="verify"), "mode: 'verify' is not one of inplace, frozen, replay"),
                              (dict(shard=(2, 2)), "shard: (2, 2) is not i/n"), (dict(B=[]), "B: an empty list"),
                              (dict(devices="tpu"), "devices: 'tpu' is not a device"),
                              (dict(fresh="yes"), "fresh: 'yes' is not True or False")]:
        with pytest.raises(SettingError) as refused:
            SweepSpec(**{"devices": "cpu"} | settings)
        assert str(refused.value).startswith(message), refused.value
