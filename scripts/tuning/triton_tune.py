"""Measure the Triton KDA decode kernel's tile configs on this GPU and regenerate the tuning table.

Measure (one GPU, a few minutes; stops timing at --budget-s and still writes everything):

    python3 -m scripts.tuning.triton_tune --out $OUT/triton_tune.csv

For HV in {16, 32, 64}, (K, V) in {(64, 64), (128, 128), (128, 256)}, B in {1, 16, 64, 256}, bf16
and fp32 state (H = HV), one token per row (``--value-heads``, ``--head-dims``, ``--batches``,
``--state-dtypes`` and ``--tokens`` choose other grids; T > 1 steps store every token's state),
each candidate tile config runs through the harness's case runner as a
sweep row does (kda_impls.bench.run_case with the config forced: verified against the float64
reference, then timed over placements in the default L2 entry state), so the table is chosen by the
figures the sweeps report. The best config per shape is also timed on a pool with padded slots.
Bandwidth counts the state read and written once plus every input and the output
(DecodeInputs.nbytes), against an in-run 1 GiB device-to-device copy (bytes read + written).

``--over-table "rewiden=1;rewiden=1,fast_gate=1"`` times, per shape, only the tabled config and the
tabled config with each of those fields replaced: a new form against the table in minutes. Such a
run also writes ``over_table.md`` beside its CSV (per shape, the fastest variant against the tabled
config; ``--over-table-report CSV ...`` writes it again from committed runs).

Writes the CSV (every candidate), a JSON of the environment and the copy bandwidth beside it
(``.json``), the table those rows make (``tuning.json``) beside it, and prints the best per shape.

Write the tuning table (kda_impls/impls/triton/tuning.json) from measurements (no GPU needed;
several CSVs, e.g. a one-token and a multi-token run, make one table):

    python3 -m scripts.tuning.triton_tune --write-table RUN/triton_tune.csv [more.csv ...]

``--save-tune-data FOLDER`` also saves what the table is written from (every run's rows, the
state-order sweeps' times, each run's environment record) into one folder, which ``--write-table
FOLDER`` then reads in place of the runs: the committed table is written from results/h200/tuning-table/.

A CSV's rows name the fields of the kernel they measured; a field added to the kernel since then
takes its default, unless the path says what that run's kernel did instead (``PATH:FIELD=VALUE``),
e.g. ``RUN/triton_tune.csv:state_first=1``: a run on a kernel that
loaded the state first, before the field existed. The table records the arguments that wrote it
(its ``command``); ``python3 -m scripts.tuning.triton_tune --rewrite-table`` runs them again (a test checks
that they write the committed table).

``--state-order TABLED FIRST``: where two sweeps of the ``targets`` preset (the table as it ran,
and every entry with its state loaded first) time an entry more than 1% apart, the entry takes
the faster order (the tune runs measured the order on kernels since changed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from kda_impls.bench.case import Method, run_case
from kda_impls.bench.config import Config, PoolLayout
from kda_impls.bench.results import environment
from kda_impls.bench.roofline import GPU_COPY_BYTES, copy_bandwidth
from kda_impls.bench.timing import Budget
from kda_impls.dtypes import dtype_name
from kda_impls.impls.triton.kernel import TritonKDA, compile_launches, launches
from kda_impls.impls.triton.tiles import TileConfig, choose_config, tile_shape
from scripts.tuning.tuning_table import (
    PADDED_SOURCE,
    STATE_ORDER_MARGIN,
    TABLE_PATH,
    key_of,
    recorded_command,
    render_table,
    write_over_table_report,
    write_table,
)

VALUE_HEADS = (16, 32, 64)
HEAD_DIMS = ((128, 128), (64, 64), (128, 256))
BATCHES = (1, 16, 64, 256)
STATE_DTYPES = (torch.bfloat16, torch.float32)
PADDED_SLOT = 64  # elements of padding per slot for the padding-cost timing
# Per candidate: three placements sharing 0.12 s of sampling (many configs to time), none added
# (the candidates of a shape are compared within one run), no call time.
METHOD = Method(kernel=Budget(min_samples=12, max_seconds=0.12, rel_ci=0.01), call=None, extra_placements=0)
PLACEMENTS = 3
COLUMNS = ["state_dtype", "HV", "K", "V", "B", "T", "slot_pad", "config", "source", "status", "us", "us_placement_min",
           "us_placement_max", "bytes", "GBps", "pct_copy", "floor_us", "method", "samples", "regs", "spills", "best"]


def candidate_configs(K: int, V: int, element_size: int, B: int, T: int = 1) -> list[TileConfig]:
    """A small set that brackets the design point: tiles of 1-16 KiB of state, 32 to 256 bytes of
    state per thread (32 only for small batches, which need many programs to fill the SMs; the
    first H200 run showed large batches gaining from more bytes per thread: more of the state in
    flight per register). One-token
    steps also try the persistent form on 1-4 KiB tiles at 64 bytes per thread (the next tile's
    loads in flight: twice the state in registers, so small tiles only) with 4 to 16 programs per
    SM, and sub-tiles (1-4 KiB tiles, 2 to 16 of them per program: the gate and norms once per
    program, the next tile's load in flight); the plain tiles of one-token steps also with the head counts
    compiled in (``const_heads``), and with the state loaded before the small inputs
    (``state_first=1``, the order sub-tiles brought), and each of those one-tile configs with the
    stored tile widened twice (``rewiden=1``: fewer registers, more instructions). Multi-token steps
    carry the tile through T tokens, so their set leans to small tiles."""
    per_thread = (32, 64, 128) if B <= 16 or T > 1 else (64, 128, 256)
    tiles = (1024, 2048, 4096, 8192) if T > 1 else (2048, 4096, 8192, 16384)
    configs = []
    for tile in tiles:
        for bytes_per_thread in per_thread:
            BV, num_warps = tile_shape(K, V, element_size, tile, bytes_per_thread)
            configs.append(TileConfig(BV=BV, num_warps=num_warps))
    if T == 1:
        # the same tiles with the head counts compiled in: a shorter path to the first load, more
        # registers on some tiles (bf16 K=V=64, 32 rows: 96 -> 125)
        configs += [replace(config, const_heads=1) for config in configs]
        # the state loaded first: faster for the 16-row bf16 tiles at K=V=128, slower for the 32-row
        # ones at K=V=64 (7-11%, the same registers; docs/triton-kernel.md)
        configs += [replace(config, state_first=1) for config in configs if not config.const_heads]
        # the reductions and the update each widening the stored tile: fewer registers for some
        # tiles (bf16 K=V=128, 16 rows: 128 -> 96; fp32, 32 rows: 206 -> 139), more instructions
        configs += [replace(config, rewiden=1) for config in configs if not config.const_heads]
        for tile in (1024, 2048, 4096):
            BV, num_warps = tile_shape(K, V, element_size, tile)
            configs += [TileConfig(BV=BV, num_warps=num_warps, programs_per_sm=n) for n in (4, 8, 16)]
        for tile in (1024, 2048, 4096):  # sub-tiles: 1-4 KiB tiles, the gate once per 2-16 of them
            BV, num_warps = tile_shape(K, V, element_size, tile)
            configs += [TileConfig(BV=BV, num_warps=num_warps, subtiles=n) for n in (2, 4, 8, 16)]
    return list(dict.fromkeys(configs))


def measure(args) -> int:
    device = torch.device("cuda")
    started = time.perf_counter()
    copy_gbps = copy_bandwidth(device) / 1e9
    meta = environment(device, args.out.parent, shlex.join(sys.argv)) | {
        "torch": torch.__version__, "cuda": torch.version.cuda, **TritonKDA().versions(),
        "copy_GBps": copy_gbps, "copy_bytes": 2 * GPU_COPY_BYTES, "l2_entry": METHOD.entry, "placements": PLACEMENTS,
    }
    print(f"{meta['gpu']}: L2 {meta['device']['l2_bytes'] / 2**20:.0f} MiB, copy {copy_gbps:.0f} GB/s (1 GiB, "
          f"read + write); torch {torch.__version__}, triton {meta['triton']}", flush=True)

    rows = []
    for T in args.tokens:
        for state_dtype in args.state_dtypes:
            for K, V in args.head_dims:
                for HV in args.value_heads:
                    rows += tune_shape(HV, K, V, T, args.batches, state_dtype, device, copy_gbps, started,
                                       args.budget_s, args.over_table)
    meta["wall_s"] = time.perf_counter() - started

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    table_out = args.out.with_name(TABLE_PATH.name)
    table_out.write_text(render_table(rows, meta, command=["--write-table", str(args.out)]))
    print_summary(rows)
    report = [write_over_table_report(args.out)] if args.over_table else []
    print(f"\nwrote {', '.join(map(str, [args.out, args.out.with_suffix('.json'), table_out, *report]))} "
          f"in {meta['wall_s']:.0f} s")
    failed = [r for r in rows if r["status"] not in ("ok", "skipped: time budget")]
    return 1 if failed else 0


def tune_shape(HV, K, V, T, batches, state_dtype, device, copy_gbps, started, budget_s,
               over_table: tuple[str, ...] = ()) -> list[dict]:
    """Every batch size of one shape: each config verified and timed per batch. The candidates are
    :func:`candidate_configs`, or with ``over_table`` (``"rewiden=1"``, ...) the tabled config and
    the tabled config with each one's fields replaced."""
    rows = []
    for B in batches:
        base = dict(state_dtype=dtype_name(state_dtype), HV=HV, K=K, V=V, B=B, T=T, slot_pad=0)
        configs = shape_configs(state_dtype, HV, K, V, B, T, over_table)
        if time.perf_counter() - started > budget_s:
            rows += [{**base, "config": str(c), "source": s, "status": "skipped: time budget"}
                     for c, s in configs.items()]
            continue
        try:
            rows += tune_batch(base, configs, device, copy_gbps)
        except Exception as exc:  # out of memory, say: record it, go on with the next batch size
            rows.append({**base, "status": f"error: {type(exc).__name__}: {exc}"[:300]})
        torch.cuda.empty_cache()
    best = ", ".join(f"B={r['B']} {r['us']:.2f}" for r in rows if r.get("best")) or "none"
    print(f"{time.perf_counter() - started:5.0f} s  {dtype_name(state_dtype):8} HV={HV:<3} K={K:<3} V={V:<3} T={T} "
          f"best us: {best}", flush=True)
    return rows


def shape_configs(state_dtype, HV, K, V, B, T, over_table: tuple[str, ...] = ()) -> dict[TileConfig, str]:
    """``{config fitted to the shape: its source}`` of one shape's candidates (see :func:`tune_shape`),
    the tabled config among them."""
    tabled = choose_config(state_dtype, HV, K, V, B, T)
    candidates = ([TileConfig.parse(text, tabled, source="--over-table") for text in over_table] if over_table
                  else candidate_configs(K, V, state_dtype.itemsize, B, T))
    configs = {c.fitted(V, T): "candidate" for c in candidates}
    tabled = tabled.fitted(V, T)
    configs[tabled] = "table+candidate" if tabled in configs else "table"
    return configs


def tune_batch(base: dict, configs: dict, device, copy_gbps: float) -> list[dict]:
    rows = []
    for config, source in configs.items():
        row = {**base, "config": str(config), "source": source}
        try:
            row |= case_columns(base, config, device, copy_gbps)
        except Exception as exc:  # a config the compiler or the GPU rejects must not end the run
            row["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    timed = [r for r in rows if r["status"] == "ok"]
    if timed:
        best = min(timed, key=lambda r: r["us"])
        best["best"] = True
        config = TileConfig.parse(best["config"], TileConfig(BV=base["V"]), source="best config")
        padded = {**base, "slot_pad": PADDED_SLOT}
        rows.append({**best, **case_columns(padded, config, device, copy_gbps), "slot_pad": PADDED_SLOT,
                     "source": PADDED_SOURCE, "best": False})
    return rows


def case_columns(base: dict, config: TileConfig, device, copy_gbps: float) -> dict:
    """The case runner's row for ``config`` forced on the shape ``base``, as tune columns."""
    HV, K, V, B = base["HV"], base["K"], base["V"], base["B"]
    cfg = Config("triton", B, HV, HV, K, V, state_dtype=base["state_dtype"], T=base["T"], slot_pad=base["slot_pad"],
                 layout=PoolLayout(placements=PLACEMENTS))
    row = run_case(cfg, device, METHOD, impl=TritonKDA(config), copy_bw=copy_gbps * 1e9)
    columns = {"status": row["status"] if row["status"] != "wrong" else f"wrong: {row['reason']}"[:300]}
    if row["status"] == "ok":
        inputs, out = _compile_args(cfg, device)
        compiled = compile_launches(inputs, launches(inputs, out, config))[0]
        columns |= {"us": row["kernel_us_mean"], "us_placement_min": row["kernel_us_placement_min"],
                    "us_placement_max": row["kernel_us_placement_max"], "bytes": row["bytes"],
                    "GBps": row["gbps"], "pct_copy": 100 * row["roofline_frac"], "floor_us": row["floor_us"],
                    "method": row["kernel_method"], "samples": row["n_samples"], "regs": compiled.n_regs,
                    "spills": compiled.n_spills}
    elif row["status"] != "wrong":
        columns["status"] = f"{row['status']}: {row['reason']}"[:300]
    return columns


def _compile_args(cfg: Config, device):
    inputs = cfg.make_inputs(device)
    return inputs, torch.empty(inputs.out_shape, dtype=inputs.v.dtype, device=device)


def print_summary(rows: list[dict]) -> None:
    best = {key_of(r): r for r in rows if r.get("best") in (True, "True")}
    # By source: the tune data's older runs record the padded rows with the best row's slot_pad (0).
    padded = {key_of(r): r for r in rows if r["source"] == PADDED_SOURCE and r.get("us") not in (None, "")}
    print(f"\n{'state':8} {'HV':>3} {'K':>4} {'V':>4} {'B':>4} {'T':>2}  {'best config':58} {'us':>8} {'GB/s':>6} "
          f"{'%copy':>6} {'floor us':>8} {'pad' + str(PADDED_SLOT) + ' us':>9} {'pad cost':>8}")
    for key in sorted(best, key=lambda k: (k[5], k[0], k[2], k[3], k[1], k[4])):
        r, p = best[key], padded.get(key)
        us = float(r["us"])
        pad = f"{float(p['us']):9.2f} {100 * (float(p['us']) / us - 1):+7.1f}%" if p else f"{'-':>9} {'-':>8}"
        print(f"{r['state_dtype']:8} {r['HV']:>3} {r['K']:>4} {r['V']:>4} {r['B']:>4} {key[5]:>2}  {r['config']:58} "
              f"{us:8.2f} {float(r['GBps']):6.0f} {float(r['pct_copy']):5.1f}% {float(r['floor_us']):8.2f} {pad}")


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def head_dims(text: str) -> tuple[tuple[int, int], ...]:
    """``"128x128,64x64"`` -> ``((128, 128), (64, 64))`` (K x V)."""
    return tuple(tuple(int(d) for d in kv.split("x")) for kv in text.split(","))


def state_dtypes(text: str) -> tuple[torch.dtype, ...]:
    return tuple(getattr(torch, name) for name in text.split(","))


def arguments() -> argparse.ArgumentParser:
    """The command line (the docstring's commands parse with it: a test runs the committed table's)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "triton_tune.csv",
                        help="CSV of every candidate (default $OUT/triton_tune.csv)")
    parser.add_argument("--budget-s", type=float, default=200.0,
                        help="stop timing new shapes after this many seconds (default 200)")
    parser.add_argument("--value-heads", type=int_list, default=VALUE_HEADS, help="HV values (default 16,32,64)")
    parser.add_argument("--head-dims", type=head_dims, default=HEAD_DIMS,
                        help="KxV pairs (default 128x128,64x64,128x256)")
    parser.add_argument("--batches", type=int_list, default=BATCHES, help="B values (default 1,16,64,256)")
    parser.add_argument("--tokens", type=int_list, default=(1,), help="T values, tokens per row (default 1)")
    parser.add_argument("--state-dtypes", type=state_dtypes, default=STATE_DTYPES,
                        help="state dtypes (default bfloat16,float32)")
    parser.add_argument("--over-table", type=lambda text: tuple(filter(None, text.split(";"))), default=(),
                        help="instead of the candidate set: the tabled config of each shape and the tabled config "
                             "with each of these fields replaced (';' between them: \"rewiden=1;rewiden=1,BV=32\")")
    parser.add_argument("--write-table", nargs="+", metavar="CSV[:FIELD=VALUE,...]",
                        help="write kda_impls/impls/triton/tuning.json from measured CSVs (FIELD=VALUE: what the "
                             "run's kernel did where its rows name no such field), or from one tune-data folder "
                             "(--save-tune-data), and exit")
    parser.add_argument("--over-table-runs", nargs="+", default=[], metavar="CSV",
                        help="with --write-table: CSVs of --over-table runs, applied last: each replaces an entry "
                             "only where its best beats the tabled config by more than 2%% (the run-to-run spread), "
                             "and the state-order sweeps do not apply to those entries")
    parser.add_argument("--state-order", nargs=2, type=Path, metavar=("TABLED", "FIRST"),
                        help="with --write-table: two sweep directories of our kernel, the table as it ran and "
                             "every entry with its state loaded first; each entry takes the faster order where they "
                             f"differ by more than {STATE_ORDER_MARGIN * 100:.0f}%%")
    parser.add_argument("--save-tune-data", type=Path, metavar="FOLDER",
                        help="with --write-table CSV...: also save the rows, run records and state-order times the "
                             "table is written from into FOLDER, which --write-table FOLDER reads in their place")
    parser.add_argument("--rewrite-table", action="store_true",
                        help="write kda_impls/impls/triton/tuning.json again with the arguments it records and exit")
    parser.add_argument("--over-table-report", nargs="+", type=Path, metavar="CSV",
                        help="write over_table.md beside each CSV of an --over-table run and exit (no GPU needed)")
    return parser


def main() -> int:
    parser = arguments()
    args = parser.parse_args()
    if args.over_table_report:
        for csv_path in args.over_table_report:
            print(f"wrote {write_over_table_report(csv_path)}")
        return 0
    if (args.state_order or args.over_table_runs or args.save_tune_data) and not args.write_table:
        parser.error("--state-order, --over-table-runs and --save-tune-data go with --write-table")
    if args.rewrite_table:
        args = parser.parse_args(recorded_command())
    if args.write_table:
        return write_table(args.write_table, TABLE_PATH, args.state_order, args.over_table_runs, args.save_tune_data)
    if not torch.cuda.is_available():
        print("measuring needs a CUDA GPU; none is available (--write-table needs none)")
        return 2
    if os.environ.get("KDA_TRITON_CONFIG"):
        print("note: KDA_TRITON_CONFIG is set; the candidates here are forced per config and ignore it")
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
