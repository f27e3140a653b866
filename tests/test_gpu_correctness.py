"""The GPU correctness grid (scripts/gpu/gpu_correctness.py) without a GPU: every kind of case its
grid holds (in place, frozen verify, replay) runs through the case runner (a field spread into Config
that is not one fails every case); its main on tiny cases, a refused mode counted with its reason."""

from scripts.gpu import gpu_correctness


def test_each_kind_of_grid_case_runs_through_the_case_runner_on_the_cpu():
    kinds = {}  # in place: one-token, GVA, multi-token storing every token or the last; frozen; replay
    for case in gpu_correctness.grid():
        mode = case.get("mode", "inplace")
        T = case.get("T", 1) if mode == "inplace" else min(case.get("T", 1), 2)
        kinds.setdefault((mode, case["H"] < case["HV"], T, case.get("checkpoints"), case.get("ring"),
                          case.get("rings")), case)
    # in place: one-token and GVA, T = 2, 4, 8 storing every token, T = 4 also the last only; frozen: one
    # token and several, each with and without GVA; replay: one-token steps on rings 4 and 16, and verifies
    # from random and from empty rings, each with and without GVA
    assert len(kinds) == 6 + 4 + 4 + 4
    for (mode, gva, *_), case in kinds.items():
        small = case | dict(B=2, H=1, HV=4 if gva else 1, K=16, V=16) | ({"ring": 4} if mode == "replay" else {})
        row = gpu_correctness.check_case("naive", small, "cpu")
        assert row["status"] == "ok", row
        assert (row["mode"], row["slot_pad"], row["T"], row["checkpoints"], row["ring"]) == (
            mode, case["slot_pad"], case.get("T", 1), case.get("checkpoints", "all"), small.get("ring", 0))
        assert row["steps"] == (4 + 1 if mode == "replay" else 1 if mode == "frozen" else row["steps"])


def test_the_modes_select_their_cases_and_leave_the_in_place_grid_as_it_was():
    every = list(gpu_correctness.grid())
    inplace = list(gpu_correctness.grid(("inplace",)))
    assert len(inplace) == 396 and all("mode" not in case for case in inplace) and every[:396] == inplace
    frozen = list(gpu_correctness.grid(("frozen",)))
    replay = list(gpu_correctness.grid(("replay",)))
    assert every[396:] == frozen + replay
    steps = [c for c in replay if "rings" not in c]  # a sweep's replay row: a one-token step
    verifies = [c for c in replay if "rings" in c]
    assert {c["T"] for c in frozen} == set(range(1, 9)) and {c["ring"] for c in steps} == {4, 16}
    assert all(c.get("T", 1) == 1 for c in steps) and {c["T"] for c in verifies} == {2, 4, 8}
    assert {c["rings"] for c in verifies} == {"random", "empty"} and {c["ring"] for c in verifies} == {16}
    for cases in (frozen, steps, verifies):
        assert {(c["HV"], c["K"]) for c in cases} == set(gpu_correctness.MODE_SHAPES)
        assert {c["state_dtype"] for c in cases} == {"bfloat16", "float32"} and any(c["H"] < c["HV"] for c in cases)


