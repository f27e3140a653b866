"""`kda-sweep`: implementations x configurations (a preset, or axes from the command line) measured
in isolated worker processes on one or several devices, resumable, with a progress bar, a summary
table, the wall time and charts at the end. The options build a :class:`~.spec.SweepSpec`, as
:func:`kda_impls.sweep` (:mod:`.api`) does from Python values.

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
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from .. import repro
from ..cli import Parser, UsageError, fail, writable_dir
from .case import Method
from .config import CHECKPOINTS, MODES, SLOT_ORDERS, Config, PoolLayout
from .driver import Sweep, settings_of
from .l2 import DEFAULT_ENTRY, ENTRY_STATES
from .merge import main as merge_main
from .presets import PRESETS
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
from .spec import EmptyShard, SettingError, SweepSpec, extra_impls
from .timing import PLACEMENT_SPREAD_LIMIT

__all__ = ["main", "merge_main", "parser", "spec_from_args", "spec_from_argv"]
PROG = "kda-sweep"
INTERRUPTED = 130


def parser() -> Parser:
    """kda-sweep's options: each given one becomes the :class:`SweepSpec` field of its name (the spec
    converts and checks the values; those not given keep the spec's defaults)."""
    p = Parser(prog="kda-sweep", description=__doc__.split("\n\n")[0], argument_default=argparse.SUPPRESS,
               epilog="Axes take comma-separated values; given with a preset they narrow it, alone they define "
                      "the grid (Kimi-Linear's layer for what is not given: B 1,16,64,256, HV 32, K 128, "
                      "H = HV, V = K). Example: kda-sweep --B 1,16,64 --HV 32,64 --state-dtype bf16,fp32")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="named grid (default: kimi-linear-48b on a GPU; smoke on the CPU, or the axes given)")
    p.add_argument("--impls",
                   help="comma-separated implementations (default: every registered one)")
    axes = p.add_argument_group("axes (comma-separated values)")
    for axis in ("B", "H", "HV", "K", "V"):
        axes.add_argument(f"--{axis}", metavar="N,...")
    axes.add_argument("--state-dtype", metavar="DTYPE,...",
                      help="bf16, fp16, fp32 (or torch's names)")
    axes.add_argument("--slot-pad", metavar="N,...",
                      help="elements of padding after each state slot")
    axes.add_argument("--pad-rows", metavar="N,...", help="batch rows with slot -1")
    axes.add_argument("--T", metavar="N,...",
                      help="tokens per row (speculative verify when > 1)")
    axes.add_argument("--checkpoints", metavar=",".join(CHECKPOINTS),
                      help="with T > 1: the state stored after every token (all) or the last only")
    axes.add_argument("--mode", metavar=",".join(MODES),
                      help="inplace: the pool updated in place; frozen: frozen verify (update_state=False), "
                           "every token's output from the row's start state, nothing stored; replay: cached-input "
                           "replay (T = 1), a ring of --ring records per slot, the pool written when it fills")
    axes.add_argument("--ring", metavar="L,...",
                      help="mode replay: records per slot (the ring's length L); a replay row's time is per step "
                           "over whole ring cycles, flush included")
    layout = p.add_argument_group("pool layout")
    layout.add_argument("--slots-per-row", metavar="N", help="timed pools hold N*B slots, the rows' drawn among "
                        f"them (default {PoolLayout.slots_per_row})")
    layout.add_argument("--slot-order", choices=SLOT_ORDERS,
                        help=f"order the rows name their slots in (default {PoolLayout.slot_order})")
    layout.add_argument("--placements", metavar="N", help="independent allocations each row "
                        f"is timed on (default {PoolLayout.placements} on a GPU, 1 on the CPU)")
    layout.add_argument("--extra-placements", metavar="N",
                        help="placements added on a GPU to a row whose step moves more bytes than the L2 "
                             f"holds, or whose first placements spread by more than {PLACEMENT_SPREAD_LIMIT * 100:g}%% "
                             f"(max / min - 1) (default {Method.extra_placements})")
    layout.add_argument("--disjoint-placements", action=argparse.BooleanOptionalAction,
                        help="keep each placement's memory until its row ends, so that the next lands on pages "
                             "no earlier one used (the driver may hand freed pages out again; default "
                             f"{Method.disjoint_placements})")
    layout.add_argument("--settle", metavar="S",
                        help="idle S seconds after handing more than 64 MiB back to the driver between "
                             "placements and rows (on the H200 a large row's first placement ran 10%% slow "
                             f"right after such a release, and not 10 ms later; default {Method.settle_s})")
    layout.add_argument("--placement-processes", metavar="N",
                        help="time each row in N worker processes of its implementation, one after another, "
                             "each with its own inputs, spacers and share of the kernel budget and of the extra "
                             "placements, and pool their placements: a process's placements can sit apart from "
                             "another's as a whole; the extra processes make their first calls before the sweep "
                             "times anything (default: the preset's on a GPU, 3 for published, gva, shapes, full "
                             "and ad-hoc axes, 1 for the others; 1 on the CPU; docs/timing.md, \"Placement "
                             "processes\")")
    timing = p.add_argument_group("timing")
    timing.add_argument("--l2-entry", choices=list(ENTRY_STATES),
                        help=f"what the L2 holds when a timed call starts (default {DEFAULT_ENTRY}; docs/timing.md)")
    timing.add_argument("--min-samples", metavar="N", help="kernel-time samples at least")
    timing.add_argument("--max-seconds", metavar="S", help="kernel-time sampling per row at most")
    timing.add_argument("--cooldown", metavar="S",
                        help="idle seconds before each row (lets a power-capped GPU recover)")
    timing.add_argument("--no-retime", dest="retime", action="store_false",
                        help="keep rows timed while the GPU throttled as they are")
    run = p.add_argument_group("run")
    run.add_argument("--devices",
                     help="cpu, cuda, or a list such as cuda:0,cuda:1 (default: every visible GPU, else the CPU)")
    run.add_argument("--shard", metavar="I/N", help="measure every N-th configuration from the I-th "
                     "(0-based), to split one sweep over machines; join the directories with kda-merge")
    run.add_argument("--out", help="results directory (default: ./sweeps/PRESET-DEVICE for a preset as "
                     "it is, else ./sweeps/NAME-DEVICE-HASH, the hash of the rows and settings)")
    run.add_argument("--row-timeout", metavar="S",
                     help=f"seconds before a silent worker is killed and its row recorded as crashed (default "
                          f"{SweepSpec.row_timeout:g})")
    run.add_argument("--fresh", action="store_true", help="measure every row again (by default a row already in "
                     "--out is kept when it is ok and was measured by the code as it is now)")
    run.add_argument("--dry-run", action="store_true", help="print the rows this command would measure and an "
                     "estimate of the time; measure nothing, write nothing")
    run.add_argument("--no-charts", dest="charts", action="store_false", help="leave the charts to kda-plot")
    run.add_argument("--repro", action="store_true", help="print the command that reproduces each row")
    run.add_argument("--baseline", help="implementation the speedup chart divides by (default: flashinfer, else naive)")
    return p


