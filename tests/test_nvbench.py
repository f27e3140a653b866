"""The nvbench cross-check: nvbench's JSON read, the comparison and its report on the CPU; the command's
bad inputs (one line, exit 2); and, on a GPU with cuda-bench, nvbench timing real launchers."""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kda_impls.bench.timing import Budget
from scripts.crosscheck import nvbench, nvbench_report
from scripts.crosscheck.eager import held_call_time
from scripts.crosscheck.nvbench_crosscheck import main
from scripts.crosscheck.nvbench_report import with_causes

REPO = Path(__file__).resolve().parents[1]



def env_with_repo() -> dict:
    """This checkout first on PYTHONPATH, the caller's entries (a GPU box's wheel parts) after it."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

def summary(tag: str, value) -> dict:
    """One summary as nvbench's json_printer writes it: the value a string inside ``data``."""
    return {"tag": tag, "name": tag, "data": [{"name": "value", "type": "float64", "value": str(value)}]}


def nvbench_json(path: Path, states: dict[str, tuple | str]) -> Path:
    """nvbench's JSON of one state per benchmark: (cold mean seconds, relative noise[, walltime s]), or a
    skip reason."""
    benchmarks = []
    for name, state in states.items():
        if isinstance(state, str):
            benchmarks.append({"name": name, "states": [{"name": "", "is_skipped": True, "skip_reason": state}]})
            continue
        mean, noise, walltime = (*state, 1.0)[:3]
        benchmarks.append({"name": name, "states": [{"name": "Device=0", "is_skipped": False, "summaries": [
            summary("nv/cold/time/gpu/mean", mean), summary("nv/cold/time/gpu/stdev/relative", noise),
            summary("nv/cold/sample_size", 1000), summary("nv/cold/walltime", walltime),
            {"tag": "nv/cold/sample_times", "data": []}]}]})
    path.write_text(json.dumps({"meta": {}, "devices": [], "benchmarks": benchmarks}))
    return path


def rows(*specs) -> pd.DataFrame:
    """Cross-check rows of (impl, B, sweep us, bytes); HV 32 K = V = 128 bf16, unpadded."""
    frame = pd.DataFrame([{"impl": impl, "B": B, "sweep_us": us, "bytes": nbytes} for impl, B, us, nbytes in specs])
    for column, value in {"H": 32, "HV": 32, "K": 128, "V": 128, "state_dtype": "bfloat16", "T": 1,
                          "checkpoints": "all", "mode": "inplace", "ring": 0, "slot_pad": 0, "pad_rows": 0,
                          "slots_per_row": 1, "slot_order": "random", "placements": 3, "source": "sweep"}.items():
        frame[column] = value
    return frame.assign(kind="row", name=[f"{i:04d}" for i in range(len(frame))])


SETTINGS = {"max-noise": 10.0, "min-time": 0.05, "timeout": 5.0}


def crosscheck(tmp_path, specs, empty=(4.0, 2.0), sweep: dict[int, float] | None = None,
               eager: dict[int, float] | None = None, flushed: dict[int, float] | None = None,
               flushed_mean: dict[int, float] | None = None) -> pd.DataFrame:
    """The cross-check table of rows (impl, B, harness us, harness dirty us, nvbench us, noise[, walltime]),
    with an empty launch (nvbench us, harness us) unless ``empty`` is None; the sweep's time is the harness's
    but where ``sweep`` (row index -> us) says otherwise; the harness's eager call is timed only where
    ``eager`` (row index -> us) says, and after a write over the L2 where ``flushed`` says (``flushed_mean``
    those samples' mean)."""
    table_rows = rows(*[(impl, B, (sweep or {}).get(i, harness), 1000 * B)
                        for i, (impl, B, harness, *_) in enumerate(specs)])
    states = {f"{i:04d}": (nv * 1e-6, *rest) for i, (_, _, _, _, nv, *rest) in enumerate(specs)}
    harness = pd.DataFrame({"name": [f"{i:04d}" for i in range(len(specs))], "harness_us": [s[2] for s in specs],
                            "harness_dirty_us": [s[3] for s in specs],
                            "harness_eager_us": [(eager or {}).get(i, float("nan")) for i in range(len(specs))],
                            "harness_eager_flushed_us": [(flushed or {}).get(i, float("nan"))
                                                         for i in range(len(specs))],
                            "harness_eager_flushed_mean_us": [(flushed_mean or {}).get(i, float("nan"))
                                                              for i in range(len(specs))]})
    if empty is not None:
        table_rows = pd.concat([pd.DataFrame({"kind": ["empty"], "name": [nvbench.EMPTY], "bytes": [2]}),
                                table_rows], ignore_index=True)
        states[nvbench.EMPTY] = (empty[0] * 1e-6, 0.05)
        harness = pd.concat([harness, pd.DataFrame({"name": [nvbench.EMPTY], "harness_us": [empty[1]],
                                                    "harness_eager_us": [empty[0]]})])
    times = nvbench.summaries(nvbench_json(tmp_path / "n.json", states))
    return with_causes(nvbench.compare(table_rows, times, harness), SETTINGS)


