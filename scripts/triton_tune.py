#!/usr/bin/env python3
"""Measure the Triton KDA decode kernel's tile configs on this GPU and regenerate the tuning table.

Measure (one GPU, a few minutes; stops timing at --budget-s and still writes everything):

    python3 scripts/triton_tune.py --out $OUT/triton_tune.csv

For HV in {16, 32, 64}, (K, V) in {(64, 64), (128, 128), (128, 256)}, B in {1, 16, 64, 256}, bf16
and fp32 state (H = HV), one token per row (``--value-heads``, ``--head-dims``, ``--batches``,
``--state-dtypes`` and ``--tokens`` choose other grids; T > 1 steps store every token's state),
each candidate tile config runs through the harness's case runner as a
sweep row does (kda_impls.bench.run_case with the config forced: verified against the float64
reference, then timed over placements in the default L2 entry state), so the table is chosen by the
figures the sweeps report. The best config per shape is also timed on a pool with padded slots.
Bandwidth counts the state read and written once plus every input and the output
(DecodeInputs.nbytes), against an in-run 1 GiB device-to-device copy (bytes read + written).

``--over-table "rewiden=1;rewiden=1,maxnreg=128"`` times, per shape, only the tabled config and the
tabled config with each of those fields replaced: a new form against the table in minutes. Such a
run also writes ``over_table.md`` beside its CSV (per shape, the fastest variant against the tabled
config; ``--over-table-report CSV ...`` writes it again from committed runs).

Writes the CSV (every candidate), a JSON of the environment and the copy bandwidth beside it
(``.json``), the regenerated ``triton_tuning.py`` beside it, and prints the best per shape.

Regenerate the committed table from measurements (no GPU needed; several CSVs, e.g. a one-token
and a multi-token run, make one table):

    python3 scripts/triton_tune.py --write-table results/h200/triton-tune/triton_tune.csv [more.csv ...]

A CSV's rows name the fields of the kernel they measured; a field added to the kernel since then
takes its default, unless the path says what that run's kernel did instead (``PATH:FIELD=VALUE``),
e.g. ``results/h200/triton-tune-subtiles/triton_tune.csv:state_first=1``: a run on a kernel that
loaded the state first, before the field existed. The committed table:

    python3 scripts/triton_tune.py --write-table results/h200/triton-tune-v3/triton_tune.csv \
        results/h200/triton-tune-multitoken/triton_tune.csv results/h200/triton-tune-subtiles/triton_tune.csv:state_first=1 \
        --state-order results/h200/state-order/table results/h200/state-order/first \
        --over-table-runs results/h200/triton-tune-rewiden/triton_tune.csv \
        results/h200/triton-tune-order/triton_tune.csv results/h200/triton-tune-tma/bf16/triton_tune.csv \
        results/h200/triton-tune-tma/fp32/triton_tune.csv results/h200/triton-tune-slots-ahead/bf16/triton_tune.csv \
        results/h200/triton-tune-slots-ahead/fp32/triton_tune.csv results/h200/triton-tune-eviction/bf16/triton_tune.csv \
        results/h200/triton-tune-eviction/fp32/triton_tune.csv results/h200/triton-tune-eviction-tiles/bf16/triton_tune.csv \
        results/h200/triton-tune-eviction-tiles/fp32/triton_tune.csv results/h200/triton-tune-b1-warps/bf16/triton_tune.csv \
        results/h200/triton-tune-b1-warps/fp32/triton_tune.csv results/h200/triton-tune-fast-gate/old-bfloat16/triton_tune.csv \
        results/h200/triton-tune-fast-gate/old-float32/triton_tune.csv \
        results/h200/triton-tune-fast-gate/new-bfloat16/triton_tune.csv:fast_gate=1 \
        results/h200/triton-tune-fast-gate/new-float32/triton_tune.csv:fast_gate=1 \
        results/h200/triton-tune-fast-gate-tiles/bf16/triton_tune.csv results/h200/triton-tune-fast-gate-tiles/fp32/triton_tune.csv \
        results/h200/triton-tune-b1-eight-rows/triton_tune.csv results/h200/triton-tune-tiled-inputs/b1/triton_tune.csv \
        results/h200/triton-tune-tiled-inputs/b16-b64/triton_tune.csv \
        results/h200/triton-tune-fast-gate-large/bf16/triton_tune.csv results/h200/triton-tune-fast-gate-large/fp32/triton_tune.csv \
        results/h200/triton-tune-fast-gate-k64/bfloat16/triton_tune.csv results/h200/triton-tune-fast-gate-k64/float32/triton_tune.csv \
        results/h200/triton-tune-fast-gate-k128/bfloat16/triton_tune.csv results/h200/triton-tune-fast-gate-k128/float32/triton_tune.csv \
        results/h200/triton-tune-near-misses/bf16-hv32-d128/triton_tune.csv \
        results/h200/triton-tune-near-misses/bf16-hv64-d64/triton_tune.csv \
        results/h200/triton-tune-near-misses/fp32-hv64-d128/triton_tune.csv \
        results/h200/triton-tune-b1-warps-tiled/triton_tune.csv

``--state-order TABLED FIRST``: where two sweeps of the ``targets`` preset (the table as it ran,
and every entry with its state loaded first) time an entry more than 1% apart, the entry takes
the faster order (the tune runs measured the order on kernels since changed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_impls.bench.case import Method, run_case  # noqa: E402
from kda_impls.bench.config import Config, PoolLayout  # noqa: E402
from kda_impls.bench.results import environment  # noqa: E402
from kda_impls.bench.results import load as load_sweep  # noqa: E402
from kda_impls.bench.roofline import GPU_COPY_BYTES, copy_bandwidth  # noqa: E402
from kda_impls.bench.timing import Budget  # noqa: E402
from kda_impls.dtypes import dtype_name  # noqa: E402
from kda_impls.impls.triton_kda import TileConfig, TritonKDA, choose_config, compile_kernel, table_key, tile_shape  # noqa: E402

# Two sweeps' times of an entry closer than this leave its state order as the tune CSVs say: the
# run-to-run spread of our kernel's rows is within 1% (results/h200/published/run_to_run.md).
STATE_ORDER_MARGIN = 0.01
# A run over the table replaces an entry only where its best beats the tabled config by more than
# this fraction of its time, by batch size (over_table_margin): our kernel's rows moved up to 1.74% from
# run to run over three runs of the published preset (results/h200/published/run_to_run.md); over four
# same-box runs of the targets preset, up to 2.2% at B = 16 and 64 and 0.24% at B = 256
# (results/h200/aa-settled/run_to_run.md), where the table would otherwise leave wins of 1-2% behind.
OVER_TABLE_MARGIN = 0.02
OVER_TABLE_MARGIN_FROM_B256 = 0.01
VALUE_HEADS = (16, 32, 64)
HEAD_DIMS = ((128, 128), (64, 64), (128, 256))
BATCHES = (1, 16, 64, 256)
STATE_DTYPES = (torch.bfloat16, torch.float32)
PADDED_SLOT = 64  # elements of padding per slot for the padding-cost timing
TABLE_PATH = Path(__file__).resolve().parents[1] / "kda_impls" / "impls" / "triton_tuning.py"
# Per candidate: three placements sharing 0.12 s of sampling (many configs to time), none added
# (the candidates of a shape are compared within one run), no call time.
METHOD = Method(kernel=Budget(min_samples=12, max_seconds=0.12, rel_ci=0.01), call=None, extra_placements=0)
PLACEMENTS = 3
PADDED_SOURCE = "best, padded pool"
COLUMNS = ["state_dtype", "HV", "K", "V", "B", "T", "slot_pad", "config", "source", "status", "us", "us_placement_min",
           "us_placement_max", "bytes", "GBps", "pct_copy", "floor_us", "method", "samples", "regs", "spills", "best"]


def candidate_configs(K: int, V: int, element_size: int, B: int, T: int = 1) -> list[TileConfig]:
    """A small set that brackets the design point: tiles of 1-16 KiB of state, 32 to 256 bytes of
    state per thread (32 only for small batches, which need many programs to fill the SMs; the
    first H200 run showed large batches gaining from more bytes per thread: more of the state in
    flight per register), and one head group whose loads are pipelined (``heads`` = 2). One-token
    steps also try the persistent form on 1-4 KiB tiles at 64 bytes per thread (the next tile's
    loads in flight: twice the state in registers, so small tiles only) with 4 to 16 programs per
    SM, and sub-tiles (1-4 KiB tiles, 2 to 16 of them per program: the gate and norms once per
    program, the next tile's load in flight); the plain tiles of one-token steps also with the head counts
    compiled in (``const_heads``), and with the state loaded before the small inputs
    (``state_first=1``, the order sub-tiles brought), and each of those one-tile configs with the
    stored tile widened twice (``rewiden=1``: fewer registers, more instructions), and the state read
    by TMA (``tma=1``, 1-4 KiB tiles: one program per tile, or 8 programs per SM pipelined four deep;
    slower on the H200 at every bf16 point, level at fp32 B = 256: docs/perf-notes.md). Multi-token steps
    carry the tile through T tokens, so their set leans to small tiles."""
    per_thread = (32, 64, 128) if B <= 16 or T > 1 else (64, 128, 256)
    tiles = (1024, 2048, 4096, 8192) if T > 1 else (2048, 4096, 8192, 16384)
    configs = []
    for tile in tiles:
        for bytes_per_thread in per_thread:
            BV, num_warps = tile_shape(K, V, element_size, tile, bytes_per_thread)
            configs.append(TileConfig(BV=BV, num_warps=num_warps))
    BV, num_warps = tile_shape(K, V, element_size, 8192)
    configs.append(TileConfig(BV=BV, heads=2, num_warps=num_warps, num_stages=2))
    if T == 1:
        # the same tiles with the head counts compiled in: a shorter path to the first load, more
        # registers on some tiles (bf16 K=V=64, 32 rows: 96 -> 125)
        configs += [replace(config, const_heads=1) for config in configs]
        # the state loaded first: faster for the 16-row bf16 tiles at K=V=128, slower for the 32-row
        # ones at K=V=64 (7-11%, the same registers; docs/perf-notes.md)
        configs += [replace(config, state_first=1) for config in configs if config.heads == 1 and not config.const_heads]
        # the reductions and the update each widening the stored tile: fewer registers for some
        # tiles (bf16 K=V=128, 16 rows: 128 -> 96; fp32, 32 rows: 206 -> 139), more instructions
        configs += [replace(config, rewiden=1) for config in configs if config.heads == 1 and not config.const_heads]
        for tile in (1024, 2048, 4096):
            BV, num_warps = tile_shape(K, V, element_size, tile)
            configs += [TileConfig(BV=BV, num_warps=num_warps, programs_per_sm=n) for n in (4, 8, 16)]
        for tile in (1024, 2048, 4096):  # the state read by TMA into shared memory
            BV, num_warps = tile_shape(K, V, element_size, tile)
            configs += [TileConfig(BV=BV, num_warps=num_warps, tma=1),
                        TileConfig(BV=BV, num_warps=num_warps, programs_per_sm=8, num_stages=4, tma=1)]
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
    table_out = args.out.with_name("triton_tuning.py")
    table_out.write_text(render_table(rows, meta))
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
    configs = {c.fitted(HV, V, T): "candidate" for c in candidates}
    tabled = tabled.fitted(HV, V, T)
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
        compiled = compile_kernel(*_compile_args(cfg, device), config)
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
    # By source: runs up to commit 49f0bc3 recorded the padded rows with the best row's slot_pad (0).
    padded = {key_of(r): r for r in rows if r["source"] == PADDED_SOURCE and r.get("us") not in (None, "")}
    print(f"\n{'state':8} {'HV':>3} {'K':>4} {'V':>4} {'B':>4} {'T':>2}  {'best config':58} {'us':>8} {'GB/s':>6} "
          f"{'%copy':>6} {'floor us':>8} {'pad' + str(PADDED_SLOT) + ' us':>9} {'pad cost':>8}")
    for key in sorted(best, key=lambda k: (k[5], k[0], k[2], k[3], k[1], k[4])):
        r, p = best[key], padded.get(key)
        us = float(r["us"])
        pad = f"{float(p['us']):9.2f} {100 * (float(p['us']) / us - 1):+7.1f}%" if p else f"{'-':>9} {'-':>8}"
        print(f"{r['state_dtype']:8} {r['HV']:>3} {r['K']:>4} {r['V']:>4} {r['B']:>4} {key[5]:>2}  {r['config']:58} {us:8.2f} "
              f"{float(r['GBps']):6.0f} {float(r['pct_copy']):5.1f}% {float(r['floor_us']):8.2f} {pad}")


def key_of(row: dict) -> tuple:
    """The table key of a row; rows of runs before the T column are one-token rows."""
    return (row["state_dtype"], int(row["HV"]), int(row["K"]), int(row["V"]), int(row["B"]), int(row.get("T") or 1))


def provenance_of(meta: dict | None) -> str:
    if not meta:
        return "measured by scripts/triton_tune.py (no metadata file beside the CSV)"
    # "utc" in the environment record; runs before it had "started"
    started = meta.get("utc", meta.get("started"))
    kernel = f" (its kernel: {meta['measured_with']})" if meta.get("measured_with") else ""
    return (f"measured on {meta['gpu']} (torch {meta['torch']}, triton {meta['triton']}) by "
            f"scripts/triton_tune.py, started {started}{kernel}; in-run copy {float(meta['copy_GBps']):.0f} GB/s")


def fitted_config(row: dict, measured_with: str = "") -> TileConfig:
    """The config of a CSV row as the kernel runs it on the row's shape; ``measured_with``: the
    fields (``"state_first=1"``) of the kernel the run measured that its rows do not name."""
    HV, V, T = int(row["HV"]), int(row["V"]), int(row.get("T") or 1)  # rows from before the T column: T = 1
    base = TileConfig.parse(measured_with, TileConfig(BV=V), source="--write-table")
    return TileConfig.parse(row["config"], base).fitted(HV, V, T)


def render_table(rows: list[dict], meta: dict | list | None, state_order: dict | None = None) -> str:
    """The source of kda_impls/impls/triton_tuning.py from measured rows (the best per shape);
    ``meta``: the environment record of the run, or a list of them (one per CSV); ``state_order``:
    per table key, (us as the table ran it, us with the state loaded first) from two sweeps
    (:func:`state_order_times`), which set the entry's ``state_first`` where they differ by more
    than STATE_ORDER_MARGIN, unless the entry comes from a run over the table (``over_table`` in the
    row: it timed the kernel as it is, state order included)."""
    metas = meta if isinstance(meta, list) else [meta]
    provenance = "; ".join(dict.fromkeys(provenance_of(m) for m in metas))
    best = {key_of(r): r for r in rows if r.get("best") in (True, "True")}
    # Each entry as it runs: every field named, fitted to its shape (a field a run's CSV predates
    # takes the default, or what the run's path says its kernel did: ``measured_with``)
    entries = {}
    for k, row in best.items():
        config = fitted_config(row, row.get("measured_with", ""))
        comment = f"{float(row['us']):.2f} us, {float(row['pct_copy']):.0f}% of copy"
        table_us, first_us = (state_order or {}).get(k, (None, None))
        if row.get("over_table"):
            table_us = None
        # an entry that loads its state first already ran the same code in both sweeps
        if table_us and not config.state_first and abs(first_us / table_us - 1) > STATE_ORDER_MARGIN:
            config = replace(config, state_first=int(first_us < table_us))
            comment += f"; state order by sweeps: {first_us:.2f} us first, {table_us:.2f} us as tabled"
        entries[table_key(getattr(torch, k[0]), *k[1:])] = (str(config), comment)
    return table_source(provenance, entries)


def state_order_times(tabled_dir: Path, first_dir: Path) -> dict:
    """Per table key (one token, unpadded pool): the kernel time of our kernel in a sweep of the table
    as it was, and in one with every entry's state loaded first (``KDA_TRITON_CONFIG=state_first=1``;
    scripts/h200_run.sh state-order makes both)."""
    times = []
    for path in (tabled_dir, first_dir):
        ok = load_sweep(path).ok
        ok = ok[(ok.impl == "triton") & (ok.slot_pad == 0) & (ok["T"] == 1)]
        times.append({(r.state_dtype, int(r.HV), int(r.K), int(r.V), int(r.B), 1): float(r.kernel_us_mean)
                      for r in ok.itertuples()})
    return {key: (times[0][key], times[1][key]) for key in times[0].keys() & times[1].keys()}


def table_source(provenance: str, entries: dict) -> str:
    """``entries``: ``{table key: (config string, comment or None)}``."""
    lines = [
        '"""Tile configs of the Triton KDA decode kernel by (state dtype, HV, K, V, B, T); see',
        "kda_impls.impls.triton_kda.choose_config (nearest tabled T, then B; fp16 state uses the bfloat16 rows).",
        "",
        "Generated by scripts/triton_tune.py; regenerate rather than edit:",
        "    python3 scripts/triton_tune.py --write-table <triton_tune.csv>",
        '"""',
        "",
        f"PROVENANCE = {provenance!r}",
        "",
        "TABLE = {",
    ]
    for key in sorted(entries, key=lambda k: (k[5], k[0], k[2], k[3], k[1], k[4])):
        config, comment = entries[key]
        lines.append(f"    {key!r}: {config!r},{'  # ' + comment if comment else ''}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def over_table_margin(B: int) -> float:
    """What a variant must beat the tabled config by, as a fraction of its time, at batch size ``B``."""
    return OVER_TABLE_MARGIN_FROM_B256 if B >= 256 else OVER_TABLE_MARGIN


def keep_tabled_unless_faster(rows: list[dict]) -> list[dict]:
    """One run's rows with each shape's best moved back to the tabled config (the row whose source
    starts with "table") unless the best beats it by more than :func:`over_table_margin` of its time:
    a candidate that wins by less than the run-to-run spread is noise, and the table keeps what it has."""
    for key in {key_of(r) for r in rows}:
        shape = [r for r in rows
                 if key_of(r) == key and r.get("source") != PADDED_SOURCE and r.get("us") not in (None, "")]
        best = [r for r in shape if r.get("best") in (True, "True")]
        tabled = [r for r in shape if str(r.get("source", "")).startswith("table")]
        if not (best and tabled):
            continue
        if float(best[0]["us"]) > float(tabled[0]["us"]) * (1 - over_table_margin(int(tabled[0]["B"]))):
            best[0]["best"], tabled[0]["best"] = "False", "True"
    return rows


def read_rows(csv_path: Path | str) -> list[dict]:
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


def over_table_report(rows: list[dict], source: str) -> str:
    """A run over the table (``--over-table``), shape by shape: the tabled config's time, the fastest
    variant's, their ratio (below 1: the variant is faster) and the fields the variant changes; then
    the ratios' range per state dtype and head dims, and how many variants beat the table by more
    than :func:`over_table_margin` (what ``--over-table-runs`` takes into the table)."""
    lines = []
    for key in sorted({key_of(r) for r in rows}):
        shape = [r for r in rows if key_of(r) == key and r.get("source") != PADDED_SOURCE and r.get("status") == "ok"]
        tabled = [r for r in shape if str(r["source"]).startswith("table")]
        variants = [r for r in shape if r["source"] == "candidate"]
        if not (tabled and variants):
            continue
        best = min(variants, key=lambda r: float(r["us"]))
        table_config, best_config = (TileConfig.parse(r["config"], TileConfig(BV=key[3])) for r in (tabled[0], best))
        changed = ",".join(f"{f.name}={getattr(best_config, f.name)}" for f in fields(TileConfig)
                           if getattr(best_config, f.name) != getattr(table_config, f.name))
        lines.append(dict(zip(("state_dtype", "HV", "K", "V", "B", "T"), key), table_us=float(tabled[0]["us"]),
                          best_us=float(best["us"]), ratio=float(best["us"]) / float(tabled[0]["us"]),
                          best_pct_copy=float(best["pct_copy"]), best_changes=changed or "(the tabled config)"))
    if not lines:
        return f"# {source} over the table\n\nNo shape has both the tabled config and a variant timed.\n"
    shapes = pd.DataFrame(lines)
    shapes["past"] = shapes.ratio < 1 - shapes.B.astype(int).map(over_table_margin)
    ranges = shapes.groupby(["state_dtype", "K", "V"]).agg(
        shapes=("ratio", "size"), ratio_min=("ratio", "min"), ratio_max=("ratio", "max"),
        past_margin=("past", "sum")).reset_index()
    shapes = shapes.drop(columns="past")
    return (f"# {source} over the table\n\nPer shape, the fastest variant against the tabled config timed in the same "
            f"run (`ratio` = best_us / table_us; `best_changes`: the fields it sets otherwise). By state dtype and "
            f"head dims, the ratios' range and how many beat the table by more than the margin "
            f"({OVER_TABLE_MARGIN:.0%}, {OVER_TABLE_MARGIN_FROM_B256:.0%} from B = 256; `past_margin`):\n\n"
            f"{ranges.to_markdown(index=False, floatfmt='.3f')}\n\n"
            f"{shapes.to_markdown(index=False, floatfmt='.3f')}\n")


def write_over_table_report(csv_path: Path) -> Path:
    """``over_table.md`` beside a run's CSV, from its rows."""
    out = Path(csv_path).with_name("over_table.md")
    out.write_text(over_table_report(read_rows(csv_path), str(csv_path)))
    return out


def write_table(csv_paths: list[Path | str], into: Path, state_order: tuple[Path, Path] | None = None,
                over_table_runs: list[Path | str] = ()) -> int:
    """The table from the CSVs (``PATH`` or ``PATH:FIELD=VALUE,...``, the fields of the kernel that
    run measured where its rows do not name them), the best row of a later CSV replacing an earlier's;
    with ``state_order`` (two sweep directories), each entry's state order by :func:`state_order_times`;
    then the ``over_table_runs`` (``--over-table`` runs, in order), each replacing an entry only where
    its best beats the tabled config it timed by more than :func:`over_table_margin`."""
    rows, metas = [], []
    for spec in map(str, [*csv_paths, *over_table_runs]):
        path, _, measured_with = spec.partition(":")
        csv_path = Path(path)
        run = [row | {"measured_with": measured_with} for row in read_rows(csv_path)]
        if spec in map(str, over_table_runs):
            run = [row | {"over_table": True} for row in keep_tabled_unless_faster(run)]
        rows += run
        meta_path = csv_path.with_suffix(".json")
        metas.append(json.loads(meta_path.read_text()) | {"measured_with": measured_with}
                     if meta_path.exists() else None)
    if not any(r.get("best") == "True" for r in rows):
        print(f"{', '.join(map(str, csv_paths))}: no measured best config in it; table left as it was")
        return 1
    into.write_text(render_table(rows, metas, state_order_times(*state_order) if state_order else None))
    print(f"wrote {into} from {', '.join(map(str, [*csv_paths, *over_table_runs]))}")
    if state_order:
        ordered = [line for line in into.read_text().splitlines() if "state order by sweeps" in line]
        first = sum(re.search(r"state_first=1\b", line) is not None for line in ordered)
        print(f"state order by the sweeps: {first} entries load the state first, {len(ordered) - first} after the "
              f"small inputs")
    return 0


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
                        help="regenerate kda_impls/impls/triton_tuning.py from measured CSVs and exit (FIELD=VALUE: "
                             "what the run's kernel did where its rows name no such field)")
    parser.add_argument("--over-table-runs", nargs="+", default=[], metavar="CSV",
                        help="with --write-table: CSVs of --over-table runs, applied last: each replaces an entry "
                             "only where its best beats the tabled config by more than 2%% (the run-to-run spread), "
                             "and the state-order sweeps do not apply to those entries")
    parser.add_argument("--state-order", nargs=2, type=Path, metavar=("TABLED", "FIRST"),
                        help="with --write-table: two sweep directories of our kernel, the table as it ran and "
                             "every entry with its state loaded first; each entry takes the faster order where they "
                             f"differ by more than {STATE_ORDER_MARGIN * 100:.0f}%%")
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
    if (args.state_order or args.over_table_runs) and not args.write_table:
        parser.error("--state-order and --over-table-runs go with --write-table")
    if args.write_table:
        return write_table(args.write_table, TABLE_PATH, args.state_order, args.over_table_runs)
    if not torch.cuda.is_available():
        print("measuring needs a CUDA GPU; none is available (--write-table needs none)")
        return 2
    if os.environ.get("KDA_TRITON_CONFIG"):
        print("note: KDA_TRITON_CONFIG is set; the candidates here are forced per config and ignore it")
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
