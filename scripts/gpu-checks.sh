#!/usr/bin/env bash
# The GPU checks, run on a GPU box from the repository root of a clean tree:
#
#   KDA_GIT_SHA=$(git rev-parse HEAD) KDA_GIT_DIRTY=0 bash scripts/gpu-checks.sh STEP [STEP ...]
#
# (the box gets the tree without its git history: KDA_GIT_SHA names the commit in every meta.json).
# Steps, in the order a fresh box runs them:
#   install     stage and install the offline wheel parts carried in .gpu/part1 .. .gpu/part3 (one part
#               a call where the tree travels with a size limit; a part staged earlier stays staged)
#   grid        the GPU correctness grid, every implementation (scripts/gpu_correctness.py)
#   targets     the targets preset on every visible GPU, then our kernel's targets judged (targets.md)
#   cupti       CUPTI's second clock on the targets run's unpadded rows (after `targets`)
#   asv         one asv run of the suite (KDA_ASV_PROFILE, default full), published as HTML
#   nvbench     NVIDIA's nvbench beside the harness, one process, with traced twins, on the unpadded
#               B >= 16 targets rows of four implementations: this call's targets run, else the committed one
#   pytest-gpu  the tests marked gpu (python3 -m pytest -m gpu)
#
# Each step writes its log to $OUT/logs/STEP.log and its results to results/h200/STEP/ ($RES; each with a
# meta.json: commit, GPU, command); results.tgz in $OUT holds every results/h200/STEP/ of the call
# (unpack it at the repository root). The README's table is written from the targets run on any
# machine: python3 scripts/targets.py results/h200/targets --readme README.md
# A step replaces its results/h200/STEP/ in the box's copy of the tree (a committed run is never mixed
# into a new one), unless RESUME=1: then a sweep cut short on the same box resumes from its rows. In a
# checkout with its git history (not the box's copy) a step whose folder exists is refused before any runs.
# LIMIT_S (default 540) bounds each step, so that a slow one cannot take the rest down with it.
# Exit status: 0 when every step exited 0, else 1 (each failed step is named in the summary).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-checks-out}
RES=${RES:-results/h200}  # where the steps' folders go
mkdir -p "$OUT/logs" "$RES"
# the scripts import this tree's package (not installed on the box); NVLink multicast stays off
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LIMIT_S=${LIMIT_S:-540}
FAILED=()
DONE=()

run_step() {  # run_step NAME COMMAND...: COMMAND under timeout, logged; its last lines printed
  local name=$1 start=$SECONDS status; shift
  timeout "$LIMIT_S" "$@" > "$OUT/logs/$name.log" 2>&1
  status=$?
  echo "== $name: exit $status ($((SECONDS - start)) s, $(date -u +%T))"
  grep -v -e 'row/s' -e 's/row' -e 'it/s' "$OUT/logs/$name.log" | tail -n 6
  [ "$status" = 0 ] || FAILED+=("$name")
  return "$status"
}

environment() {  # the wheel parts' site packages (torch, Triton, FlashInfer, fla, asv; nvbench's own)
  local env
  for env in /root/gpu-site/env.sh /root/gpu-nvbench/env.sh; do
    [ -f "$env" ] && source "$env"
  done
}

fresh() {  # fresh DIR: DIR removed for this call's run, unless RESUME=1
  [ "${RESUME:-0}" = 1 ] || rm -rf "$1"
}

write_meta() {  # write_meta DIR COMMAND: DIR/meta.json as the harness writes it (kda_impls.bench.results)
  python3 -c 'import sys, torch; from pathlib import Path
from kda_impls.bench.results import environment, write_meta
write_meta(Path(sys.argv[1]), environment(torch.device("cuda"), Path(sys.argv[1]), sys.argv[2]))' "$1" "$2"
}

step_install() {
  local part found=0
  for part in .gpu/part1 .gpu/part2 .gpu/part3; do
    if [ -f "$part/install.sh" ]; then found=1; run_step "install-$(basename "$part")" bash "$part/install.sh"; fi
  done
  [ "$found" = 1 ] || { echo "== install: this call carries no .gpu/part1 .. part3"; FAILED+=(install); }
}

step_grid() {
  fresh "$RES/grid"
  run_step grid python3 scripts/gpu_correctness.py --out "$RES/grid"
}

step_targets() {
  fresh "$RES/targets"
  run_step targets python3 scripts/sweep.py --preset targets --out "$RES/targets" &&
    run_step targets-judged python3 scripts/targets.py "$RES/targets"
}

needs_targets() {  # needs_targets STEP: the targets run is there, or STEP fails with one line
  [ -f "$RES/targets/results.csv" ] && return 0
  echo "== $1: needs $RES/targets/results.csv (the committed targets run, or the targets step first)"
  FAILED+=("$1"); return 1
}