def test_summaries_read_nvbench_json_in_microseconds_and_skips(tmp_path):
    times = nvbench.summaries(nvbench_json(tmp_path / "n.json", {"a": (12.5e-6, 0.004, 0.7), "b": "Unsupported: K"}))
    a, b = times.set_index("name").loc["a"], times.set_index("name").loc["b"]
    assert a.nvbench_us == pytest.approx(12.5) and a.nvbench_noise == pytest.approx(0.004)
    assert a.nvbench_samples == 1000 and a.nvbench_walltime_s == pytest.approx(0.7)
    assert pd.isna(a.nvbench_batch_us) and pd.isna(a.error)
    assert b.error == "Unsupported: K" and pd.isna(b.nvbench_us)


# (impl, B, harness us, harness dirty us, nvbench us, noise[, walltime s]); the empty launch: nvbench 4, harness 2
PLANTED = [
    ("triton", 256, 380.0, 381.0, 400.0, 0.01),  # 5% under nvbench beyond the overhead and the flush: unexplained
    ("fla", 256, 396.0, 396.0, 399.0, 0.01),  # within 3%
    ("triton", 16, 30.0, 30.0, 32.1, 0.02),  # the overhead's 2 us
    ("triton", 64, 50.0, 56.0, 58.2, 0.02),  # the overhead and 6 us of flushed L2
    ("fla", 64, 50.0, 50.0, 60.0, 0.2),  # noisy beyond the limit, and unexplained
    ("fla", 16, 30.0, 30.0, 40.0, 0.02, 5.0),  # timed out, and unexplained
]


def test_each_difference_is_explained_by_a_measured_quantity_or_counted_unexplained(tmp_path):
    table = crosscheck(tmp_path, PLANTED).set_index("name")
    assert nvbench_report.fixed_overhead_us(table.reset_index()) == pytest.approx(2.0)
    assert list(table.loc[[f"{i:04d}" for i in range(6)], "cause"]) == [
        "unexplained", "", "overhead", "overhead + L2 flush", "unexplained", "unexplained"]
    assert table.loc["0000", "ratio"] == pytest.approx(0.95) and not table.loc["0000", "agrees"]
    assert table.loc["0000", "why"] == ("nvbench - harness +20.00 us; less the overhead (2.00 us) +4.5%, "
                                        "less the flushed L2 too (+1.00 us) +4.2%")
    assert table.loc["0003", "why"].startswith("overhead 2.00 us and the flushed L2 +6.00 us")
    assert not table.loc["0004", "settled"] and "noise 20.0% over its limit 10.0%" in table.loc["0004", "why"]
    assert not table.loc["0005", "settled"] and "its 5 s timeout reached after 1000 samples" in table.loc["0005", "why"]
    assert table.loc[["0000", "0001", "0002", "0003"], "settled"].all()
    assert table.loc["0004", "nvbench_mean_error"] == pytest.approx(0.2 / 1000 ** 0.5)  # noise / sqrt(samples)
    # no empty launch, no overhead measured: the same rows explain nothing
    bare = crosscheck(tmp_path, PLANTED, empty=None)
    assert set(bare.cause) == {"", "unexplained"} and (bare.cause == "unexplained").sum() == 5


