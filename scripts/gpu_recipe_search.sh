#!/usr/bin/env bash
# Recipe search for configs/demo.yaml on a GPU machine: the same steps, batch and data as the 2-core
# CPU run, several variants at once (float32, amp off, so the result transfers), to choose what the
# CPU run (the real, recorded one) trains. Needs 2 GPUs (two variants on each) and many CPU cores.
#   OUT=DIR bash scripts/gpu_recipe_search.sh     -> $OUT/recipes.jsonl (one line per variant)
set -u -o pipefail
OUT=${OUT:-/tmp/recipes}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
STEPS=${STEPS:-5400}
BASE="device=cuda amp=false steps=$STEPS threads=3 num_workers=0 data.cache=true progress=false eval_every=0"
declare -A V
if [ "${ROUND:-2}" = 1 ]; then  # round 1 (2026-11-29, H200 x2): A 2.62x, B 2.09x, C 2.19x, D 1.99x
  V=([A_base]="data.num_samples=8000"
     [B_abspos]="data.num_samples=8000 model.head_abs_pos=true"
     [C_abspos_flip]="data.num_samples=8000 model.head_abs_pos=true hflip=true"
     [D_abspos_flip_16k]="data.num_samples=16000 model.head_abs_pos=true hflip=true")
else
  V=([E_extra3]="data.num_samples=8000 extra_points=3"
     [F_extra3_flip]="data.num_samples=8000 extra_points=3 hflip=true"
     [G_extra7]="data.num_samples=8000 extra_points=7"
     [H_base_seed1]="data.num_samples=8000 seed=1")
fi
i=0
for name in "${!V[@]}"; do
  CUDA_VISIBLE_DEVICES=$((i % 2)) timeout ${RUN_S:-500} python3 train/train.py --config configs/demo.yaml \
    out_dir=/tmp/recipes/$name $BASE ${V[$name]} > "$OUT/$name.log" 2>&1 &
  i=$((i + 1))
done
wait
for name in "${!V[@]}"; do
  python3 - "$name" "${V[$name]}" <<'PY' | tee -a "$OUT/recipes.jsonl"
import json, sys
name, over = sys.argv[1], sys.argv[2]
try:
    s = json.load(open(f"/tmp/recipes/{name}/summary.json"))
    v = s["val"]
    print(json.dumps(dict(variant=name, overrides=over, wall_s=s["wall_s"], abs_rel=round(v["abs_rel"], 4),
                          constant=round(v["constant_abs_rel"], 4), ratio=round(v["constant_abs_rel"] / v["abs_rel"], 3))))
except Exception as e:
    print(json.dumps(dict(variant=name, overrides=over, error=repr(e))))
PY
done
