"""scripts.audit.mutation_rates: the audit's survival rates read from mutmut's own results."""

import json

import pytest

from scripts.audit import mutation_rates


def test_rates_by_module_count_only_the_judged_mutants_of_the_patterns(tmp_path):
    pytest.importorskip("mutmut", reason="the statuses are mutmut's, the dev extra's")
    (tmp_path / "kda_impls").mkdir()
    codes = {"kda_impls.verify.x_verify__mutmut_1": 1, "kda_impls.verify.x_verify__mutmut_2": 0,
             "kda_impls.verify.x_verify__mutmut_3": 1, "kda_impls.verify.x_verify__mutmut_4": 36,
             "kda_impls.verify.x_verify__mutmut_5": None, "kda_impls.verify.x_rel_err__mutmut_1": 0}
    (tmp_path / "kda_impls" / "verify.py.meta").write_text(json.dumps({"exit_code_by_key": codes}))
    row = mutation_rates.rates(tmp_path, ["kda_impls.verify.x_verify*"]).iloc[0]
    assert (row.module, row.mutants, row.checked, row.killed, row.survived) == ("kda_impls.verify", 5, 4, 2, 1)
    assert row.rate == pytest.approx(1 / 3) and row.other == "1 timeout"
    assert mutation_rates.rates(tmp_path, []).iloc[0].survived == 2  # no pattern: every mutant


def test_without_a_mutants_directory_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        mutation_rates.main(["--mutants", str(tmp_path / "none")])
    assert exit_.value.code == 2 and "no such directory" in capsys.readouterr().err