def test_the_report_counts_causes_and_shows_the_sweep_and_unsettled_rows(tmp_path):
    table = crosscheck(tmp_path, PLANTED, sweep={1: 420.0})  # the sweep's run 6% over this one's harness
    meta = {"nvbench": SETTINGS, "copy_gbps": 4000.0, "sweeps": {"results/h200/targets": "abc123"}}
    text = nvbench_report.report(table, meta)
    assert ("**All rows: 1 of 6 within 3%; the others: overhead 1, overhead + L2 flush 1, eager launch 0, "
            "eager launch + L2 flush 0, flushed eager launch 0, gap modes 0, unexplained 3. "
            "At B >= 16: 1 of 6 within 3%") in text
    assert "did not settle: 2" in text and "## Rows nvbench did not settle" in text
    assert "nvbench's fixed per-sample overhead: 2.00 us (its cold mean of the empty launch" in text
    assert "`results/h200/targets` (commit abc123)" in text
    assert "sweep_us" in text.split("## The largest differences")[1].splitlines()[2]  # the table's header
    b256 = next(line for line in text.split("## By batch")[1].splitlines() if line.startswith("| 256"))
    assert "| 1.03 |" in b256.replace("  ", "")  # the median sweep / harness ratio at B = 256: (420/396 + 1) / 2


# rows whose launch costs more than the empty launch's (a call of several kernels): the harness's eager call,
# one per sample between events, is nvbench's time; and a 5% slowdown that no measured quantity explains
EAGER = [
    ("flashinfer", 16, 30.0, 30.0, 35.5, 0.02),  # overhead 2 us leaves +4.9%; the eager call 35.3 us: +0.6%
    ("flashinfer", 64, 50.0, 56.0, 62.5, 0.02),  # the eager call 56.3 us and 6 us of flushed L2: +0.3%
    ("triton", 256, 380.0, 381.0, 400.0, 0.01),  # planted 5% slowdown, its eager call 382 us: unexplained
]


def test_the_rows_eager_launch_explains_its_difference_and_not_a_slowdown(tmp_path):
    table = crosscheck(tmp_path, EAGER, eager={0: 35.3, 1: 56.3, 2: 382.0}).set_index("name")
    assert list(table.loc[["0000", "0001", "0002"], "cause"]) == ["eager launch", "eager launch + L2 flush",
                                                                  "unexplained"]
    assert table.loc["0000", "eager_launch_us"] == pytest.approx(5.3)
    assert table.loc["0000", "why"] == ("one eager launch between events: the harness's eager call 35.30 us, its "
                                        "replayed 30.00 us: the launch +5.30 us against the empty launch's 2.00 us; "
                                        "+0.6% left")
    assert table.loc["0001", "why"].endswith("and the flushed L2 +6.00 us; +0.3% left")
    assert "nvbench - the harness's eager call (382.00 us) +4.5%, less the flushed L2 too +4.2%" in table.loc[
        "0002", "why"]
    # the same rows without the eager timer's times (a table made before it): the old rules alone
    assert list(crosscheck(tmp_path, EAGER).cause) == ["", "unexplained", "unexplained", "unexplained"]
    text = nvbench_report.report(crosscheck(tmp_path, EAGER, eager={0: 35.3, 1: 56.3, 2: 382.0}),
                                 {"nvbench": SETTINGS})
    assert ("At B >= 16: 0 of 3 within 3%; the others: overhead 0, overhead + L2 flush 0, eager launch 1, "
            "eager launch + L2 flush 1, flushed eager launch 0, gap modes 0, unexplained 1.") in text
    assert "The harness's eager call of it, one per sample between events: 4.00 us." in text
    flashinfer = next(line for line in text.split("## One eager launch")[1].splitlines() if "| flashinfer" in line)
    assert "5.8" in flashinfer  # the median eager launch of its two rows: (5.3 + 6.3) / 2