def test_the_grid_writes_rows_and_meta_under_out_and_fails_on_a_compounding_error(tmp_path, monkeypatch, capsys):
    """The grid's own main on two tiny cases: the multi-step check runs for every implementation
    (the planted 0.5%-per-step drift is wrong, exit 1), results and meta (commit, versions) land in --out."""
    import json

    import pandas as pd
    from planted import extra_impls

    monkeypatch.setenv("KDA_EXTRA_IMPLS", extra_impls("planted-drift", "planted-replay-drift"))
    tiny = [dict(B=4, H=2, HV=2, K=16, V=16, slot_pad=8, state_dtype="bfloat16"),
            dict(B=2, H=2, HV=2, K=16, V=16, slot_pad=0, state_dtype="bfloat16", T=2, checkpoints="all"),
            dict(B=4, H=2, HV=2, K=16, V=16, slot_pad=8, state_dtype="bfloat16", mode="replay", ring=4),
            dict(B=2, H=2, HV=2, K=16, V=16, slot_pad=0, state_dtype="bfloat16", mode="replay", ring=4, T=2,
                 rings="random")]
    monkeypatch.setattr(gpu_correctness, "grid", lambda modes: iter(tiny))
    out = tmp_path / "grid"
    impls = ["naive", "planted-drift", "planted-replay-drift"]
    assert gpu_correctness.main(["--impls", ",".join(impls), "--out", str(out), "--device", "cpu"]) == 1
    table = pd.read_csv(out / "correctness.csv")
    statuses = list(zip(table.impl, table["mode"], table.status, strict=True))
    assert statuses == [("naive", "inplace", "ok")] * 2 + [("naive", "replay", "ok")] * 2 + \
        [("planted-drift", "inplace", "wrong")] * 2 + [("planted-drift", "replay", "unsupported")] * 2 + \
        [("planted-replay-drift", "inplace", "ok")] * 2 + [("planted-replay-drift", "replay", "wrong")] * 2
    checked = table[table.status != "unsupported"]
    assert (checked.steps >= 1).all() and table[table.impl == "naive"].err_steps.notna().all()
    assert list(table[table.impl == "naive"].steps.iloc[-2:]) == [5, 5]  # replay: L + 1, every ring flushing
    meta = json.loads((out / "meta.json").read_text())
    assert "sha" in meta["git"] and meta["versions"]["torch"] and meta["impls_done"] == impls
    printed = capsys.readouterr().out
    assert "against the reference carried over them" in printed and "effective state error" in printed


def test_the_script_leaves_sys_path_alone():
    """It runs against the installed package (pip install -e .), as every entry point does."""
    from pathlib import Path

    assert "sys.path" not in Path(gpu_correctness.__file__).read_text()


def test_every_nth_case_keeps_each_kind_of_case():
    """--every 8 (the grid's quick form) still holds one-token, GVA and multi-token cases of both state dtypes
    in place, frozen verify at one token and several, replay with both rings and verifies from both starts."""
    quick = list(gpu_correctness.grid())[::8]
    inplace = {(c["H"] < c["HV"], c.get("T", 1) > 1, c["state_dtype"]) for c in quick if "mode" not in c}
    assert inplace == {(gva, multi, dtype) for gva, multi in ((False, False), (True, False), (False, True))
                       for dtype in ("bfloat16", "float32")}
    frozen = {(c["T"] > 1, c["state_dtype"]) for c in quick if c.get("mode") == "frozen"}
    assert frozen == {(multi, dtype) for multi in (False, True) for dtype in ("bfloat16", "float32")}
    assert {(c["ring"], c["state_dtype"]) for c in quick if c.get("mode") == "replay"} >= {
        (4, "bfloat16"), (16, "bfloat16"), (4, "float32"), (16, "float32")}
    assert {(c["rings"], c["state_dtype"]) for c in quick if "rings" in c} == {
        (rings, dtype) for rings in ("random", "empty") for dtype in ("bfloat16", "float32")}


def test_a_refused_mode_is_counted_with_its_reason_not_as_a_failure(tmp_path, monkeypatch, capsys):
    """planted-drift declares no replay (its capabilities): unsupported with the reason, the run passes (exit 0)."""
    import pandas as pd
    from planted import extra_impls

    monkeypatch.setenv("KDA_EXTRA_IMPLS", extra_impls("planted-drift"))
    tiny = [dict(B=2, H=1, HV=2, K=16, V=16, slot_pad=0, state_dtype="bfloat16", mode="replay", ring=4)]
    monkeypatch.setattr(gpu_correctness, "grid", lambda modes: iter(tiny))
    argv = ["--impls", "naive,planted-drift", "--modes", "replay", "--out", str(tmp_path), "--device", "cpu"]
    assert gpu_correctness.main(argv) == 0
    table = pd.read_csv(tmp_path / "correctness.csv")
    assert list(zip(table.impl, table.status, strict=True)) == [("naive", "ok"), ("planted-drift", "unsupported")]
    assert table.detail.iloc[1] == "cache= (replay: the state a checkpoint plus cached records) not supported by " \
                                   "planted-drift"
    assert "refused, with the implementation's reason" in capsys.readouterr().out


def test_an_unknown_mode_is_one_line_before_anything_runs(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        gpu_correctness.main(["--modes", "inplace,replya", "--out", str(tmp_path / "grid"), "--device", "cpu"])
    assert exit_.value.code == 2 and "--modes must name modes among inplace, frozen, replay; got replya" in \
        capsys.readouterr().err
    assert not (tmp_path / "grid").exists()