def spec_from_argv(argv: list[str] | None) -> SweepSpec:
    """The :class:`SweepSpec` that kda-sweep's arguments ask for; :class:`UsageError` naming the option."""
    extra_impls()  # a malformed $KDA_EXTRA_IMPLS before the parser lists the registered names
    return spec_from_args(parser().parse_args(argv))


def spec_from_args(args: argparse.Namespace, **fixed) -> SweepSpec:
    """The :class:`SweepSpec` of the kda-sweep options in ``args`` (a parser built on :func:`parser`
    may add its own, which are left out) and of ``fixed`` fields; :class:`UsageError` naming the option."""
    given = {f.name: getattr(args, f.name) for f in fields(SweepSpec) if hasattr(args, f.name)} | fixed
    try:
        return SweepSpec(**given)
    except SettingError as exc:
        flag = {"retime": "no-retime", "charts": "no-charts"}.get(exc.field, exc.field.replace("_", "-"))
        raise UsageError(f"argument --{flag}: {exc.message}") from None


def default_out(spec: SweepSpec, configs: list[Config], settings: dict) -> Path:
    """``sweeps/PRESET-DEVICE`` for a preset as it is (every implementation, default settings), else
    ``sweeps/NAME-DEVICE-HASH``, HASH of the rows' keys and the settings: two runs of other grids or
    settings never share a directory."""
    base = Path.cwd() / "sweeps" / f"{spec.name}-{settings['device_type']}"
    if spec.is_plain():
        return base
    digest = hashlib.sha256(json.dumps([sorted(c.key() for c in configs), settings], sort_keys=True).encode())
    return base.with_name(f"{base.name}-{digest.hexdigest()[:8]}")