def test_the_flushed_eager_call_explains_what_the_sum_of_its_parts_does_not_and_not_a_slowdown(tmp_path):
    """A row whose eager call (35.3 us) and flushed L2 (+0.0) leave nvbench 4.5% above, but whose eager call
    after a write over the L2 is nvbench's time; the planted 5% slowdown stays unexplained with it measured."""
    rows = [("triton", 16, 30.0, 30.0, 37.0, 0.02), ("triton", 256, 380.0, 381.0, 400.0, 0.01)]
    table = crosscheck(tmp_path, rows, eager={0: 35.3, 1: 382.0}, flushed={0: 36.6, 1: 383.0}).set_index("name")
    assert list(table.loc[["0000", "0001"], "cause"]) == ["flushed eager launch", "unexplained"]
    assert table.loc["0000", "why"] == ("one eager launch between events after a write over the L2, nvbench's cold "
                                        "method on the harness's clock: 36.60 us (median); +1.1% left")
    assert table.loc["0001", "why"].endswith("; nvbench - the flushed eager call (383.00 us, median) +4.2%")
    without = crosscheck(tmp_path, rows, eager={0: 35.3, 1: 382.0})
    assert list(without[without.kind == "row"].cause) == ["unexplained", "unexplained"]


def test_the_flushed_eager_samples_mean_is_compared_with_nvbenchs_mean_and_not_a_slowdown(tmp_path):
    """A two-kernel call whose gap has two modes: the flushed eager median sits on the low one (8.46 us), its
    mean (9.00 us) beside nvbench's mean (9.08 us) explains the row; a planted 5% slowdown stays unexplained."""
    rows = [("flashinfer", 16, 5.6, 5.6, 9.08, 0.06), ("flashinfer", 64, 11.0, 11.0, 13.6, 0.04)]
    table = crosscheck(tmp_path, rows, eager={0: 8.1, 1: 12.1}, flushed={0: 8.46, 1: 12.9},
                       flushed_mean={0: 9.0, 1: 12.95}).set_index("name")
    assert list(table.loc[["0000", "0001"], "cause"]) == ["flushed eager launch", "unexplained"]
    assert table.loc["0000", "why"] == ("one eager launch between events after a write over the L2, nvbench's cold "
                                        "method on the harness's clock: 9.00 us (mean); +0.9% left")
    assert table.loc["0001", "why"].endswith("; nvbench - the flushed eager call (12.95 us, mean) +4.8%")
    medians_only = crosscheck(tmp_path, rows, eager={0: 8.1, 1: 12.1}, flushed={0: 8.46, 1: 12.9})
    assert list(medians_only[medians_only.kind == "row"].cause) == ["unexplained", "unexplained"]


def test_the_gaps_two_modes_explain_a_two_kernel_row_the_eager_clock_cannot_resolve_and_no_more(tmp_path):
    """Two-kernel rows whose gap has two modes (1.1 and 2.0 us): nvbench's samples span them, the flushed eager
    timer's sit in one. A row 0.62 us below nvbench (more than 3%, less than 3% plus half the modes' distance)
    is within what the eager clock can resolve; a planted 10% slowdown is not, nor a one-kernel row, nor a row
    whose eager samples span the modes too."""
    rows = [("flashinfer", 16, 5.6, 5.6, 9.08, 0.06), ("flashinfer", 64, 11.0, 11.0, 13.6, 0.04)]
    table = crosscheck(tmp_path, rows, eager={0: 8.1, 1: 10.5}, flushed={0: 8.46, 1: 12.24},
                       flushed_mean={0: 8.46, 1: 12.24})
    modes = {"trace_nvbench_gap_p25_us": 1.1, "trace_nvbench_gap_p75_us": 2.0, "trace_eager_gap_p25_us": 1.15,
             "trace_eager_gap_p75_us": 1.31}
    judged = with_causes(table.assign(**modes, kernels_per_call=2), SETTINGS).set_index("name")
    assert list(judged.loc[["0000", "0001"], "cause"]) == ["gap modes", "unexplained"]
    assert judged.loc["0000", "why"] == (
        "the gap between the call's 2 kernels has two modes (CUPTI in the samples): nvbench's samples span them "
        "(gap quartiles 1.10-2.00 us), the flushed eager timer's sit in one (1.15-1.31 us); nvbench - the flushed "
        "eager call +0.62 us, within 3% and half the modes' distance (0.45 us): a difference this clock cannot "
        "resolve")
    one_kernel = with_causes(table.assign(**modes, kernels_per_call=1), SETTINGS)
    both_span = with_causes(table.assign(**modes | {"trace_eager_gap_p75_us": 2.0}, kernels_per_call=2), SETTINGS)
    untraced = with_causes(table.assign(kernels_per_call=2), SETTINGS)
    for other in (one_kernel, both_span, untraced):
        assert list(other[other.kind == "row"].cause) == ["unexplained", "unexplained"]


