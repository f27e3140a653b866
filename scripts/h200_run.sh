#!/usr/bin/env bash
# The H200 measurements committed under results/h200/, in the steps a lent two-GPU H200 box
# (nvidia-h200-x2) runs them. Each step is one call of the device tool from the repo root, from a
# clean tree, with KDA_GIT_SHA=<HEAD> KDA_GIT_DIRTY=0 set in the command (the box gets the tree
# without its history), carrying the wheelhouse part it names (../shared/gpu/build-wheelhouse).
# Steps after `go` need the box still warm from the one before (the packages stay installed there).
# A call carries the tracked tree with the wheelhouse part, 64 MiB in all: with part 2 (~44 MB) the
# tree (~25 MB with results/h200) is too large, so move results/h200 aside for such a call, keeping
# the tune CSVs `validate_gate.py planted` reads (`validate_gate.TUNE_CSVS`: triton-tune-v3/,
# triton-tune-subtiles/, triton-tune-eviction-tiles/).
# A wheelhouse that holds two versions of one wheel (platformdirs, 2026-11-30) fails part 2's install
# (pip: ResolutionImpossible): delete the older from .gpu/part1 and, on the box, from /root/gpu-stage.
#
#   scripts/h200_run.sh sanity     # carry .gpu/part1: stage part 1; the harness's GPU tests (timers,
#                                  # entry ops, CUPTI, NVML), a tiny sweep, its CUPTI cross-check and a
#                                  # tiny L2 study, on GPU 0 (torch and Triton only: part 2 is not there)
#   scripts/h200_run.sh go         # carry .gpu/part2: install; GPU 1: the correctness grid (every
#                                  # implementation); GPU 0: the L2 entry-state study, the GPU tests,
#                                  # spec-decode and kimi-linear-48b
#   scripts/h200_run.sh published  # GPU 0: the published preset three times (separate processes;
#                                  # RUNS="a1 a2" then RUNS=a3 ASV=0 splits them over two calls);
#                                  # GPU 1 meanwhile: the asv-form gate validation (3 A/A runs + planted)
#   scripts/h200_run.sh published-check  # GPU 0: the published preset once with the planted Triton
#                                  # slowdown, the sweep-form gate, the published comparison, run to
#                                  # run, the estimators' report and kimi-linear-48b (its wall time);
#                                  # GPU 1: CUPTI on the first run (and on targets/)
#   The same in lanes beside the published runs (one call each, GPU 1 beside GPU 0's run):
#     call 1 (part 2): published RUNS=a1 ASV=0, targets-lane on GPU 1
#     call 2: published RUNS=a2 ASV=0, crosscheck-lane on GPU 1
#     call 3: published RUNS=a3 ASV=0 then slow-lane, kimi-lane on GPU 1
#     then `RES=<unpacked results> scripts/h200_run.sh analysis` on the CPU
#   scripts/h200_run.sh targets    # (carry .gpu/part2 on a box that has only part 1: it is installed
#                                  # first) the targets preset on both GPUs, from a cold Triton cache
#   scripts/h200_run.sh targets-lane # the targets preset on one GPU beside published (resumable)
#   scripts/h200_run.sh targets-one  # the same on GPU 0 alone (its own cold cache) while GPU 1 runs
#                                  # the fla and FlashInfer GPU tests and cross-checks the two-GPU run
#                                  # with CUPTI (the multi-GPU proof: wall times and per-row agreement)
#
# After a kernel change, on a fresh box (the steps of 2026-11-30, second session):
#
#   scripts/h200_run.sh check      # carry .gpu/part1: install part 1; GPU 0: our kernel's GPU tests and
#                                  # the harness's; GPU 1: our kernel's share of the correctness grid
#   scripts/h200_run.sh targets    # as above, then targets-one
#   scripts/h200_run.sh placements # (after targets) fla's and our rows that moved between processes, three
#                                  # sweeps with placements freed in turn (GPU 0) and three disjoint (GPU 1)
#   scripts/h200_run.sh placement-cost  # nine placements a row, freed against held: what holding costs
#   scripts/h200_run.sh wide-rows  # fla's widest-spread rows and ours, three sweeps: run to run
#   scripts/h200_run.sh triton-targets  # our kernel alone over the targets preset, the table as committed
#   scripts/h200_run.sh first-placement  # what our kernel's slow first placement follows (bare box)
#   scripts/h200_run.sh replay     # the harness's GPU tests; CUPTI inside the harness's pass (fla, ours,
#                                  # B = 16 and 64 of published/a1)
#   scripts/h200_run.sh settle     # our kernel over the targets preset with --settle 1 (bare box)
#   scripts/h200_run.sh state-order  # our kernel alone, the table against every entry state-first (~2 min)
#   scripts/h200_run.sh spec       # spec-decode again (the multi-token tiles); FlashInfer's dense call
#                                  # in its own benchmark's configuration (published preset, sorted slots)
#   scripts/h200_run.sh profile    # (a bare one-GPU box will do: torch and Triton only) Nsight Compute
#                                  # counters of our kernel beside a copy; memcheck of every tile form;
#                                  # the CUPTI test
#   scripts/h200_run.sh tune       # (a bare one-GPU box will do) every one-token candidate, every
#                                  # shape, with and without the head counts compiled in (~8 min);
#   scripts/h200_run.sh tune-multitoken  # then the multi-token shapes; regenerate the table with
#                                  # --write-table from the CSVs
#
# The tenth session's (each a bare box, but the last, which needs part 2 installed):
#
#   scripts/h200_run.sh tma        # two GPUs: the TMA form against the table; sanitizers on every form
#   scripts/h200_run.sh slots-ahead  # the same for the persistent form looking ahead only at the slots
#   scripts/h200_run.sh placement-noise  # our placement spread against the timer's own (placement_noise.py)
#   scripts/h200_run.sh placement-noise-libraries  # the same for fla and FlashInfer beside ours
#
# The eleventh session's (bare two-GPU boxes):
#
#   scripts/h200_run.sh eviction   # the table without the state's evict-first hints, against the table
#   scripts/h200_run.sh placement-noise-eviction  # placement_noise.py on the table with and without them
#   scripts/h200_run.sh placement-noise-hints  # the same at six rows, each hint dropped alone and both
#   RUN=hints-fp32 ROWS=float32:16:64:256,... scripts/h200_run.sh placement-noise-hints  # other rows
#   scripts/h200_run.sh eviction-tiles  # other tiles without the hints, against the table at B = 64 and 256
#   scripts/h200_run.sh ncu-b1     # (after part 2 is installed) Nsight Compute on our B = 1 step and
#                                  # FlashInfer's at three bf16 shapes
#   scripts/h200_run.sh b1-warps   # (bare two-GPU box) B = 1 in FlashInfer's launch shape (ncu-b1: fewer
#                                  # programs of 2-4 warps), BV = 8 rows a warp, each state order, against the table
#   OLD_KERNEL=old_triton_kda.py scripts/h200_run.sh fast-gate  # (bare box) the base-2 gate against the
#                                  # kernel before it at B = 1, after the new kernel's GPU tests
#   scripts/h200_run.sh b1-eight-rows  # (bare box) bf16 B = 1: 8- and 16-row base-2 tiles under a register cap
#   scripts/h200_run.sh tiled-inputs  # (bare box) the small inputs as tiles (tiled_inputs=1) over the table, bf16 B = 1-64
#   scripts/h200_run.sh ncu-b1-ours    # (bare box) our kernel's B = 1 cases of ncu-b1 on the table as it is
#   scripts/h200_run.sh fast-gate-tiles  # (bare box) fast_gate=1 tiles at B = 1 and 16 over the table
#   SWEEP=results/h200/targets-<sha> scripts/h200_run.sh cupti-triton  # (bare one-GPU box) CUPTI on our
#                                  # kernel's unpadded rows of a committed targets run at B = 64 and 256
#
# The fourteenth session's (bare one-GPU boxes):
#
#   (k-groups, k-groups-large: the tile viewed in K groups over the table, bf16 B = 1-256; the form is
#   gone, its steps with it: git show b602e3f:scripts/h200_run.sh)
#   scripts/h200_run.sh settle-idles  # how long after a hand-back the slow first placement lasts
#   scripts/h200_run.sh settled    # with the default settle since: the first placements, our kernel over targets
#
# The fifteenth session's (bare one-GPU boxes):
#
#   scripts/h200_run.sh aa-settled  # the gate on settling sweeps: our kernel over targets three times and
#                                  # once planted slower, one box, then validate_gate.py sweep (~6 min)
#   scripts/h200_run.sh ceiling-cold  # the memory ceiling at the sweeps' L2 entry state, every bandwidth row's shape
#   scripts/h200_run.sh fast-gate-large  # the base-2 gate over the table at B = 64 and 256 (~1 min)
#   scripts/h200_run.sh fast-gate-table  # the table with its entries: GPU tests, correctness grid, our kernel over targets
#   scripts/h200_run.sh fast-gate-k64  # the base-2 gate on other tiles at K = V = 64, B = 64 and 256
#   SWEEP=<run> scripts/h200_run.sh fast-gate-k128  # CUPTI on SWEEP; the same search at K = V = 128
#   scripts/h200_run.sh near-misses  # more variants at the three bandwidth rows within 0.3 points of their target
#
# The sixteenth session's (two calls after the installs; the run resumes where the first stopped):
#
#   RUN_LIMIT=420 TARGETS_DIR=targets scripts/h200_run.sh targets-lane  # every library over targets, then again
#   SWEEP=$RES/targets scripts/h200_run.sh targets-cupti  # CUPTI on its B = 1, 64 and 256 rows
#   TAG=<sha> scripts/h200_run.sh ceiling-latency  # (after part 2) the B = 1 and 16 ceiling on the table as it is
#   scripts/h200_run.sh grid-triton  # our kernel's correctness grid on the table as committed
#   scripts/h200_run.sh b1-warps-tiled  # bf16 B = 1: multi-warp programs with the small inputs as tiles, over the table
#   scripts/h200_run.sh b1-targets  # (after part 2) the new B = 1 entries against every library; grid; sanitizers
#
# The seventeenth session's:
#
#   scripts/h200_run.sh pad-cost  # the one padding miss's rows in six processes each, stores hinted and not
#   ROWS=<the placement misses> RUN=hints-<sha> scripts/h200_run.sh placement-noise-hints  # their hints
#
# ENTRY=<state> overrides the L2 entry state of the sweeps (default: the harness's default). Logs
# and every result directory go into a tarball in $OUT (default
# ./h200-out; the device tool returns at most 8 files): unpack it into results/h200/ and commit.
# Steps are bounded by `timeout` so that a slow one cannot take the rest down with it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/h200-out}
# A box can keep an earlier session's /root: results go under the commit's name, so that no run
# resumes rows another commit measured
RES=${RES:-/root/h200-results-${KDA_GIT_SHA:-unstated}}
LOGS=$RES/logs
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