@dataclass
class Prepared:
    """A spec's run, checked and ready: the driver and the spec."""

    sweep: Sweep
    spec: SweepSpec

    @property
    def device_type(self) -> str:
        return self.spec.device_type


def prepare(spec: SweepSpec, command: str, exits_on_interrupt: bool = False) -> Prepared:
    """The run ``spec`` asks for; :class:`UsageError` for anything refused (:class:`EmptyShard` for a
    shard without rows), before anything is written or measured."""
    from .. import registry

    configs = spec.configs()
    method = spec.method()
    out_dir = spec.out or default_out(spec, configs, settings_of(list(spec.devices), method))
    if not spec.dry_run:
        writable_dir(out_dir)
    registry.interpret_triton_on(spec.device_type)  # the workers inherit it
    sweep = Sweep(configs, out_dir, list(spec.devices), method, command=command, preset=spec.name,
                  row_timeout=spec.row_timeout, fresh=spec.fresh, cooldown_s=spec.cooldown,
                  exits_on_interrupt=exits_on_interrupt)
    sweep.check_resumable()
    return Prepared(sweep, spec)


def _estimate_line(run: Prepared, configs: list[Config]) -> str:
    seconds = estimate_seconds(configs, run.sweep.method, run.device_type)
    where = "on the CPU, kernels interpreted" if run.device_type == "cpu" else f"on {len(run.sweep.devices)} GPU(s)"
    return f"{len(configs)} rows to measure: about {duration(seconds / len(run.sweep.devices))} {where}"


def report(run: Prepared, table: pd.DataFrame, started: float) -> pd.DataFrame:
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
        spec = spec_from_argv(argv)
        run = prepare(spec, shlex.join(sys.argv if argv is None else argv), exits_on_interrupt=True)
        plan = run.sweep.plan()
    except EmptyShard as exc:
        print(f"{PROG}: {exc}; nothing to measure")
        return
    except UsageError as exc:
        fail(PROG, str(exc))
    if spec.dry_run:
        print(f"{len(run.sweep.configs)} rows in {run.sweep.out_dir}: {plan.describe()}{plan.why_again()}")
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
    ours = report(run, table, started)
    if spec.repro:
        print(repro.sweep_rows(ours, out_dir))
    if spec.charts:
        try:
            charts = draw_charts(run)
        except OSError as exc:
            _failed_writing(exc, out_dir, run.sweep.measured)
        print(textwrap.fill(f"charts: {', '.join(p.name for p in charts) or 'none (too few ok rows)'}", WIDTH))
    status, line = verdict(ours)
    if status:
        print(f"{PROG}: {line}", file=sys.stderr)
        raise SystemExit(status)


def draw_charts(run: Prepared) -> list[Path]:
    """The charts of the run's directory (matplotlib loads only once the measuring is over)."""
    from .plots import plot_dir

    return plot_dir(run.sweep.out_dir, baseline=run.spec.baseline)


def _failed_writing(exc: OSError, out_dir: Path, measured: int) -> None:
    print(f"{PROG}: error: writing {exc.filename or out_dir} failed ({exc.strerror or exc}); the {measured} rows "
          f"measured are saved in {out_dir}/rows: free the space, then run the same command again to finish",
          file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":  # python3 -m kda_impls.bench.sweep: kda-sweep from a checkout
    main()
