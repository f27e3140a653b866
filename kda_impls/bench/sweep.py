"""`kda-sweep`: implementations x configurations (a preset, or axes from the command line) measured
in isolated worker processes on one or several devices, resumable, with a progress bar, a summary
table, the wall time and charts at the end; and :func:`sweep`, the same run from a Python script.

The driver is :mod:`.driver`, the scheduling of rows to devices :mod:`.schedule`, what is printed
:mod:`.report`, ``kda-merge`` :mod:`.merge`. The exit status is 0 when every row is ok or unsupported
(and one is ok), 1 when a row is wrong, error or crashed, 2 for refused input, 130 when interrupted.
``--shard i/n`` measures every n-th configuration so that machines of one kind split a sweep, and
``kda-merge`` joins their directories.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import signal
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from .. import dtypes, registry, repro
from ..cli import (
    Parser,
    UsageError,
    comma_list,
    devices,
    fail,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    writable_dir,
)
from .case import Method
from .config import AXES, CHECKPOINTS, MODES, SLOT_ORDERS, Config, PoolLayout
from .driver import Sweep, settings_of
from .l2 import DEFAULT_ENTRY, ENTRY_STATES
from .merge import main as merge_main
from .presets import PRESETS, Preset, adhoc_configs
from .report import (
    WARN_CPU_ABOVE_S,
    WIDTH,
    dry_run_table,
    duration,
    estimate_seconds,
    lane_summary,
    problems_table,
    replay_speedup_table,
    summary_table,
    verdict,
)
from .timing import PLACEMENT_SPREAD_LIMIT, Budget

__all__ = ["main", "merge_main", "parser", "sweep"]
PROG = "kda-sweep"
INTERRUPTED = 130
# options that do not change which rows are measured nor how: left out of the default directory's name
NOT_SETTINGS = {"out", "no_charts", "dry_run", "fresh", "baseline", "row_timeout", "cooldown", "devices", "preset",
                "repro"}


def _shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not sep or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r} is not i/n with 0 <= i < n (e.g. 0/2 and 1/2)")
    return i, n


def _one_of(choices: tuple[str, ...]):
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def parser() -> Parser:
    p = Parser(prog="kda-sweep", description=__doc__.split("\n\n")[0],
               epilog="Axes take comma-separated values; given with a preset they narrow it, alone they define "
                      "the grid (Kimi-Linear's layer for what is not given: B 1,16,64,256, HV 32, K 128, "
                      "H = HV, V = K). Example: kda-sweep --B 1,16,64 --HV 32,64 --state-dtype bf16,fp32")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="named grid (default: kimi-linear-48b on a GPU; smoke on the CPU, or the axes given)")
    p.add_argument("--impls", type=comma_list(str),
                   help="comma-separated implementations (default: every registered one)")
    axes = p.add_argument_group("axes (comma-separated values)")
    for axis, kind in (("B", positive_int), ("H", positive_int), ("HV", positive_int), ("K", positive_int),
                       ("V", positive_int)):
        axes.add_argument(f"--{axis}", type=comma_list(kind), metavar="N,...")
    axes.add_argument("--state-dtype", type=comma_list(dtypes.full), metavar="DTYPE,...",
                      help="bf16, fp16, fp32 (or torch's names)")
    axes.add_argument("--slot-pad", type=comma_list(non_negative_int), metavar="N,...",
                      help="elements of padding after each state slot")
    axes.add_argument("--pad-rows", type=comma_list(non_negative_int), metavar="N,...", help="batch rows with slot -1")
    axes.add_argument("--T", type=comma_list(positive_int), metavar="N,...",
                      help="tokens per row (speculative verify when > 1)")
    axes.add_argument("--checkpoints", type=comma_list(_one_of(CHECKPOINTS)), metavar="all,last",
                      help="with T > 1: the state stored after every token (all) or the last only")
    axes.add_argument("--mode", type=comma_list(_one_of(MODES)), metavar=",".join(MODES),
                      help="inplace: the pool updated in place; frozen: frozen verify (update_state=False), "
                           "every token's output from the row's start state, nothing stored; replay: cached-input "
                           "replay (T = 1), a ring of --ring records per slot, the pool written when it fills")
    axes.add_argument("--ring", type=comma_list(positive_int), metavar="L,...",
                      help="mode replay: records per slot (the ring's length L); a replay row's time is per step "
                           "over whole ring cycles, flush included")
    layout = p.add_argument_group("pool layout")
    layout.add_argument("--slots-per-row", type=positive_int, default=PoolLayout.slots_per_row, metavar="N",
                        help="timed pools hold N*B slots, the rows' drawn among them (default %(default)s)")
    layout.add_argument("--slot-order", choices=SLOT_ORDERS, default=PoolLayout.slot_order,
                        help="order the rows name their slots in (default %(default)s)")
    layout.add_argument("--placements", type=positive_int, metavar="N", help="independent allocations each row "
                        f"is timed on (default {PoolLayout.placements} on a GPU, 1 on the CPU)")
    layout.add_argument("--extra-placements", type=non_negative_int, default=Method.extra_placements, metavar="N",
                        help="placements added on a GPU to a row whose step moves more bytes than the L2 "
                             f"holds, or whose first placements spread by more than {PLACEMENT_SPREAD_LIMIT * 100:g}%% "
                             "(max / min - 1) (default %(default)s)")
    layout.add_argument("--disjoint-placements", action=argparse.BooleanOptionalAction,
                        default=Method.disjoint_placements,
                        help="keep each placement's memory until its row ends, so that the next lands on pages "
                             "no earlier one used (the driver may hand freed pages out again; default %(default)s)")
    layout.add_argument("--settle", type=non_negative_float, default=Method.settle_s, metavar="S",
                        help="idle S seconds after handing more than 64 MiB back to the driver between "
                             "placements and rows (on the H200 a large row's first placement ran 10%% slow "
                             "right after such a release, and not 10 ms later; default %(default)s)")
    layout.add_argument("--placement-processes", type=positive_int, metavar="N",
                        help="time each row in N worker processes of its implementation, one after another, "
                             "each with its own inputs, spacers and share of the kernel budget and of the extra "
                             "placements, and pool their placements: a process's placements can sit apart from "
                             "another's as a whole; the extra processes make their first calls before the sweep "
                             "times anything (default: the preset's on a GPU, 3 for published, gva, shapes, full "
                             "and ad-hoc axes, 1 for the others; 1 on the CPU; docs/timing.md, \"Placement "
                             "processes\")")
    timing = p.add_argument_group("timing")
    timing.add_argument("--l2-entry", choices=list(ENTRY_STATES), default=DEFAULT_ENTRY,
                        help="what the L2 holds when a timed call starts (default %(default)s; docs/timing.md)")
    timing.add_argument("--min-samples", type=positive_int, metavar="N", help="kernel-time samples at least")
    timing.add_argument("--max-seconds", type=positive_float, metavar="S", help="kernel-time sampling per row at most")
    timing.add_argument("--cooldown", type=positive_float, default=0.0, metavar="S",
                        help="idle seconds before each row (lets a power-capped GPU recover)")
    timing.add_argument("--no-retime", action="store_true", help="keep rows timed while the GPU throttled as they are")
    run = p.add_argument_group("run")
    run.add_argument("--devices", type=devices, default="all",
                     help="cpu, cuda, or a list such as cuda:0,cuda:1 (default: every visible GPU, else the CPU)")
    run.add_argument("--shard", type=_shard, metavar="I/N", help="measure every N-th configuration from the I-th "
                     "(0-based), to split one sweep over machines; join the directories with kda-merge")
    run.add_argument("--out", type=Path, help="results directory (default: ./sweeps/PRESET-DEVICE for a preset as "
                     "it is, else ./sweeps/NAME-DEVICE-HASH, the hash of the rows and settings)")
    run.add_argument("--row-timeout", type=positive_float, default=600.0, metavar="S",
                     help="seconds before a silent worker is killed and its row recorded as crashed")
    run.add_argument("--fresh", action="store_true", help="measure every row again (by default a row already in "
                     "--out is kept when it is ok and was measured by the code as it is now)")
    run.add_argument("--dry-run", action="store_true", help="print the rows this command would measure and an "
                     "estimate of the time; measure nothing, write nothing")
    run.add_argument("--no-charts", action="store_true", help="leave the charts to kda-plot")
    run.add_argument("--repro", action="store_true", help="print the command that reproduces each row")
    run.add_argument("--baseline", help="implementation the speedup chart divides by (default: flashinfer, else naive)")
    return p


def configs_from_args(args, device_type: str) -> tuple[str, list[Config]]:
    """(the run's name, its configurations) from parsed arguments."""
    # a CPU's timings model no placement (they smoke-test the harness): one there unless asked for more
    placements = args.placements or (1 if device_type == "cpu" else PoolLayout.placements)
    layout = PoolLayout(slots_per_row=args.slots_per_row, slot_order=args.slot_order, placements=placements)
    given = {axis: getattr(args, axis) for axis in AXES if getattr(args, axis) is not None}
    impls = list(args.impls or registry.names())
    name = "adhoc" if args.preset is None and given else args.preset or (
        "kimi-linear-48b" if device_type == "cuda" else "smoke")
    try:
        configs = (adhoc_configs(impls, given, layout) if name == "adhoc"
                   else PRESETS[name].configs(impls, layout, only=given))
    except ValueError as exc:  # a combination a Config refuses (mode replay without a ring, ...)
        raise UsageError(str(exc)) from None
    if args.ring and not any(c.mode == "replay" for c in configs):
        raise UsageError(f"--ring {','.join(map(str, args.ring))}: no replay row of {name} has that ring (--ring sets "
                         "the rings of mode replay's rows: add --mode replay, or inplace,replay, or leave --ring out)")
    return name, configs


def default_out(args, name: str, configs: list[Config], settings: dict) -> Path:
    """``sweeps/PRESET-DEVICE`` for a preset as it is (every implementation, default settings), else
    ``sweeps/NAME-DEVICE-HASH``, HASH of the rows' keys and the settings: two runs of other grids or
    settings never share a directory."""
    defaults = vars(parser().parse_args([]))
    plain = name != "adhoc" and all(getattr(args, k) == v for k, v in defaults.items() if k not in NOT_SETTINGS)
    base = Path.cwd() / "sweeps" / f"{name}-{settings['device_type']}"
    if plain:
        return base
    digest = hashlib.sha256(json.dumps([sorted(c.key() for c in configs), settings], sort_keys=True).encode())
    return base.with_name(f"{base.name}-{digest.hexdigest()[:8]}")


def _check_impls(impls) -> None:
    """Refuse unknown names and, of $KDA_EXTRA_IMPLS, an entry that is malformed or, of those named
    (every one where ``impls`` is None: the default, every registered one), one that does not import."""
    try:
        extra = registry.extra_impls()
    except ValueError as exc:
        raise UsageError(f"{exc}; set it to name=module:Class[,name=module:Class] or unset it") from None
    unknown = [name for name in impls or () if name not in registry.names()]
    if unknown:
        raise UsageError(f"unknown implementations {', '.join(unknown)}; registered: {', '.join(registry.names())}")
    for name in [n for n in impls if n in extra] if impls is not None else extra:
        try:
            registry.get(name)
        except Exception as exc:
            raise UsageError(f"{registry.EXTRA_IMPLS_ENV}: {name}={extra[name]} does not import here "
                             f"({type(exc).__name__}: {exc}); fix the variable or leave {name} out") from None


@dataclass
class Prepared:
    """A command's run, checked and ready: the driver, the run's name and its method."""

    sweep: Sweep
    name: str
    device_type: str


def prepare(args, command: str, exits_on_interrupt: bool = False) -> Prepared:
    """The run that parsed arguments ask for; :class:`UsageError` for anything refused, before
    anything is written or measured."""
    _check_impls(args.impls)
    device_type = torch.device(args.devices[0]).type
    name, configs = configs_from_args(args, device_type)
    if not configs:
        raise UsageError(f"the axes given leave no configuration of preset {name}")
    if args.shard:
        index, count = args.shard
        configs = configs[index::count]
    if args.baseline and args.baseline not in {c.impl for c in configs}:
        raise UsageError(f"--baseline {args.baseline} is not among this run's implementations "
                         f"({', '.join(dict.fromkeys(c.impl for c in configs))})")
    method = method_from_args(args, PRESETS.get(name, PRESETS["published"]), device_type)
    out_dir = args.out or default_out(args, name, configs, settings_of(args.devices, method))
    if not args.dry_run:
        writable_dir(out_dir)
    registry.interpret_triton_on(device_type)  # the workers inherit it
    sweep = Sweep(configs, out_dir, args.devices, method, command=command, preset=name, row_timeout=args.row_timeout,
                  fresh=args.fresh, cooldown_s=args.cooldown, exits_on_interrupt=exits_on_interrupt)
    return Prepared(sweep, name, device_type)


def _estimate_line(run: Prepared, configs: list[Config]) -> str:
    seconds = estimate_seconds(configs, run.sweep.method, run.device_type)
    where = "on the CPU, kernels interpreted" if run.device_type == "cpu" else f"on {len(run.sweep.devices)} GPU(s)"
    return f"{len(configs)} rows to measure: about {duration(seconds / len(run.sweep.devices))} {where}"


def _report(run: Prepared, table: pd.DataFrame, started: float) -> pd.DataFrame:
    """Print the summary after a run; the run's own rows of the directory's table."""
    ours = table[table.key.isin({c.key() for c in run.sweep.configs})]
    print(f"\nkernel time, bandwidth, share of the copy roofline (L2 entry state {run.sweep.method.entry}):")
    print(summary_table(ours))
    speedups = replay_speedup_table(ours)
    if speedups:
        print("\nreplay per step against in-place (in-place kernel time / replay's, over whole ring cycles):")
        print(speedups)
    problems = problems_table(ours)
    if problems:
        print("\nrows not ok:\n" + problems)
    print(f"\n{verdict(ours)[1]}\nwall time {time.perf_counter() - started:.1f} s; "
          f"results in {run.sweep.out_dir}/results.csv")
    if ours.device.nunique() > 1:
        print(f"lanes (rows, seconds busy, of which first calls): {lane_summary(ours)}")
    return ours


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    try:
        _check_impls(())  # a malformed $KDA_EXTRA_IMPLS before the parser lists the registered names
        args = parser().parse_args(argv)
        run = prepare(args, shlex.join(sys.argv if argv is None else argv), exits_on_interrupt=True)
        if args.dry_run:
            run.sweep.check_resumable()
        plan = run.sweep.plan()
    except UsageError as exc:
        fail(PROG, str(exc))
    if args.dry_run:
        print(f"{len(run.sweep.configs)} rows in {run.sweep.out_dir}: {plan.describe()}")
        if plan.pending:
            print(dry_run_table(plan.pending) + "\n" + _estimate_line(run, plan.pending))
        return
    if run.device_type == "cpu" and estimate_seconds(plan.pending, run.sweep.method, "cpu") > WARN_CPU_ABOVE_S:
        print(f"{PROG}: warning: {_estimate_line(run, plan.pending)}; a CPU sweep is a smoke test (--preset smoke); "
              f"stop with Ctrl-C, the rows done are kept", file=sys.stderr)
    # a time limit's SIGTERM (timeout, a batch system) ends the sweep as Ctrl-C does: rows saved,
    # results.csv and meta.json written
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    out_dir = run.sweep.out_dir
    try:
        table = run.sweep.run()
    except UsageError as exc:
        fail(PROG, str(exc))
    except KeyboardInterrupt:
        print(f"\ninterrupted: {run.sweep.measured} rows saved in {out_dir}; run the same command again to resume",
              file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except OSError as exc:
        _failed_writing(exc, out_dir, run.sweep.measured)
    ours = _report(run, table, started)
    if args.repro:
        print(repro.sweep_rows(ours, out_dir))
    if not args.no_charts:
        from .plots import plot_dir  # matplotlib only once the measuring is over

        try:
            charts = plot_dir(out_dir, baseline=args.baseline)
        except OSError as exc:
            _failed_writing(exc, out_dir, run.sweep.measured)
        print(textwrap.fill(f"charts: {', '.join(p.name for p in charts) or 'none (too few ok rows)'}", WIDTH))
    status, line = verdict(ours)
    if status:
        print(f"{PROG}: {line}", file=sys.stderr)
        raise SystemExit(status)


def _failed_writing(exc: OSError, out_dir: Path, measured: int) -> None:
    print(f"{PROG}: error: writing {exc.filename or out_dir} failed ({exc.strerror or exc}); the {measured} rows "
          f"measured are saved in {out_dir}/rows: free the space, then run the same command again to finish",
          file=sys.stderr)
    raise SystemExit(1)


def sweep(preset: str | None = None, *, out: str | Path | None = None, fresh: bool = False, charts: bool = False,
          **options) -> pd.DataFrame:
    """Run a sweep from Python as ``kda-sweep`` would, and return its results table (one row per
    implementation x configuration, the columns of results.csv).

    ``options`` are kda-sweep's options by their Python names: ``impls=["naive"]``, ``devices="cpu"``,
    axes as a value or a list (``B=[1, 2]``, ``state_dtype="bf16"``), ``placements=1``,
    ``max_seconds=0.01``, ``disjoint_placements=False``. The same rows, workers, resume (``out``; by
    default a directory named by the settings under ./sweeps) and checks; a refused argument raises
    :class:`kda_impls.cli.UsageError`. Rows that are not ok are in the table with their status and
    reason. Worker processes are started with "spawn": call it under ``if __name__ == "__main__":``
    in a script."""
    argv = [] if preset is None else ["--preset", preset]
    for name, value in {"out": out, "fresh": fresh, "no_charts": not charts, **options}.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv += [] if name in ("fresh", "no_charts") else [f"--no-{name.replace('_', '-')}"]
        elif value is not None:
            values = value if isinstance(value, (list, tuple)) else [value]
            argv += [flag, ",".join(str(v) for v in values)]
    started = time.perf_counter()
    p = parser()
    p.raises = True
    run = prepare(p.parse_args(argv), f"kda_impls.sweep({shlex.join(argv)})")
    table = run.sweep.run()
    ours = _report(run, table, started)
    if charts:
        from .plots import plot_dir

        plot_dir(run.sweep.out_dir, baseline=options.get("baseline"))
    return ours.reset_index(drop=True)


def method_from_args(args, preset: Preset, device_type: str) -> Method:
    """How the sweep times its rows: the preset's budgets unless the arguments narrow them, and
    the preset's placement processes on a GPU unless ``--placement-processes`` says otherwise."""
    kernel = Budget(min_samples=args.min_samples or preset.kernel.min_samples,
                    max_samples=max(preset.kernel.max_samples, args.min_samples or 0),
                    max_seconds=args.max_seconds or preset.kernel.max_seconds, rel_ci=preset.kernel.rel_ci)
    return Method(entry=args.l2_entry, kernel=kernel, call=preset.call, extra_placements=args.extra_placements,
                  disjoint_placements=args.disjoint_placements, settle_s=args.settle,
                  placement_processes=args.placement_processes or (
                      preset.placement_processes if device_type == "cuda" else Method.placement_processes),
                  retime_throttled=not args.no_retime)