step() {  # step NAME SECONDS COMMAND...: run, log to $LOGS/NAME.log, print its last lines
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  echo "== $name: exit $? ($((SECONDS - start)) s, $(date -u +%T))"
  grep -v -e 'row/s' -e 's/row' -e 'it/s' "$LOGS/$name.log" | tail -n "${TAIL:-4}"
}
background() {  # background NAME GPU SECONDS COMMAND...: the same on GPU number GPU alone, in the background
  local name=$1 gpu=$2 limit=$3; shift 3
  ( export CUDA_VISIBLE_DEVICES=$gpu; step "$name" "$limit" "$@" ) > "$LOGS/$name.summary" 2>&1 &
}
# A step's one-GPU commands run on GPU 0, or on the one CUDA_VISIBLE_DEVICES names: a step on GPU 1
# beside one on GPU 0 in the same call, its tarball in an OUT of its own (results land in one RES,
# where published-check finds the lane's targets/):
#   CUDA_VISIBLE_DEVICES=1 OUT=$OUT/gpu1 bash scripts/h200_run.sh targets-lane &
ON_GPU="env CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}"
pack() {  # the results so far, without the per-row files a resume reads
  tar -C "$(dirname "$RES")" -czf "$OUT/results.tgz" --exclude=rows --exclude=html --exclude=scratch-repo --exclude="triton-cache-*" \
    "$(basename "$RES")"
}
entry() {  # the L2 entry state of the sweeps: $ENTRY, else the harness's default
  python3 -c "import os; from kda_impls.bench.timing import DEFAULT_ENTRY as d; print(os.environ.get('ENTRY') or d)"
}

# The steps after the published runs. SWEEP_ARGS as the published runs had them (the gate compares
# only sweeps timed alike)
crosscheck() {  # CUPTI on the first published run, then on the targets run a lane made, if there is one
  step cupti-published 200 python3 scripts/cupti_crosscheck.py "$RES/published/a1" --out "$RES/cupti/published" \
    --calls 20
  if [ -d "$RES/targets" ]; then
    step cupti-targets 300 python3 scripts/cupti_crosscheck.py "$RES/targets" --unpadded-only \
      --out "$RES/cupti/targets" --calls 20
  fi
}
planted_config() {  # the planted slowdown's config (validate_gate.py planted; its ratios go to the log), or a
  # failure where it prints none (a run with an empty KDA_TRITON_CONFIG would time the table)
  local config
  config=$(python3 scripts/validate_gate.py planted 2>> "$LOGS/planted.log") && [ -n "$config" ] && echo "$config"
}
planted_slowdown() {  # a Triton tile config the tune CSV shows 5-10% slower (validate_gate.py planted)
  local planted
  planted=$(planted_config) || { echo "== published-slow: no planted config ($LOGS/planted.log)"; return 1; }
  TAIL=1 step published-slow 150 env KDA_TRITON_CONFIG="$planted" python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" \
    --preset published --devices cuda:0 --impls triton ${SWEEP_ARGS:-} --out "$RES/published/slow"
}
analysis() {
  TAIL=3 step gate-sweep 60 python3 scripts/validate_gate.py sweep "$RES/gate-sweep" "$RES"/published/a{1,2,3} \
    "$RES/published/slow"
  TAIL=3 step compare 60 python3 scripts/compare_published.py results/published/triton-issue-h200.csv \
    "$RES"/published/a{1,2,3} --out "$RES/published"
  TAIL=12 step run-to-run 30 python3 scripts/run_to_run.py "$RES"/published/a{1,2,3} --out "$RES/published/run_to_run.md"
  TAIL=3 step estimators 60 python3 scripts/placement_estimators.py "$RES"/published/a{1,2,3} \
    --out "$RES/published/estimators.md"
}
over_table() {  # over_table STEP SECONDS BATCHES DTYPE VARIANTS OUT: the tabled config against VARIANTS
  # (--over-table) at BATCHES of every targets shape, one state dtype, on this step's GPU, into OUT (a CSV)
  TAIL=2 step "$1" "$2" $ON_GPU python3 scripts/triton_tune.py --value-heads 16,32,64 --head-dims 128x128,64x64 \
    --batches "$3" --state-dtypes "$4" --budget-s $(($2 - 50)) --over-table "$5" --out "$6"
}
sanitizers() {  # sanitizers SECONDS: memcheck, then racecheck, on every kernel form, on this step's GPU
  local tool
  for tool in memcheck racecheck; do
    TAIL=3 step "$tool" "$1" $ON_GPU compute-sanitizer --tool "$tool" --error-exitcode 99 python3 scripts/sanitize_triton.py
  done
}
over_table_both_gpus() {  # over_table_both_gpus NAME BATCHES VARIANTS: the tabled config against VARIANTS
  # (--over-table) at BATCHES of every targets shape, into triton-tune-NAME/: bf16 on GPU 0;
  # compute-sanitizer on every kernel form, then fp32, on GPU 1
  ( ON_GPU="env CUDA_VISIBLE_DEVICES=1"
    sanitizers 100
    over_table "tune-$1-fp32" 350 "$2" float32 "$3" "$RES/triton-tune-$1/fp32/triton_tune.csv" ) > "$LOGS/gpu1.summary" 2>&1 &
  over_table "tune-$1-bf16" 550 "$2" bfloat16 "$3" "$RES/triton-tune-$1/bf16/triton_tune.csv"
  wait; cat "$LOGS/gpu1.summary"
}
first_placements() {  # first_placements DIR PREFIX BF16_HV SECONDS OPTIONS...: first_placement.py with OPTIONS,
  # two processes each for bf16 at HV=BF16_HV and fp32 at HV=64, K=V=128 B=256, on this step's GPU, into $RES/DIR/
  local dir=$1 prefix=$2 hv=$3 limit=$4 run shape name; shift 4
  for run in 1 2; do
    for shape in "--HV $hv --state-dtype bfloat16" "--HV 64 --state-dtype float32"; do
      name="$prefix-$run-$(echo "$shape" | tr -d ' -')"
      TAIL=12 step "$name" "$limit" $ON_GPU python3 scripts/first_placement.py $shape "$@" --out "$RES/$dir/$name.md"
    done
  done
}
fast_gate_search() {  # fast_gate_search NAME D CHANGE...: the base-2 gate with its head counts compiled in and each
  # CHANGE, over the table at B = 64 and 256 of every targets shape with K = V = D, both dtypes, into triton-tune-NAME/
  local name=$1 d=$2 change dtype variants=""; shift 2
  for change in "$@"; do variants="$variants;fast_gate=1,const_heads=1,$change"; done
  for dtype in bfloat16 float32; do
    TAIL=2 step "tune-$name-$dtype" 200 $ON_GPU python3 scripts/triton_tune.py --value-heads 16,32,64 \
      --head-dims "${d}x$d" --batches 64,256 --state-dtypes "$dtype" --budget-s 150 --over-table "${variants#;}" \
      --out "$RES/triton-tune-$name/$dtype/triton_tune.csv"
  done
}
cupti_sweep() {  # cupti_sweep NAME IMPLS BATCHES: CUPTI's second clock on SWEEP's unpadded rows of IMPLS at
  # BATCHES, the harness's own graph pass profiled too, into cupti/<SWEEP's name><NAME>/
  TAIL=12 step "cupti${1:--triton}" 300 $ON_GPU python3 scripts/cupti_crosscheck.py "$SWEEP" --unpadded-only --impls "$2" \
    --B "$3" --calls 20 --replay --out "$RES/cupti/$(basename "$SWEEP")$1"
}
triton_grid() {  # triton_grid [NAME]: our kernel's H200 correctness grid on the table as committed, into
  # correctness-triton-<NAME, else the commit>/
  TAIL=8 step correctness-triton 200 $ON_GPU python3 scripts/gpu_correctness.py --impls triton \
    --out "$RES/correctness-triton-${1:-${KDA_GIT_SHA:-unstated}}"
}
triton_gpu_tests() {  # our kernel's GPU tests, one-token and multi-token
  TAIL=3 step pytest-triton 300 $ON_GPU python3 -m pytest -q -m gpu tests/test_triton.py tests/test_triton_multitoken.py
}
hints_noise() {  # hints_noise RUN NAME GPU CONFIG: placement_noise.py at $rows under KDA_TRITON_CONFIG=CONFIG
  # on GPU number GPU, into placement-noise-RUN/NAME-gpuGPU
  TAIL=8 step "placement-noise-$2-gpu$3" 280 env CUDA_VISIBLE_DEVICES=$3 KDA_TRITON_CONFIG="$4" python3 scripts/placement_noise.py \
    --settle 2 --out "$RES/placement-noise-$1/$2-gpu$3" --rows $rows
}
kimi_cost() {  # what the method costs on the preset with the 60 s target (docs/timing.md, "What it costs")
  TAIL=2 step kimi 420 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset kimi-linear-48b --devices cuda:0 \
    --impls naive,triton,fla,flashinfer ${SWEEP_ARGS:-} --out "$RES/kimi-linear-48b"
}

