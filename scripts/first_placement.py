#!/usr/bin/env python3
"""What a row's first placement follows when it runs slower than the others: one configuration's
kernel time taken several times in one process, each time after something else, placements held
as the timing method holds them, and each time's first placement set against the rest.

    python3 scripts/first_placement.py --impl triton --HV 64 --K 128 --state-dtype float32 --B 256

On the H200 the first of 27 placements of our kernel's largest rows ran 8-10% slower than the other
26 in some sweeps (docs/timing.md, "Method 4"), on fresh allocations. In order, in this process: the
row's correctness check then the kernel time (as a sweep row runs them), the kernel time again
straight after, after each idle of ``--idles`` (one second by default), after the check again, and
after allocating and freeing the check's inputs without running anything on them. Each kernel time
hands its held placements back to the driver as it ends, so each idle follows such a hand-back: the
shortest idle after which the first placement runs as fast as the others is what ``--settle``
needs (docs/timing.md, "Method 4"); ``--settle`` has the kernel times settle as a sweep's do.

    python3 scripts/first_placement.py --idles 0.01,0.03,0.1,0.3,1
    python3 scripts/first_placement.py --idles 0 --settle 0.03
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_impls.bench.config import Config, PoolLayout  # noqa: E402
from kda_impls.bench.timing import Budget, as_device, kernel_time  # noqa: E402
from kda_impls.cli import Parser, comma_list, non_negative_float, positive_int, print_and_save  # noqa: E402
from kda_impls.registry import get  # noqa: E402
from kda_impls.verify import verify  # noqa: E402


def conditions(cfg: Config, device, impl, idles) -> dict:
    """What runs before each kernel time, by name, in the order they run."""
    def check():
        verify(impl, cfg.make_inputs(device, 0, timed=False))

    def allocate_only():
        inputs = cfg.make_inputs(device, 0, timed=False)
        del inputs

    idling = {f"after {idle:g} s idle": lambda idle=idle: time.sleep(idle) for idle in idles}
    return {"after the check": check, "straight after": lambda: None, **idling,
            "after the check again": check, "after the check's inputs, unused": allocate_only}


def study(cfg: Config, device, placements: int, budget: Budget, idles, settle_s: float = 0.0) -> pd.DataFrame:
    """One line per condition: each placement's median (us) and the first over the others' median."""
    device = as_device(device)
    impl = get(cfg.impl)
    rows = []
    for name, before in conditions(cfg, device, impl, idles).items():
        before()
        timing = kernel_time(lambda p: cfg.make_inputs(device, 1 + p), impl.bind, device, budget,
                             placements=placements, disjoint=True, settle_s=settle_s)
        medians = [m * 1e6 for m in timing.placement_medians]
        rows.append({"before": name, "first / others": medians[0] / np.median(medians[1:]),
                     "placements (us)": " ".join(f"{m:.2f}" for m in medians)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--B", type=positive_int, default=256)
    parser.add_argument("--HV", type=positive_int, default=64)
    parser.add_argument("--K", type=positive_int, default=128, help="K = V")
    parser.add_argument("--state-dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--placements", type=positive_int, default=6)
    parser.add_argument("--idles", type=comma_list(non_negative_float), default=(1.0,), metavar="S,S,...",
                        help="idle this long after a kernel time's hand-back, each in turn (seconds)")
    parser.add_argument("--settle", type=non_negative_float, default=0.0, metavar="S",
                        help="the kernel times settle as a sweep's do (timing.kernel_time's settle_s; default "
                             "%(default)s: not, to see what the hand-backs do)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args(argv)
    cfg = Config(args.impl, args.B, args.HV, args.HV, args.K, args.K, state_dtype=args.state_dtype,
                 layout=PoolLayout(placements=args.placements))
    budget = Budget(min_samples=10, max_samples=200, max_seconds=0.02 * args.placements)
    table = study(cfg, args.device, args.placements, budget, args.idles, args.settle)
    text = (f"# The first placement of `{cfg.key()}` on {args.device}\n\n"
            + table.to_markdown(index=False, floatfmt=".3f") + "\n")
    return print_and_save(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