def test_the_report_says_what_the_traced_samples_hold_and_how_many_rows_the_flushed_call_explains(tmp_path):
    """The report's own figures of a traced run: the lead in each clock, the kernels' agreement, the gap's
    quartile spread in calls of several kernels, a row whose trace failed, and the flushed eager tally
    (its mean where there is one); a table without a trace says none of it."""
    rows = [("flashinfer", 16, 5.6, 5.6, 9.08, 0.06), ("triton", 64, 11.0, 11.0, 11.2, 0.04)]
    table = crosscheck(tmp_path, rows, eager={0: 8.1, 1: 11.1}, flushed={0: 8.46, 1: 11.2},
                       flushed_mean={0: 9.0})
    traced = table.assign(kernels_per_call=[np.nan, 2, 1], trace_nvbench_lead_us=[np.nan, 2.5, 2.46],
                          trace_eager_lead_us=[np.nan, 2.6, 2.69], trace_nvbench_busy_us=[np.nan, 5.0, 8.0],
                          trace_eager_busy_us=[np.nan, 4.9, 8.0], trace_nvbench_gap_p25_us=[np.nan, 1.1, 0.0],
                          trace_nvbench_gap_p75_us=[np.nan, 2.0, 0.0], trace_eager_gap_p25_us=[np.nan, 1.15, 0.0],
                          trace_eager_gap_p75_us=[np.nan, 1.31, 0.0], trace_error=[None, None, None])
    text = nvbench_report.report(traced, {"nvbench": SETTINGS})
    assert "Within 3% of the flushed eager call: 2 of 2." in text  # 9.08 / 9.00 (the mean), 11.2 / 11.2
    assert ("Inside the samples of the 2 traced rows (medians per row): the lead is 2.46-2.50 us in nvbench's, "
            "2.60-2.69 us in the flushed eager timer's; the call's kernels take within 2.0% of each other's time "
            "in every row. In the 1 rows of calls of several kernels, the gap between kernels has quartiles "
            "0.90-0.90 us apart (median 0.90) in nvbench's samples; 0.16-0.16 us apart (median 0.16) in the eager "
            "timer's.") in text
    failed = traced.assign(trace_error=[None, None, "no sample of a 'block_stream' kernel then 1 others"])
    assert "Not traced: 1 rows (no sample of a 'block_stream' kernel then 1 others)." in nvbench_report.report(
        failed, {"nvbench": SETTINGS})
    none_traced = table.assign(trace_error=[None, "no sample of a 'block_stream' kernel then 2 others", None])
    assert "Not traced: 1 rows (no sample of a 'block_stream' kernel then 2 others)." in nvbench_report.report(
        none_traced, {"nvbench": SETTINGS})
    plain = nvbench_report.report(table, {"nvbench": SETTINGS})
    assert "Inside the samples" not in plain and "Within 3% of the flushed eager call: 2 of 2." in plain


def test_nvbench_argv_names_the_criterion_before_its_parameters():
    argv = nvbench.nvbench_argv({"max-noise": 10.0, "min-time": 0.05, "timeout": 5.0}, ["--min-samples", "20"])
    assert argv == ["--stopping-criterion", "stdrel", "--max-noise", "10.0", "--min-time", "0.05", "--timeout", "5.0",
                    "--min-samples", "20"]


def test_the_harness_times_the_bound_launcher_and_the_empty_launch_on_the_cpu():
    """The CPU's clock (perf_counter, no cache modelled): the code path a GPU row takes, on a naive step."""
    budget = Budget(min_samples=2, max_samples=4, max_seconds=0.02)
    row = rows(("naive", 1, float("nan"), 0)).iloc[0].to_dict() | {"H": 1, "HV": 1, "K": 16, "V": 16}
    bound = nvbench.row_job("r", row, "cpu", 1, "previous-step", budget).setup()
    times = bound.harness()
    assert times["harness_us"] > 0 and times["harness_dirty_us"] > 0 and times["harness_eager_us"] > 0
    assert times["harness_eager_flushed_us"] > 0 and times["harness_eager_flushed_mean_us"] > 0
    # the flushed timer alone, as a traced twin runs it: the same kind of timing, its own samples
    assert bound.flushed_eager().method == "perf_counter"
    # the CPU makes no L2 state
    assert times["harness_entry"] == times["harness_dirty_entry"] == times["harness_eager_entry"] == "none"
    empty = nvbench.copy_job(nvbench.EMPTY, 2, "cpu", harness=budget).setup()
    assert empty.harness()["harness_us"] > 0 and nvbench.copy_job("c", 64, "cpu").setup().harness() == {}


