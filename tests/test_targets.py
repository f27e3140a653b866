"""scripts.reports.targets: the kernel issue's targets judged on a results table (each library at its best
variant); scripts.reports.mode_targets: the decode modes' targets."""


import pandas as pd
import pytest

from scripts.reports import mode_targets, targets


def row(impl, B, us, frac, state="bfloat16", slot_pad=0, spread=0.01, library=None, K=128, engine="", mode="inplace"):
    return dict(impl=impl, library=library or impl, engine_call=engine, B=B, H=32, HV=32, K=K, V=K, pad_rows=0, T=1,
                checkpoints="all", mode=mode, ring=0,
                slot_pad=slot_pad, slots_per_row=1, slot_order="random", placements=3, state_dtype=state,
                status="ok", kernel_us_mean=us, kernel_us_placement_min=us * (1 - spread / 2),
                kernel_us_placement_max=us * (1 + spread / 2), roofline_frac=frac)


def table():
    return pd.DataFrame([
        row("triton", 1, 2.6, 0.2), row("flashinfer", 1, 2.8, 0.2, engine="SGLang"),  # 0.93x this one, but
        row("flashinfer-dense", 1, 2.7, 0.2, library="flashinfer"),                     # 0.96x the best: missed
        row("triton", 16, 10.0, 0.8, spread=0.03),                                      # spread 3%: missed
        row("flashinfer", 16, 12.0, 0.7, engine="SGLang"),
        row("fla", 16, 9.0, 0.6),                                                        # fla best: missed
        row("triton", 64, 36.0, 0.93), row("flashinfer", 64, 40.0, 0.8, engine="SGLang"),  # 93% >= 92%, 0.95x: met
        row("flashinfer-dense", 64, 38.0, 0.85, library="flashinfer"),
        row("triton", 64, 36.5, 0.9, slot_pad=64),                                      # +1.4%: met
        row("triton", 256, 150.0, 0.91), row("triton", 256, 160.0, 0.8, slot_pad=64),  # 91% < 92%; +6.7%
        row("triton", 64, 20.0, 0.81, K=64), row("triton", 256, 70.0, 0.87, K=64),     # 81% >= 80%; 87% < 88%
        row("triton", 64, 70.0, 0.95, state="float32"),                                 # fp32 95% >= 94%: met
    ])


def test_targets_are_judged():
    sections, summary = targets.judge(table(), "triton")
    assert summary == {"speed": "1/3 met", "bandwidth": "3/5 met", "placements": "5/6 met", "padding": "1/2 met"}
    # a frozen-verify row (no state written: faster, more of the copy) is not in-place decode's target
    frozen = pd.concat([table(), pd.DataFrame([row("triton", 256, 80.0, 0.99, mode="frozen")])], ignore_index=True)
    assert targets.judge(frozen, "triton")[1] == summary
    speed = next(s for s in sections if s.startswith("## Faster"))
    assert "flashinfer-dense" in speed and "| fla " in speed  # each point against the best rival, named


def test_latency_table_takes_each_library_at_its_best_variant():
    latency = targets.latency_table(table())
    assert latency.loc[(32, 128, 128, 64), "flashinfer bf16"] == "38.00 us (85%) flashinfer-dense"
    assert latency.loc[(32, 128, 128, 16), "flashinfer bf16"] == "12.00 us (70%)"
    engines = targets.engine_table(table())
    assert list(engines.columns) == ["flashinfer bf16"] and engines.loc[(32, 128, 128, 64)].iloc[0] == "40.00 us (80%)"
    assert targets.engine_legend(table()) == "- `flashinfer`: SGLang"


def test_misses_across_runs_count_each_point_in_every_run():
    first = table()
    second = table()  # the same code again: the B = 16 spread back within 2%, B = 256 K=V=64 bandwidth too
    second.loc[(second.impl == "triton") & (second.B == 16), ["kernel_us_placement_min", "kernel_us_placement_max"]] = \
        [10.0, 10.05]
    second.loc[(second.impl == "triton") & (second.B == 256) & (second.K == 64), "roofline_frac"] = 0.89
    third = table()[lambda t: t.impl == "triton"]  # our kernel alone: no speed verdict, nothing counted for it
    report = targets.misses_across({"a": first, "b": second, "c": third}, "triton")
    sections = dict(s.split("\n\n", 1) for s in report.split("\n\n## "))
    speed = next(body for head, body in sections.items() if "Faster" in head)
    assert "| 1/2 " not in speed and speed.count("| 2/2 ") == 2  # B = 1 and 16 missed in both runs judging speed
    bandwidth_head = next(head for head in sections if head.startswith("Share"))
    bandwidth = sections[bandwidth_head]
    assert "missed in every run at 1 points, in some at 1" in bandwidth_head
    assert "| 3/3 " in bandwidth and "| 2/3 " in bandwidth  # 91% at K=V=128 always; 87% at K=V=64 in a and c
    placements_head = next(head for head in sections if head.startswith("Placement"))
    assert "missed in every run at 0 points, in some at 1" in placements_head
    assert "| 2/3 " in sections[placements_head]


