#!/usr/bin/env python3
"""How much of a row's placement spread is the timer's own: a row's medians over N fresh placements,
as a sweep times a large row, against N medians re-timed on one placement's memory (an A/A: the
memory does not change between them) and N more on it with the rows' slots shuffled among them
before each (what a fresh placement changes besides the memory: its inputs draw another slot
order), each with the share of the kernel budget a sweep gives one placement.

    python3 scripts/placement_noise.py --rows bfloat16:32:128:16,bfloat16:32:128:256 --out DIR

A row is ``STATE_DTYPE:HV:K:B`` (H = HV, V = K). Writes ``placement_noise.csv`` (each median) and
``placement_noise.md``: per row and mode the spread (max / min - 1, issue 13's placement target),
the coefficient of variation, and Levene's test (scipy) of whether the fresh placements' medians
vary more than the repeats on one placement do (``levene_p``), and of whether the reshuffled slots
do (``levene_p_slots``). Where neither does, a spread over the 2% target is the timer's resolution
at that many medians; where only the fresh placements do, it is where the pool landed; where the
reshuffled slots do too, the order the slots scatter the rows in.

The repeats start ``--settle`` seconds after the fresh placements have handed their memory back: in
the first run (``results/h200/placement-noise-537269b/``, no idle) the first repeats of the
largest rows ran slower on the very memory the later ones ran on (docs/timing.md, "Method 4":
the slow first placement follows a large hand-back of memory, not the placement).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_impls.bench.case import Method  # noqa: E402
from kda_impls.bench.config import Config, PoolLayout  # noqa: E402
from kda_impls.bench.results import environment  # noqa: E402
from kda_impls.bench.timing import Budget, _time_placement, as_device, kernel_time, rotation_inputs  # noqa: E402
from kda_impls.cli import Parser, positive_int, print_and_save  # noqa: E402
from kda_impls.registry import get  # noqa: E402

MODES = ("fresh", "same", "reslotted")


def parse_row(text: str) -> tuple[str, int, int, int]:
    try:
        dtype, HV, K, B = text.split(":")
        if dtype not in ("bfloat16", "float32"):
            raise ValueError
        return dtype, int(HV), int(K), int(B)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not STATE_DTYPE:HV:K:B (bfloat16 or float32)") from None


def fresh_medians(cfg: Config, device, n: int, share: Budget, method: Method) -> list[float]:
    """``n`` placements as a sweep times them (fresh allocations behind random spacers, held, the
    method's settling after each hand-back), each with ``share`` of the budget (the budget handed to
    kernel_time is ``share`` times ``n``)."""
    budget = replace(share, min_samples=share.min_samples * n, max_samples=share.max_samples * n,
                     max_seconds=share.max_seconds * n)
    timing = kernel_time(lambda p: cfg.make_inputs(device, 1 + p), get(cfg.impl).bind, device, budget, placements=n,
                         entry=method.entry, seed=method.seed, disjoint=True, settle_s=method.settle_s)
    return list(timing.placement_medians)


def same_medians(cfg: Config, device, n: int, share: Budget, method: Method, reslot: bool = False) -> list[float]:
    """``n`` medians of one placement: its inputs drawn and bound once (with the input sets the
    entry state rotates over), then timed ``n`` times with ``share`` of the budget each; with
    ``reslot`` each time after its rows' slots are shuffled among them in place (the slot order a
    fresh draw changes, on the same memory)."""
    device = as_device(device)
    entry, input_sets = rotation_inputs(method.entry, cfg.make_inputs(device, 1), device)
    launchers = [get(cfg.impl).bind(x) for x in input_sets]
    shuffle = torch.Generator().manual_seed(method.seed)
    medians = []
    for _ in range(n):
        if reslot:
            for x in input_sets:
                x.slots.copy_(x.slots[torch.randperm(len(x.slots), generator=shuffle).to(x.slots.device)])
        medians.append(_time_placement(launchers, device, share, entry).placement_medians[0])
    return medians


def reslotted_medians(cfg: Config, device, n: int, share: Budget, method: Method) -> list[float]:
    return same_medians(cfg, device, n, share, method, reslot=True)


def study(rows, impls, device, n: int, method: Method, settle_s: float = 0.0) -> pd.DataFrame:
    """One line per (impl, row, mode, index): the median (us); ``settle_s`` idle before the repeats.
    Each median gets the kernel budget one placement of a sweep row gets: the method's budget split
    over the layout's placements (an added placement gets the same share: timing.kernel_time)."""
    records = []
    for impl in impls:
        for dtype, HV, K, B in rows:
            cfg = Config(impl, B, HV, HV, K, K, state_dtype=dtype, layout=PoolLayout())
            share = method.kernel.share(cfg.layout.placements)
            for mode, timer in zip(MODES, (fresh_medians, same_medians, reslotted_medians)):
                if mode != "fresh":
                    time.sleep(settle_s)
                for index, median in enumerate(timer(cfg, device, n, share, method)):
                    records.append(dict(impl=impl, state_dtype=dtype, HV=HV, K=K, B=B, mode=mode, index=index,
                                        us=median * 1e6))
    return pd.DataFrame(records)


