"""scripts/gpu_correctness.py without a GPU: every kind of case its grid holds runs through the case
runner (the first H200 run died on its first case, a field spread into Config that is not one)."""

from helpers import load_script

gpu_correctness = load_script("gpu_correctness")


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