def mode_row(impl, B, us, mode, T=1, ring=0, library=None, state="bfloat16", HV=32, floor=1.0):
    return row(impl, B, us, 0.5, state=state, library=library) | dict(T=T, mode=mode, ring=ring, H=HV, HV=HV,
                                                                      floor_us=floor)


def test_mode_targets_judge_frozen_against_flashinfers_best_and_replay_against_in_place():
    frozen = pd.DataFrame([
        mode_row("triton", 16, 8.0, "frozen", T=4), mode_row("flashinfer", 16, 10.0, "frozen", T=4),  # 0.80x: met
        mode_row("flashinfer-loggate", 16, 12.0, "frozen", T=4, library="flashinfer"),
        mode_row("triton", 64, 33.0, "frozen", T=4, floor=32.5), mode_row("flashinfer", 64, 40.0, "frozen", T=4),
        mode_row("flashinfer-loggate", 64, 32.0, "frozen", T=4, library="flashinfer"),  # 33/32: missed
        mode_row("triton", 1, 1.0, "frozen", T=4), mode_row("flashinfer", 1, 9.0, "frozen", T=4),  # B < 16: not judged
        mode_row("triton", 16, 9.0, "frozen", T=2), mode_row("flashinfer", 16, 9.0, "frozen", T=2),  # 1.00x: met
        mode_row("triton", 16, 1.0, "frozen", T=3), mode_row("flashinfer", 16, 9.0, "frozen", T=3),  # T = 3: not judged
    ])
    points = mode_targets.frozen_points(frozen, "triton").sort_values(["T", "B"])
    assert points[["T", "B"]].values.tolist() == [[2, 16], [4, 16], [4, 64]]
    assert points.met.tolist() == [True, True, False]
    assert points.flashinfer_variant.tolist() == ["flashinfer", "flashinfer", "flashinfer-loggate"]
    assert points.target_us.tolist() == pytest.approx([9.0, 10.0, 32.0])  # FlashInfer's best
    assert "met at 2 of 3 points; the target is under the step's copy floor at 1 of them" in \
        mode_targets.section("frozen", "target", points)  # 32 us < the 32.5 us its bytes take at copy speed
    replay = pd.DataFrame([
        mode_row("triton", 64, 40.0, "inplace"), mode_row("triton", 64, 29.0, "replay", ring=16),  # 1.38x: met
        mode_row("triton", 256, 140.0, "inplace"), mode_row("triton", 256, 110.0, "replay", ring=16),  # 1.27x
        mode_row("triton", 256, 50.0, "replay", ring=8),  # another ring: not judged
        mode_row("triton", 16, 20.0, "inplace"), mode_row("triton", 16, 5.0, "replay", ring=16),  # B < 64
    ])
    points = mode_targets.replay_points(replay, "triton")
    assert points.B.tolist() == [64, 256] and points.met.tolist() == [True, False]
    assert points.target_us.tolist() == pytest.approx([40 / 1.35, 140 / 1.35])


def test_mode_targets_cli_exits_1_on_a_miss_and_2_without_rows(tmp_path, capsys):
    rows = pd.DataFrame([mode_row("triton", 64, 40.0, "inplace"), mode_row("triton", 64, 35.0, "replay", ring=16)])
    rows["key"] = ["inplace-row", "replay-row"]
    rows.to_csv(tmp_path / "results.csv", index=False)
    (tmp_path / "meta.json").write_text('{"gpu": "test GPU", "git": {"sha": "abc"}}')
    assert mode_targets.main([str(tmp_path)]) == 1  # 1.14x < 1.35x
    assert "met at 0 of 1 points; the target is under the step's copy floor at 0 of them" in \
        (tmp_path / "mode-targets.md").read_text()
    rows.assign(mode="inplace").to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(SystemExit) as exit_:
        mode_targets.main([str(tmp_path)])
    assert exit_.value.code == 2 and "holds no ok rows" in capsys.readouterr().err