def summary(medians: pd.DataFrame) -> pd.DataFrame:
    """Per row: each mode's spread (max / min - 1) and coefficient of variation, and Levene's test
    (median-centred) of equal variances, fresh placements and reshuffled slots each against the
    repeats on one placement."""
    lines = []
    for key, row in medians.groupby(["impl", "state_dtype", "HV", "K", "B"], sort=False):
        by_mode = {mode: row[row["mode"] == mode]["us"].to_numpy() for mode in MODES}
        line = dict(zip(["impl", "state_dtype", "HV", "K", "B"], key))
        for mode, us in by_mode.items():
            line[f"{mode}_us"] = float(np.mean(us))
            line[f"{mode}_spread"] = float(us.max() / us.min() - 1)
            line[f"{mode}_cv"] = float(np.std(us, ddof=1) / np.mean(us))
        line["levene_p"] = float(stats.levene(by_mode["fresh"], by_mode["same"], center="median").pvalue)
        line["levene_p_slots"] = float(stats.levene(by_mode["reslotted"], by_mode["same"], center="median").pvalue)
        lines.append(line)
    return pd.DataFrame(lines)


def report(table: pd.DataFrame, n: int, device_name: str, settle_s: float) -> str:
    return (f"# The placement spread against the timer's own ({device_name})\n\n"
            f"Each row timed on {n} fresh placements (`fresh`, as a sweep times a large row) and {n} times on one "
            f"placement's memory (`same`, after {settle_s:g} s idle) and {n} times more on it with the rows' slots "
            f"shuffled among them before each (`reslotted`), each with a sweep placement's share of the "
            f"kernel budget; `spread` = "
            f"max / min - 1 of the medians, `cv` their coefficient of variation, `levene_p` Levene's test of equal "
            f"variances (small: the fresh placements vary more than the timer does), `levene_p_slots` the same for "
            f"the reshuffled slots (small: the slot order alone moves the time).\n\n"
            + table.to_markdown(index=False, floatfmt=".4f") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog=__doc__)
    parser.add_argument("--rows", type=lambda text: [parse_row(r) for r in text.split(",")],
                        default=[parse_row("bfloat16:32:128:16"), parse_row("bfloat16:32:128:256")])
    parser.add_argument("--impls", default="triton", help="registry names, comma-separated")
    parser.add_argument("--placements", type=positive_int, default=27, help="medians per mode (a sweep's large rows: 27)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds idle between the fresh placements' hand-back and the repeats")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True, help="directory for the CSV, the report and meta.json")
    args = parser.parse_args(argv)
    method = Method()
    medians = study(args.rows, args.impls.split(","), args.device, args.placements, method, args.settle)
    args.out.mkdir(parents=True, exist_ok=True)
    medians.to_csv(args.out / "placement_noise.csv", index=False)
    command = shlex.join(["scripts/placement_noise.py", *(sys.argv[1:] if argv is None else argv)])
    env = environment(as_device(args.device), args.out, command)
    (args.out / "meta.json").write_text(json.dumps(env, indent=1, default=str) + "\n")
    return print_and_save(report(summary(medians), args.placements, env["gpu"], args.settle), args.out / "placement_noise.md")


if __name__ == "__main__":
    sys.exit(main())
