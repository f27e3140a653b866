# scratch: tile exploration of the frozen and replay kernels on the H200 (not committed)
set -u
common="--impls triton --B 64,256 --H 32 --HV 32 --K 128 --V 128 --state-dtype bf16 --placements 1 --extra-placements 0 --no-charts"
for t in 32,4 16,4 32,2 16,2 64,8; do
  IFS=, read bv w <<< "$t"
  KDA_TRITON_FROZEN_CONFIG=BV=$bv,num_warps=$w timeout 80 python3 scripts/sweep.py $common --mode frozen --T 4 --out $OUT/tiles/frozen-$bv-$w > $OUT/tiles-frozen-$bv-$w.log 2>&1
  echo "frozen $bv/$w rc=$?"
done
for t in 32,4 16,4 32,8 64,8 16,2; do
  IFS=, read bv w <<< "$t"
  modes=replay; [ "$t" = 32,4 ] && modes=inplace,replay
  KDA_TRITON_REPLAY_CONFIG=BV=$bv,num_warps=$w timeout 80 python3 scripts/sweep.py $common --mode $modes --ring 16 --out $OUT/tiles/replay-$bv-$w > $OUT/tiles-replay-$bv-$w.log 2>&1
  echo "replay $bv/$w rc=$?"
done
python3 - <<'PY'
import glob, os, pandas as pd
for d in sorted(glob.glob(os.environ["OUT"] + "/tiles/*/results.csv")):
    r = pd.read_csv(d)
    cols = [c for c in ("mode", "B", "status", "kernel_us_mean", "gbps") if c in r]
    print(d.split("/")[-2], r[cols].to_string(index=False, header=False).replace("\n", " | "))
PY
