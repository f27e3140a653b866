"""`kda-ab BASE HEAD [sweep options]`: two revisions (or two checkout directories) measured side by side
on one device. Each side is checked out into its own worktree (:mod:`.revisions`) and measured by its own
long-lived worker process that imports that tree (:mod:`.side`); every configuration of the grid is
measured for both sides in each of ``--rounds`` rounds, in the order A B, then B A, so that drift cancels
in each round's ratio. Both sides are written as ordinary sweep directories (``OUT/base``, ``OUT/head``,
which kda-regress and kda-plot read), each round's kernel times to ``OUT/rounds.json``, and the verdict
(:mod:`.paired`: the gate's statuses, thresholds and exit statuses, judged round by round) to
``OUT/gate.json``. Exit 1 where a benchmark is broken, slower, missing or unsure (as kda-regress), 2 on
unusable input (checked before anything is measured), 130 when interrupted."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import sys
import time
from dataclasses import MISSING, asdict, fields, is_dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from .. import regress, regress_rule
from ..bench import sweep as sweep_cli
from ..bench.case import Method, merge_rows
from ..bench.config import Config
from ..bench.driver import settings_of
from ..bench.results import assemble, environment, write_meta, write_row
from ..bench.roofline import copy_bandwidth
from ..bench.spec import SweepSpec
from ..cli import UsageError, fail, positive_int
from . import paired, revisions
from .sides import SideDied, SideWorker, side_environment

PROG = "kda-ab"
INTERRUPTED = 130


def _assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not (sep and name.isidentifier()):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def parser() -> argparse.ArgumentParser:
    """kda-sweep's parser (its grid, timing and run options mean the same here: :func:`checked_spec`
    makes them a :class:`SweepSpec`) with the sides, the rounds and the gate's options added."""
    p = sweep_cli.parser()
    p.prog, p.description = PROG, __doc__.split("\n\n")[0].split(": ", 1)[1]
    p.epilog = ("--out: the A/B directory (default sweeps/ab-BASE-HEAD-PRESET-DEVICE); --fresh replaces one that "
                "holds a run; --dry-run lists the rows; --devices: one device; --shard i/n: every n-th "
                "configuration, for a CI matrix (kda-perf-ci gate merges). Verdict: the gate's statuses and "
                "thresholds; the ratio is the median over rounds of head/base kernel time, and slower or faster "
                "needs a sign test p < alpha over the rounds (8 rounds at alpha 0.01). Exit status 1 when a "
                "benchmark is broken, slower, missing or unsure (--allow-missing and --allow-unsure pass those "
                "two), 2 on unusable input, 130 when interrupted.")
    p.add_argument("base", help="revision (or checkout directory) A")
    p.add_argument("head", help="revision (or checkout directory) B")
    ab = p.add_argument_group("A/B")
    ab.add_argument("--rounds", type=positive_int, default=paired.min_rounds(regress_rule.DEFAULT_ALPHA),
                    help="rounds of both sides per configuration (default %(default)s: the fewest whose sign test "
                         "can reach p < alpha)")
    ab.add_argument("--env-base", type=_assignment, action="append", default=[], metavar="NAME=VALUE",
                    help="set a variable in the base side's worker only (repeatable)")
    ab.add_argument("--env-head", type=_assignment, action="append", default=[], metavar="NAME=VALUE",
                    help="set a variable in the head side's worker only (repeatable)")
    add_gate_options(p, repro=False)  # kda-sweep's --repro is there already
    return p


def add_gate_options(p: argparse.ArgumentParser, repro: bool = True) -> None:
    """kda-regress's options (the same names and defaults), and --repro."""
    gate = p.add_argument_group("gate (as kda-regress)")
    gate.add_argument("--threshold", type=float, default=regress_rule.DEFAULT_THRESHOLD,
                      help="relative move that counts where no --threshold-for rule names the benchmark")
    gate.add_argument("--threshold-for", metavar="REGEX=VALUE", action="append", type=regress_rule.threshold_rule,
                      default=None, help="threshold of benchmarks matching REGEX, or 'none' (repeatable)")
    gate.add_argument("--alpha", type=float, default=regress_rule.DEFAULT_ALPHA, help="significance level")
    gate.add_argument("--allow-unsure", action="store_true", default=False,
                      help="pass benchmarks whose rounds cannot support a verdict (listed with the reason)")
    gate.add_argument("--allow-missing", action="store_true", default=False,
                      help="pass benchmarks absent from head")
    if repro:
        gate.add_argument("--repro", action="store_true", default=False,
                          help="print the command that reproduces each line")


