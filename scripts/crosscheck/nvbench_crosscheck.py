"""The nvbench cross-check command (scripts.crosscheck.nvbench_crosscheck): a sweep's ok rows (or a preset's
configurations) timed by nvbench and by the harness, one launcher in one process (:mod:`scripts.crosscheck.nvbench`),
the sweep's own time beside them.

Writes OUT/nvbench.json.gz (nvbench's own), OUT/crosscheck.csv, OUT/crosscheck.md and OUT/meta.json (commit,
device, versions of cuda-bench, cuda-bindings, torch and triton, nvbench's settings, the harness's budget
and entry state per source). The harness times each row with its sweep's kernel budget and entry state
(a preset's: the preset's budget, the default state). Bad input (no rows, an unknown implementation, an
OUT that already holds a cross-check or cannot be written, no CUDA or no cuda-bench) is one line and exit
status 2 before anything runs. ``--report-only`` rewrites crosscheck.md, and the verdict columns of
crosscheck.csv, from crosscheck.csv's measured columns on any machine.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from kda_impls import registry
from kda_impls.bench.l2 import DEFAULT_ENTRY
from kda_impls.bench.results import SweepDirError, environment, load, read_meta, write_meta
from kda_impls.bench.timing import Budget
from kda_impls.cli import Parser, comma_list, fail, positive_float, positive_int, print_and_save
from scripts.crosscheck.nvbench import (
    EMPTY,
    ROW_COLUMNS,
    NvbenchMissing,
    compare,
    copy_job,
    import_bench,
    nvbench_argv,
    row_job,
    run_jobs,
    summaries,
)
from scripts.crosscheck.nvbench_report import AGREEMENT, REQUIRED, report, with_causes

# nvbench's stopping rule, chosen so that rows settle: its per-sample noise on a step of microseconds is the
# jitter of one launch between events, which more samples do not lower (the noise column of
# results/h200/nvbench/crosscheck.md), so the limit sits above it and min-time ends the row; the mean's
# own uncertainty is noise / sqrt(samples), thousands of samples at min-time.
MAX_NOISE = 10.0  # %
MIN_TIME = 0.05  # s of GPU time (nvbench's own 0.5: hundreds of thousands of samples of a 5 us step)
TIMEOUT = 5.0  # s a row at most


def _rows_of(args, parser) -> tuple[pd.DataFrame, dict[str, tuple[str, Budget]]]:
    """The rows to time, each with its ``source``, ``name``, the ``seed`` its inputs are drawn with and
    ``sweep_us`` (its sweep's kernel time), from the sweep directories or the preset, narrowed by --impls and
    --B; and for each source the entry state and kernel budget the harness times its rows with. A bad
    input fails here."""
    if bool(args.sweeps) == bool(args.preset):
        parser.error("name the sweep directories to cross-check, or --preset NAME (one of the two)")
    unknown = sorted(set(args.impls or ()) - set(registry.names()))
    if unknown:
        parser.error(f"--impls: unknown implementation {', '.join(unknown)} (known: {', '.join(registry.names())})")
    frames, methods = [], {}
    if args.preset:
        from kda_impls.bench.presets import PRESETS

        if args.preset not in PRESETS:
            parser.error(f"--preset {args.preset}: not a preset (one of {', '.join(PRESETS)})")
        impls = list(args.impls or registry.names())
        configs = PRESETS[args.preset].configs(impls)
        source = f"preset {args.preset}"
        frames.append(pd.DataFrame([c.columns() | {"key": c.key(), "source": source, "seed": 1} for c in configs]))
        methods[source] = (DEFAULT_ENTRY, PRESETS[args.preset].kernel)
    for sweep_dir in args.sweeps:
        try:
            sweep = load(sweep_dir)
        except SweepDirError as exc:
            fail(parser.prog, str(exc))
        method = sweep.meta.get("settings", {}).get("method", {})
        frames.append(sweep.ok.rename(columns={"kernel_us_mean": "sweep_us"}).assign(
            source=str(sweep_dir), seed=method.get("seed", 0) + 1))  # the first placement's seed
        budget = {k: v for k, v in method.get("kernel", {}).items() if k in Budget.__dataclass_fields__}
        methods[str(sweep_dir)] = (method.get("entry", DEFAULT_ENTRY), Budget(**budget))
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if args.impls and not rows.empty:
        rows = rows[rows.impl.isin(args.impls)]
    if args.B and not rows.empty:
        rows = rows[rows.B.isin(args.B)]
    if args.unpadded_only and not rows.empty:
        rows = rows[(rows.slot_pad == 0) & (rows.pad_rows == 0)]
    if rows.empty:
        fail(parser.prog, "no rows to time: the sweeps have no ok rows that match --impls/--B/--unpadded-only")
    rows = rows.reindex(columns=[*ROW_COLUMNS, "source", "seed"]).reset_index(drop=True)
    return rows.assign(kind="row", name=[f"{i:04d} {key}" for i, key in enumerate(rows.key)]), methods


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("cuda-bench", "cuda-bindings", "torch", "triton"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def _impl_versions(name: str) -> dict:
    try:
        return registry.get(name).versions()
    except Exception as exc:  # an implementation that will not load here: its rows were skipped, say why
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _gzip(path: Path) -> None:
    """``path`` replaced by ``path.gz``: nvbench's JSON holds every sample's time, megabytes a run."""
    with open(path, "rb") as plain, gzip.open(f"{path}.gz", "wb") as packed:
        shutil.copyfileobj(plain, packed)
    path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="nvbench_crosscheck", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("sweeps", type=Path, nargs="*", help="sweep directories whose ok rows to time")
    parser.add_argument("--preset", help="time a preset's configurations instead (no harness times to compare)")
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the cross-check")
    parser.add_argument("--report-only", action="store_true",
                        help="time nothing: write OUT/crosscheck.md and crosscheck.csv's verdicts again from "
                             "OUT/crosscheck.csv (no GPU needed)")
    parser.add_argument("--impls", type=comma_list(str), help="only these implementations (comma-separated)")
    parser.add_argument("--B", type=comma_list(positive_int), help="only these batch sizes (comma-separated)")
    parser.add_argument("--unpadded-only", action="store_true", help="skip rows with slot padding or padding rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-noise", type=positive_float, default=MAX_NOISE,
                        help=f"nvbench's stdrel stopping rule: the relative noise of its samples under this, in %% "
                             f"(default {MAX_NOISE:g}); a row over it is reported with its noise")
    parser.add_argument("--min-time", type=positive_float, default=MIN_TIME,
                        help=f"and at least this many seconds of GPU time per row (default {MIN_TIME:g})")
    parser.add_argument("--timeout", type=positive_float, default=TIMEOUT,
                        help=f"seconds per row at most (default {TIMEOUT:g}); a row that reaches it did not settle")
    parser.add_argument("--batch", action="store_true",
                        help="also run nvbench's batch measurement (launches back to back, no flush; with Python "
                             "launches the GPU waits on the host, so not a kernel time for microsecond kernels)")
    parser.add_argument("--trace", action="store_true",
                        help="also trace every sample of nvbench's and of the harness's flushed eager timer under "
                             "CUPTI (the lead from the hold's release, kernels, gaps: OUT/crosscheck.md's sample "
                             "timelines); the profiler's cost is then in nvbench's times")
    parser.add_argument("--nvbench", default="", help="more arguments for nvbench's own command line, quoted")
    args = parser.parse_args(argv)
    out = args.out
    if args.report_only:
        if not (out / "crosscheck.csv").exists():
            fail(parser.prog, f"{out / 'crosscheck.csv'}: missing; --report-only rewrites the report of a "
                              f"cross-check made there")
        checked = pd.read_csv(out / "crosscheck.csv")
        missing = [c for c in REQUIRED if c not in checked]
        if missing:
            fail(parser.prog, f"{out / 'crosscheck.csv'}: no {', '.join(missing)} column (made before the harness "
                              f"timed each row beside nvbench); run the cross-check again")
        meta = read_meta(out)
        # the verdict columns (agrees, cause, why, ...) by the rules as they are now; the measured ones untouched
        with_causes(checked, meta.get("nvbench", {})).to_csv(out / "crosscheck.csv", index=False)
        return print_and_save(report(checked, meta), out / "crosscheck.md")
    if (out / "crosscheck.csv").exists():
        fail(parser.prog, f"{out} already holds a cross-check: choose another --out (or remove {out} yourself)")
    rows, methods = _rows_of(args, parser)
    import torch

    if not torch.cuda.is_available():
        fail(parser.prog, "nvbench times CUDA kernels and this machine has no CUDA device")
    try:
        import_bench()
    except NvbenchMissing as exc:
        fail(parser.prog, str(exc))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(parser.prog, f"--out {out}: cannot create it ({exc.strerror})")
    if not os.access(out, os.W_OK):
        fail(parser.prog, f"--out {out}: not writable")
    device = torch.device(args.device)
    if rows.bytes.isna().any():  # a preset's configurations: the bytes a step moves, from its inputs
        from kda_impls.bench.config import Config

        rows["bytes"] = [r["bytes"] if pd.notna(r["bytes"])
                         else Config.from_columns(r).make_inputs(device, int(r["seed"])).nbytes()
                         for r in rows.to_dict("records")]
    copies = pd.DataFrame({"bytes": sorted(rows.bytes.dropna().astype(int).unique())})
    copies = copies.assign(kind="copy", name=[f"copy {n}B" for n in copies.bytes], source="copy")
    empty = pd.DataFrame({"kind": ["empty"], "name": [EMPTY], "bytes": [2], "source": ["empty"]})
    rows["bytes"] = rows.bytes.astype(int)
    # the empty launch first, with the first source's budget: the overhead it measures is every row's
    jobs = [copy_job(EMPTY, 2, device, harness=next(iter(methods.values()))[1])]
    jobs += [row_job(r["name"], r, device, int(r["seed"]), *methods[r["source"]]) for r in rows.to_dict("records")]
    jobs += [copy_job(r["name"], int(r["bytes"]), device) for r in copies.to_dict("records")]
    settings = {"max-noise": args.max_noise, "min-time": args.min_time, "timeout": args.timeout}
    started = time.perf_counter()
    harness = run_jobs(jobs, out / "nvbench.json", device, nvbench_argv(settings, shlex.split(args.nvbench)),
                       batched=args.batch, trace=args.trace)
    table = compare(pd.concat([empty, rows, copies], ignore_index=True), summaries(out / "nvbench.json"), harness)
    with_causes(table, settings).to_csv(out / "crosscheck.csv", index=False)
    _gzip(out / "nvbench.json")
    from kda_impls.bench.roofline import copy_bandwidth

    meta = environment(device, out, shlex.join(sys.argv)) | {
        "versions": _versions(), "impls": {name: _impl_versions(name) for name in sorted(rows.impl.unique())},
        "nvbench": settings | {"batch": args.batch, "trace": args.trace, "extra": args.nvbench},
        "harness": {source: {"entry": entry, "kernel": asdict(budget)} for source, (entry, budget) in methods.items()},
        "wall_s": round(time.perf_counter() - started, 1), "agreement": AGREEMENT,
        "copy_gbps": copy_bandwidth(device) / 1e9,
        "sweeps": {str(s): read_meta(s).get("git", {}).get("sha") for s in args.sweeps}}
    write_meta(out, meta)
    return print_and_save(report(table, meta), out / "crosscheck.md")


if __name__ == "__main__":
    sys.exit(main())
