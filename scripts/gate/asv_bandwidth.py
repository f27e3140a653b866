"""The asv suite's bandwidth set beside a sweep's, on a GPU box: one asv run of the ``bandwidth``
profile (our kernel at Kimi-Linear's layer, B = 256, bf16 and fp32 state), published, and a sweep
of the same points; per point both GB/s, each one's placement range and their difference.

    python3 -m scripts.gate.asv_bandwidth OUT [--impl triton] [--sweep DIR] [--machine NAME]

OUT gets ``results/`` and ``html/`` (asv's; ``asv preview --html-dir OUT/html`` serves the graphs),
``asv.log``, ``sweep/`` (unless ``--sweep`` names one measured already), ``compare.csv`` and
``meta.json``. A point agrees when the two GB/s differ by no more than the wider of the two
placement ranges (max / min - 1 of each side's per-placement GB/s): the run-to-run spread of one
process. Exit 0 when every point agrees, 1 when one does not or a run failed, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

from kda_impls.bench.results import SweepDirError, device_info
from kda_impls.bench.results import load as load_sweep
from kda_impls.cli import Parser
from kda_impls.regress_load import load_asv
from scripts.gate.validate_gate import REPO, commit_to_label

PROFILE = "bandwidth"
SHAPE = dict(H=32, HV=32, K=128, V=128)  # the profile's one head layout, HV32-K128-V128
POINTS = [dict(B=256, state_dtype=dtype, T=1) for dtype in ("bfloat16", "float32")]


def asv_name(impl: str, point: dict) -> str:
    return (f"decode.Bandwidth.track_gbps('{impl}', {point['B']}, 'HV32-K128-V128', 0, '{point['state_dtype']}', "
            f"{point['T']})")


def run_asv(out: Path, impl: str, machine: str, env: dict) -> tuple[str, Path | None, int, int]:
    """(commit filed under, result file, asv run's exit status, asv publish's) of the profile's
    kernel-time and bandwidth benchmarks of ``impl``, results and site under ``out``."""
    import json5  # asv's reader of asv.conf.json (it has comments)

    repo, commit, branch = commit_to_label(out / "scratch-repo")
    conf = json5.loads((REPO / "asv.conf.json").read_text())
    conf.update(repo=str(repo), branches=[branch], benchmark_dir=str(REPO / "benchmarks"),
                results_dir=str(out / "results"), html_dir=str(out / "html"))
    conf_path = out / "asv.conf.json"
    conf_path.write_text(json.dumps(conf, indent=1))
    asv = [sys.executable, "-m", "asv"]
    with open(out / "asv.log", "w") as log:
        ran = subprocess.run([*asv, "run", "--config", str(conf_path), "-E", f"existing:{sys.executable}", "--machine",
                              machine, "--set-commit-hash", commit, "--record-samples", "--show-stderr", "--bench",
                              rf"^decode\.(KernelTime|Bandwidth)\..*\('{impl}',"], cwd=REPO, env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        published = subprocess.run([*asv, "publish", "--config", str(conf_path)], cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    found = list((out / "results" / machine).glob(f"{commit[:8]}-existing-*.json"))
    return commit, (found[0] if len(found) == 1 else None), ran.returncode, published.returncode


def run_sweep(out: Path, impl: str, env: dict) -> int:
    dtypes = ",".join(p["state_dtype"] for p in POINTS)
    args = ["--impls", impl, "--B", str(POINTS[0]["B"]), "--state-dtype", dtypes, "--T", "1", "--devices", "cuda",
            "--no-charts", "--out", str(out)] + [a for k, v in SHAPE.items() for a in (f"--{k}", str(v))]
    return subprocess.run([sys.executable, str(REPO / "scripts" / "sweep.py"), *args], cwd=REPO, env=env).returncode


def compare(result: Path, sweep_dir: Path, impl: str) -> pd.DataFrame:
    """One row per point: asv's GB/s (median of its per-placement GB/s) and range, the sweep's
    (its gbps column: bytes over the mean kernel time) and range, their difference and agreement."""
    measured = load_asv(result).measurements
    table = load_sweep(sweep_dir).ok
    rows = []
    for point in POINTS:
        m = measured.get(asv_name(impl, point))
        match = table[(table.impl == impl) & (table.B == point["B"]) & (table.state_dtype == point["state_dtype"])
                      & (table["T"] == point["T"]) & (table.slot_pad == 0) & (table.pad_rows == 0)
                      & (table.H == SHAPE["H"]) & (table.HV == SHAPE["HV"]) & (table.K == SHAPE["K"])
                      & (table.V == SHAPE["V"])]
        if m is None or match.empty:
            rows.append(dict(point, asv_gbps=m and m.time, sweep_gbps=None, agrees=False))
            continue
        s = match.iloc[0]
        sweep_lo, sweep_hi = (s.bytes / s[column] / 1e3 for column in ("kernel_us_placement_max",
                                                                        "kernel_us_placement_min"))
        asv_lo, asv_hi = min(m.samples), max(m.samples)
        spread = max(asv_hi / asv_lo, sweep_hi / sweep_lo) - 1
        difference = m.time / s.gbps - 1
        rows.append(dict(point, asv_gbps=m.time, asv_min=asv_lo, asv_max=asv_hi, sweep_gbps=s.gbps,
                         sweep_min=sweep_lo, sweep_max=sweep_hi, difference=difference, spread=spread,
                         agrees=abs(difference) <= spread))
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="asv_bandwidth", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("out", type=Path, help="directory for every output (created)")
    parser.add_argument("--impl", default="triton", help="the implementation (default %(default)s)")
    parser.add_argument("--sweep", type=Path, help="a sweep directory of the same points, instead of a new sweep")
    parser.add_argument("--machine", help="an asv machine already registered, instead of registering this GPU")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: the bandwidth of a CPU run says nothing about a kernel")
    if args.sweep is not None and not (args.sweep / "results.csv").exists():
        parser.error(f"--sweep {args.sweep}: no results.csv there")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KDA_ASV_PROFILE": PROFILE, "KDA_ASV_IMPLS": args.impl,
           "ASV_PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("ASV_PYTHONPATH")]))}
    machine = args.machine or subprocess.run([sys.executable, "-m", "kda_impls.asv_machine"], cwd=REPO, env=env,
                                             capture_output=True, text=True, check=True).stdout.strip()
    commit, result, asv_exit, publish_exit = run_asv(out, args.impl, machine, env)
    sweep_dir, sweep_exit = args.sweep or out / "sweep", None
    if args.sweep is None:
        sweep_exit = run_sweep(sweep_dir, args.impl, env)
    meta = dict(device=device_info(torch.device("cuda")), machine=machine, profile=PROFILE, impl=args.impl,
                commit=os.environ.get("KDA_GIT_SHA") or commit,
                asv_result=str(result), asv_run_exit=asv_exit, asv_publish_exit=publish_exit,
                sweep=str(sweep_dir), sweep_exit=sweep_exit, argv=sys.argv)
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    if result is None:
        print(f"asv_bandwidth: asv run saved no result file (exit {asv_exit}); see {out / 'asv.log'}", file=sys.stderr)
        return 1
    try:
        table = compare(result, sweep_dir, args.impl)
    except SweepDirError as exc:
        print(f"asv_bandwidth: {exc}", file=sys.stderr)
        return 1
    table.to_csv(out / "compare.csv", index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    agree = bool(table.agrees.all())
    print(f"{'every point agrees' if agree else 'DISAGREE'}: asv GB/s vs the sweep's within the wider placement "
          f"range; asv exit {asv_exit}, publish exit {publish_exit}; {out / 'compare.csv'}")
    return 0 if agree and asv_exit == 0 and publish_exit == 0 and not sweep_exit else 1


if __name__ == "__main__":
    sys.exit(main())
