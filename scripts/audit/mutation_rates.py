"""The mutation audit's survival rates by module, from mutmut's own results (``mutants/**/*.meta``).

    python3 -m scripts.audit.mutation_rates [--mutants mutants] [PATTERN ...]

One row per mutated module: mutants whose names match a PATTERN (shell-style, as ``mutmut run`` takes
them; every mutant without one), how many mutmut has checked, killed and survived, and the survival
rate docs/mutation-testing.md states, survived / (killed + survived). Statuses are mutmut's
(``mutmut.stats.status_by_exit_code``); needs the ``dev`` extra. Exit 2 without a mutants directory.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections import Counter
from pathlib import Path

import pandas as pd

from kda_impls.cli import fail

PROG = "mutation_rates.py"


def rates(mutants: Path, patterns: list[str]) -> pd.DataFrame:
    """Per module: ``mutants`` (matching ``patterns``), ``checked``, ``killed``, ``survived``, ``rate``
    and ``other``, the other statuses (timeouts, suspicious, no tests) counted apart."""
    from mutmut.stats import status_by_exit_code

    rows = []
    for meta in sorted(mutants.rglob("*.py.meta")):
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        picked = {k: c for k, c in codes.items() if not patterns or any(fnmatch.fnmatch(k, p) for p in patterns)}
        if not picked:
            continue
        status = Counter(status_by_exit_code[c] for c in picked.values())
        killed, survived = status.pop("killed", 0) + status.pop("caught by type check", 0), status.pop("survived", 0)
        unchecked = status.pop("not checked", 0)
        judged = killed + survived
        rows.append({"module": ".".join(meta.relative_to(mutants).with_suffix("").with_suffix("").parts),
                     "mutants": len(picked), "checked": len(picked) - unchecked, "killed": killed,
                     "survived": survived, "rate": survived / judged if judged else float("nan"),
                     "other": ", ".join(f"{n} {s}" for s, n in sorted(status.items()))})
    return pd.DataFrame(rows, columns=["module", "mutants", "checked", "killed", "survived", "rate", "other"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"), help="mutmut's directory")
    parser.add_argument("patterns", nargs="*", help="mutant names, shell-style (kda_impls.regress.x_verdict*)")
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        fail(PROG, f"{args.mutants}: no such directory; expected mutmut's mutants/ (python3 -m mutmut run first)")
    table = rates(args.mutants, args.patterns)
    print(table.to_markdown(index=False, floatfmt=".1%"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
