"""The nvbench cross-check's verdicts and report: which rows agree, what explains each that does not, and
crosscheck.md (:func:`report`).

A difference is explained only by quantities measured in the same run: nvbench's fixed per-sample
overhead (its cold mean of the empty launch less the harness's kernel time of it), and the cost of the
L2 state nvbench's flush leaves (the harness's kernel time of the row in the ``dirty`` entry state less
its time in the sweep's), and the row's own eager launch (the harness's time of one eager call per sample
between events, in the sweep's entry state: nvbench's cold method less its flush, for which the empty
launch's overhead stands in only where a call launches like a one-byte copy), and that eager call after a
write over the L2 before each sample (nvbench's cold method whole, on the harness's clock and stopping
rule). A row beyond AGREEMENT that
none of them brings within AGREEMENT is counted as unexplained, with the numbers; a row nvbench did not
settle (its noise over the limit, or its timeout reached) says so with the noise and the limit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kda_impls.bench.config import CONFIG_COLUMNS

AGREEMENT = 0.03  # |harness / nvbench - 1|, as for the CUPTI cross-check
SETTLED_B = 16  # batches from which the fixed per-sample overhead is a small share of the time
CAUSES = ("overhead", "overhead + L2 flush", "eager launch", "eager launch + L2 flush", "flushed eager launch",
          "gap modes", "unexplained")
CONFIGURATION = [c for c in CONFIG_COLUMNS if c not in ("impl", "placements")]  # whose implementations rank
# the columns a cross-check table needs for its report (a table made before the harness timed each row
# beside nvbench lacks the harness's)
REQUIRED = ("kind", "name", "B", "impl", "harness_us", "harness_dirty_us", "nvbench_us", "nvbench_noise",
            "nvbench_samples", "nvbench_walltime_s", "sweep_us")


# what the causes and the report read of a traced run's columns (:mod:`.sample_trace`, ``--trace``)
TRACE_COLUMNS = tuple(f"trace_{clock}_{part}" for clock in ("nvbench", "eager") for part in (
    "mean_lead_us", "mean_busy_us", "mean_gap_us", "gap_p25_us", "gap_p75_us")) + (
    "trace_nvbench_us", "trace_eager_us")


def fixed_overhead_us(table: pd.DataFrame) -> float:
    """nvbench's cold mean of the empty launch less the harness's kernel time of it: what nvbench's
    method adds to every sample whatever the kernel (NaN where either did not time it)."""
    empty = table[table.kind == "empty"]
    return float((empty.nvbench_us - empty.harness_us).iloc[0]) if len(empty) else float("nan")


def _settled(row, settings: dict) -> tuple[bool, str]:
    """(whether nvbench settled on the row, and if not, why, in numbers)."""
    limit, timeout = settings.get("max-noise", float("nan")) / 100, settings.get("timeout", float("inf"))
    reasons = []
    if not row.nvbench_noise <= limit:
        reasons.append(f"noise {row.nvbench_noise:.1%} over its limit {limit:.1%}")
    if row.nvbench_walltime_s >= timeout:
        reasons.append(f"its {timeout:g} s timeout reached after {row.nvbench_samples:.0f} samples")
    return not reasons, ", ".join(reasons)


def _cause(row, overhead: float, unsettled: str) -> tuple[str, str]:
    """(CAUSES entry, the numbers) of a row beyond AGREEMENT; ("", "") for one within or untimed."""
    if pd.isna(row.ratio) or abs(row.ratio - 1) <= AGREEMENT:
        return "", ""
    tolerance = AGREEMENT * row.nvbench_us
    rest = row.nvbench_us - row.harness_us - overhead  # NaN without the empty launch: nothing explained
    if abs(rest) <= tolerance:
        return CAUSES[0], (f"nvbench's fixed per-sample overhead, {overhead:.2f} us on the empty launch; "
                           f"{rest / row.nvbench_us:+.1%} left")
    flush = row.harness_dirty_us - row.harness_us
    left = rest - flush
    if abs(left) <= tolerance:
        return CAUSES[1], (f"overhead {overhead:.2f} us and the flushed L2 {flush:+.2f} us (the harness in the "
                           f"dirty entry state); {left / row.nvbench_us:+.1%} left")
    eager = row.nvbench_us - row.harness_eager_us  # NaN without the eager timer's time: nothing explained
    launch = (f"the harness's eager call {row.harness_eager_us:.2f} us, its replayed {row.harness_us:.2f} us: "
              f"the launch {row.eager_launch_us:+.2f} us against the empty launch's {overhead:.2f} us")
    if abs(eager) <= tolerance:
        return CAUSES[2], f"one eager launch between events: {launch}; {eager / row.nvbench_us:+.1%} left"
    if abs(eager - flush) <= tolerance:
        return CAUSES[3], (f"one eager launch between events, {launch}, and the flushed L2 {flush:+.2f} us; "
                           f"{(eager - flush) / row.nvbench_us:+.1%} left")
    # nvbench's statistic is a mean: the flushed eager samples' mean where the table has it, else their median
    flushed_us, statistic = ((row.harness_eager_flushed_mean_us, "mean") if pd.notna(row.harness_eager_flushed_mean_us)
                             else (row.harness_eager_flushed_us, "median"))
    flushed = row.nvbench_us - flushed_us  # NaN where that timer did not run: nothing explained
    if abs(flushed) <= tolerance:
        return CAUSES[4], (f"one eager launch between events after a write over the L2, nvbench's cold method on "
                           f"the harness's clock: {flushed_us:.2f} us ({statistic}); "
                           f"{flushed / row.nvbench_us:+.1%} left")
    # A traced run (--trace): a call of several kernels whose gap between them has two modes, which
    # nvbench's samples span while the eager timer's sit in one per run (its quartiles close together):
    # the eager clock is then off nvbench's mean by up to half the modes' distance, either way.
    spread = row.trace_nvbench_gap_p75_us - row.trace_nvbench_gap_p25_us
    eager_spread = row.trace_eager_gap_p75_us - row.trace_eager_gap_p25_us
    if row.kernels_per_call >= 2 and eager_spread < spread / 2 and abs(flushed) <= tolerance + spread / 2:
        return CAUSES[5], (f"the gap between the call's {row.kernels_per_call:.0f} kernels has two modes (CUPTI in "
                           f"the samples): nvbench's samples span them (gap quartiles "
                           f"{row.trace_nvbench_gap_p25_us:.2f}-{row.trace_nvbench_gap_p75_us:.2f} us), the flushed "
                           f"eager timer's sit in one ({row.trace_eager_gap_p25_us:.2f}-"
                           f"{row.trace_eager_gap_p75_us:.2f} us); nvbench - the flushed eager call {flushed:+.2f} us, "
                           f"within {AGREEMENT:.0%} and half the modes' distance ({spread / 2:.2f} us): a difference "
                           f"this clock cannot resolve")
    why = (f"nvbench - harness {row.diff_us:+.2f} us; less the overhead ({overhead:.2f} us) "
           f"{rest / row.nvbench_us:+.1%}, less the flushed L2 too ({flush:+.2f} us) {left / row.nvbench_us:+.1%}")
    if pd.notna(eager):
        why += (f"; nvbench - the harness's eager call ({row.harness_eager_us:.2f} us) {eager / row.nvbench_us:+.1%}, "
                f"less the flushed L2 too {(eager - flush) / row.nvbench_us:+.1%}")
    if pd.notna(flushed):
        why += (f"; nvbench - the flushed eager call ({flushed_us:.2f} us, {statistic}) "
                f"{flushed / row.nvbench_us:+.1%}")
    return CAUSES[6], why + (f"; nvbench did not settle: {unsettled}" if unsettled else "")


def with_causes(table: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """``table`` (:func:`.nvbench.compare`) with ``agrees``, ``eager_launch_us`` (the harness's eager call
    less its replayed one: what one launch between events adds), ``settled``, ``unsettled`` (why not, in
    numbers), ``flush_us`` (harness dirty - harness), ``nvbench_mean_error`` (the relative standard error
    of nvbench's mean: noise / sqrt(samples)), ``cause`` (a CAUSES entry or "") and ``why``,
    by the rules as they are now; ``settings`` are nvbench's (max-noise in %, timeout in s)."""
    overhead = fixed_overhead_us(table)
    for column in ("harness_eager_us", "harness_eager_flushed_us", "harness_eager_flushed_mean_us",
                   "kernels_per_call", *TRACE_COLUMNS):  # made before a timer or without a trace: NaN
        if column not in table:
            table = table.assign(**{column: np.nan})
    table = table.assign(eager_launch_us=table.harness_eager_us - table.harness_us,
                         agrees=(table.ratio - 1).abs() <= AGREEMENT,
                         flush_us=table.harness_dirty_us - table.harness_us,
                         nvbench_mean_error=table.nvbench_noise / np.sqrt(table.nvbench_samples))
    settled = [_settled(r, settings) for r in table.itertuples()]
    table["settled"] = [s for s, _ in settled]
    table["unsettled"] = [why for _, why in settled]
    causes = [_cause(r, overhead, why) for r, (_, why) in zip(table.itertuples(), settled, strict=True)]
    table["cause"] = [c for c, _ in causes]
    table["why"] = [w for _, w in causes]
    return table


def same_ranking(rows: pd.DataFrame) -> tuple[int, int]:
    """(configurations whose implementations the harness and nvbench put in the same order, those with
    at least two implementations timed by both)."""
    timed = rows.dropna(subset=["ratio"])
    same = total = 0
    for _, group in timed.groupby(CONFIGURATION):
        if len(group) < 2:
            continue
        total += 1
        same += list(group.sort_values("harness_us").impl) == list(group.sort_values("nvbench_us").impl)
    return same, total


def _markdown(frame: pd.DataFrame, **kwargs) -> str:
    """A table with whole numbers whole and the rest to 4 significant digits (tabulate's floatfmt is
    per column, and a column of whole numbers read from a CSV is float)."""
    def cell(value):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return float(f"{value:.4g}") if isinstance(value, float) else value

    return frame.map(cell).astype(object).to_markdown(**kwargs)


def _batch_table(rows: pd.DataFrame) -> pd.DataFrame:
    counts = {cause: (rows.cause == cause).groupby(rows.B).sum() for cause in CAUSES}
    table = rows.groupby("B").agg(rows=("ratio", "count"), within=("agrees", "sum"), ratio_min=("ratio", "min"),
                                  ratio_median=("ratio", "median"), ratio_max=("ratio", "max"),
                                  diff_us_median=("diff_us", "median"), flush_us_median=("flush_us", "median"),
                                  eager_launch_us_median=("eager_launch_us", "median"),
                                  noise_max=("nvbench_noise", "max"), mean_error_max=("nvbench_mean_error", "max"),
                                  sweep_ratio_median=("sweep_ratio", "median"))
    return table.assign(**counts).reset_index()


def _tally(rows: pd.DataFrame) -> str:
    within = int(rows.agrees.sum())
    named = ", ".join(f"{c} {int((rows.cause == c).sum())}" for c in CAUSES)
    return f"{within} of {len(rows)} within {AGREEMENT:.0%}; the others: {named}"


def _flushed_tally(timed: pd.DataFrame) -> str:
    """How many timed rows the flushed eager call (its mean where the table has it) puts within AGREEMENT
    of nvbench: nvbench's cold method on the harness's clock; "" for a table without that timer."""
    flushed = timed.harness_eager_flushed_mean_us.fillna(timed.harness_eager_flushed_us)
    known = flushed.notna()
    if not known.any():
        return ""
    within = int(((timed.nvbench_us / flushed - 1).abs() <= AGREEMENT)[known].sum())
    return f" Within {AGREEMENT:.0%} of the flushed eager call: {within} of {int(known.sum())}."


def _trace_summary(table: pd.DataFrame) -> str:
    """What every traced row's samples hold (``--trace``), in one paragraph: the lead in each clock, how
    far the call's kernel durations agree, and, for calls of several kernels, how far apart the gap's
    quartiles lie in each; "" without a trace."""
    errors = table.get("trace_error", pd.Series(dtype=object)).dropna()
    failed = f" Not traced: {len(errors)} rows ({errors.iloc[0]})." if len(errors) else ""
    if "trace_nvbench_lead_us" not in table:
        return failed.strip()
    traced = table[table.kind == "row"].dropna(subset=["trace_nvbench_lead_us", "trace_eager_lead_us"])
    if traced.empty:
        return failed.strip()
    busy = (traced.trace_nvbench_busy_us / traced.trace_eager_busy_us - 1).abs().max()
    text = (f"Inside the samples of the {len(traced)} traced rows (medians per row): the lead is "
            f"{traced.trace_nvbench_lead_us.min():.2f}-{traced.trace_nvbench_lead_us.max():.2f} us in nvbench's, "
            f"{traced.trace_eager_lead_us.min():.2f}-{traced.trace_eager_lead_us.max():.2f} us in the flushed eager "
            f"timer's; the call's kernels take within {busy:.1%} of each other's time in every row.")
    several = traced[traced.kernels_per_call >= 2]
    if len(several):
        apart = {c: several[f"trace_{c}_gap_p75_us"] - several[f"trace_{c}_gap_p25_us"] for c in ("nvbench", "eager")}
        text += (f" In the {len(several)} rows of calls of several kernels, the gap between kernels has quartiles "
                 + "; ".join(f"{a.min():.2f}-{a.max():.2f} us apart (median {a.median():.2f}) in {name}"
                             for name, a in (("nvbench's samples", apart["nvbench"]),
                                             ("the eager timer's", apart["eager"])))
                 + ".")
    return text + failed


def _trace_table(table: pd.DataFrame) -> pd.DataFrame:
    """The traced rows (``--trace``) at B >= SETTLED_B that the launch and flush rules leave (the last two
    CAUSES): each clock's traced twin (nvbench's
    cold mean, the flushed eager samples' mean, both under CUPTI) and where they differ, part by part
    (:mod:`.sample_trace`, means over the samples; nvbench's less the eager timer's), the gap between
    kernels as its quartiles in each, and the row's cause."""
    traced = table[(table.kind == "row") & (table.B >= SETTLED_B) & table.cause.isin(CAUSES[-2:])].dropna(
        subset=["trace_nvbench_us", "trace_eager_us"])
    out = traced[["impl", "state_dtype", "HV", "K", "B", "kernels_per_call", "nvbench_us",
                  "harness_eager_flushed_mean_us", "trace_nvbench_us", "trace_eager_us"]].copy()
    for part in ("lead", "busy", "gap"):
        out[f"{part}_diff_us"] = traced[f"trace_nvbench_mean_{part}_us"] - traced[f"trace_eager_mean_{part}_us"]
    for clock in ("nvbench", "eager"):
        out[f"{clock}_gap_quartiles_us"] = [f"{a:.2f}-{b:.2f}" for a, b in zip(
            traced[f"trace_{clock}_gap_p25_us"], traced[f"trace_{clock}_gap_p75_us"], strict=True)]
    return out.assign(cause=traced.cause)


def report(table: pd.DataFrame, meta: dict) -> str:
    """crosscheck.md from the cross-check table (:func:`.nvbench.compare`) and the run's meta.json."""
    settings = meta.get("nvbench", {})
    table = with_causes(table, settings)
    rows = table[table.kind == "row"]
    timed = rows.dropna(subset=["ratio"])
    settled_b = timed[timed.B >= SETTLED_B]
    same, configs = same_ranking(rows)
    empty = table[table.kind == "empty"]
    sweeps = ", ".join(f"`{s}` (commit {sha})" for s, sha in meta.get("sweeps", {}).items())
    parts = [
        "# Harness kernel time against nvbench's cold GPU time, one launcher, one process",
        f"harness: the harness's kernel time (`timing.kernel_time`, the sweep's budget and L2 entry state, one "
        f"placement) of the launcher nvbench times, on the same inputs, in this process just before nvbench. "
        f"ratio = harness / nvbench's cold GPU mean; within: |ratio - 1| <= {AGREEMENT:.0%}. sweep: the "
        f"source row's kernel time from its own run ({sweeps or 'none: a preset'}); sweep_ratio = sweep / "
        f"harness, the difference between the two runs (box, commit, placements) kept apart from the clocks'. "
        f"nvbench settings: " + (", ".join(f"{k} {v}" for k, v in settings.items()) or "its defaults")
        + ". nvbench's own JSON: `nvbench.json.gz`.",
        f"**All rows: {_tally(timed)}. At B >= {SETTLED_B}: {_tally(settled_b)}.** Rows nvbench did not "
        f"time: {int(rows.nvbench_us.isna().sum())}; did not settle: {int((~timed.settled).sum())}. "
        f"Configurations ranked the same by both: {same} of {configs}." + _flushed_tally(timed),
    ]
    if len(empty):
        e = empty.iloc[0]
        parts.append(f"nvbench's fixed per-sample overhead: {fixed_overhead_us(table):.2f} us (its cold mean of "
                     f"the empty launch, a one-byte copy, {e.nvbench_us:.2f} us at noise {e.nvbench_noise:.1%}, "
                     f"less the harness's "
                     f"{e.harness_us:.2f} us): one launch between events in each sample, which the harness's "
                     f"replayed passes do not pay."
                     + (f" The harness's eager call of it, one per sample between events: {e.harness_eager_us:.2f} us."
                        if pd.notna(e.harness_eager_us) else ""))
    if not timed.empty:
        parts.append("## By batch\n\nflush_us: the harness in the dirty entry state less the harness in the "
                     "sweep's; mean_error: nvbench's noise / sqrt(samples), the relative standard error of its "
                     "mean.\n\n" + _markdown(_batch_table(timed), index=False))
        by_impl = timed.astype({"B": int}).pivot_table(index="impl", columns="B", values="ratio", aggfunc="median")
        parts.append("## Median ratio by implementation and batch\n\n" + _markdown(by_impl))
        if timed.harness_eager_us.notna().any():  # a table made before the eager timer has none
            launches = timed.groupby("impl").agg(kernels_per_call=("kernels_per_call", "median"),
                                                 eager_launch_us_median=("eager_launch_us", "median"),
                                                 diff_us_median=("diff_us", "median"))
            parts.append("## One eager launch per sample, by implementation\n\nkernels_per_call: GPU kernels one "
                         "eager call launches (CUPTI); eager_launch_us: the harness's eager call (one per sample "
                         "between events, nvbench's method less its flush) less its replayed one; diff_us: nvbench "
                         f"- harness. The empty launch's overhead: {fixed_overhead_us(table):.2f} us.\n\n"
                         + _markdown(launches))
        worst = timed.assign(off=(timed.ratio - 1).abs()).sort_values("off", ascending=False).head(20)
        parts.append("## The largest differences\n\n" + _markdown(worst[
            ["impl", "state_dtype", "HV", "K", "B", "harness_us", "harness_eager_us", "nvbench_us", "nvbench_noise",
             "ratio", "sweep_us", "cause", "why"]], index=False))
    unsettled = timed[~timed.settled]
    if not unsettled.empty:
        parts.append("## Rows nvbench did not settle\n\n" + _markdown(unsettled[
            ["impl", "state_dtype", "HV", "K", "B", "nvbench_us", "nvbench_samples", "nvbench_walltime_s",
             "nvbench_mean_error", "unsettled"]], index=False))
    copies = table[table.kind == "copy"].dropna(subset=["nvbench_us"])
    if not copies.empty:
        copies = copies.assign(nvbench_copy_gbps=copies.bytes / copies.nvbench_us / 1e3)
        parts.append("## nvbench's copy of the same bytes (its roofline)\n\nHalf the bytes read, half written. "
                     "The harness's copy bandwidth on this device (a 1 GiB copy): "
                     f"{meta.get('copy_gbps', float('nan')):,.4g} GB/s.\n\n" + _markdown(copies[
                         ["bytes", "nvbench_us", "nvbench_noise", "nvbench_copy_gbps"]].sort_values("bytes"),
                         index=False))
    summary = _trace_summary(table)
    if summary:
        parts.append("## Inside the samples (CUPTI)\n\n" + summary)
    traced = _trace_table(table)
    if not traced.empty:
        parts.append(f"## Inside the samples of the rows at B >= {SETTLED_B} no launch or flush explains "
                     "(CUPTI)\n\nEach row timed again by a traced twin (`--trace`): nvbench's cold loop "
                     "(trace_nvbench_us, its mean) and the flushed "
                     "eager timer (trace_eager_us, its samples' mean), every sample under CUPTI. lead: from the "
                     "hold's release (nvbench: its timestamp kernel) through the start event to the call's first "
                     "kernel; busy: the call's kernels' durations; gap: idle between them. A *_diff is nvbench's "
                     "mean less the eager timer's; the gap's quartiles show its modes.\n\n"
                     + _markdown(traced, index=False))
    errors = table[table.error.notna()] if "error" in table else table.iloc[:0]
    if not errors.empty:
        parts.append("## Not timed\n\n" + _markdown(errors[["name", "error"]], index=False))
    return "\n\n".join(parts) + "\n"

