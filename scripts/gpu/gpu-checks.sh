#!/usr/bin/env bash
# The GPU checks, run on a CUDA GPU machine from the repository root (scripts/README.md):
#
#   bash scripts/gpu/gpu-checks.sh [--wheelhouse DIR] STEP [STEP ...]
#
# Steps, in the order a fresh machine runs them:
#   install     pip install -e ".[test,fla,flashinfer,nvbench,sglang]" and SGLang without its dependencies
#               (from PyPI, or only from DIR with --wheelhouse)
#   grid        the GPU correctness grid, every implementation (scripts.gpu.gpu_correctness)
#   targets     the targets preset on every visible GPU, then our kernel's targets judged (targets.md)
#   frozen-verify  frozen verify (T 2/4/8, B 16/64/256) of ours beside FlashInfer's two fastest calls, judged
#   spec-step   the speculative step both ways (B 16/64/256), ours beside FlashInfer's two fastest calls:
#               spec-step.md (kda-spec-step)
#   replay      replay (ring 16, B 16/64/256) of ours and SGLang's ReplaySSM beside our in-place step, judged
#   published   the published preset's shapes, every library's fastest calls, SGLang's among them, and the
#               engines report (engines.md: the fastest in-place decode and replay step per point)
#   ab          kda-ab proven: an A/A pair passes, a planted 6% copy in one side is slower (kda_impls.perfci.prove)
#   cupti       CUPTI's second clock on the targets run's unpadded rows (after `targets`)
#   asv         one asv run of the suite (KDA_ASV_PROFILE, default full), published as HTML
#   nvbench     NVIDIA's nvbench beside the harness on the unpadded B >= 16 targets rows of four implementations
#   pytest-gpu  the tests marked gpu (python3 -m pytest -m gpu)
#
# Each step writes its results to results/<gpu>/STEP/ (RES; <gpu> from python3 -m scripts.gpu.gpu_name,
# e.g. h200 or h100-80gb-hbm3; each folder with a meta.json: commit, GPU, command) and its log to
# $OUT/logs/STEP.log (OUT, default gpu-checks-out/). A step whose folder exists is refused before any
# step runs, unless RESUME=1: then a sweep cut short resumes from its rows. KDA_GIT_SHA names the commit
# in every meta.json where the tree has no git history. LIMIT_S (default 540) bounds each step.
# Exit status: 0 when every step exited 0, 1 when one failed (named in the summary), 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/../.."
STEPS="install grid targets frozen-verify spec-step replay published ab cupti asv nvbench pytest-gpu"
WHEELHOUSE=
if [ "${1:-}" = --wheelhouse ]; then
  [ -d "${2:-}" ] || { echo "gpu-checks.sh: --wheelhouse needs a folder of wheels (got '${2:-}')"; exit 2; }
  WHEELHOUSE=$(cd "$2" && pwd); shift 2
fi
[ $# -gt 0 ] || { sed -n '2,/^set /p' "$0" | grep '^#'; exit 2; }
for name in "$@"; do  # every step checked before any runs: a typo costs no GPU time
  case " $STEPS " in *" $name "*) ;; *)
    echo "gpu-checks.sh: unknown step '$name' (expected one of: $STEPS)"; exit 2 ;;
  esac
done
refuse_replacing() {  # nothing a user did not ask to replace is lost
  local name
  for name in "$@"; do
    if [ "$name" != install ] && [ -e "$RES/$name" ] && [ "${RESUME:-0}" != 1 ]; then
      echo "gpu-checks.sh: step $name would replace $RES/$name (expected a new folder, or RESUME=1); move it away first"
      exit 2
    fi
  done
}
[ -z "${RES:-}" ] || refuse_replacing "$@"
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-checks.sh: the GPU checks need a CUDA GPU (expected nvidia-smi to list one; it lists none here)"
  exit 2
fi
OUT=${OUT:-$PWD/gpu-checks-out}
# this tree's package and scripts, whatever else is installed; NVLink multicast stays off
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

write_meta() {  # write_meta DIR COMMAND: DIR/meta.json as the harness writes it (kda_impls.bench.results)
  python3 -c 'import sys, torch; from pathlib import Path
from kda_impls.bench.results import environment, write_meta
write_meta(Path(sys.argv[1]), environment(torch.device("cuda"), Path(sys.argv[1]), sys.argv[2]))' "$1" "$2"
}

step_install() {
  local index=()
  [ -n "$WHEELHOUSE" ] && index=(--no-index --find-links "$WHEELHOUSE")
  # SGLang pins its own torch and serving stack; its kernel files need none of them
  run_step install python3 -m pip install "${index[@]}" -e ".[test,fla,flashinfer,nvbench,sglang]" &&
    run_step install-sglang python3 -m pip install "${index[@]}" --no-deps sglang==0.5.23
}

step_grid() {
  run_step grid python3 -m scripts.gpu.gpu_correctness --out "$RES/grid"
}

step_targets() {
  run_step targets python3 -m kda_impls.bench.sweep --preset targets --out "$RES/targets" &&
    run_step targets-judged python3 -m scripts.reports.targets "$RES/targets"
}

