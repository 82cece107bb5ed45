#!/usr/bin/env bash
# Which change to the scale recipe closes the packed-versus-dense gap? (docs/scale/README.md: the first
# run left packed +6.4% over dense at Q=256.) Several trainings of configs/scale.yaml at once on one
# H200, each with its own overrides, the same STEPS each so every cosine schedule ends, then each
# evaluated on the 256 held-out scenes. One run, under 10 minutes. Three vits evaluations at once ran
# past 110 s and lost everything (two runs of 2026-12-02), so they run one after another, each with
# its own EVAL_S limit, and a killed one costs only its own rows:
#   1. render + cache 256 val scenes and as many train scenes as RENDER_S allows (14 cores)
#   2. the trainings, at once; max_time_s guards the deadline
#   3. the evaluations, one at a time: Q = 16 64 256 (packed, masked, dense, anchors on/off) and the
#      512-slot buffer at the same queries
#   RUNS="NAME:K=V,K=V NAME:..." OUT=DIR bash scripts/gpu_ab.sh     (STEPS, RENDER_S, TRAIN_S override)
#   e.g. RUNS="base: distill:distill_weight=1.0" (the distillation A/B of docs/scale/h200/distill/)
#   CFG=configs/tiny.yaml CONTEXT= STEPS=4 PY=.venv/bin/python bash scripts/gpu_ab.sh   (every step, on a CPU)
set -u -o pipefail
OUT=${OUT:-/tmp/ab_out}
PY=${PY:-python3}
RUNS=${RUNS:-"base: anchors12:model.anchor_grid=12 distill01:distill_weight=0.1"}
STEPS=${STEPS:-1400}; RENDER_S=${RENDER_S:-45}; TRAIN_S=${TRAIN_S:-200}; EVAL_S=${EVAL_S:-100}
mkdir -p "$OUT"
LOG="$OUT/ab.log"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/ab.XXXX)
CFG=${CFG:-configs/scale.yaml}; CONTEXT=${CONTEXT-512}
COMMON=(data.cache_dir="$WORK/scenes" data.render_budget_s=30 eval_every=0 progress=false)
T0=$(date +%s)
step() { echo "== $(date -u +%T) +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
names=(); for r in $RUNS; do names+=("${r%%:*}"); done
overrides() { local spec; for r in $RUNS; do [ "${r%%:*}" = "$1" ] && spec=${r#*:}; done; echo "${spec//,/ }"; }
step "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null), $(nproc) cores, $(git log --oneline -1 2>/dev/null | cut -c1-60)"
step "1. render + cache: val, then train for ${RENDER_S}s"
timeout $(( RENDER_S + 60 )) $PY -m depthpack.data.prerender --config $CFG "${COMMON[@]}" --splits val train \
  --processes $(( $(nproc) - 2 )) --budget "$RENDER_S" > "$WORK/render.log" 2>&1
grep '^{' "$WORK/render.log" | cut -c1-300 | tee -a "$LOG"
step "2. train ${names[*]} at once, $STEPS steps each (guard ${TRAIN_S}s)"
for run in "${names[@]}"; do
  # shellcheck disable=SC2046  # the overrides are words by design
  echo "[$run] $(overrides "$run")" | tee -a "$LOG"
  timeout $(( TRAIN_S + 30 )) $PY train/train.py --config $CFG "${COMMON[@]}" out_dir="$WORK/$run" steps="$STEPS" \
    max_time_s="$TRAIN_S" $(overrides "$run") > "$WORK/train_$run.log" 2>&1 &
done
wait
for run in "${names[@]}"; do
  cp "$WORK/$run/log.csv" "$OUT/train_log_$run.csv" 2>/dev/null
  grep '^{"step"' "$WORK/train_$run.log" | cut -c1-420 | tee -a "$LOG" || tail -3 "$WORK/train_$run.log" | tee -a "$LOG"
done
step "3. evaluate each: Q = 16 64 256 on the held-out scenes (and buffers of ${CONTEXT:-no more} slots)"
for run in "${names[@]}"; do
  t=$(date +%s)
  timeout "$EVAL_S" $PY -m depthpack.eval --checkpoint "$WORK/$run" --queries 16 64 256 ${CONTEXT:+--context $CONTEXT} --curve \
    --batch-size 16 --figure-images 0 --no-progress --out "$WORK/eval_$run" > "$WORK/eval_$run.log" 2>&1
  echo "[$run] exit $?, $(( $(date +%s) - t )) s" | tee -a "$LOG"
  cp "$WORK/eval_$run/eval.md" "$OUT/eval_$run.md" 2>/dev/null
  grep -e '^- q' -e '^|' "$WORK/eval_$run/eval.md" 2>/dev/null | tee -a "$LOG" || tail -3 "$WORK/eval_$run.log" | tee -a "$LOG"
done
step "done"
