#!/usr/bin/env bash
# The H200 measurements committed under results/h200/, in the steps a lent GPU box runs them.
# Each step is one call of the device tool from the repo root, from a clean tree, with
# KDA_GIT_SHA=<HEAD> KDA_GIT_DIRTY=0 set in the command (the box gets the tree without its history,
# or with a stale .git) and carrying the wheelhouse part the step names (../shared/gpu/build-wheelhouse;
# a fresh box first takes part1 alone: `bash .gpu/part1/install.sh`):
#
#   scripts/h200_run.sh checks    # carry .gpu/part1: Triton GPU tests, compute-sanitizer
#   scripts/h200_run.sh sweeps    # carry .gpu/part2: correctness grid, kimi-linear-48b, targets, shapes
#   scripts/h200_run.sh published # carry .gpu/part2: correctness grid, the published table's shapes
#                                 # under three pool layouts (four runs), compared with results/published/
#   scripts/h200_run.sh asv       # asv A/A + planted slowdown + publish (after sweeps or published, same
#                                 # machine). Each asv run of the quick profile takes ~4 min, so a call
#                                 # makes ASV_RUNS of them (default 1) and the next call resumes: three calls
#
# Logs and a tarball of each step's result directories land in $OUT (default ./h200-out); unpack
# the tarball into results/h200/ and commit. Steps are bounded by `timeout` so that a slow one
# cannot take the rest down with it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/h200-out}
RES=${RES:-/root/h200-results}
mkdir -p "$OUT" "$RES"
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, print its last lines
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? ($(date -u +%T))"
  grep -v -e 'row/s' -e 's/row' -e 'it/s' "$OUT/$name.log" | tail -n "${TAIL:-6}"
}
pack() {  # the results so far, without the per-row files a resume reads
  tar -C "$(dirname "$RES")" -czf "$OUT/results.tgz" --exclude=rows "$(basename "$RES")"
}
echo "tree of commit ${KDA_GIT_SHA:-unstated} (set KDA_GIT_SHA: a .git copied here may be stale)"
git status --short 2>/dev/null | head -5

case ${1:-} in
  checks)
    bash .gpu/part1/install.sh > "$OUT/install.log" 2>&1
    step pytest-triton 150 python3 -m pytest -q tests/test_triton.py
    step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 99 python3 scripts/sanitize_triton.py
    step racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 99 python3 scripts/sanitize_triton.py
    ;;
  sweeps)
    bash .gpu/part2/install.sh > "$OUT/install.log" 2>&1
    source /root/gpu-site/env.sh
    step correctness 170 python3 scripts/gpu_correctness.py --impls triton,fla,flashinfer --out "$RES/correctness"
    pack
    TAIL=3 step kimi 110 python3 scripts/sweep.py --preset kimi-linear-48b --out "$RES/kimi-linear-48b"
    pack
    TAIL=2 step targets 130 python3 scripts/sweep.py --preset targets --impls triton,flashinfer,fla --out "$RES/targets"
    step targets-report 30 python3 scripts/targets.py "$RES/targets"
    pack
    TAIL=2 step single-pool 50 python3 scripts/sweep.py --preset kimi-linear-48b --impls triton,flashinfer --l2-hot \
      --out "$RES/kimi-linear-48b-single-pool"
    pack
    TAIL=2 step shapes 150 python3 scripts/sweep.py --preset shapes --impls triton,flashinfer,fla --out "$RES/shapes"
    pack
    ;;
  published)
    bash .gpu/part2/install.sh > "$OUT/install.log" 2>&1
    source /root/gpu-site/env.sh
    step correctness 170 python3 scripts/gpu_correctness.py --impls triton,fla,flashinfer --out "$RES/correctness"
    pack
    # NAME:SWEEP-OPTIONS; the repeated layout gives the run-to-run spread the comparison judges by
    for layout in dense-random-1: dense-random-2: dense-sorted:--sorted-slots pool2x-random:--pool-slots-per-row=2; do
      TAIL=2 step "published-${layout%%:*}" 100 python3 scripts/sweep.py --preset published \
        --impls triton,flashinfer,fla --no-charts ${layout#*:} --out "$RES/published/${layout%%:*}"
      pack
    done
    TAIL=12 step compare 30 python3 scripts/compare_published.py results/published/triton-issue-h200.csv \
      "$RES"/published/*/ --out "$RES/published"
    pack
    ;;
  asv)
    source /root/gpu-site/env.sh
    step asv-validate 590 python3 scripts/asv_validate.py "$RES/asv-validation" --max-runs "${ASV_RUNS:-1}"
    tar -C "$RES" -czf "$OUT/asv.tgz" --exclude=html --exclude=scratch-repo asv-validation
    ;;
  *)
    echo "usage: $0 checks|sweeps|published|asv" >&2; exit 2 ;;
esac