echo "tree of commit ${KDA_GIT_SHA:-unstated}; $(nvidia-smi -L | wc -l) GPU(s)"
case ${1:-} in
  sanity)
    bash .gpu/part1/install.sh > "$LOGS/install1.log" 2>&1
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv
    TAIL=12 step gpu-bench 200 $ON_GPU python3 -m pytest -q -m gpu tests/test_bench.py
    TAIL=12 step tiny-sweep 120 python3 scripts/sweep.py --devices cuda:0 --impls naive,triton --B 1,64 --HV 32 \
      --state-dtype bf16,fp32 --placements 2 --out "$RES/sanity/sweep"
    TAIL=6 step tiny-cupti 120 $ON_GPU python3 scripts/cupti_crosscheck.py "$RES/sanity/sweep" --out "$RES/sanity/cupti"
    TAIL=6 step tiny-l2 120 $ON_GPU python3 scripts/l2_entry_study.py --impls triton --batches 64 --state-dtypes bfloat16 \
      --out "$RES/sanity/l2-entry"
    pack
    ;;
  go)
    bash .gpu/part2/install.sh > "$LOGS/install2.log" 2>&1; tail -n 1 "$LOGS/install2.log"
    source /root/gpu-site/env.sh
    background correctness 1 520 python3 scripts/gpu_correctness.py --out "$RES/correctness"
    TAIL=3 step l2-entry 200 $ON_GPU python3 scripts/l2_entry_study.py --out "$RES/l2-entry" \
      --impls triton,fla,fla-loggate-sigmoid,flashinfer,flashinfer-sigmoid,flashinfer-loggate-sigmoid
    echo "L2 entry state of the sweeps: $(entry) (the study's closest: $(sed -n 's/^closest: //p' "$LOGS/l2-entry.log"))"
    TAIL=3 step pytest-gpu 240 $ON_GPU python3 -m pytest -q -m gpu tests/test_triton_multitoken.py \
      tests/test_multitoken.py tests/test_fla_multitoken.py tests/test_flashinfer_multitoken.py tests/test_variants.py \
      tests/test_flashinfer.py tests/test_fla.py
    TAIL=2 step spec-decode 150 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset spec-decode --devices cuda:0 \
      --impls triton,fla,fla-loggate-sigmoid,flashinfer-sigmoid,flashinfer-loggate-sigmoid --out "$RES/spec-decode"
    TAIL=2 step kimi 150 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset kimi-linear-48b --devices cuda:0 --impls naive,triton,fla,flashinfer \
      --out "$RES/kimi-linear-48b"
    wait; cat "$LOGS/correctness.summary"
    pack
    ;;
  published)  # packed after every step: a call that runs out of time still returns what it finished
    # (a run cut short resumes from its rows when the step is run again)
    if [ -d .gpu/part2 ] && [ ! -f /root/gpu-site/env.sh ]; then bash .gpu/part2/install.sh > "$LOGS/install2.log" 2>&1; fi
    source /root/gpu-site/env.sh
    # GPU 1: the asv-form gate (GPU 0 is busy with the sweeps meanwhile), unless ASV=0
    if [ "${ASV:-1}" = 1 ]; then
      ( export CUDA_VISIBLE_DEVICES=1
        step asv-gate 420 python3 scripts/validate_gate.py asv "$RES/gate-asv" --max-runs 4 ) > "$LOGS/gpu1.summary" 2>&1 &
    fi
    # RUNS names the runs this call makes: a run takes 280-312 s with three placement processes a row
    # (183-240 s with one), so one a call on GPU 0; a second beside it on GPU 1 (the header's lanes)
    # PUBLISHED_DIR and SWEEP_ARGS make the runs of another method, e.g. PUBLISHED_DIR=published-pp1
    # SWEEP_ARGS="--placement-processes 1" (then run_to_run.py on them); RUN_LIMIT: seconds a run (300)
    DIR=${PUBLISHED_DIR:-published}
    for run in ${RUNS:-a1 a2 a3}; do
      TAIL=1 step "$DIR-$run" "${RUN_LIMIT:-300}" python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset published --devices cuda:0 \
        ${SWEEP_ARGS:-} --out "$RES/$DIR/$run"
      pack
    done
    wait; [ "${ASV:-1}" = 1 ] && cat "$LOGS/gpu1.summary"
    pack
    ;;
  published-check)  # after published: GPU 1 the cross-check lane, GPU 0 the slow lane, the analysis and
    # kimi-linear-48b's cost (the same steps as crosscheck-lane, slow-lane, analysis and kimi-lane)
    source /root/gpu-site/env.sh
    ( export CUDA_VISIBLE_DEVICES=1; crosscheck ) > "$LOGS/cupti.summary" 2>&1 &
    planted_slowdown
    analysis
    kimi_cost
    wait; cat "$LOGS/cupti.summary"
    pack
    ;;
  crosscheck-lane)  # CUPTI on published/a1, then on targets/ if a lane made one (one GPU)
    source /root/gpu-site/env.sh
    crosscheck
    pack
    ;;
  slow-lane)  # the published preset's Triton rows with the planted slowdown (one GPU: the runs' own)
    source /root/gpu-site/env.sh
    planted_slowdown
    pack
    ;;
  kimi-lane)  # kimi-linear-48b's wall time (one GPU)
    source /root/gpu-site/env.sh
    kimi_cost
    pack
    ;;
  analysis)  # (the CPU will do, RES naming the unpacked results) the sweep-form gate, the published
    # comparison, run to run and the estimators' report
    analysis
    ;;
  check)
    bash .gpu/part1/install.sh > "$LOGS/install1.log" 2>&1; tail -n 1 "$LOGS/install1.log"
    source /root/gpu-site/env.sh
    background correctness-triton 1 420 python3 scripts/gpu_correctness.py --impls triton --out "$RES/correctness-triton"
    TAIL=3 step pytest-triton 300 $ON_GPU python3 -m pytest -q -m gpu tests/test_triton.py tests/test_triton_multitoken.py \
      tests/test_bench.py
    wait; cat "$LOGS/correctness-triton.summary"
    pack
    ;;
  targets)
    if [ -d .gpu/part2 ]; then bash .gpu/part2/install.sh > "$LOGS/install2.log" 2>&1; tail -n 1 "$LOGS/install2.log"; fi
    source /root/gpu-site/env.sh
    # Each run compiles from nothing (its own Triton cache): the wall times compare like with like.
    TAIL=2 step targets-2gpu 560 env TRITON_CACHE_DIR="$RES/triton-cache-2gpu" python3 scripts/sweep.py --no-charts \
      --l2-entry "$(entry)" --preset targets --devices cuda:0,cuda:1 --out "$RES/targets-2gpu"
    pack
    ;;
  targets-lane)  # the targets preset on one GPU (GPU 0, or the one CUDA_VISIBLE_DEVICES names) beside
    # published on GPU 0 in the same calls, with SWEEP_ARGS; a call that runs out of time (RUN_LIMIT,
    # default 540 s) resumes it when the step runs again
    source /root/gpu-site/env.sh
    TAIL=2 step targets-lane "${RUN_LIMIT:-540}" $ON_GPU python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" \
      --preset targets --devices cuda:0 ${SWEEP_ARGS:-} --out "$RES/${TARGETS_DIR:-targets}"
    pack
    ;;
  targets-one)  # the same on GPU 0 alone, while GPU 1 runs the library GPU tests and CUPTI on the two-GPU run
    source /root/gpu-site/env.sh
    ( export CUDA_VISIBLE_DEVICES=1
      step pytest-libraries 200 python3 -m pytest -q -m gpu tests/test_fla_multitoken.py tests/test_flashinfer_multitoken.py \
        tests/test_variants.py tests/test_flashinfer.py tests/test_fla.py
      step cupti-targets 300 python3 scripts/cupti_crosscheck.py "$RES/targets-2gpu" --unpadded-only \
        --out "$RES/cupti/targets" --calls 20 ) > "$LOGS/cupti-targets.summary" 2>&1 &
    TAIL=2 step targets 540 env TRITON_CACHE_DIR="$RES/triton-cache-1gpu" python3 scripts/sweep.py --no-charts \
      --l2-entry "$(entry)" --preset targets --devices cuda:0 --out "$RES/targets"
    wait; cat "$LOGS/cupti-targets.summary"
    pack
    ;;
  placements)  # the rows whose medians moved between processes (published/a1..a3), three sweeps each
    # way, each its own process: placements freed in turn (GPU 0) against disjoint ones (GPU 1)
    if [ -d .gpu/part2 ] && [ ! -f /root/gpu-site/env.sh ]; then bash .gpu/part2/install.sh > "$LOGS/install2.log" 2>&1; fi
    source /root/gpu-site/env.sh
    ROWS="--no-charts --l2-entry $(entry) --preset published --impls fla,fla-loggate,fla-batched,triton --HV 32 --K 128 --V 128
      --state-dtype bf16 --B 64,256 --slot-pad 0 --devices cuda:0"
    for run in 1 2 3; do
      background "placements-freed-$run" 0 150 python3 scripts/sweep.py $ROWS --no-disjoint-placements \
        --out "$RES/placements/freed-$run"
      TAIL=1 step "placements-disjoint-$run" 150 env CUDA_VISIBLE_DEVICES=1 python3 scripts/sweep.py $ROWS \
        --disjoint-placements --out "$RES/placements/disjoint-$run"
      wait; tail -n 1 "$LOGS/placements-freed-$run.summary"
    done
    for way in freed disjoint; do
      TAIL=12 step "placements-$way" 30 python3 scripts/run_to_run.py "$RES/placements/$way"-{1,2,3} --min-B 64 \
        --out "$RES/placements/$way.md"
    done
    pack
    ;;
  placement-cost)  # what disjoint placements cost: the published preset's naive and triton rows on nine
    # placements each, freed in turn (GPU 0) and held (GPU 1) at once, then row times set side by side
    source /root/gpu-site/env.sh
    ROWS="--no-charts --l2-entry $(entry) --preset published --impls naive,triton --placements 9 --extra-placements 0"
    background placement-cost-freed 0 200 python3 scripts/sweep.py $ROWS --devices cuda:0 --no-disjoint-placements \
      --out "$RES/placement-cost/freed"
    TAIL=1 step placement-cost-disjoint 200 python3 scripts/sweep.py $ROWS --devices cuda:1 --disjoint-placements \
      --out "$RES/placement-cost/disjoint"
    wait; tail -n 1 "$LOGS/placement-cost-freed.summary"
    TAIL=30 step placement-cost-compare 30 python3 scripts/compare_sweeps.py "$RES/placement-cost/freed" \
      "$RES/placement-cost/disjoint" --name-a "freed in turn" --name-b "held (disjoint)" --out "$RES/placement-cost/compare.md"
    pack
    ;;
  wide-rows)  # the rows whose placements spread widest (fla's bf16 HV=32 K=V=128 B=256; ours beside),
    # three sweeps in separate processes on GPU 0, then how far they moved: the large-step rule's check.
    # WIDE_IMPLS, SWEEP_ARGS and WIDE_DIR make another trial of them, e.g. WIDE_IMPLS=fla,fla-loggate
    # SWEEP_ARGS="--placement-processes 3" WIDE_DIR=wide-rows-pp3
    if [ -d .gpu/part2 ] && [ ! -f /root/gpu-site/env.sh ]; then bash .gpu/part2/install.sh > "$LOGS/install2.log" 2>&1; fi
    source /root/gpu-site/env.sh
    DIR=${WIDE_DIR:-wide-rows}
    ROWS="--no-charts --l2-entry $(entry) --preset published --impls ${WIDE_IMPLS:-fla,fla-loggate,fla-loggate-sigmoid,triton}
      --HV 32 --K 128 --V 128 --state-dtype bf16 --B 256 --slot-pad 0 --devices cuda:0 ${SWEEP_ARGS:-}"
    for run in 1 2 3; do
      TAIL=1 step "$DIR-$run" 120 python3 scripts/sweep.py $ROWS --out "$RES/$DIR/run$run"
    done
    TAIL=14 step "$DIR-compare" 30 python3 scripts/run_to_run.py "$RES/$DIR"/run{1,2,3} --min-B 64 \
      --out "$RES/$DIR/run_to_run.md"
    pack
    ;;
  aa-settled)  # (a bare box will do) the gate under the settling sweeps (commit 6ba54d8), on one box: our
    # kernel alone over the targets preset three times and once with the planted slowdown, each its own
    # process; validate_gate.py sweep gates the A/A pairs and a1-slow (resumable: a finished run is kept)
    for run in a1 a2 a3 slow; do
      [ -f "$RES/aa-settled/$run/results.csv" ] && continue
      planted=""
      if [ "$run" = slow ]; then
        planted=$(planted_config) || { echo "== aa-settled-slow: no planted config ($LOGS/planted.log)"; break; }
      fi
      TAIL=1 step "aa-settled-$run" 150 env ${planted:+KDA_TRITON_CONFIG=$planted} python3 scripts/sweep.py --no-charts \
        --l2-entry "$(entry)" --preset targets --impls triton --devices cuda:0 --out "$RES/aa-settled/$run"
      pack
    done
    TAIL=3 step aa-settled-gate 60 python3 scripts/validate_gate.py sweep "$RES/aa-settled/gate" "$RES"/aa-settled/{a1,a2,a3,slow}
    pack
    ;;
  triton-targets)  # (a bare box will do: torch and Triton only) our kernel alone over the targets preset
    # on GPU 0, the table as committed: after a table change, set beside state-order/ or targets runs
    TAIL=1 step triton-targets 200 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset targets \
      --impls triton --devices cuda:0 --out "$RES/triton-targets"
    pack
    ;;
  first-placement)  # (a bare box will do) what the slow first placement of our kernel's largest rows
    # follows: two processes each for bf16 HV=32 and fp32 HV=64 K=V=128 B=256 (docs/timing.md, "Method 4")
    first_placements first-placement first-placement 32 60
    pack
    ;;
  replay)  # (carry .gpu/part2, or after published on the same box) the harness's GPU tests of
    # settling, placements and CUPTI; CUPTI inside the harness's own pass for fla's and our one-kernel
    # rows at B = 16 and 64 of the published run (docs/timing.md, "The second clock")
    if [ -d .gpu/part2 ] && [ ! -f /root/gpu-site/env.sh ]; then bash .gpu/part2/install.sh > "$LOGS/install2.log" 2>&1; fi
    source /root/gpu-site/env.sh
    TAIL=3 step pytest-harness 120 $ON_GPU python3 -m pytest -q -m gpu tests/test_bench.py -k "settle or cupti or disjoint"
    TAIL=12 step cupti-replay 150 $ON_GPU python3 scripts/cupti_crosscheck.py results/h200/published --impls fla,triton \
      --B 16,64 --replay --calls 20 --out "$RES/cupti/replay"
    pack
    ;;
  settle)  # (a bare box will do) our kernel alone over the targets preset with --settle 1 (idle a second
    # after handing back more than 1 GiB): whether the slow first placements of the largest rows go,
    # and what it costs (set beside triton-targets/ or targets-a026c60/ with compare_sweeps.py)
    TAIL=1 step triton-settle 300 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset targets \
      --impls triton --devices cuda:0 --settle 1 --out "$RES/triton-settle"
    TAIL=3 step triton-settle-estimators 60 python3 scripts/placement_estimators.py "$RES/triton-settle" \
      --out "$RES/triton-settle/estimators.md"
    pack
    ;;
  state-order)  # our kernel alone over the targets preset, the table as it is and every entry with its
    # state loaded first (the kernel before state_first existed), back to back on GPU 0: what the field does
    source /root/gpu-site/env.sh
    TAIL=1 step state-order-table 200 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset targets \
      --impls triton --devices cuda:0 --out "$RES/state-order/table"
    TAIL=1 step state-order-first 200 env KDA_TRITON_CONFIG=state_first=1 python3 scripts/sweep.py --no-charts \
      --l2-entry "$(entry)" --preset targets --impls triton --devices cuda:0 --out "$RES/state-order/first"
    TAIL=20 step state-order-compare 30 python3 scripts/compare_sweeps.py "$RES/state-order/first" "$RES/state-order/table" \
      --name-a "every entry state-first" --name-b "the table (state_first per entry)" --flag 0.02 \
      --out "$RES/state-order/compare.md"
    pack
    ;;
  spec)
    source /root/gpu-site/env.sh
    background correctness-triton 1 420 python3 scripts/gpu_correctness.py --impls triton --out "$RES/correctness-triton"
    TAIL=2 step spec-decode 200 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset spec-decode --devices cuda:0 \
      --impls triton,fla,fla-loggate-sigmoid,flashinfer-sigmoid,flashinfer-loggate-sigmoid --out "$RES/spec-decode"
    TAIL=2 step flashinfer-dense 150 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset published --devices cuda:0 \
      --slot-order sorted --impls flashinfer-dense,flashinfer-loggate-sigmoid,triton --out "$RES/published-sorted"
    wait; cat "$LOGS/correctness-triton.summary"
    pack
    ;;
  profile)
    TAIL=30 step ncu 300 $ON_GPU python3 scripts/ncu_profile.py --out "$RES/ncu"
    TAIL=12 step memcheck 200 $ON_GPU compute-sanitizer --tool memcheck --error-exitcode 99 python3 scripts/sanitize_triton.py
    TAIL=3 step pytest-cupti 120 $ON_GPU python3 -m pytest -q -m gpu tests/test_bench.py -k cupti
    cp "$LOGS"/memcheck.log "$RES/ncu/" 2>/dev/null
    pack
    ;;
  rewiden)  # (a bare box will do) the stored tile widened twice (rewiden=1, some with a register cap)
    # against the table at every shape of the targets preset, then compute-sanitizer on every kernel form
    TAIL=4 step tune-rewiden 420 $ON_GPU python3 scripts/triton_tune.py --out "$RES/triton-tune-rewiden/triton_tune.csv" \
      --value-heads 16,32,64 --head-dims 128x128,64x64 --batches 1,16,64,256 --budget-s 360 --over-table \
      "rewiden=1;rewiden=1,BV=8,num_warps=1,state_first=1;rewiden=1,BV=16,num_warps=1,state_first=1;rewiden=1,BV=16,num_warps=1,state_first=1,maxnreg=88;rewiden=1,BV=32,num_warps=1,state_first=0;rewiden=1,BV=32,num_warps=4"
    sanitizers 90
    pack
    ;;
  tma)  # (a bare two-GPU box will do) the state read by TMA (tma=1: one program per tile, or persistent
    # programs pipelined 4-5 deep) against the table at every batch of the targets preset
    VARIANTS="tma=1,BV=16,num_warps=4,programs_per_sm=0,num_stages=1;tma=1,BV=8,num_warps=1,programs_per_sm=0,num_stages=1"
    VARIANTS="$VARIANTS;tma=1,BV=16,num_warps=1,programs_per_sm=0,num_stages=1;tma=1,BV=8,num_warps=1,programs_per_sm=16,num_stages=4"
    VARIANTS="$VARIANTS;tma=1,BV=8,num_warps=1,programs_per_sm=8,num_stages=5;tma=1,BV=16,num_warps=2,programs_per_sm=8,num_stages=4"
    VARIANTS="$VARIANTS;tma=1,BV=16,num_warps=1,programs_per_sm=8,num_stages=4;tma=1,BV=32,num_warps=4,programs_per_sm=4,num_stages=4"
    over_table_both_gpus tma 1,16,64,256 "$VARIANTS"
    pack
    ;;
  slots-ahead)  # (a bare two-GPU box will do) the persistent form looking ahead only at the slots
    # (lookahead=0: each tile's loads issued in its turn, its slot loaded before) against the table at
    # B = 16-256 of every targets shape
    VARIANTS="lookahead=0,BV=8,num_warps=1,programs_per_sm=8;lookahead=0,BV=8,num_warps=1,programs_per_sm=16"
    VARIANTS="$VARIANTS;lookahead=0,BV=8,num_warps=1,programs_per_sm=32;lookahead=0,BV=16,num_warps=1,programs_per_sm=8"
    VARIANTS="$VARIANTS;lookahead=0,BV=16,num_warps=1,programs_per_sm=16;lookahead=0,BV=16,num_warps=2,programs_per_sm=8"
    VARIANTS="$VARIANTS;lookahead=0,BV=32,num_warps=1,programs_per_sm=8;lookahead=0,BV=4,num_warps=1,programs_per_sm=32"
    over_table_both_gpus slots-ahead 16,64,256 "$VARIANTS"
    pack
    ;;
  eviction)  # (a bare two-GPU box will do) each tabled config with the state's loads, its stores or both
    # left without the evict-first hint (as FlashInfer's kernel leaves them) at every batch of the targets preset
    over_table_both_gpus eviction 1,16,64,256 "load_evict_first=0,store_evict_first=0;load_evict_first=0;store_evict_first=0"
    pack
    ;;
  b1-warps)  # (a bare two-GPU box will do) at B = 1, the tabled one-warp 8-row tiles against programs of
    # 2-8 warps, BV = 8 rows a warp (FlashInfer's launch shape at B = 1, ncu-b1/), each state order
    VARIANTS="BV=16,num_warps=2,state_first=1;BV=16,num_warps=2,state_first=2;BV=32,num_warps=4,state_first=1"
    VARIANTS="$VARIANTS;BV=32,num_warps=4,state_first=2;BV=32,num_warps=4,state_first=2,rewiden=1"
    VARIANTS="$VARIANTS;BV=32,num_warps=4,state_first=1,const_heads=1;BV=64,num_warps=8,state_first=1"
    VARIANTS="$VARIANTS;BV=64,num_warps=8,state_first=2"
    over_table_both_gpus b1-warps 1 "$VARIANTS"
    pack
    ;;
  fast-gate)  # (a bare box will do) the gate in base 2 on MUFU's log2 and rsqrt (the twelfth session's kernel)
    # against the kernel before it, OLD_KERNEL (that commit's kda_impls/impls/triton_kda.py: `git show
    # acee2e5:kda_impls/impls/triton_kda.py > old_triton_kda.py`), at B = 1: the table and candidates with the
    # head counts compiled in, bf16 new, old, then fp32 old, new; first the new kernel's GPU tests and grid
    triton_gpu_tests
    triton_grid fast-gate
    VARIANTS="const_heads=1;BV=4,num_warps=1;BV=4,num_warps=1,const_heads=1;BV=8,num_warps=1,state_first=1,const_heads=1"
    VARIANTS="$VARIANTS;BV=8,num_warps=1,state_first=2,const_heads=1;BV=8,num_warps=1,state_first=0,const_heads=1"
    VARIANTS="$VARIANTS;BV=16,num_warps=2,state_first=1,const_heads=1;BV=16,num_warps=1,state_first=1,const_heads=1"
    VARIANTS="$VARIANTS;BV=32,num_warps=4,state_first=1,const_heads=1"
    VARIANTS="$VARIANTS;BV=8,num_warps=1,state_first=1,const_heads=1,load_evict_first=0,store_evict_first=0"
    cp kda_impls/impls/triton_kda.py "$RES/new_triton_kda.py"
    for run in new:bfloat16 old:bfloat16 old:float32 new:float32; do
      code=${run%%:*} dtype=${run#*:}
      cp "$([ "$code" = old ] && echo "$OLD_KERNEL" || echo "$RES/new_triton_kda.py")" kda_impls/impls/triton_kda.py
      over_table "tune-fast-gate-$code-$dtype" 200 1 "$dtype" "$VARIANTS" \
        "$RES/triton-tune-fast-gate/$code-$dtype/triton_tune.csv"
    done
    cp "$RES/new_triton_kda.py" kda_impls/impls/triton_kda.py && rm "$RES/new_triton_kda.py"
    pack
    ;;
  fast-gate-tiles)  # (a bare box will do) the base-2 gate (fast_gate=1) with the head counts compiled in, over
    # the table at B = 1 and 16: tiles of 2-8 rows a warp, each state order, widened once or twice (the
    # parallel reductions), unhinted; bf16, then the fp32 one-warp tiles at B = 1; the GPU tests first
    triton_gpu_tests
    F=fast_gate=1,const_heads=1 VARIANTS=""
    for tile in BV=2,num_warps=1 BV=4,num_warps=1 BV=8,num_warps=1; do
      for order in 1 2; do for widen in 0 1; do VARIANTS="$VARIANTS;$F,$tile,state_first=$order,rewiden=$widen"; done; done
    done
    VARIANTS="${VARIANTS#;};$F,BV=4,num_warps=1,state_first=0,rewiden=0;$F,BV=8,num_warps=2,state_first=1,rewiden=0"
    VARIANTS="$VARIANTS;$F,BV=4,num_warps=1,state_first=1,rewiden=0,load_evict_first=0,store_evict_first=0"
    over_table tune-fast-gate-tiles-bf16 300 1,16 bfloat16 "$VARIANTS" "$RES/triton-tune-fast-gate-tiles/bf16/triton_tune.csv"
    VARIANTS="$F,BV=4,num_warps=1,state_first=0;$F,BV=4,num_warps=1,state_first=1;$F,BV=8,num_warps=1,state_first=0"
    VARIANTS="$VARIANTS;$F,BV=8,num_warps=1,state_first=1;$F,BV=2,num_warps=1,state_first=0"
    over_table tune-fast-gate-tiles-fp32 200 1 float32 "$VARIANTS" "$RES/triton-tune-fast-gate-tiles/fp32/triton_tune.csv"
    pack
    ;;
  fast-gate-large)  # (a bare box will do) the base-2 gate (fast_gate=1), with and without the head counts
    # compiled in, over the table at B = 64 and 256 of every targets shape, both state dtypes: ceiling-cold puts
    # our math at 1.8-5.3 points of the copy over the math-free kernel at the bandwidth rows it does not explain
    over_table tune-fast-gate-large-bf16 260 64,256 bfloat16 "fast_gate=1;fast_gate=1,const_heads=1" \
      "$RES/triton-tune-fast-gate-large/bf16/triton_tune.csv"
    over_table tune-fast-gate-large-fp32 240 64,256 float32 "fast_gate=1;fast_gate=1,const_heads=1" \
      "$RES/triton-tune-fast-gate-large/fp32/triton_tune.csv"
    pack
    ;;
  fast-gate-k64)  # (a bare box will do) at K = V = 64, B = 64 and 256, where the math costs our kernel 2.6-7.8 points
    # of the copy over the math-free kernel (ceiling-cold): the base-2 gate on other tiles, hints and state orders
    fast_gate_search fast-gate-k64 64 BV=16,num_warps=1 BV=32,num_warps=2 BV=64,num_warps=2 BV=64,num_warps=4 \
      subtiles=2 rewiden=1 state_first=0 state_first=1 load_evict_first=0,store_evict_first=0 \
      load_evict_first=1,store_evict_first=1
    pack
    ;;
  fast-gate-k128)  # (a bare box will do) CUPTI on SWEEP's rows at B = 64 and 256 (as cupti-triton), then the same
    # search as fast-gate-k64 at K = V = 128, where two sub-tiles with the base-2 gate had not been timed
    cupti_sweep "" triton 64,256
    fast_gate_search fast-gate-k128 128 subtiles=2 subtiles=2,state_first=1 subtiles=2,state_first=0 BV=8,num_warps=1 \
      BV=32,num_warps=2 subtiles=2,load_evict_first=0,store_evict_first=0 subtiles=2,load_evict_first=1,store_evict_first=1
    pack
    ;;
  near-misses)  # (a bare box will do) the three bandwidth rows within 0.3 points of their target after the
    # fast-gate runs (bf16 HV=32 K=V=128 B=256, bf16 HV=64 K=V=64 B=256, fp32 HV=64 K=V=128 B=64): variants
    # of their tabled configs not timed there yet, over the table
    near_miss() {  # near_miss NAME HV D B DTYPE VARIANTS
      TAIL=2 step "tune-near-misses-$1" 100 $ON_GPU python3 scripts/triton_tune.py --value-heads "$2" --head-dims "$3x$3" \
        --batches "$4" --state-dtypes "$5" --budget-s 60 --over-table "$6" --out "$RES/triton-tune-near-misses/$1/triton_tune.csv"
    }
    near_miss bf16-hv32-d128 32 128 256 bfloat16 "subtiles=4;BV=8,subtiles=2;BV=8,subtiles=4;BV=32,num_warps=2,subtiles=2;\
state_first=2;rewiden=1;load_evict_first=1,store_evict_first=1;store_evict_first=1"
    near_miss bf16-hv64-d64 64 64 256 bfloat16 "BV=16,subtiles=2;BV=16,subtiles=4;BV=64,num_warps=2;state_first=2;rewiden=1;\
load_evict_first=0,store_evict_first=0;store_evict_first=0"
    near_miss fp32-hv64-d128 64 128 64 float32 "BV=8;BV=8,fast_gate=1,const_heads=1;BV=4,subtiles=2;BV=4,subtiles=4;\
BV=8,subtiles=2,fast_gate=1,const_heads=1;rewiden=1;state_first=1;load_evict_first=0,store_evict_first=0"
    pack
    ;;
  fast-gate-table)  # (a bare box will do) the table with fast-gate-large's entries (NAME=k64: and fast-gate-k64's;
    # NAME=k128: and fast-gate-k128's):
    # our kernel's GPU tests and its correctness grid, then our kernel alone over the targets preset (set beside
    # aa-settled/ with regress.py)
    triton_gpu_tests
    triton_grid fast-gate-${NAME:-large}
    TAIL=1 step triton-targets-fast-gate 150 python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset targets \
      --impls triton --devices cuda:0 --out "$RES/triton-targets-fast-gate${NAME:+-$NAME}"
    pack
    ;;
  ncu-b1)  # (after part 2 is installed) where FlashInfer's B = 1 step is shorter than ours: launch shape,
    # registers, stalls, each step with the L2 flushed
    source /root/gpu-site/env.sh
    TAIL=30 step ncu-b1 400 $ON_GPU python3 scripts/ncu_profile.py --out "$RES/ncu-b1" --cases \
      bf16-B1-table,bf16-B1-flashinfer,bf16-B1-HV64-table,bf16-B1-HV64-flashinfer,bf16-B1-D64-table,bf16-B1-D64-flashinfer
    pack
    ;;
  b1-eight-rows)  # (a bare box will do) at bf16 B = 1, the 8- and 16-row tiles in base 2 under a register cap,
    # which keeps their state loads together at the program's start offline (fast_gate_hv32_d128.txt: the
    # uncapped 8-row tile spreads them over 262 instructions), against the table's 2- and 4-row tiles; first
    # memcheck and racecheck on every kernel form, the base-2 gate's among them
    sanitizers 100
    F=fast_gate=1,const_heads=1
    VARIANTS="$F,BV=8,num_warps=1,state_first=1,maxnreg=96;$F,BV=8,num_warps=1,state_first=2,maxnreg=96"
    VARIANTS="$VARIANTS;$F,BV=8,num_warps=1,state_first=1,maxnreg=128;$F,BV=8,num_warps=1,state_first=1,rewiden=1,maxnreg=96"
    VARIANTS="$VARIANTS;$F,BV=16,num_warps=2,state_first=1,maxnreg=128;$F,BV=16,num_warps=1,state_first=1,maxnreg=128"
    over_table tune-b1-eight-rows 300 1 bfloat16 "$VARIANTS" "$RES/triton-tune-b1-eight-rows/triton_tune.csv"
    pack
    ;;
  tiled-inputs)  # (a bare box will do) the small inputs loaded as tiles of copies in the state tile's layout
    # (tiled_inputs=1: no layout change, whose shared-memory instructions ptxas issues no load past) over the
    # table: bf16 B = 1 on 2-8-row base-2 tiles in both state orders and as tabled; B = 16 and 64 as tabled and
    # on 4- and 8-row tiles; the GPU tests and compute-sanitizer first
    triton_gpu_tests
    sanitizers 100
    F=fast_gate=1,const_heads=1,tiled_inputs=1 VARIANTS="tiled_inputs=1"
    for tile in BV=2,num_warps=1 BV=4,num_warps=1 BV=8,num_warps=1; do
      for order in 1 2; do VARIANTS="$VARIANTS;$F,$tile,state_first=$order"; done
    done
    over_table tune-tiled-inputs-b1 200 1 bfloat16 "$VARIANTS;$F,BV=4,num_warps=1,state_first=2,rewiden=1" \
      "$RES/triton-tune-tiled-inputs/b1/triton_tune.csv"
    over_table tune-tiled-inputs-b16 200 16,64 bfloat16 \
      "tiled_inputs=1;$F,BV=4,num_warps=1,state_first=2;$F,BV=8,num_warps=1,state_first=2" \
      "$RES/triton-tune-tiled-inputs/b16-b64/triton_tune.csv"
    pack
    ;;
  settle-idles)  # (a bare box will do) how long the slow first placement lasts: first_placement.py with
    # idles of 10 ms to 1 s after each hand-back, bf16 HV=64 and fp32 HV=64 K=V=128 B=256, two processes each
    first_placements first-placement-idles settle-idles 64 90 --idles 0.01,0.03,0.1,0.3,1
    pack
    ;;
  settled)  # (a bare box will do) the default settle after it (Method.settle_s after every hand-back of more than
    # timing.SETTLE_MIN_BYTES): first_placement.py's conditions with the kernel times settling, then our kernel
    # alone over the targets preset (placement spreads and wall time against targets-7ebc604/)
    first_placements first-placement-settled settled 64 90 --idles 0 \
      --settle "$(python3 -c "from kda_impls.bench.case import Method; print(Method.settle_s)")"
    TAIL=1 step triton-targets-settled 300 $ON_GPU python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" \
      --preset targets --impls triton --devices cuda:0 --out "$RES/triton-targets-settled"
    pack
    ;;
  ncu-b1-ours)  # (a bare box will do) our kernel's B = 1 cases of ncu-b1 under Nsight Compute as the table has them
    # now (FlashInfer's were profiled the same way in ncu-b1/)
    TAIL=30 step ncu-b1-ours 300 $ON_GPU python3 scripts/ncu_profile.py --out "$RES/ncu-b1-ours" --cases \
      bf16-B1-table,bf16-B1-HV64-table,bf16-B1-D64-table
    pack
    ;;
  cupti-triton)  # (a bare box will do) the second clock on the bandwidth rows of a committed targets run
    cupti_sweep "" triton 64,256
    pack
    ;;
  targets-cupti)  # (after part 2 is installed) the second clock on a targets run: our B = 64 and 256 rows, and
    # the B = 1 rows of ours and FlashInfer's own call (the speed target's closest points); SWEEP: the run
    source /root/gpu-site/env.sh
    cupti_sweep -triton triton 64,256
    cupti_sweep -b1 triton,flashinfer 1
    pack
    ;;
  eviction-tiles)  # (a bare two-GPU box will do) at B = 64 and 256, where the eviction run found the
    # unhinted table entries fastest, other tiles without the hints: the table's tiles were tuned with them
    U=load_evict_first=0,store_evict_first=0
    VARIANTS="BV=8,num_warps=1,state_first=0,$U;BV=8,num_warps=1,state_first=1,$U;BV=16,num_warps=1,state_first=0,$U"
    VARIANTS="$VARIANTS;BV=16,num_warps=1,state_first=1,$U;BV=16,num_warps=2,state_first=1,$U"
    VARIANTS="$VARIANTS;BV=32,num_warps=1,state_first=0,$U;BV=32,num_warps=2,state_first=1,$U;BV=4,num_warps=1,state_first=0,$U"
    over_table_both_gpus eviction-tiles 64,256 "$VARIANTS"
    pack
    ;;
  placement-noise-eviction)  # (a bare two-GPU box will do) placement_noise.py on the table as committed and
    # without the state's evict-first hints, at four rows of placement-noise/, each config on both GPUs in
    # turn (GPU 0 the table first, GPU 1 the unhinted config first)
    rows=bfloat16:32:128:16,bfloat16:64:128:16,bfloat16:32:128:64,bfloat16:32:128:256
    ( hints_noise eviction unhinted 1 "load_evict_first=0,store_evict_first=0"; hints_noise eviction table 1 "" ) \
      > "$LOGS/gpu1.summary" 2>&1 &
    hints_noise eviction table 0 ""; hints_noise eviction unhinted 0 "load_evict_first=0,store_evict_first=0"
    wait; cat "$LOGS/gpu1.summary"
    pack
    ;;
  placement-noise-hints)  # (a bare two-GPU box will do) placement_noise.py at six bf16 rows of B = 16-64
    # (five that missed the 2% target in targets-8068b63), the table as committed and with the state's
    # loads' hint, its stores' or both dropped: which hint the spread follows (two configs per GPU)
    # (ROWS and RUN override the rows and the directory's suffix: placement-noise-RUN/)
    rows=${ROWS:-bfloat16:16:128:16,bfloat16:32:128:16,bfloat16:64:128:16,bfloat16:32:128:64,bfloat16:64:128:64,bfloat16:32:64:64}
    # (on a one-GPU box the second pair runs after the first, on GPU 0)
    run=${RUN:-hints}
    second=1; [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || second=0
    ( hints_noise "$run" loads-unhinted $second "load_evict_first=0"; hints_noise "$run" stores-unhinted $second "store_evict_first=0" ) \
      > "$LOGS/gpu1.summary" 2>&1 &
    [ $second = 1 ] || wait
    hints_noise "$run" table 0 ""; hints_noise "$run" unhinted 0 "load_evict_first=0,store_evict_first=0"
    wait; cat "$LOGS/gpu1.summary"
    pack
    ;;
  placement-noise)  # (a bare box will do) our kernel's placement spread against the timer's own: the rows
    # of targets-8068b63 that missed the 2% target, one that met it and the slow-first-placement row,
    # each on 27 fresh placements and 27 times on one placement
    TAIL=16 step placement-noise 500 $ON_GPU python3 scripts/placement_noise.py --settle 2 --out "$RES/placement-noise" --rows \
      bfloat16:16:128:16,bfloat16:32:128:16,bfloat16:32:128:64,bfloat16:64:128:16,bfloat16:64:128:64,float32:32:64:16,bfloat16:64:64:256,bfloat16:32:128:256,bfloat16:64:128:256
    pack
    ;;
  placement-noise-libraries)  # (after part 2 is installed) the same for fla and FlashInfer beside ours at
    # three of those rows: is a fresh placement's spread ours alone?
    source /root/gpu-site/env.sh
    TAIL=12 step placement-noise-libraries 400 $ON_GPU python3 scripts/placement_noise.py --settle 2 \
      --impls triton,fla,flashinfer --out "$RES/placement-noise-libraries" --rows bfloat16:32:128:16,bfloat16:64:128:16,bfloat16:32:128:64
    pack
    ;;
  tune-order)  # (a bare box will do) at B = 1 and 16, the table against the state load in each of its
    # three places (state_first 0/1/2), re-widened, and on two B = 1 tiles, at every targets shape
    TAIL=4 step tune-order 300 $ON_GPU python3 scripts/triton_tune.py --out "$RES/triton-tune-order/triton_tune.csv" \
      --value-heads 16,32,64 --head-dims 128x128,64x64 --batches 1,16 --budget-s 240 --over-table \
      "state_first=0;state_first=1;state_first=2;state_first=2,rewiden=1;BV=8,num_warps=1,state_first=2;BV=16,num_warps=4,state_first=2"
    pack
    ;;
  ceiling)  # (a bare box will do) the memory ceiling of the step's state traffic without its math
    # (copy, in-place, our tiles with and without the slot load and in other program shapes, our
    # kernel; five placements each)
    TAIL=12 step ceiling-bf16-d128 120 $ON_GPU python3 scripts/memory_ceiling.py --out "$RES/memory-ceiling/bf16-hv32-d128"
    TAIL=12 step ceiling-bf16-hv64-d128 120 $ON_GPU python3 scripts/memory_ceiling.py --HV 64 \
      --out "$RES/memory-ceiling/bf16-hv64-d128"
    TAIL=12 step ceiling-bf16-d64 120 $ON_GPU python3 scripts/memory_ceiling.py --D 64 --out "$RES/memory-ceiling/bf16-hv32-d64"
    TAIL=12 step ceiling-fp32-d128 120 $ON_GPU python3 scripts/memory_ceiling.py --state-dtype float32 \
      --out "$RES/memory-ceiling/fp32-hv32-d128"
    pack
    ;;
  ceiling-cold)  # (a bare box will do) the memory ceiling at the sweeps' L2 entry state (--entry previous-step)
    # at every shape of the targets' bandwidth rows, B = 64 and 256: what a math-free kernel, a copy and an
    # in-place op reach where the sweeps time ours (resumable: a shape already measured is kept)
    for shape in "bfloat16 16 64" "bfloat16 32 64" "bfloat16 64 64" "bfloat16 16 128" "bfloat16 32 128" \
                 "bfloat16 64 128" "float32 16 128" "float32 32 128" "float32 64 128"; do
      set -- $shape
      name="cold-$(echo "$1" | sed 's/bfloat/bf/;s/float/fp/')-hv$2-d$3"
      [ -f "$RES/memory-ceiling/$name/ceiling.csv" ] && continue
      TAIL=3 step "ceiling-$name" 150 $ON_GPU python3 scripts/memory_ceiling.py --entry previous-step \
        --state-dtype "$1" --HV "$2" --D "$3" --out "$RES/memory-ceiling/$name"
      pack
    done
    ;;
  b1-warps-tiled)  # (a bare box will do) bf16 B = 1: programs of 2-8 warps, 4 or 8 rows a warp, with the small
    # inputs as tiles (tiled_inputs=1 keeps every load ahead of the first shared-memory instruction, which the
    # multi-warp tiles otherwise reach after 2-3 loads), the base-2 gate, the head counts compiled in: four
    # times fewer programs saved 0.49 us of the math-free tile at HV=64 K=V=128 (latency-151e802-HV64D128)
    sanitizers 100
    F=fast_gate=1,const_heads=1,tiled_inputs=1 VARIANTS=""
    for tile in BV=8,num_warps=2 BV=16,num_warps=4 BV=32,num_warps=8 BV=16,num_warps=2 BV=32,num_warps=4; do
      VARIANTS="$VARIANTS;$F,$tile,state_first=1"
    done
    over_table tune-b1-warps-tiled 200 1 bfloat16 "$VARIANTS;$F,BV=16,num_warps=4,state_first=1,rewiden=1" \
      "$RES/triton-tune-b1-warps-tiled/triton_tune.csv"
    pack
    ;;
  b1-targets)  # (after part 2 is installed) a table change at bf16 B = 1 judged against every other library: the
    # targets preset's bf16 B = 1 rows, every implementation but the torch one, ours first (a sweep cut by its time
    # limit keeps the rows it reached: about 140 rows in 250 s; the step resumes), then our kernel's correctness
    # grid and the sanitizers on every form
    source /root/gpu-site/env.sh
    TAIL=2 step b1-targets 300 $ON_GPU python3 scripts/sweep.py --no-charts --l2-entry "$(entry)" --preset targets \
      --B 1 --state-dtype bf16 --impls "$(python3 -c "from kda_impls.registry import names
