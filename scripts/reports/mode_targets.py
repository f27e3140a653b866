"""The decode modes' targets, judged on a sweep directory: frozen verify against FlashInfer's
``disable_state_update`` call (the ``frozen-verify`` preset) and replay against in-place decode (the
``replay`` preset).

    python3 -m scripts.reports.mode_targets results/h100-80gb-hbm3/frozen-verify [--impl triton]

Writes DIR/mode-targets.md and prints it; each section is judged only where DIR holds its rows.
- frozen verify, T = 2, 4 and 8, B >= 16: ``impl``'s time at most that of FlashInfer's fastest
  verified frozen-verify variant at the same point (named);
- replay, T = 1, ring L = 16, B >= 64, HV 32/64, K = V = 128, bf16 and fp32 state: at least 1.35x
  faster per step than ``impl``'s in-place step (a replay row's time is its mean over whole ring
  cycles, flush included).
Each point also gives the target as a time (``target_us``) beside the step's floor (``floor_us``: its
bytes at the device's copy bandwidth, the sweep's own column), and the verdict counts the points whose
target is under that floor, where no kernel moving those bytes can meet it.
Exit status 1 when a judged point misses its target, 2 on an unusable directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from kda_impls import dtypes
from kda_impls.bench.config import CONFIG_COLUMNS
from kda_impls.bench.results import SweepDirError, best_per_library, load
from kda_impls.cli import fail

FROZEN_T, FROZEN_MIN_B, FROZEN_RATIO = (2, 4, 8), 16, 1.0
REPLAY_RING, REPLAY_MIN_B, REPLAY_SPEEDUP, REPLAY_HV = 16, 64, 1.35, (32, 64)
POINT = ["state_dtype", "HV", "K", "V", "B"]


def frozen_points(ok: pd.DataFrame, impl: str) -> pd.DataFrame:
    """Per point of frozen verify at T = 2, 4 and 8, B >= 16: ``impl``'s time, FlashInfer's best and
    their ratio."""
    rows = ok[(ok["mode"] == "frozen") & ok["T"].isin(FROZEN_T) & (ok.B >= FROZEN_MIN_B)]
    point = [*POINT, "T"]
    ours = rows[rows.impl == impl][[*point, "kernel_us_mean", "floor_us"]]
    best = best_per_library(rows)
    flashinfer = best[best.library == "flashinfer"][[*point, "impl", "kernel_us_mean"]]
    points = ours.merge(flashinfer, on=point, suffixes=("", "_flashinfer")).rename(
        columns={"impl": "flashinfer_variant"})
    return points.assign(ratio=points.kernel_us_mean / points.kernel_us_mean_flashinfer,
                         target_us=FROZEN_RATIO * points.kernel_us_mean_flashinfer,
                         met=lambda p: p.ratio <= FROZEN_RATIO)


def replay_points(ok: pd.DataFrame, impl: str) -> pd.DataFrame:
    """Per point of the replay target: ``impl``'s in-place and replay step times and the speedup."""
    same = [c for c in CONFIG_COLUMNS if c not in ("mode", "ring", "checkpoints")]
    mine = ok[(ok.impl == impl) & (ok["T"] == 1) & (ok.B >= REPLAY_MIN_B) & ok.HV.isin(REPLAY_HV)
              & (ok.K == 128) & (ok.V == 128) & (ok.H == ok.HV)]
    inplace = mine[mine["mode"] == "inplace"][[*same, "kernel_us_mean"]]
    replay = mine[(mine["mode"] == "replay") & (mine.ring == REPLAY_RING)]
    points = replay.merge(inplace, on=same, suffixes=("", "_inplace"))[[*POINT, "ring", "kernel_us_mean_inplace",
                                                                          "kernel_us_mean", "floor_us"]]
    return points.assign(speedup=points.kernel_us_mean_inplace / points.kernel_us_mean,
                         target_us=points.kernel_us_mean_inplace / REPLAY_SPEEDUP,
                         met=lambda p: p.speedup >= REPLAY_SPEEDUP)


def section(title: str, target: str, points: pd.DataFrame) -> str:
    shown = points.assign(state_dtype=points.state_dtype.map(dtypes.short), met=points.met.map({True: "yes",
                                                                                                False: "NO"}))
    under = int((points.target_us < points.floor_us).sum())
    verdict = (f"met at {int(points.met.sum())} of {len(points)} points; the target is under the step's copy "
               f"floor at {under} of them")
    return f"## {title}\n\n{target}: **{verdict}**.\n\n{shown.to_markdown(index=False, floatfmt='.3f')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--impl", default="triton")
    args = parser.parse_args(argv)
    try:
        sweep = load(args.dir)
    except SweepDirError as exc:
        fail("mode_targets.py", str(exc))
    ok, meta = sweep.ok, sweep.meta
    frozen, replay = frozen_points(ok, args.impl), replay_points(ok, args.impl)
    if frozen.empty and replay.empty:
        fail("mode_targets.py", f"{args.dir} holds no ok rows of either target (expected frozen verify at T in "
                                f"{FROZEN_T} beside FlashInfer's, or replay at ring {REPLAY_RING} beside in-place, "
                                f"of {args.impl})")
    sections = [f"# {args.impl}: the decode modes' targets on {meta.get('gpu')}\n\n"
                f"From `{args.dir}` (commit {meta.get('git', {}).get('sha')}); kernel times in us."]
    if len(frozen):
        sections.append(section(f"Frozen verify, T = {', '.join(map(str, FROZEN_T))}, B >= {FROZEN_MIN_B}",
                                "at most the time of FlashInfer's fastest frozen-verify variant",
                                frozen))
    if len(replay):
        sections.append(section(f"Replay, ring {REPLAY_RING}, B >= {REPLAY_MIN_B}",
                                f"at least {REPLAY_SPEEDUP}x faster per step than in-place decode", replay))
    text = "\n\n".join(sections) + "\n"
    (args.dir / "mode-targets.md").write_text(text)
    print(text)
    return 0 if pd.concat([frozen.met, replay.met]).all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