judge_modes() {  # judge_modes DIR: mode-targets.md beside the run; a missed target is a finding, not a failure
  local name status
  name=$(basename "$1")
  python3 -m scripts.reports.mode_targets "$1" > "$OUT/logs/$name-judged.log" 2>&1
  status=$?
  echo "== $name judged: $1/mode-targets.md (mode_targets exit $status: 1 where a target is missed)"
}

step_frozen-verify() {
  run_step frozen-verify python3 -m kda_impls.bench.sweep --preset frozen-verify --T 2,4,8 --B 16,64,256 \
    --impls triton,flashinfer,flashinfer-loggate-sigmoid --mode frozen --no-charts --out "$RES/frozen-verify"
  judge_modes "$RES/frozen-verify"  # a wrong row fails the step; the rows that are ok are judged all the same
}

step_spec-step() {
  run_step spec-step python3 -m kda_impls.bench.sweep --preset spec-step --B 16,64,256 \
    --impls triton,flashinfer,flashinfer-loggate-sigmoid --no-charts --out "$RES/spec-step" &&
    run_step spec-step-report sh -c 'python3 -m kda_impls.bench.spec_step "$1" > "$1/spec-step.md"' sh "$RES/spec-step"
}

step_replay() {
  run_step replay python3 -m kda_impls.bench.sweep --preset replay --ring 16 --B 16,64,256 \
    --impls triton,sglang-replayssm --no-charts --out "$RES/replay"
  judge_modes "$RES/replay"
}

step_published() {  # the engines report takes the replay run too where it is there
  local replay=()
  [ -f "$RES/replay/results.csv" ] && replay=("$RES/replay")
  run_step published python3 -m kda_impls.bench.sweep --preset published --impls \
    triton,sglang-cutedsl,sglang-triton,flashinfer,flashinfer-loggate-sigmoid,fla-batched,fla-loggate-sigmoid \
    --out "$RES/published"
  run_step published-engines python3 -m scripts.reports.engines "$RES/published" "${replay[@]}"
}

step_ab() {
  run_step ab python3 -m kda_impls.perfci.prove "$RES/ab" --impls triton,fla
}

needs_targets() {  # needs_targets STEP: the targets run is there, or STEP fails with one line
  [ -f "$RES/targets/results.csv" ] && return 0
  echo "== $1: needs $RES/targets/results.csv (run the targets step first)"
  FAILED+=("$1"); return 1
}

step_cupti() {
  needs_targets cupti &&
    run_step cupti python3 -m scripts.crosscheck.cupti_crosscheck "$RES/targets" --unpadded-only --calls 20 \
      --out "$RES/cupti"
}

step_nvbench() {  # nvbench's stopping rule at the script's defaults, chosen so that rows settle
  needs_targets nvbench &&
    run_step nvbench python3 -m scripts.crosscheck.nvbench_crosscheck "$RES/targets" --unpadded-only \
      --out "$RES/nvbench" --impls triton,fla-batched,flashinfer,flashinfer-loggate-sigmoid --B 16,64,256 --trace
}

step_asv() {  # asv files results under a commit of a git repository: this tree's, or a scratch one's
  local dir=$RES/asv repo=$PWD sha machine
  mkdir -p "$dir"
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
  machine=$(python3 -m kda_impls.asv_machine 2> "$OUT/logs/asv-machine.log") || { FAILED+=(asv); return 1; }
  # the benchmark processes drop PYTHONPATH and put ASV_PYTHONPATH on sys.path: this tree
  ASV_PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" run_step asv python3 -m asv run --config "$dir/asv.conf.json" \
    -E "existing:$(command -v python3)" --machine "$machine" --set-commit-hash "$sha" --record-samples \
    --show-stderr --durations 10 &&
    run_step asv-publish python3 -m asv publish --config "$dir/asv.conf.json" &&
    write_meta "$dir" "asv run --machine $machine (KDA_ASV_PROFILE=${KDA_ASV_PROFILE:-full}); asv publish"
}

step_pytest-gpu() {
  local dir=$RES/pytest-gpu
  mkdir -p "$dir"
  run_step pytest-gpu python3 -m pytest -q -m gpu --junitxml "$dir/junit.xml"
  write_meta "$dir" "python3 -m pytest -q -m gpu"
}

mkdir -p "$OUT/logs"
if [ "$1" = install ]; then  # before the GPU's name can be read: torch may not be installed yet
  step_install || { echo "failed: install"; exit 1; }
  DONE+=(install); shift
fi
[ $# -gt 0 ] || { echo "every step exited 0: ${DONE[*]}"; exit 0; }
if [ -z "${RES:-}" ]; then
  GPU=$(python3 -m scripts.gpu.gpu_name) || { echo "gpu-checks.sh: torch sees no CUDA GPU (run the install step)"; exit 2; }
  RES=results/$GPU
fi
refuse_replacing "$@"
echo "commit ${KDA_GIT_SHA:-$(git rev-parse HEAD 2> /dev/null || echo unstated)}; $(nvidia-smi -L | wc -l) GPU(s); results in $RES"
for name in "$@"; do
  "step_$name"
  DONE+=("$name")
done
if [ ${#FAILED[@]} -gt 0 ]; then echo "failed: ${FAILED[*]}"; exit 1; fi
echo "every step exited 0: ${DONE[*]}"
