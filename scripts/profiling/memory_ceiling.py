"""What the memory system gives a KDA decode step's state traffic without its math: the copy
bandwidth our kernel's targets are judged against, taken apart step by step.

    python3 -m scripts.profiling.memory_ceiling --out $OUT/memory-ceiling          # bf16 HV=32 K=V=128 B=64,256
    python3 -m scripts.profiling.memory_ceiling --HV 64 --state-dtype float32 --B 256 --placements 5
    python3 -m scripts.profiling.memory_ceiling --HV 16 --D 64 --entry previous-step   # the L2 as the sweeps leave it

For each batch size and each of ``--placements`` fresh pools (new allocations, each at a new
address: the earlier pools stay allocated), each kernel variant's per-call time is the median over
``--replays`` replays of a CUDA graph of ``--calls`` back-to-back calls (the host's launch gaps are
left out, as in the harness); the two copies are timed eagerly (the median of ``--calls`` calls), as
the roofline times its copy. ``--entry`` says what the L2 holds when a call starts:

- ``back-to-back`` (default): every call on the placement's one pool. Where the pool is many times
  the L2 each call finds most of it cold; where it is not (small B, K = V = 64), the L2 serves much
  of it and the figures say what the L2 gives (over 100% of the copy); at B = 1 they are latencies.
- ``previous-step``: the sweeps' entry state (``kda_impls.bench.timing.rotation_inputs``): each
  placement is a set of copies of its inputs adding up to three L2s, each call on the next, so a
  call finds its own pool cold and the L2 full of the other sets' dirty lines. The calls per graph
  (and per copy) are rounded up to a whole number of turns over the sets. This is the ceiling the
  sweeps' bandwidth figures are read against at every size.

The variants are interleaved within a placement:

- ``copy-1GiB``: the roofline's copy (1 GiB out of place, read + write counted), the denominator
  of every "% of copy" the suite reports;
- ``copy-state``: an out-of-place torch copy of the live state bytes (the step's size);
- ``inplace-state``: an in-place torch elementwise op on the same bytes (each read and written
  back at one address, as the step does);
- ``tiles``: a Triton kernel with our kernel's grid (one program per ``[BV, K]`` tile, the V-tile
  fastest, then the head, then the row) reading each tile and writing it back unchanged, no math,
  the tile's row taken from the program id;
- ``tiles-slots``: the same, each program first loading its row's slot (our kernel's dependent
  load chain, without its math);
- ``tiles-sorted-slots``: the same through the slots sorted ascending (the same amount of state,
  rows in address order: whether the slot load's latency costs, or the order it scatters rows in);
- ``tiles-slots-x4``: the same with four times the rows per program on four times the warps (the
  same bytes per thread, a quarter of the programs);
- ``head-slots``: one program per (row, head) walking its tiles, the next tile's load issued before
  this one's store (one slot load per head: the chain paid once per head, not per tile);
- ``kda``: our kernel on the same pool, its table config;
- each of ``--impls``: that implementation of the registry on the same pool, timed as ours is.

Bytes are the live state read and written (``2 B HV V K`` elements) for all but the copy and
the implementations (every input and the output too, ``DecodeInputs.nbytes``). If ``tiles-slots``
reaches what
``kda`` does, the math is not what stands between the kernel and the copy; if ``inplace-state``
falls short of ``copy-state``, writing back where one read is what costs. The spread over
placements of each variant says whether placement sensitivity belongs to the traffic pattern or
to the kernel. Writes ``ceiling.csv``, ``ceiling.md`` and ``meta.json`` into ``--out``;
``--report-only`` writes ``ceiling.md`` again from the other two, on any machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
import triton
import triton.language as tl

from kda_impls import get, make_inputs
from kda_impls.bench.l2 import rotation_inputs
from kda_impls.bench.results import environment
from kda_impls.bench.roofline import GPU_COPY_BYTES, copy_bandwidth, median_copy_seconds
from kda_impls.bench.timing import timed_runs
from kda_impls.impls.triton.gate import _program_tile
from kda_impls.impls.triton.kernel import TritonKDA

WARMUP = 3
# What each step of the traffic costs, in points of the copy: (the variant without the step, with it)
STEPS = {"slots": ("tiles", "tiles-slots"),  # each row's state through its slot
         "order": ("tiles-sorted-slots", "tiles-slots"),  # of that, the slots' scattered order
         "math": ("tiles-slots", "kda"),  # our kernel's math, on the same traffic
         "x4": ("tiles-slots", "tiles-slots-x4"),  # four times the rows per program
         "head": ("tiles-slots", "head-slots")}  # one program per head
OWN_VARIANTS = ("copy-1GiB", "copy-state", "inplace-state", "tiles", "tiles-slots", "tiles-sorted-slots",
                "tiles-slots-x4", "head-slots", "kda")


@triton.jit
def _tile_roundtrip_kernel(state_ptr, slots_ptr, slot_stride, flip, HV: tl.constexpr, K: tl.constexpr,
                           V: tl.constexpr, BV: tl.constexpr, SUBTILES: tl.constexpr, THROUGH_SLOTS: tl.constexpr):
    """Read ``SUBTILES`` consecutive ``[BV, K]`` tiles of one head of the pool and write each back
    XOR ``flip`` (0: unchanged bits, and a value the compiler cannot know, so the store is not
    dropped as a no-op), the next tile's load issued before this one's store (the look-ahead of the
    KDA kernel's sub-tiles). Program order as in the KDA kernel: the V-tile fastest, then the head,
    then the row. The pool is seen as integers of the state's width, so any state dtype
    round-trips bit for bit."""
    CHUNK: tl.constexpr = BV * SUBTILES
    row_hv, chunk = _program_tile(V // CHUNK)  # the KDA kernel's own mapping
    row = row_hv // HV
    hv = row_hv % HV
    if THROUGH_SLOTS:
        slot = tl.load(slots_ptr + row).to(tl.int64)
    else:
        slot = row
    head = (state_ptr + slot * slot_stride + hv * (V * K) + (chunk * CHUNK + tl.arange(0, BV))[:, None] * K
            + tl.arange(0, K)[None, :])
    ahead = tl.load(head, eviction_policy="evict_first")
    for s in tl.static_range(SUBTILES):
        bits = ahead
        if s + 1 < SUBTILES:
            ahead = tl.load(head + (s + 1) * BV * K, eviction_policy="evict_first")
        tl.store(head + s * BV * K, bits ^ flip.to(bits.dtype), eviction_policy="evict_first")


def tile_roundtrip(inputs, BV: int, num_warps: int, through_slots: bool, subtiles: int = 1, flip: int = 0):
    """A zero-argument launcher of :func:`_tile_roundtrip_kernel` over every live row's state
    (``through_slots``: each row's slot as ``inputs.slots`` says; else rows 0..B-1 of the pool)."""
    bits = inputs.state.view({2: torch.int16, 4: torch.int32}[inputs.state.element_size()])
    grid = (inputs.B * inputs.HV * (inputs.V // (BV * subtiles)),)
    kernel = _tile_roundtrip_kernel[grid]
    args = (bits, inputs.slots, inputs.slot_stride, flip)
    meta = dict(HV=inputs.HV, K=inputs.K, V=inputs.V, BV=BV, SUBTILES=subtiles, THROUGH_SLOTS=through_slots,
                num_warps=num_warps)
    return lambda: kernel(*args, **meta)


def in_slot_order(inputs):
    """The same inputs with the slots sorted ascending: the same state, rows in address order."""
    return replace(inputs, slots=inputs.slots.sort().values)


def variant_launchers(inputs, config, impls: tuple[str, ...] = ()) -> dict:
    """``{variant: (launcher, bytes moved)}`` on one pool, the tile kernels on our kernel's tile
    ``config`` (its ``BV`` and warps); the 1 GiB copy is not among them (:func:`measure` times it)."""
    BV, warps = config.BV, config.num_warps
    rows_x4 = min(4 * BV, inputs.V)
    live = inputs.state[inputs.slots.long()]  # a compact copy of the live rows: what copy/in-place move
    target = torch.empty_like(live)
    state_bytes = 2 * live.numel() * live.element_size()
    return {
        "copy-state": (lambda: target.copy_(live), state_bytes),
        "inplace-state": (lambda: live.mul_(1.0), state_bytes),
        "tiles": (tile_roundtrip(inputs, BV, warps, through_slots=False), state_bytes),
        "tiles-slots": (tile_roundtrip(inputs, BV, warps, through_slots=True), state_bytes),
        # the same slots in ascending order: neighbouring rows' state at neighbouring addresses
        "tiles-sorted-slots": (tile_roundtrip(in_slot_order(inputs), BV, warps, through_slots=True), state_bytes),
        # four times the rows on four times the warps: the same bytes per thread, a quarter of the programs
        "tiles-slots-x4": (tile_roundtrip(inputs, rows_x4, warps * rows_x4 // BV, through_slots=True), state_bytes),
        # one program per (row, head), its tiles walked with the next one's load in flight: one slot load per head
        "head-slots": (tile_roundtrip(inputs, BV, warps, through_slots=True, subtiles=inputs.V // BV), state_bytes),
        "kda": (TritonKDA().bind(inputs), inputs.nbytes()),
    } | {name: (get(name).bind(inputs), inputs.nbytes()) for name in impls if not get(name).unsupported(inputs)}


ENTRIES = ("back-to-back", "previous-step")


def input_sets(first, entry: str, device) -> list:
    """The input sets one placement's calls turn over: ``first`` alone back to back, or the sweeps'
    rotation for ``previous-step``. A step too small to rotate within the sweeps' set limit is
    refused: the sweeps time it after a dirty write instead, which graph replay cannot."""
    if entry == "back-to-back":
        return [first]
    made, sets = rotation_inputs(entry, first, device)
    if made != entry:
        raise SystemExit(f"memory_ceiling: --entry {entry} needs a rotation of input sets, and the sweeps "
                         f"time this step ({first.B} rows) as {made!r} instead")
    return sets


def in_turn(launchers: list):
    """One zero-argument launcher that calls ``launchers`` in turn, one a call."""
    turn = itertools.cycle(launchers)
    return lambda: next(turn)()


def calls_per_turn(requested: int, sets: int) -> int:
    """At least ``requested`` calls, a whole number of turns over ``sets`` input sets."""
    return sets * math.ceil(requested / sets)


def eager_seconds(launch, calls: int, device) -> list[float]:
    """Seconds of each of ``calls`` back-to-back eager calls of ``launch``, after warm-ups."""
    for _ in range(WARMUP):
        launch()
    return timed_runs(launch, calls, device)


def replayed_seconds(launch, calls: int, replays: int, device) -> list[float]:
    """Seconds per call of ``launch``, one figure per replay of a CUDA graph of ``calls`` back-to-back
    calls (after warm-ups, which also compile): the host's launch gaps left out, as the harness does."""
    for _ in range(WARMUP):
        launch()
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        for _ in range(calls):
            launch()
    graph.replay()
    return [seconds / calls for seconds in timed_runs(graph.replay, replays, device)]


def measure(args) -> pd.DataFrame:
    device = torch.device("cuda")
    rows, held = [], []
    for B in args.B:
        for placement in range(args.placements):
            # Fresh inputs each placement; the earlier pools stay allocated, so this one lands elsewhere
            inputs = make_inputs(B, args.HV, args.HV, args.D, args.D, state_dtype=args.state_dtype,
                                 device=device, seed=placement)
            sets = input_sets(inputs, args.entry, device)
            held.append(sets)
            config = TritonKDA().config_for(inputs)
            calls = calls_per_turn(args.calls, len(sets))
            per_set = [variant_launchers(one, config, args.impls) for one in sets]
            # the roofline's copy, again beside each placement; then each variant
            timed = {"copy-1GiB": (median_copy_seconds(GPU_COPY_BYTES, device, args.calls), 2 * GPU_COPY_BYTES)}
            for variant, (_, nbytes) in per_set[0].items():
                launch = in_turn([launchers[variant][0] for launchers in per_set])
                # A captured torch copy becomes a copy-engine node, slower than the copy kernel the eager
                # call runs (2.77 TB/s on the H200): the copies
                # are timed eagerly, as the roofline times its own, and are large enough not to wait on
                # the host
                times = (eager_seconds(launch, calls, device) if variant.startswith("copy")
                         else replayed_seconds(launch, calls, args.replays, device))
                timed[variant] = float(pd.Series(times).median()), nbytes
            rows += [dict(B=B, placement=placement, variant=variant, config=str(config), input_sets=len(sets),
                          bytes=nbytes, us=seconds * 1e6, GBps=nbytes / seconds / 1e9)
                     for variant, (seconds, nbytes) in timed.items()]
            torch.cuda.empty_cache()
            print(f"B={B} placement {placement}: "
                  + ", ".join(f"{r['variant']} {r['GBps']:.0f}" for r in rows
                              if (r["B"], r["placement"]) == (B, placement)),
                  flush=True)
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (B, variant): the median over placements of GB/s, its share of the same placement's
    1 GiB copy, and the placement spread of the time (max / min)."""
    copy = df[df.variant == "copy-1GiB"].set_index(["B", "placement"]).GBps
    df = df.assign(pct_copy=100 * df.GBps / copy.loc[list(zip(df.B, df.placement, strict=True))].to_numpy())
    grouped = df.groupby(["B", "variant"], sort=False)
    return pd.DataFrame({"GBps": grouped.GBps.median(), "pct_copy": grouped.pct_copy.median(),
                         "us": grouped.us.median(), "spread": grouped.us.max() / grouped.us.min(),
                         "placements": grouped.size()}).reset_index()


def step_costs(table: pd.DataFrame) -> pd.DataFrame:
    """Per batch size, from :func:`summary`: each of :data:`STEPS` in points of the copy (positive: the
    step costs), our kernel's time over the math-free tile's through the same slots (us), and our
    kernel's time over each other implementation's (``kda / <impl>``)."""
    pct = table.pivot(index="B", columns="variant", values="pct_copy")
    us = table.pivot(index="B", columns="variant", values="us")
    costs = pd.DataFrame({f"{step} (points)": pct[without] - pct[with_]
                          for step, (without, with_) in STEPS.items()})
    costs["kda - tiles-slots (us)"] = us["kda"] - us["tiles-slots"]
    for impl in (v for v in table.variant.unique() if v not in OWN_VARIANTS):
        costs[f"kda / {impl}"] = us["kda"] / us[impl]
    return costs.reset_index()


def report(df: pd.DataFrame, meta: dict, args) -> str:
    """ceiling.md's text: the run's command and method (from ``args``, the run's own), :func:`summary`
    and :func:`step_costs`."""
    shape = f"HV={args.HV} K=V={args.D} {str(args.state_dtype).removeprefix('torch.')} state"
    table = summary(df)
    costs = step_costs(table).astype({"B": str})  # an integer beside floats would print as one
    if args.entry == "back-to-back":
        calls = (f"a CUDA graph of {args.calls} back-to-back calls (the copies: the median of {args.calls} "
                 f"eager calls), each on the placement's one pool")
    else:
        sets = df.groupby("B").input_sets.first()
        calls = (f"a CUDA graph of at least {args.calls} calls (the copies: the median of as many eager calls), "
                 f"each on the next of the placement's input sets, a whole number of turns over them: the "
                 f"sweeps' `{args.entry}` L2 entry state (sets adding up to at least three L2s: "
                 + ", ".join(f"{n} at B = {B}" for B, n in sets.items()) + ")")
    return (f"# Memory ceiling of the decode step's state traffic ({meta['gpu']}, {shape})\n\n"
            f"`{meta['command']}`; median over {args.placements} placements of each placement's median over "
            f"{args.replays} replays of {calls}; `pct_copy` against the same placement's 1 GiB copy; "
            f"`spread` is max / min of the time over placements.\n\n"
            + table.to_markdown(index=False, floatfmt=".3f") + "\n\n"
            "## What each step costs\n\n"
            "Points of the copy between the variant without a step and with it (positive: the step costs; "
            "`slots`: tiles - tiles-slots; `order`: tiles-sorted-slots - tiles-slots, the part of it the "
            "slots' order makes; `math`: tiles-slots - kda; `x4`, `head`: tiles-slots - the fatter "
            "programs), our kernel's time over the math-free tile's, and over each other implementation "
            "timed with it.\n\n"
            + costs.to_markdown(index=False, floatfmt=".3f") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--HV", type=int, default=32)
    parser.add_argument("--D", type=int, default=128, help="K = V")
    parser.add_argument("--B", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    parser.add_argument("--state-dtype", type=lambda s: getattr(torch, s), default=torch.bfloat16)
    parser.add_argument("--impls", type=lambda s: tuple(filter(None, s.split(","))), default=(),
                        help="implementations of the registry timed beside ours, the same way (e.g. "
                             "flashinfer,flashinfer-loggate-sigmoid); one that cannot run the shape is left out")
    parser.add_argument("--entry", choices=ENTRIES, default="back-to-back",
                        help="what the L2 holds when a call starts (above; default %(default)s)")
    parser.add_argument("--placements", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph")
    parser.add_argument("--replays", type=int, default=7, help="timed replays of each graph")
    parser.add_argument("--report-only", action="store_true",
                        help="no GPU: write --out's ceiling.md again from its ceiling.csv and meta.json")
    args = parser.parse_args()
    if args.report_only:
        meta = json.loads((args.out / "meta.json").read_text())
        run_args = parser.parse_args(shlex.split(meta["command"])[1:])  # the run's own settings
        (args.out / "ceiling.md").write_text(report(pd.read_csv(args.out / "ceiling.csv"), meta, run_args))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    meta = environment(device, args.out, shlex.join(sys.argv)) | {
        "torch": torch.__version__, "triton": triton.__version__, "copy_GBps": copy_bandwidth(device) / 1e9}
    df = measure(args)
    df.to_csv(args.out / "ceiling.csv", index=False)
    text = report(df, meta, args)
    (args.out / "ceiling.md").write_text(text)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(text)
    return 0

if __name__ == "__main__":
    sys.exit(main())