step_cupti() {
  needs_targets cupti && fresh "$RES/cupti" &&
    run_step cupti python3 scripts/cupti_crosscheck.py "$RES/targets" --unpadded-only --calls 20 --out "$RES/cupti"
}

step_nvbench() {  # nvbench's stopping rule at the script's defaults, chosen so that rows settle
  needs_targets nvbench && fresh "$RES/nvbench" &&
    run_step nvbench python3 scripts/nvbench_crosscheck.py "$RES/targets" --unpadded-only --out "$RES/nvbench" \
      --impls triton,fla-batched,flashinfer,flashinfer-loggate-sigmoid --B 16,64,256 --trace
}

step_asv() {  # asv files results under a commit of a git repository: this tree's, or a scratch one's
  local dir=$RES/asv repo=$PWD sha machine
  fresh "$dir"; mkdir -p "$dir"
  if ! sha=$(git rev-parse HEAD 2> /dev/null) || [ "$sha" != "${KDA_GIT_SHA:-$sha}" ]; then
    repo=$(mktemp -d)
    git init -q -b main "$repo"
    git -C "$repo" -c user.name=gpu-checks -c user.email=gpu-checks@localhost commit -q --allow-empty \
      -m "asv run of ${KDA_GIT_SHA:-an uncommitted tree}"
    sha=$(git -C "$repo" rev-parse HEAD)
  fi
  python3 -c 'import json, sys; from asv import util
conf = util.load_json("asv.conf.json", js_comments=True)
conf.update(repo=sys.argv[1], branches=[sys.argv[4]], benchmark_dir=sys.argv[2] + "/benchmarks",
            results_dir=sys.argv[3] + "/results", html_dir=sys.argv[3] + "/html")
open(sys.argv[3] + "/asv.conf.json", "w").write(json.dumps(conf, indent=1))' \
    "$repo" "$PWD" "$PWD/$dir" "$(git -C "$repo" rev-parse --abbrev-ref HEAD)" || return 1
  machine=$(python3 scripts/asv_machine.py 2> "$OUT/logs/asv-machine.log") || { FAILED+=(asv); return 1; }
  # the benchmark processes drop PYTHONPATH and put ASV_PYTHONPATH on sys.path: this tree and the wheel parts
  ASV_PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" run_step asv python3 -m asv run --config "$dir/asv.conf.json" \
    -E "existing:$(command -v python3)" --machine "$machine" --set-commit-hash "$sha" --record-samples \
    --show-stderr --durations 10 &&
    run_step asv-publish python3 -m asv publish --config "$dir/asv.conf.json" &&
    write_meta "$dir" "asv run --machine $machine (KDA_ASV_PROFILE=${KDA_ASV_PROFILE:-full}); asv publish"
}

step_pytest-gpu() {
  local dir=$RES/pytest-gpu
  fresh "$dir"; mkdir -p "$dir"
  run_step pytest-gpu python3 -m pytest -q -m gpu --junitxml "$dir/junit.xml"
  write_meta "$dir" "python3 -m pytest -q -m gpu"
}

[ $# -gt 0 ] || { sed -n '2,/^set /p' "$0" | grep '^#'; exit 2; }
for name in "$@"; do  # every step checked before any runs: a typo costs no GPU time, and nothing is lost
  if ! declare -F "step_$name" > /dev/null; then
    echo "gpu-checks.sh: unknown step '$name' (expected one of: install grid targets cupti asv nvbench pytest-gpu)"
    exit 2
  fi
  if [ -e "$RES/$name" ] && [ "${RESUME:-0}" != 1 ] && git rev-parse --git-dir > /dev/null 2>&1; then
    echo "gpu-checks.sh: step $name would replace $RES/$name of this checkout (expected: the box's copy of the tree," \
      "or RESUME=1); move it away first"
    exit 2
  fi
done
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-checks.sh: the GPU checks need a CUDA GPU (expected nvidia-smi to list one; it lists none here)"
  exit 2
fi
echo "tree of commit ${KDA_GIT_SHA:-unstated}; $(nvidia-smi -L 2> /dev/null | wc -l) GPU(s)"
for name in "$@"; do
  environment
  "step_$name"
  DONE+=("$name")
done
dirs=$(for name in "${DONE[@]}"; do [ -d "$RES/$name" ] && echo "$RES/$name"; done)
[ -n "$dirs" ] && tar -czf "$OUT/results.tgz" --exclude=rows $dirs
if [ ${#FAILED[@]} -gt 0 ]; then echo "failed: ${FAILED[*]}"; exit 1; fi
echo "every step exited 0: ${DONE[*]}"
