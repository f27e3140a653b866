"""The reports and the chart that set a step's modes side by side, on tables of real configurations'
rows: the speculative step both ways (kda-spec-step: which way is faster per (B, T, accepted a), the
bytes each moved from the rows' own bytes), replay's speedup per step over in-place decode, and the
replay chart (a colour per mode and ring)."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from kda_impls.bench import mode_charts, plots, spec_step
from kda_impls.bench.case import empty_row
from kda_impls.bench.presets import PRESETS
from kda_impls.bench.report import WIDTH, replay_speedup_table


def spec_us(cfg) -> float:
    """Kernel us of a spec-step row: a checkpointing verify pays a store per token, the frozen verify
    none, the commit of a tokens a store and a read for each."""
    if cfg.mode == "frozen":
        return 5.0 + cfg.T
    return 10.0 + 3 * cfg.T if cfg.checkpoints == "all" and cfg.T > 1 else 8.0 + 2 * cfg.T


def rows_of(configs, us, status=lambda cfg: "ok") -> pd.DataFrame:
    """Result rows (the sweep's columns) of ``configs``, each ok with kernel time ``us(cfg)`` and bytes
    of its own (the row's index, so that each sum is traceable), else of the status ``status`` gives."""
    rows = []
    for i, cfg in enumerate(configs):
        row = empty_row(cfg, status(cfg))
        if row["status"] == "ok":
            row |= {"kernel_us_mean": us(cfg), "bytes": 1000 * (i + 1), "library": "kda-impls", "gbps": 1.0,
                    "kernel_us_placement_min": us(cfg), "kernel_us_placement_max": us(cfg), "roofline_frac": 0.5}
        rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def spec_table() -> pd.DataFrame:
    return rows_of(PRESETS["spec-step"].configs(["triton"], only={"B": (1, 64)}), spec_us)


def test_each_step_picks_the_faster_way_and_sums_each_ways_bytes(spec_table):
    steps = spec_step.spec_step_rows(spec_table).set_index(["B", "T", "a"])
    assert len(steps) == 2 * (2 + 4 + 8)  # every a in 1..T at each B
    t8a1, t2a1, t8a8 = steps.loc[64, 8, 1], steps.loc[64, 2, 1], steps.loc[1, 8, 8]
    assert t8a1.faster == "frozen+commit" and t8a1.by == pytest.approx(34 / (13 + 10))
    assert t2a1.faster == "checkpointing" and t2a1.by == pytest.approx(17 / 16)
    assert t8a8.faster == "checkpointing" and t8a8["frozen+commit_us"] == 13 + 24
    bytes_of = spec_table.set_index("key").bytes
    cfgs = {(c.B, c.T, c.mode, c.checkpoints): c.key() for c in PRESETS["spec-step"].configs(["triton"])}
    assert t8a1.checkpointing_bytes == bytes_of[cfgs[64, 8, "inplace", "all"]]
    frozen, commit = bytes_of[cfgs[64, 8, "frozen", "all"]], bytes_of[cfgs[64, 1, "inplace", "all"]]
    assert t8a1["frozen+commit_bytes"] == frozen + commit

    swapped = spec_table.assign(kernel_us_mean=spec_table.kernel_us_mean.where(
        (spec_table["mode"] != "inplace") | (spec_table.checkpoints != "all") | (spec_table["T"] == 1),
        spec_table.kernel_us_mean * 10))  # the checkpointing verify ten times slower: never the faster
    assert set(spec_step.spec_step_rows(swapped).faster) == {"frozen+commit"}


def test_a_step_without_all_three_ok_rows_is_left_out(spec_table):
    def status(cfg):
        return "wrong" if (cfg.mode == "frozen" and cfg.T == 2) or (cfg.checkpoints == "last" and cfg.T == 3) else "ok"

    steps = spec_step.spec_step_rows(rows_of(PRESETS["spec-step"].configs(["triton"], only={"B": (1, 64)}), spec_us,
                                             status))
    assert 2 not in set(steps["T"]) and 3 not in set(steps.a) and len(steps) == 2 * (4 - 1 + 8 - 1)


def test_kda_spec_step_prints_the_report_and_refuses_a_directory_without_steps(spec_table, tmp_path, capsys):
    steps, none = tmp_path / "steps", tmp_path / "none"
    for path, table in ((steps, spec_table), (none, spec_table[spec_table["mode"] != "frozen"])):
        path.mkdir()
        table.to_csv(path / "results.csv", index=False)
    spec_step.main([str(steps)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("H=32 HV=32 K=128 V=128 state_dtype=bf16") and max(map(len, lines)) <= WIDTH
    assert lines[1] == "impl=triton"
    assert lines[2].split() == ["B", "T", "a", "ckpt_us", "frozen_us", "commit_us", "frz_commit_us", "ckpt_MB",
                                "frz_commit_MB", "faster", "by"]
    assert len(lines) == 3 + 2 * 14 and lines[-1].split()[:3] == ["64", "8", "8"]
    assert lines[-1].split()[-2:] == ["checkpointing", "1.09x"] and lines[-8].split()[-2:] == ["frozen+commit", "1.48x"]
    with pytest.raises(SystemExit) as refused:
        spec_step.main([str(none)])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1 and "kda-sweep --preset spec-step" in err


def test_several_implementations_are_set_against_the_fastest_ones_faster_way(spec_table):
    """A second implementation at twice our every time: its faster way is 2.00 of ours at each step;
    the report prints the table below the ways' one."""
    other = spec_table.assign(impl="other", kernel_us_mean=2 * spec_table.kernel_us_mean)
    both = pd.concat([spec_table, other], ignore_index=True)
    ratios = spec_step.faster_way_by_impl(spec_step.spec_step_rows(both))
    assert len(ratios) == 2 * 14 and (ratios["triton"] == 1).all() and (ratios["other"] == 2).all()
    report = spec_step.spec_step_report(both).splitlines()
    assert max(map(len, report)) <= WIDTH
    assert "faster way over the fastest" in report[-2 * 14 - 2] and report[-1].split() == ["64", "8", "8", "2.0", "1.0"]
    assert report.count("impl=other") == 1 and report.count("impl=triton") == 1
    assert spec_step.spec_step_report(spec_table).count("fastest implementation") == 0


def replay_us(cfg) -> float:
    """In place 100 us at every batch; replay 100 / (1 + ring / 32) (ring 16: 1.5x, 32: 2x)."""
    return 100.0 if cfg.mode == "inplace" else 100.0 / (1 + cfg.ring / 32)


def replay_table(**only) -> pd.DataFrame:
    return rows_of(PRESETS["replay"].configs(["triton"], only={"HV": (32,), "state_dtype": ("bfloat16",)} | only),
                   replay_us)


def test_replay_speedup_is_in_place_time_over_replays_per_ring_and_batch():
    text = replay_speedup_table(replay_table())
    lines = text.splitlines()
    assert max(map(len, lines)) <= WIDTH and lines[0].split()[-6:] == ["1", "16", "32", "64", "128", "256"]
    cells = [line.split()[-6:] for line in lines[2:]]  # rings 8, 16, 32
    assert cells == [["1.25x"] * 6, ["1.50x"] * 6, ["2.00x"] * 6], text
    table = replay_table()
    without_inplace = table[table["mode"] == "replay"]
    assert replay_speedup_table(without_inplace) == ""  # no pair, no table


def test_the_replay_chart_draws_a_colour_per_mode_and_ring():
    frame = replay_table(B=(16, 64))
    fig = mode_charts.replay_time(plots.libraries(frame), frame, {"device": {"name": "CPU", "type": "cpu"}})
    (ax,) = [ax for ax in fig.axes if ax.get_lines()]
    drawn = {to_hex(line.get_color()): list(line.get_ydata()) for line in ax.get_lines()}
    assert drawn[to_hex(mode_charts.INPLACE_COLOR)] == [100.0, 100.0] and len(drawn) == 4
    assert sorted(round(y[0], 3) for y in drawn.values()) == [50.0, 66.667, 80.0, 100.0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "in place" in labels and "replay, a ring of 16 records" in labels
    assert mode_charts.replay_time(plots.libraries(frame[frame["mode"] == "replay"]), frame, {}) is None
    plt.close(fig)
