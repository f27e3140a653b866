"""The GPU correctness grid: every implementation against the float64 reference on real shapes, in each mode.

In place (``--modes inplace``): B in {1, 8, 64, 512} x HV in {16, 32, 64} x (K, V) in {(64, 64), (128, 128),
(128, 256)} x slot_pad in {0, 16, 64} x state dtype, H = HV; a GVA slice (H = HV / 4); and multi-token steps
(speculative verify): T in {2, 4, 8} x B in {1, 8, 64} x HV in {16, 32} x K = V in {64, 128} x slot_pad in
{0, 64} x state dtype, the state stored after every token with a random number of accepted tokens per row,
or after the last only. Frozen verify (``frozen``): T in 1..8 x (HV, K = V) in {(16, 64), (32, 128),
(64, 128)} x B in {1, 8, 64} x state dtype, GVA at B = 8, slot_pad 64 at odd T. Replay (``replay``): one-token
steps on rings L in {4, 16}, and speculative verifies with their commits, T in {2, 4, 8} on the ring of 16
from random ring lengths or from empty rings, x the same shapes and batches. Every case is the check a sweep
makes of a row (kda_impls.verify, through the harness's case runner; a verify, which a sweep's Config does not
take, directly): fresh inputs, the output poisoned with NaN, one step against the exact float64 reference,
then several more on the same pool (8 to 16 in place, by shape; L + 1 in replay, every ring flushing once)
against the reference that stores the state as the pool does, untouched slots and padding bit for bit
(frozen verify: one step, nothing stored). Rows with slot -1 are included (B // 8 of them). An
implementation refuses a mode or shape it does not support with its reason: such a case is counted
``unsupported`` and its reason printed, not a failure. Writes correctness.csv (err_steps: the stored states'
error after the steps) and meta.json (commit, devices, library versions) under --out. Exits 1 if any case is
wrong or errors.

    python3 -m scripts.gpu.gpu_correctness --out results/h200/grid                  # every implementation but naive
    python3 -m scripts.gpu.gpu_correctness --impls triton,fla --out DIR
    python3 -m scripts.gpu.gpu_correctness --modes frozen,replay --out DIR    # the in-place grid left out
    python3 -m scripts.gpu.gpu_correctness --every 8 --out DIR    # every 8th case: each kind of case, in minutes
"""

from __future__ import annotations

import argparse
import itertools
import platform
import shlex
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from kda_impls import Unsupported, get, make_inputs, names, verify
from kda_impls.bench.case import one_line, run_case, verdict_columns
from kda_impls.bench.config import Config
from kda_impls.bench.results import environment, write_meta

BATCHES = (1, 8, 64, 512)
VALUE_HEADS = (16, 32, 64)
HEAD_DIMS = ((64, 64), (128, 128), (128, 256))
SLOT_PADS = (0, 16, 64)
STATE_DTYPES = ("bfloat16", "float32")


MODES = ("inplace", "frozen", "replay")
MODE_SHAPES = ((16, 64), (32, 128), (64, 128))  # frozen verify's and replay's (HV, K = V)
RINGS = (4, 16)
VERIFY_TOKENS = (2, 4, 8)  # replay's speculative verify, on the larger ring
# a verify's rings: random lengths (records cached, flushes first), or every ring empty (a verify from the
# checkpoint alone, as FlashInfer's RecoverSSM call takes it)
RING_STARTS = ("random", "empty")


def grid(modes=MODES):
    """The cases of ``modes``, each a dict of Config fields (the shape, and the mode where not in place); a
    replay verify's also its ``rings`` (it is checked outside Config: :func:`check_case`)."""
    if "inplace" in modes:
        yield from _inplace()
    if "frozen" in modes:
        for dtype, T, (HV, D), B in itertools.product(STATE_DTYPES, range(1, 9), MODE_SHAPES, (1, 8, 64)):
            yield dict(B=B, H=HV // 4 if B == 8 else HV, HV=HV, K=D, V=D, slot_pad=64 if T % 2 else 0,
                       state_dtype=dtype, T=T, mode="frozen")
    if "replay" in modes:
        for dtype, L, (HV, D), B in itertools.product(STATE_DTYPES, RINGS, MODE_SHAPES, (1, 8, 64)):
            yield dict(B=B, H=HV // 4 if B == 8 else HV, HV=HV, K=D, V=D, slot_pad=16 if B == 64 else 0,
                       state_dtype=dtype, mode="replay", ring=L)
        for dtype, rings, T, (HV, D), B in itertools.product(STATE_DTYPES, RING_STARTS, VERIFY_TOKENS, MODE_SHAPES,
                                                             (1, 8, 64)):
            yield dict(B=B, H=HV // 4 if B == 8 else HV, HV=HV, K=D, V=D, slot_pad=16 if B == 64 else 0,
                       state_dtype=dtype, mode="replay", ring=max(RINGS), T=T, rings=rings)


