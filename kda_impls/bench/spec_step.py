"""`kda-spec-step DIR`: a speculative step of T draft tokens done both ways, from a sweep's rows (the
``spec-step`` preset measures them), per (B, T, accepted a):

- checkpointing verify: one in-place step of the T tokens storing the state after every token
  (``checkpoints="all"``), from which the engine keeps the state after the a-th;
- frozen verify and commit: a frozen verify of the T tokens (``mode="frozen"``, nothing stored), then
  an in-place step of the a accepted tokens storing the last state (``T=a``, ``checkpoints="last"``);
  its time is the sum of the two rows' kernel times, its bytes the sum of their bytes.

Which way is faster, by how much, and the bytes each moved (the rows' ``bytes``: the sweeps' byte
model). Only ok rows count; a (B, T, a) without all three ok rows is left out.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import dtypes
from ..cli import Parser, fail
from .config import CONFIG_COLUMNS
from .report import WIDTH
from .results import SweepDirError, load

# what a step's three rows share: everything but the tokens and how they are stored
SAME = [c for c in CONFIG_COLUMNS if c not in ("T", "checkpoints", "mode", "ring")]
WAYS = ("checkpointing", "frozen+commit")


def spec_step_rows(table: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration, T and accepted a (1..T) whose checkpointing verify, frozen verify and
    commit rows are all ok: their kernel times (us) and bytes, each way's total, and ``faster``
    (one of WAYS) with ``by`` (the slower way's time over the faster's)."""
    ok = table[(table.status == "ok") & table.kernel_us_mean.notna()]
    inplace = ok["mode"] == "inplace"
    picked = {"checkpointing": ok[inplace & (ok["T"] > 1) & (ok.checkpoints == "all")],
              "frozen": ok[ok["mode"] == "frozen"],
              "commit": ok[inplace & ((ok["T"] == 1) | (ok.checkpoints == "last"))]}
    parts = {way: rows[[*SAME, "T", "kernel_us_mean", "bytes"]].rename(
        columns={"kernel_us_mean": f"{way}_us", "bytes": f"{way}_bytes"}) for way, rows in picked.items()}
    verify = parts["checkpointing"].merge(parts["frozen"], on=[*SAME, "T"])
    accepted = verify.loc[verify.index.repeat(verify["T"])].assign(
        a=lambda t: t.groupby(level=0).cumcount() + 1).reset_index(drop=True)
    steps = accepted.merge(parts["commit"].rename(columns={"T": "a"}), on=[*SAME, "a"])
    steps["frozen+commit_us"] = steps.frozen_us + steps.commit_us
    steps["frozen+commit_bytes"] = steps.frozen_bytes + steps.commit_bytes
    first = steps["checkpointing_us"] <= steps["frozen+commit_us"]
    steps["faster"] = first.map({True: WAYS[0], False: WAYS[1]})
    times = steps[["checkpointing_us", "frozen+commit_us"]]
    steps["by"] = times.max(axis=1) / times.min(axis=1)
    return steps.sort_values([*SAME, "T", "a"], ignore_index=True)


def faster_way_by_impl(steps: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, T and accepted a of :func:`spec_step_rows` measured by more than one
    implementation: each implementation's faster way's time over the fastest implementation's (1: the
    fastest), a column per implementation."""
    best = steps.assign(best_us=steps[["checkpointing_us", "frozen+commit_us"]].min(axis=1))
    table = best.pivot_table(index=[c for c in SAME if c != "impl"] + ["T", "a"], columns="impl", values="best_us")
    return table.div(table.min(axis=1), axis=0).dropna()


def spec_step_report(table: pd.DataFrame) -> str:
    """:func:`spec_step_rows` as text at most WIDTH columns wide, a table per implementation: the
    configuration columns that take one value said once above them; empty where no step has all three
    rows. With several implementations, :func:`faster_way_by_impl` below them."""
    steps = spec_step_rows(table)
    if steps.empty:
        return ""
    steps = steps.assign(state_dtype=steps.state_dtype.map(dtypes.short))
    varying = [c for c in SAME if steps[c].nunique() > 1 or c in ("impl", "B")]
    fixed = " ".join(f"{c}={steps[c].iloc[0]}" for c in SAME if c not in varying)
    shown = steps[[*varying, "T", "a"]].assign(
        ckpt_us=steps.checkpointing_us.round(1), frozen_us=steps.frozen_us.round(1),
        commit_us=steps.commit_us.round(1), frz_commit_us=steps["frozen+commit_us"].round(1),
        ckpt_MB=steps.checkpointing_bytes.map(_mb), frz_commit_MB=steps["frozen+commit_bytes"].map(_mb),
        faster=steps.faster, by=steps.by.map(lambda x: f"{x:.2f}x"))
    lines = [fixed] if fixed else []
    for impl, rows in shown.groupby("impl", sort=False):
        lines += [f"impl={impl}", rows.drop(columns="impl").to_string(index=False, line_width=WIDTH)]
    if steps.impl.nunique() > 1:
        ratios = faster_way_by_impl(steps).reset_index()
        ratios = ratios[[c for c in ratios if c in varying or c in ("T", "a") or c in set(steps.impl)]]
        lines += ["", "each implementation's faster way over the fastest implementation's (1.00: the fastest):",
                  ratios.round(2).to_string(index=False, line_width=WIDTH)]
    return "\n".join(lines)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g}"


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="kda-spec-step", description="a speculative step done both ways (checkpointing verify; "
                    "frozen verify and commit), per (B, T, accepted a), from a sweep directory")
    parser.add_argument("dir", type=Path, help="a sweep directory (results.csv, meta.json) of the spec-step preset")
    args = parser.parse_args(argv)
    try:
        table = load(args.dir).table
    except SweepDirError as exc:
        fail("kda-spec-step", str(exc))
    report = spec_step_report(table)
    if not report:
        fail("kda-spec-step", f"{args.dir} has no speculative step measured both ways (ok rows of a checkpointing "
                              "verify, a frozen verify of the same T and a commit of 1..T tokens): measure them with "
                              "kda-sweep --preset spec-step")
    print(report)


if __name__ == "__main__":  # python3 -m kda_impls.bench.spec_step: kda-spec-step from a checkout
    main()