print(','.join(['triton'] + [n for n in names() if n not in ('naive', 'triton')]))")" --devices cuda:0 \
      --out "$RES/targets-b1-${KDA_GIT_SHA:-unstated}"
    pack
    triton_grid
    pack
    sanitizers 100
    pack
    ;;
  pad-cost)  # (a bare box will do) the one padding point missed in most runs (bf16 HV=16 K=V=64 B=16: its padded
    # row 0.2-3.9% over the unpadded between runs, targets-e10d22a/misses.md): both rows, our kernel alone, in
    # six worker processes each (is the cost a process's, as placements are?), the table as it is and with its
    # stores unhinted (the hint the placement misses were tied to)
    for variant in table:"" unhinted:store_evict_first=0; do
      TAIL=2 step "pad-cost-${variant%%:*}" 200 $ON_GPU env KDA_TRITON_CONFIG="${variant#*:}" python3 scripts/sweep.py \
        --no-charts --l2-entry "$(entry)" --preset targets --B 16 --HV 16 --K 64 --state-dtype bf16 --impls triton \
        --placement-processes 6 --extra-placements 0 --out "$RES/pad-cost/${variant%%:*}"
      pack
    done
    ;;
  grid-triton)  # (a bare box will do) our kernel's H200 correctness grid on the table as committed
    triton_grid
    pack
    ;;
  ceiling-latency)  # (after part 2 is installed) the same at B = 1 and 16, FlashInfer's calls timed the same
    # way beside ours: what the step's latency is made of, theirs against ours (TAG: a prefix of the
    # directories' names, so that a run on a later table lands beside the committed ones)
    source /root/gpu-site/env.sh
    for shape in "--HV 32 --D 128" "--HV 64 --D 128" "--HV 32 --D 64"; do
      name="latency-${TAG:+$TAG-}$(echo "$shape" | tr -d ' -')"
      TAIL=12 step "ceiling-$name" 120 $ON_GPU python3 scripts/memory_ceiling.py $shape --B 1,16 \
        --impls flashinfer,flashinfer-loggate-sigmoid --out "$RES/memory-ceiling/$name"
    done
    pack
    ;;
  tune)  # every one-token candidate (with and without the head counts compiled in), every shape
    TAIL=4 step tune 540 $ON_GPU python3 scripts/triton_tune.py --out "$RES/triton-tune-v4/triton_tune.csv" --budget-s 460
    pack
    ;;
  tune-multitoken)
    TAIL=4 step tune-multitoken 200 $ON_GPU python3 scripts/triton_tune.py --out "$RES/triton-tune-multitoken-v2/triton_tune.csv" \
      --tokens 2,4,8 --value-heads 32 --head-dims 128x128 --batches 1,8,32,128 --budget-s 150
    pack
    ;;
  *)
    echo "usage: $0 $(grep -oE '^  [a-z0-9-]+\)' "$0" | tr -d ' )' | paste -sd'|')" >&2; exit 2 ;;
esac