def checked_spec(args: argparse.Namespace) -> SweepSpec:
    """The :class:`SweepSpec` of kda-ab's sweep options in ``args``, checked with its own; :class:`UsageError`
    for anything refused."""
    spec = sweep_cli.spec_from_args(args, import_extras=False)  # each side imports its own, from its tree
    if len(spec.devices) != 1:
        raise UsageError(f"--devices {','.join(spec.devices)}: both sides are measured on one device; name one")
    if spec.placement_processes not in (None, 1):
        raise UsageError("--placement-processes: kda-ab measures each side in one warm process; --rounds repeats")
    if not (args.threshold >= 0 and 0 < args.alpha < 1):
        raise UsageError(f"need --threshold >= 0 and 0 < --alpha < 1; got {args.threshold}, {args.alpha}")
    return spec


def prepare(spec: SweepSpec) -> tuple[list[Config], Method]:
    """The configurations and the method of the grid ``spec`` names; nothing written."""
    run = sweep_cli.prepare(replace(spec, dry_run=True, out=Path("/nonexistent-kda-ab")), PROG)
    return run.sweep.configs, replace(run.sweep.method, placement_processes=1)


def default_out(name: str, device_type: str, shas: list[str]) -> Path:
    return Path.cwd() / "sweeps" / f"ab-{shas[0][:8]}-{shas[1][:8]}-{name}-{device_type}"


def check_out(out: Path, fresh: bool) -> None:
    """Refuse an A/B directory that holds a run unless --fresh; with it, remove that run's files."""
    owned = [out / side for side in paired.SIDES] + [out / paired.ROUNDS_FILE, out / "gate.json"]
    held = [p for p in owned if p.exists()]
    if held and not fresh:
        raise UsageError(f"--out {out} holds an A/B run ({', '.join(p.name for p in held)}): pass --fresh to replace "
                         f"it, or another --out")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name a directory")
    for path in held:
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _default(f) -> object:
    """A dataclass field's default as :func:`dataclasses.asdict` spells it (None where it has none)."""
    value = f.default_factory() if f.default_factory is not MISSING else None if f.default is MISSING else f.default
    return asdict(value) if is_dataclass(value) else value


def check_fields(worker: SideWorker, configs: list[Config], method: Method) -> None:
    """Refuse a grid or timing setting the side's harness does not have, unless at its default."""
    for what, items, kind in (("axis", configs, Config), ("timing setting", [method], Method)):
        known = set(worker.hello[f"{kind.__name__.lower()}_fields"])
        defaults = {f.name: _default(f) for f in fields(kind)}
        for item in items:
            unknown = [k for k, v in asdict(item).items() if k not in known and v != defaults.get(k)]
            if unknown:
                raise UsageError(f"{worker.side.label} {worker.side.spec}: its harness has no {what} "
                                 f"{', '.join(unknown)}; leave it at its default")


def measure(workers: dict, configs: list[Config], method, copy_bw: float, rounds: int, timeout: float
            ) -> dict[str, dict[str, list[dict]]]:
    """side -> key -> its rows, round by round (A B, then B A). A configuration that is not ok on a side
    in a round is measured no further: its status is the verdict."""
    rows = {side: {cfg.key(): [] for cfg in configs} for side in workers}
    done: set[str] = set()
    order = list(workers)
    with tqdm(total=rounds * len(configs) * len(workers), unit="row", dynamic_ncols=True) as bar:
        for r in range(rounds):
            for cfg in configs:
                for side in order if r % 2 == 0 else order[::-1]:
                    if cfg.key() not in done and cfg.impl in workers[side].hello["impls"]:
                        row = workers[side].measure(cfg, method, copy_bw, timeout)
                        rows[side][cfg.key()].append(row | {"round": r})
                        if row["status"] != "ok":
                            done.add(cfg.key())
                    bar.update()
    return rows


def side_row(rounds: list[dict], rows_total: int) -> dict:
    """One sweep row of a side's rounds: the first that is not ok (its reason naming the round), else
    their samples and placements pooled (:func:`kda_impls.bench.case.merge_rows`)."""
    for row in rounds:
        if row["status"] != "ok":
            return row | {"reason": f"round {row['round'] + 1} of {rows_total}: {row['reason']}"}
    return rounds[0] if len(rounds) == 1 else merge_rows(rounds)


def write_side(out: Path, side: revisions.Side, worker: SideWorker, rows: dict[str, list[dict]], devices,
               method, copy_bw: float, preset: str, command: str, rounds: int) -> None:
    """``OUT/<side>`` as a sweep directory: rows, results.csv, samples, meta.json."""
    directory = out / side.label
    directory.mkdir(parents=True, exist_ok=True)
    for measured in rows.values():
        if measured:
            row = side_row(measured, rounds)
            write_row(directory, {k: v for k, v in row.items() if k != "round"} | {
                "commit": side.sha, "dirty": side.dirty,
                "fingerprint": worker.described.get(row["impl"], {}).get("fingerprint"), "host": platform.node()})
    device = torch.device(devices[0])
    env = environment(device, directory, command)
    env["git"] = {"sha": side.sha, "dirty": side.dirty, "source": f"kda-ab {side.label} {side.spec} ({side.tree})"}
    key = f"{platform.node()}/{devices[0]}"
    meta = env | {"settings": settings_of(devices, method), "copy_bandwidth_by_device": {key: copy_bw},
                  "copy_bandwidth_Bps": copy_bw, "presets": [preset],
                  "impls": dict(worker.described),
                  "versions": {"python": platform.python_version(), "torch": torch.__version__}
                  | {k: v for d in worker.described.values() for k, v in d.get("versions", {}).items()},
                  "ab": {"side": side.label, "spec": side.spec, "tree": str(side.tree), "rounds": rounds,
                         "order": "A B, then B A, per round"},
                  "runs": [{"utc": env["utc"], "command": command, "git": env["git"], "devices": list(devices),
                            "rows_measured": sum(map(len, rows.values()))}]}
    write_meta(directory, meta)
    assemble(directory)


