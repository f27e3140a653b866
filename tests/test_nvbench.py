"""The nvbench cross-check: nvbench's JSON read, the comparison and its report on the CPU; the command's
bad inputs (one line, exit 2); and, on a GPU with cuda-bench, nvbench timing real launchers."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kda_impls.bench import nvbench
from kda_impls.bench.nvbench_crosscheck import main

REPO = Path(__file__).resolve().parents[1]



def env_with_repo() -> dict:
    """This checkout first on PYTHONPATH, the caller's entries (a GPU box's wheel parts) after it."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

def summary(tag: str, value) -> dict:
    """One summary as nvbench's json_printer writes it: the value a string inside ``data``."""
    return {"tag": tag, "name": tag, "data": [{"name": "value", "type": "float64", "value": str(value)}]}


def nvbench_json(path: Path, states: dict[str, tuple[float, float] | str]) -> Path:
    """nvbench's JSON of one state per benchmark: (cold mean seconds, relative noise), or a skip reason."""
    benchmarks = []
    for name, state in states.items():
        if isinstance(state, str):
            benchmarks.append({"name": name, "states": [{"name": "", "is_skipped": True, "skip_reason": state}]})
            continue
        mean, noise = state
        benchmarks.append({"name": name, "states": [{"name": "Device=0", "is_skipped": False, "summaries": [
            summary("nv/cold/time/gpu/mean", mean), summary("nv/cold/time/gpu/stdev/relative", noise),
            summary("nv/cold/sample_size", 1000), {"tag": "nv/cold/sample_times", "data": []}]}]})
    path.write_text(json.dumps({"meta": {}, "devices": [], "benchmarks": benchmarks}))
    return path


def rows(*specs) -> pd.DataFrame:
    """Cross-check rows of (impl, B, harness us, bytes); HV 32 K = V = 128 bf16, unpadded."""
    frame = pd.DataFrame([{"impl": impl, "B": B, "kernel_us_mean": us, "bytes": nbytes}
                          for impl, B, us, nbytes in specs])
    for column, value in {"H": 32, "HV": 32, "K": 128, "V": 128, "state_dtype": "bfloat16", "T": 1,
                          "checkpoints": "all", "mode": "inplace", "ring": 0, "slot_pad": 0, "pad_rows": 0,
                          "slots_per_row": 1, "slot_order": "random", "source": "sweep"}.items():
        frame[column] = value
    return frame.assign(kind="row", name=[f"{i:04d}" for i in range(len(frame))])


def test_summaries_read_nvbench_json_in_microseconds_and_skips(tmp_path):
    times = nvbench.summaries(nvbench_json(tmp_path / "n.json", {"a": (12.5e-6, 0.004), "b": "Unsupported: K"}))
    a, b = times.set_index("name").loc["a"], times.set_index("name").loc["b"]
    assert a.nvbench_us == pytest.approx(12.5) and a.nvbench_noise == pytest.approx(0.004)
    assert a.nvbench_samples == 1000 and pd.isna(a.nvbench_batch_us) and pd.isna(a.error)
    assert b.error == "Unsupported: K" and pd.isna(b.nvbench_us)


def test_compare_flags_a_planted_slowdown_and_names_the_fixed_overhead(tmp_path):
    # nvbench pays ~2 us per sample: the B = 1 rows differ by it, as does one B = 16 row; a harness row
    # 5% under nvbench at B = 256 beyond that must not agree, and a 1% one must
    table_rows = rows(("triton", 1, 4.0, 100), ("fla", 1, 5.0, 100), ("triton", 16, 30.0, 200),
                      ("triton", 256, 380.0, 400), ("fla", 256, 396.0, 400))
    table_rows = pd.concat([table_rows, pd.DataFrame({"kind": "copy", "name": ["c100", "c200", "c400"],
                                                      "bytes": [100, 200, 400]})], ignore_index=True)
    times = nvbench.summaries(nvbench_json(tmp_path / "n.json", {
        "0000": (6.0e-6, 0.002), "0001": (7.1e-6, 0.002), "0002": (32.0e-6, 0.001), "0003": (400e-6, 0.001),
        "0004": (399e-6, 0.001), "c100": (3e-6, 0.001), "c200": (16e-6, 0.001), "c400": (300e-6, 0.001)}))
    table = nvbench.compare(table_rows, times, max_noise=0.005).set_index("name")
    assert table.loc["0003", "ratio"] == pytest.approx(0.95) and not table.loc["0003", "agrees"]
    assert table.loc["0004", "agrees"] and table.loc["0004", "cause"] == ""
    assert "beyond its fixed overhead" in table.loc["0003", "cause"]
    assert "fixed per-sample overhead" in table.loc["0002", "cause"]
    assert nvbench.fixed_overhead_us(table[table.kind == "row"]) == (pytest.approx(2.05), 1)
    assert table.loc["0003", "of_copy"] == pytest.approx(0.75) and pd.isna(table.loc["c400", "ratio"])
    text = nvbench.report(table.reset_index(), {"nvbench": {"max-noise": 0.5}, "copy_gbps": 4000.0})
    assert "**1 of 5 rows within 3%; at B >= 16: 1 of 3.**" in text
    assert "Configurations ranked the same by both: 1 of 2" in text  # B = 1 agrees, B = 256 swaps
    assert "nvbench - harness at B = 1 (median): 2.05 us" in text and "its roofline" in text


