#!/usr/bin/env bash
# Does distillation toward the dense path close the packed-versus-dense gap of the scale model?
# (docs/scale/README.md: the first run left packed +6.4% over dense at Q=256.) One H200 run, ~7 minutes:
#   1. render + cache 256 val scenes and as many train scenes as RENDER_S allows (14 cores)
#   2. two trainings of configs/scale.yaml at once on the one GPU, the same STEPS each, so both cosine
#      schedules end: "base" (distill_weight 0) and "distill" (distill_weight DW, a detached dense
#      forward of the same weights per step); max_time_s guards the deadline
#   3. both evaluated on the 256 held-out scenes at Q = 16 64 256 (packed, masked, dense, anchors on/off)
#   OUT=DIR bash scripts/gpu_distill.sh          (STEPS, DW, RENDER_S, TRAIN_S override)
set -u -o pipefail
OUT=${OUT:-/tmp/distill_out}
PY=${PY:-python3}
STEPS=${STEPS:-2000}; DW=${DW:-1.0}; RENDER_S=${RENDER_S:-60}; TRAIN_S=${TRAIN_S:-270}
mkdir -p "$OUT"
LOG="$OUT/distill.log"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/distill.XXXX)
CFG=configs/scale.yaml
COMMON=(data.cache_dir="$WORK/scenes" data.render_budget_s=30 eval_every=0 progress=false)
T0=$(date +%s)
step() { echo "== $(date -u +%T) +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
step "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null), $(nproc) cores, $(git log --oneline -1 2>/dev/null | cut -c1-60)"
step "1. render + cache: val, then train for ${RENDER_S}s"
timeout $(( RENDER_S + 60 )) $PY -m depthpack.data.prerender --config $CFG "${COMMON[@]}" --splits val train \
  --processes $(( $(nproc) - 2 )) --budget $RENDER_S > "$WORK/render.log" 2>&1
grep '^{' "$WORK/render.log" | cut -c1-300 | tee -a "$LOG"
step "2. train base and distill (distill_weight=$DW) at once, $STEPS steps each (guard ${TRAIN_S}s)"
for run in base distill; do
  dw=$([ $run = distill ] && echo "$DW" || echo 0)
  timeout $(( TRAIN_S + 30 )) $PY train/train.py --config $CFG "${COMMON[@]}" out_dir="$WORK/$run" steps=$STEPS \
    distill_weight=$dw max_time_s=$TRAIN_S > "$WORK/train_$run.log" 2>&1 &
done
wait
for run in base distill; do
  cp "$WORK/$run/log.csv" "$OUT/train_log_$run.csv" 2>/dev/null
  grep '^{"step"' "$WORK/train_$run.log" | cut -c1-420 | tee -a "$LOG" || tail -3 "$WORK/train_$run.log" | tee -a "$LOG"
done
step "3. evaluate both: Q = 16 64 256 on the 256 held-out scenes"
for run in base distill; do
  timeout 100 $PY -m depthpack.eval --checkpoint "$WORK/$run" --queries 16 64 256 --curve --batch-size 16 \
    --figure-images 0 --no-progress --out "$WORK/eval_$run" > "$WORK/eval_$run.log" 2>&1 &
done
wait
for run in base distill; do
  cp "$WORK/eval_$run/eval.md" "$OUT/eval_$run.md" 2>/dev/null
  echo "[$run]" | tee -a "$LOG"; grep -e '^- q' "$WORK/eval_$run/eval.md" 2>/dev/null | tee -a "$LOG" || tail -3 "$WORK/eval_$run.log" | tee -a "$LOG"
done
step "done"
