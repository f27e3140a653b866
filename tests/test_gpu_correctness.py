"""The GPU correctness grid (kda_impls/tools/gpu_correctness.py) without a GPU: every kind of case its
grid holds runs through the case runner (a field spread into Config that is not one fails every case)."""

from kda_impls.tools import gpu_correctness


def test_each_kind_of_grid_case_runs_through_the_case_runner_on_the_cpu():
    kinds = {}  # one-token, GVA, multi-token with every token stored and with the last only
    for case in gpu_correctness.grid():
        kinds.setdefault((case["H"] < case["HV"], case.get("T", 1), case.get("checkpoints")), case)
    assert len(kinds) == 6  # one-token and GVA; T = 2, 4, 8 storing every token, T = 4 also the last only
    for (gva, _, _), case in kinds.items():
        small = case | dict(B=2, H=1, HV=4 if gva else 1, K=16, V=16)
        row = gpu_correctness.check_case("naive", small, "cpu")
        assert row["status"] == "ok", row
        assert (row["slot_pad"], row["T"], row["checkpoints"]) == (case["slot_pad"], case.get("T", 1),
                                                                  case.get("checkpoints", "all"))


def test_the_grid_writes_rows_and_meta_under_out_and_fails_on_a_compounding_error(tmp_path, monkeypatch, capsys):
    """The grid's own main on two tiny cases: the multi-step check runs for every implementation
    (the planted 0.5%-per-step drift is wrong, exit 1), results and meta (commit, versions) land in --out."""
    import json

    import pandas as pd
    from planted import extra_impls

    monkeypatch.setenv("KDA_EXTRA_IMPLS", extra_impls("planted-drift"))
    tiny = [dict(B=4, H=2, HV=2, K=16, V=16, slot_pad=8, state_dtype="bfloat16"),
            dict(B=2, H=2, HV=2, K=16, V=16, slot_pad=0, state_dtype="bfloat16", T=2, checkpoints="all")]
    monkeypatch.setattr(gpu_correctness, "grid", lambda: iter(tiny))
    out = tmp_path / "grid"
    assert gpu_correctness.main(["--impls", "naive,planted-drift", "--out", str(out), "--device", "cpu"]) == 1
    table = pd.read_csv(out / "correctness.csv")
    statuses = sorted(zip(table.impl, table.status, strict=True))
    assert statuses == [("naive", "ok")] * 2 + [("planted-drift", "wrong")] * 2
    assert (table.steps >= 1).all() and table[table.impl == "naive"].err_steps.notna().all()
    meta = json.loads((out / "meta.json").read_text())
    assert "sha" in meta["git"] and meta["versions"]["torch"] and meta["impls_done"] == ["naive", "planted-drift"]
    assert "against the reference carried over them" in capsys.readouterr().out


def test_the_script_leaves_sys_path_alone():
    """It runs against the installed package (pip install -e .), as every entry point does."""
    from pathlib import Path

    assert "sys.path" not in Path(gpu_correctness.__file__).read_text()


def test_every_nth_case_keeps_each_kind_of_case():
    """--every 8 (the grid's quick form) still holds one-token, GVA and multi-token cases of both state dtypes."""
    quick = list(gpu_correctness.grid())[::8]
    kinds = {(c["H"] < c["HV"], c.get("T", 1) > 1, c["state_dtype"]) for c in quick}
    assert kinds == {(gva, multi, dtype) for gva, multi in ((False, False), (True, False), (False, True))
                     for dtype in ("bfloat16", "float32")}