def test_the_fixed_overhead_is_named_before_noise_and_noise_before_the_rest(tmp_path):
    """B = 1 sets the overhead (2 us); a noisy row off by that much is the overhead's, one off by more is unsettled."""
    table_rows = rows(("triton", 1, 2.0, 100), ("triton", 64, 100.0, 100), ("triton", 64, 20.0, 100))
    times = nvbench.summaries(nvbench_json(tmp_path / "n.json", {
        "0000": (4e-6, 0.04), "0001": (120e-6, 0.04), "0002": (22e-6, 0.04)}))
    causes = nvbench.compare(table_rows, times, max_noise=0.005).cause
    assert causes[1].startswith("nvbench did not settle: noise 4.0%"), causes[1]
    assert causes[2].startswith("nvbench's fixed per-sample overhead"), causes[2]


def one_line(capsys, argv, expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err


def sweep_dir(path: Path) -> Path:
    """A sweep directory of one ok row (what load() needs)."""
    path.mkdir()
    row = rows(("naive", 4, 10.0, 1000)).drop(columns=["kind", "name", "source"]).assign(
        status="ok", key="naive_B4", placements=1, library="naive", l2_entry="previous-step")
    row.to_csv(path / "results.csv", index=False)
    (path / "meta.json").write_text("{}")
    return path


def test_bad_input_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys):
    sweep = sweep_dir(tmp_path / "sweep")
    out = tmp_path / "out"
    one_line(capsys, ["--out", str(out)], "name the sweep directories")
    one_line(capsys, [str(sweep), "--preset", "smoke", "--out", str(out)], "one of the two")
    one_line(capsys, [str(tmp_path / "nope"), "--out", str(out)], "no such directory")
    one_line(capsys, [str(sweep), "--impls", "nosuch", "--out", str(out)], "unknown implementation nosuch")
    one_line(capsys, [str(sweep), "--B", "64", "--out", str(out)], "no rows to time")
    one_line(capsys, [str(sweep), "--B", "0", "--out", str(out)], "must be a whole number >= 1")
    one_line(capsys, ["--preset", "nosuch", "--out", str(out)], "not a preset")
    one_line(capsys, ["--report-only", "--out", str(out)], "crosscheck.csv: missing")
    assert not out.exists()  # nothing written
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "crosscheck.csv").write_text("kept")
    one_line(capsys, [str(sweep), "--out", str(tmp_path / "done")], "already holds a cross-check")
    assert (tmp_path / "done" / "crosscheck.csv").read_text() == "kept"


def test_the_script_runs_without_path_edits_and_says_what_is_missing(tmp_path):
    sweep = sweep_dir(tmp_path / "sweep")
    import torch

    if torch.cuda.is_available() and _has_bench():
        pytest.skip("CUDA and cuda-bench are here: the GPU test times for real")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "nvbench_crosscheck.py"), str(sweep), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path,
                          env=env_with_repo())
    expected = "no CUDA device" if not torch.cuda.is_available() else "cuda-bench is not installed"
    assert done.returncode == 2 and expected in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_report_only_rewrites_the_report_from_the_table(tmp_path, capsys):
    table_rows = rows(("triton", 16, 30.0, 200))
    times = nvbench.summaries(nvbench_json(tmp_path / "n.json", {"0000": (30.3e-6, 0.001)}))
    out = tmp_path / "out"
    out.mkdir()
    nvbench.compare(table_rows, times, max_noise=0.005).to_csv(out / "crosscheck.csv", index=False)
    assert main(["--report-only", "--out", str(out)]) == 0
    assert "**1 of 1 rows within 3%" in (out / "crosscheck.md").read_text()


def _has_bench() -> bool:
    try:
        nvbench.import_bench()
    except nvbench.NvbenchMissing:
        return False
    return True


@pytest.mark.gpu
def test_nvbench_times_a_preset_and_its_copies_on_the_gpu(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not _has_bench():
        pytest.skip("cuda-bench is not installed (pip install 'kda-impls[nvbench]')")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "nvbench_crosscheck.py"), "--preset", "smoke",
                           "--impls", "naive,triton", "--B", "4", "--out", str(out), "--min-time", "0.005"],
                          capture_output=True, text=True, env=env_with_repo())
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(out / "crosscheck.csv")
    timed = table[table.kind == "row"].dropna(subset=["nvbench_us"])
    assert len(timed) >= 2 and (timed.nvbench_us > 0).all() and (timed.of_copy > 0).all()
    assert (table[table.kind == "copy"].nvbench_us > 0).all()
    assert json.loads(gzip.decompress((out / "nvbench.json.gz").read_bytes()))["benchmarks"]
    assert json.loads((out / "meta.json").read_text())["versions"]["cuda-bench"] != "not installed"