def test_the_eager_timer_times_one_call_per_sample_on_the_cpu():
    """A call that takes 2 ms: each sample is one call, not a pass divided by its calls."""
    timing = held_call_time(None, lambda: time.sleep(0.002), None, "cpu",
                            Budget(min_samples=3, max_samples=3, max_seconds=1.0), "previous-step")
    assert timing.n == 3 and min(timing.samples) >= 0.002 and timing.entry == "none"


@pytest.mark.gpu
def test_the_eager_timer_holds_the_stream_so_the_host_is_not_in_a_sample():
    """A launcher that idles the host 0.5 ms between two tiny kernels: held, a sample is the GPU's microseconds;
    a second kernel in the call shows as more time than one."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.zeros(1, device="cuda")
    budget = Budget(min_samples=20, max_samples=50, max_seconds=0.5)

    def two():
        x.add_(1)
        time.sleep(5e-4)
        x.add_(1)

    held = held_call_time(None, two, None, "cuda", budget, "hot").time
    assert held < 1e-4, held  # the host's 0.5 ms is not in it
    assert held > held_call_time(None, lambda: x.add_(1), None, "cuda", budget, "hot").time


def one_line(capsys, argv, expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err


def sweep_dir(path: Path) -> Path:
    """A sweep directory of one ok row (what load() needs)."""
    path.mkdir()
    row = rows(("naive", 4, 10.0, 1000)).drop(columns=["kind", "name", "source"]).rename(
        columns={"sweep_us": "kernel_us_mean"}).assign(status="ok", key="naive_B4", placements=1, library="naive",
                                                       l2_entry="previous-step")
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
    one_line(capsys, [str(sweep), "--max-noise", "0", "--out", str(out)], "must be a number > 0")
    one_line(capsys, ["--report-only", "--out", str(out)], "crosscheck.csv: missing")
    assert not out.exists()  # nothing written
    (tmp_path / "old").mkdir()  # a table made before the harness timed each row beside nvbench
    rows(("triton", 16, 30.0, 200)).to_csv(tmp_path / "old" / "crosscheck.csv", index=False)
    one_line(capsys, ["--report-only", "--out", str(tmp_path / "old")], "no harness_us, harness_dirty_us, nvbench_us")
    assert not (tmp_path / "old" / "crosscheck.md").exists()
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "crosscheck.csv").write_text("kept")
    one_line(capsys, [str(sweep), "--out", str(tmp_path / "done")], "already holds a cross-check")
    assert (tmp_path / "done" / "crosscheck.csv").read_text() == "kept"


def test_the_script_runs_without_path_edits_and_says_what_is_missing(tmp_path):
    sweep = sweep_dir(tmp_path / "sweep")
    import torch

    if torch.cuda.is_available() and _has_bench():
        pytest.skip("CUDA and cuda-bench are here: the GPU test times for real")
    done = subprocess.run([sys.executable, "-m", "scripts.crosscheck.nvbench_crosscheck", str(sweep), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path,
                          env=env_with_repo())
    expected = "no CUDA device" if not torch.cuda.is_available() else "cuda-bench is not installed"
    assert done.returncode == 2 and expected in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_report_only_rewrites_the_report_from_the_table(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    crosscheck(tmp_path, PLANTED[:3]).to_csv(out / "crosscheck.csv", index=False)
    (out / "meta.json").write_text(json.dumps({"nvbench": SETTINGS}))
    assert main(["--report-only", "--out", str(out)]) == 0
    assert ("**All rows: 1 of 3 within 3%; the others: overhead 1, overhead + L2 flush 0, eager launch 0, "
            "eager launch + L2 flush 0, flushed eager launch 0, gap modes 0, "
            "unexplained 1.") in (out / "crosscheck.md").read_text()
    rewritten = pd.read_csv(out / "crosscheck.csv")
    assert list(rewritten[rewritten.kind == "row"].cause.fillna("")) == list(
        crosscheck(tmp_path, PLANTED[:3])[lambda t: t.kind == "row"].cause)


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
                           "--impls", "naive,triton", "--B", "4", "--out", str(out), "--min-time", "0.005", "--trace"],
                          capture_output=True, text=True, env=env_with_repo())
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(out / "crosscheck.csv")
    timed = table[table.kind == "row"].dropna(subset=["nvbench_us"])
    assert len(timed) >= 2 and (timed.nvbench_us > 0).all() and (timed.of_copy > 0).all()
    assert (timed.harness_us > 0).all() and (timed.harness_dirty_us > 0).all() and timed.sweep_us.isna().all()
    assert (timed.harness_eager_us > 0).all() and (timed.kernels_per_call >= 1).all()
    assert (timed.harness_eager_flushed_us >= timed.harness_eager_us * 0.97).all()  # a flush costs, never saves
    assert (timed.harness_eager_flushed_mean_us > 0).all()
    # each sample traced inside both clocks' loops: the call's kernels found after each holder
    assert (timed.trace_nvbench_samples > 10).all() and (timed.trace_eager_samples > 10).all()
    assert (timed.trace_nvbench_busy_us > 0).all() and (timed.trace_eager_busy_us > 0).all()
    assert ((timed.trace_nvbench_busy_us / timed.trace_eager_busy_us - 1).abs() < 0.5).all()
    empty = table[table.kind == "empty"].iloc[0]
    assert empty.nvbench_us > 0 and empty.harness_us > 0
    assert (table[table.kind == "copy"].nvbench_us > 0).all()
    assert json.loads(gzip.decompress((out / "nvbench.json.gz").read_bytes()))["benchmarks"]
    assert json.loads((out / "meta.json").read_text())["versions"]["cuda-bench"] != "not installed"


def test_a_held_sample_is_the_holder_nvbenchs_clock_kernels_then_the_call():
    from scripts.crosscheck.sample_trace import held_samples, summary

    kernels = [(0.0, 5.0, "block_stream(int const volatile*)"), (5.5, 0.8, "get_timestamps_kernel(unsigned long*)"),
               (8.0, 2.0, "decode"), (11.0, 1.0, "gate"), (13.0, 1.0, "get_timestamps_kernel(unsigned long*)"),
               (20.0, 1.0, "block_stream(int const volatile*)"), (21.5, 0.8, "get_timestamps_kernel(unsigned long*)"),
               (30.0, 2.0, "decode"),  # a sample cut short: the trace ends before its second kernel
               ]
    samples = held_samples(kernels, "block_stream", 2)
    assert samples.to_dict("records") == [{"lead_us": 8.0 - 6.3, "busy_us": 3.0, "gap_us": 1.0, "span_us": 4.0,
                                           "kernel0_us": 2.0, "kernel1_us": 1.0}]
    spun = held_samples([(0.0, 50.0, "spin_kernel(long)"), (52.0, 3.0, "decode"),
                         (60.0, 50.0, "spin_kernel(long)"), (111.0, 3.0, "decode")], "spin_kernel", 1)
    assert list(spun.lead_us) == [2.0, 1.0] and list(spun.gap_us) == [0.0, 0.0]
    two_modes = pd.DataFrame({"lead_us": [1.0] * 4, "busy_us": [3.0] * 4, "gap_us": [1.2, 1.2, 2.0, 2.0],
                              "span_us": [4.2, 4.2, 5.0, 5.0]})
    parts = summary(two_modes, "trace_eager")
    assert parts["trace_eager_gap_us"] == 1.6 and parts["trace_eager_samples"] == 4
    assert parts["trace_eager_mean_gap_us"] == 1.6 and parts["trace_eager_mean_span_us"] == 4.6
    assert (parts["trace_eager_gap_p25_us"], parts["trace_eager_gap_p75_us"]) == (1.2, 2.0)
    with pytest.raises(RuntimeError, match=r"no sample of a 'block_stream' kernel then 3 others in a trace of 8 "
                                           r"kernels \(block_stream"):
        held_samples(kernels, "block_stream", 3)
