"""``kda-merge``: the directories of one sweep's shards (``kda-sweep --shard i/n``, same settings and
GPU) joined into one, which is refused where any of them, the target included, was measured otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..cli import Parser, UsageError, writable_dir
from .driver import differences
from .results import assemble, read_meta, read_rows, write_meta, write_row


def main(argv: list[str] | None = None) -> None:
    """``kda-merge OUT DIR...``: join sweep directories of one sweep's shards (same settings, same
    GPU) into OUT, which may be one of them or a directory of the same settings."""
    p = Parser(prog="kda-merge", description=main.__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the merged directory (created if missing)")
    p.add_argument("dirs", type=Path, nargs="+", help="sweep directories to join")
    args = p.parse_args(argv)
    metas = []
    for directory in args.dirs:
        meta = read_meta(directory)
        if not meta:
            p.error(f"{directory}: no meta.json: not a sweep directory")
        metas.append(meta)
    first = metas[0]
    target = read_meta(args.out) if args.out.is_dir() else {}
    others = [*zip(args.dirs[1:], metas[1:], strict=True), *([(args.out, target)] if target else [])]
    for directory, meta in others:
        if meta.get("settings") != first.get("settings") or meta.get("gpu") != first.get("gpu"):
            changes = differences({"gpu": first.get("gpu"), **first.get("settings", {})},
                                  {"gpu": meta.get("gpu"), **meta.get("settings", {})})
            p.error(f"{directory} was measured otherwise than {args.dirs[0]} ({'; '.join(changes)}); "
                    f"nothing was changed: merge into a new directory")
    if target and args.out.resolve() not in {d.resolve() for d in args.dirs}:
        metas.append(target)  # its rows and runs are kept beside the shards'
        args.dirs.append(args.out)
    rows = {}
    for directory in args.dirs:
        for row in read_rows(directory):
            if row["key"] in rows and row["status"] != "crashed" and rows[row["key"]]["status"] != "crashed":
                p.error(f"{row['key']} is in two of the directories; shards of one sweep do not overlap")
            if row["key"] not in rows or rows[row["key"]]["status"] == "crashed":
                rows[row["key"]] = row
    try:
        writable_dir(args.out, "OUT")
    except UsageError as exc:
        p.error(str(exc))
    for row in rows.values():
        write_row(args.out, row)
    merged = dict(first)
    for meta in metas[1:]:
        merged["copy_bandwidth_by_device"] = merged.get("copy_bandwidth_by_device", {}) | meta.get(
            "copy_bandwidth_by_device", {})
        merged["impls"] = merged.get("impls", {}) | meta.get("impls", {})
        merged["versions"] = merged.get("versions", {}) | meta.get("versions", {})
        merged["presets"] = sorted(set(merged.get("presets", [])) | set(meta.get("presets", [])))
    merged["runs"] = [run for meta in metas for run in meta.get("runs", [])]
    merged["copy_bandwidth_Bps"] = float(np.median(list(merged.get("copy_bandwidth_by_device", {}).values())))
    merged["merged_from"] = [str(d) for d in args.dirs]
    write_meta(args.out, merged)
    assemble(args.out)
    print(f"{len(rows)} rows from {len(args.dirs)} directories in {args.out}")