def _inplace():
    for dtype, (K, V), HV, B, pad in itertools.product(STATE_DTYPES, HEAD_DIMS, VALUE_HEADS, BATCHES, SLOT_PADS):
        yield dict(B=B, H=HV, HV=HV, K=K, V=V, slot_pad=pad, state_dtype=dtype)
    for dtype, (K, V), HV, B in itertools.product(STATE_DTYPES, HEAD_DIMS, VALUE_HEADS, (8, 64)):
        yield dict(B=B, H=HV // 4, HV=HV, K=K, V=V, slot_pad=16, state_dtype=dtype)
    for dtype, T, D, HV, B, pad in itertools.product(STATE_DTYPES, (2, 4, 8), (64, 128), (16, 32), (1, 8, 64), (0, 64)):
        yield dict(B=B, H=HV, HV=HV, K=D, V=D, slot_pad=pad, state_dtype=dtype, T=T,
                   checkpoints="last" if T == 4 and pad else "all")


def check_case(impl: str, case: dict, device: str) -> dict:
    """One case through the harness's case runner (correctness only): fresh inputs, a pool of 2B
    slots, B // 8 rows with slot -1."""
    if "rings" in case:
        return _check_verify(impl, case, device)
    cfg = Config(impl, **case, pad_rows=case["B"] // 8)
    row = run_case(cfg, device)
    return {"impl": impl, **cfg.columns(), "status": row["status"], "err_out": row["err_out"],
            "err_state": row["err_state"], "err_steps": row["err_steps"], "steps": row["steps"],
            "detail": row["reason"]}


def _check_verify(impl: str, case: dict, device: str) -> dict:
    """A replay verify (T > 1), which a sweep's Config does not take (it times one-token replay steps): the
    case runner's check, on ``make_inputs(ring=L)`` (a pool of 2B slots, B // 8 rows with slot -1), its
    rings emptied where the case says so."""
    dims = {name: case[name] for name in ("B", "H", "HV", "K", "V", "T", "slot_pad")}
    row = {"impl": impl, **case, "pad_rows": case["B"] // 8, "checkpoints": "all"}
    try:
        x = make_inputs(**dims, ring=case["ring"], state_dtype=getattr(torch, case["state_dtype"]),
                        pad_rows=row["pad_rows"], device=device)
        if case["rings"] == "empty":
            x.cache.length.zero_()
        implementation = get(impl)
        reason = implementation.unsupported(x)
        columns = {"status": "unsupported", "reason": reason} if reason else verdict_columns(verify(implementation, x))
    except (ImportError, Unsupported) as exc:
        columns = {"status": "unsupported", "reason": one_line(exc)}
    except Exception as exc:  # as the case runner: a ContractError, a failed launch
        columns = {"status": "error", "reason": one_line(exc)}
    return row | {name: columns.get(name) for name in ("status", "err_out", "err_state", "err_steps", "steps")} | {
        "detail": columns["reason"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", default=",".join(n for n in names() if n != "naive"))
    parser.add_argument("--out", type=Path, required=True, help="directory for correctness.csv and meta.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated modes whose cases run (default every one: {','.join(MODES)})")
    parser.add_argument("--every", type=int, default=1,
                        help="check every Nth case of the grid only (its order interleaves the kinds of case)")
    args = parser.parse_args(argv)

    impls, modes = args.impls.split(","), args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes must name modes among {', '.join(MODES)}; got {', '.join(unknown)}")
    cases = list(grid(modes))[::args.every]
    rows, started = [], time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = environment(torch.device(args.device), args.out, shlex.join(sys.argv))
    versions = {"python": platform.python_version()}
    for impl in impls:
        for case in tqdm(cases, desc=impl, mininterval=2.0):
            rows.append(check_case(impl, case, args.device))
            torch.cuda.empty_cache()
        versions |= get(impl).versions()
        # after each implementation, so that a run cut short keeps what it checked
        table = pd.DataFrame(rows)
        table.to_csv(args.out / "correctness.csv", index=False)
        write_meta(args.out, meta | {"versions": versions, "impls_done": impls[:impls.index(impl) + 1],
                                     "wall_s": round(time.perf_counter() - started, 1)})

    summary = table.pivot_table(index=["impl", "mode"], columns="status", values="B", aggfunc="count",
                                fill_value=0)
    print(summary.to_string())
    refused = table[table.status == "unsupported"].groupby(["impl", "mode", "detail"]).size()
    if len(refused):
        print("refused, with the implementation's reason (cases):\n" + refused.to_string())
    worst = table[table.status == "ok"].groupby(["impl", "mode", "state_dtype"])[["err_out", "err_state",
                                                                                  "err_steps"]].max()
    print("worst relative error among ok cases:\n" + worst.to_string(float_format="{:.2e}".format))
    bad = table[table.status.isin(["wrong", "error"])]
    if len(bad):
        print(bad.head(20).to_string())
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