def write_rounds(out: Path, rows: dict[str, dict[str, list[dict]]]) -> None:
    per_key: dict[str, dict[str, list]] = {}
    for side, by_key in rows.items():
        for key, measured in by_key.items():
            per_key.setdefault(key, {s: [] for s in rows})[side] = [row.get("kernel_us_mean") for row in measured]
    (out / paired.ROUNDS_FILE).write_text(json.dumps(per_key, indent=1) + "\n")


def report(out: Path, args, command: str, repro: bool) -> int:
    """Judge ``out``, print the table and the last line, write gate.json; the exit status."""
    thresholds = None if args.threshold_for is None else dict(args.threshold_for)
    try:
        table = paired.judge(out, args.threshold, args.alpha, thresholds)
    except regress.InputError as exc:
        fail(PROG, str(exc))
    print(f"A: {out / 'base'}\nB: {out / 'head'}\nratio: median over rounds of head/base kernel time; ci: its "
          f"{1 - args.alpha:.0%} interval; slower: beyond the threshold with a sign test p < {args.alpha}\n")
    print(paired.format_paired(table) if len(table) else "(no benchmarks)")
    if repro:
        from ..repro import gate_lines

        print(gate_lines(table, out / "base", out / "head"))
    status, line = paired.summary(table, args.allow_missing, args.allow_unsure)
    paired.write_report(table, out / "gate.json", command=command, threshold=args.threshold, alpha=args.alpha,
                        allow_unsure=args.allow_unsure, allow_missing=args.allow_missing, status=status, line=line)
    counts = table["status"].astype(str).value_counts()
    print("\n" + ", ".join(f"{counts[s]} {s}" for s in regress_rule.STATUSES if s in counts) + "\n" + line)
    return status


def run(argv: list[str] | None = None) -> int:
    command = shlex.join([PROG, *(sys.argv[1:] if argv is None else argv)])
    cwd = Path.cwd()
    try:
        args = parser().parse_args(argv)
        found = [revisions.resolve(label, rev, cwd) for label, rev in (("BASE", args.base), ("HEAD", args.head))]
        spec = checked_spec(args)
        configs, method = prepare(spec)
        out = spec.out or default_out(spec.name, spec.device_type, [sha or path.name for _, path, sha in found])
        if not spec.dry_run:
            check_out(out, spec.fresh)
    except UsageError as exc:
        fail(PROG, str(exc))
    if spec.dry_run:
        print(f"{len(configs)} configurations x 2 sides x {args.rounds} rounds into {out}:\n" +
              "\n".join(cfg.key() for cfg in configs))
        return 0
    extra = {"base": dict(args.env_base), "head": dict(args.env_head)}
    sides = [revisions.side(label, spec, cwd, os.environ | extra[label])
             for label, spec in (("base", args.base), ("head", args.head))]
    device = spec.devices[0]
    copy_bw = copy_bandwidth(device)  # before any worker runs: one roofline for both sides
    workers = {s.label: SideWorker(s, device, side_environment(s, extra[s.label])) for s in sides}
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.perf_counter()
    try:
        for worker in workers.values():
            try:
                worker.start()
                check_fields(worker, configs, method)
            except SideDied as exc:
                fail(PROG, f"{worker.side.label} {worker.side.spec}: its worker did not start ({exc}); its stderr "
                           f"is above")
            except UsageError as exc:
                fail(PROG, str(exc))
        rows = measure(workers, configs, method, copy_bw, args.rounds, spec.row_timeout)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; nothing judged", file=sys.stderr)
        return INTERRUPTED
    finally:
        for worker in workers.values():
            worker.stop()
    out.mkdir(parents=True, exist_ok=True)
    for s in sides:
        write_side(out, s, workers[s.label], rows[s.label], spec.devices, method, copy_bw, spec.name, command,
                   args.rounds)
    write_rounds(out, rows)
    print(f"measured in {time.perf_counter() - started:.1f} s; sweep directories {out}/base and {out}/head")
    return report(out, args, command, spec.repro)


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run(argv))


if __name__ == "__main__":
    main()
