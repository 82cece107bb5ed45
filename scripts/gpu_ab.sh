#!/usr/bin/env bash
# Trainings of the scale recipe (configs/scale.yaml, vits 420x560) side by side on one H200, each with its own
# overrides and the same STEPS, then each evaluated on the same 256 held-out 420x560 scenes. One device call.
#   1. render + cache the val and train scenes of every image size the runs use (every core but two)
#   2. the trainings, at once (GPU_TESTS=1: the GPU tests beside them, on the CPU cores they leave)
#   3. per run: packed and dense AbsRel at Q = QUERIES (a run at another image size reads the 420x560 scenes
#      resized to its own: the equal-tokens dense baselines, trained with train_path=dense and evaluated
#      dense only), the context diagnostic, and the packed vs dense gap at every kept checkpoint
#   4. LAYOUTS="NAME:K=V+K=V ...": B1 latency (python -m depthpack.bench, BENCH_ROWS: fast and dense-graph) of each
#      run's model and of each layout's untrained model (latency does not depend on the weights)
#   RUNS="NAME:K=V+K=V NAME:..." OUT=DIR bash scripts/gpu_ab.sh          (STEPS, RENDER_S, TRAIN_S, EVAL_S)
#   CFG=configs/tiny.yaml STEPS=4 QUERIES="4 16" PY=.venv/bin/python bash scripts/gpu_ab.sh   (every step, on a CPU)
# $OUT gets ab.log (the summary, also printed) and results.tgz (every run's eval.json, gap.json, log.csv, figures).
set -u -o pipefail
OUT=${OUT:-/tmp/ab_out}
PY=${PY:-python3}
RUNS=${RUNS:-"base: glance:model.context=glance+model.registers=4"}
STEPS=${STEPS:-3000}; RENDER_S=${RENDER_S:-70}; TRAIN_S=${TRAIN_S:-360}; EVAL_S=${EVAL_S:-60}
QUERIES=${QUERIES:-16 64 256 1024}; CKPT_EVERY=${CKPT_EVERY:-500}
mkdir -p "$OUT"
LOG="$OUT/ab.log"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/ab.XXXX)
CFG=${CFG:-configs/scale.yaml}
COMMON=(data.cache_dir="$WORK/scenes" data.render_budget_s=30 eval_every=0 progress=false)
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"  # overrides for every run, e.g. EXTRA="graph=true"
COMMON+=("${EXTRA_ARGS[@]}")
DEADLINE_S=${DEADLINE_S:-570}  # the whole script: the evaluations take what is left
T0=$(date +%s)
step() { echo "== $(date -u +%T) +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
limit() { local l; l=$(( $(left) - 5 )); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }
finish() { tar czf "$OUT/results.tgz" -C "$WORK" --exclude=scenes --exclude=checkpoints . 2>/dev/null; step "done"; }
trap finish EXIT
names=(); for r in $RUNS; do names+=("${r%%:*}"); done
overrides() { local spec=""; for r in $RUNS ${LAYOUTS:-}; do [ "${r%%:*}" = "$1" ] && spec=${r#*:}; done; echo "${spec//+/ }"; }
is_dense() { overrides "$1" | tr ' ' '\n' | grep -qx 'train_path=dense'; }
size_of() { overrides "$1" | tr ' ' '\n' | grep '^model.img_size=' | cut -d= -f2; }
# the held-out scenes every run is scored on: the config's own image size
HW=$($PY -c "from depthpack.train import load_train_config as l; h, w = l('$CFG').model_config().img_size; print(f'{w}x{h}')")
step "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null), $(nproc) cores, $(git log --oneline -1 2>/dev/null | cut -c1-60); scenes ${HW}"

step "1. render + cache: val, then train for ${RENDER_S}s, at each image size"
sizes=$(for run in "${names[@]}"; do size_of "$run"; done | sort -u)
main_splits="val"  # the config's own size: the held-out scenes, and training scenes when a run trains there
for run in "${names[@]}"; do [ -z "$(size_of "$run")" ] && main_splits="val train"; done
# shellcheck disable=SC2086  # the splits are words
timeout $(( RENDER_S + 60 )) $PY -m depthpack.data.prerender --config $CFG "${COMMON[@]}" --splits $main_splits \
  --processes $(( $(nproc) > 4 ? $(nproc) - 2 : $(nproc) )) --budget "$RENDER_S" > "$WORK/render.log" 2>&1
for s in $sizes; do  # smaller sizes render faster: a third of the budget each
  timeout $(( RENDER_S / 3 + 60 )) $PY -m depthpack.data.prerender --config $CFG "${COMMON[@]}" model.img_size="$s" \
    --splits train --processes $(( $(nproc) > 4 ? $(nproc) - 2 : $(nproc) )) --budget $(( RENDER_S / 3 )) >> "$WORK/render.log" 2>&1
done
grep '^{' "$WORK/render.log" | cut -c1-300 | tee -a "$LOG"

step "2. train ${names[*]} at once, $STEPS steps each (guard ${TRAIN_S}s)"
for run in "${names[@]}"; do
  echo "[$run] $(overrides "$run")" | tee -a "$LOG"
  # shellcheck disable=SC2046  # the overrides are words by design
  timeout $(( TRAIN_S + 60 )) $PY train/train.py --config $CFG "${COMMON[@]}" out_dir="$WORK/$run" steps="$STEPS" \
    max_time_s="$TRAIN_S" ckpt_every="$CKPT_EVERY" keep_checkpoints=20 $(overrides "$run") > "$WORK/train_$run.log" 2>&1 &
done
if [ "${GPU_TESTS:-0}" = 1 ]; then  # correctness tests beside the trainings: compile-bound, they need the CPU cores
  timeout "${TEST_S:-400}" $PY -m pytest -m gpu tests -q -rfEs -p no:cacheprovider --tb=short -n "${XDIST:-6}" \
    --junitxml="$WORK/gpu_tests.xml" > "$WORK/gpu_tests.log" 2>&1
  echo "pytest -m gpu exit $?" | tee -a "$LOG"
  grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/gpu_tests.log" | tail -20 | tee -a "$LOG"
fi
wait
for run in "${names[@]}"; do
  grep '^{"step"' "$WORK/train_$run.log" | cut -c1-400 | tee -a "$LOG" || tail -3 "$WORK/train_$run.log" | tee -a "$LOG"
done

step "3. evaluate each on the ${HW} held-out scenes: Q = $QUERIES, packed and dense, the gap over training"
for run in "${names[@]}"; do
  t=$(date +%s)
  size=$(size_of "$run")
  if is_dense "$run"; then paths=(--paths dense); else paths=(--paths packed dense --curve); fi
  timeout "$(limit "$EVAL_S")" $PY -m depthpack.eval --checkpoint "$WORK/$run" --queries $QUERIES "${paths[@]}" \
    --anchors on --max-images 256 --batch-size 16 --figure-images 1 --no-progress \
    ${size:+--image-size "$HW"} --out "$WORK/$run/eval" > "$WORK/eval_$run.log" 2>&1
  echo "[$run] eval exit $?, $(( $(date +%s) - t )) s" | tee -a "$LOG"
  grep -e '^- q' "$WORK/$run/eval/eval.md" 2>/dev/null | tee -a "$LOG" || tail -3 "$WORK/eval_$run.log" | tee -a "$LOG"
done
for run in "${names[@]}"; do  # the gap over training: after every run's own evaluation, with what time is left
  is_dense "$run" && continue
  size=$(size_of "$run")
  timeout "$(limit "$EVAL_S")" $PY scripts/diagnostics.py gap --checkpoint "$WORK/$run" --queries 16 256 --max-images 128 \
    --out "$WORK/$run/gap" > "$WORK/gap_$run.log" 2>&1
  echo "[$run] gap curve exit $?" | tee -a "$LOG"; cat "$WORK/$run/gap/gap.md" 2>/dev/null | tee -a "$LOG"
done
if [ -n "${LAYOUTS:-}" ]; then
  step "4. B1 latency at Q = ${LAT_Q:-256}, rows ${BENCH_ROWS:-fast,dense-graph}: each run's model and each layout's"
  for spec in $LAYOUTS; do  # the layout's model, untrained: the same shapes, so the same latency
    name=${spec%%:*}
    # shellcheck disable=SC2046
    $PY -c 'import sys; from pathlib import Path; from depthpack.train.run_folder import untrained_checkpoint
untrained_checkpoint(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])' $CFG "$WORK/$name" $(overrides "$name") \
      >> "$WORK/bench.log" 2>&1
  done
  for spec in $RUNS $LAYOUTS; do
    name=${spec%%:*}
    rows=${BENCH_ROWS:-fast,dense-graph}
    is_dense "$name" && rows=${rows##*,}  # a dense-trained baseline: its dense row alone
    timeout "$(limit "${BENCH_S:-120}")" $PY -m depthpack.bench --checkpoint "$WORK/$name" --dtype bfloat16 \
      --pairs "1x${LAT_Q:-256}" --rows "$rows" --out "$WORK/$name/bench" >> "$WORK/bench.log" 2>&1
    echo "[$name] bench exit $?" | tee -a "$LOG"
    grep -E "^\| .*\| (${rows//,/|}) \|" "$WORK/$name/bench/bench.md" 2>/dev/null | tee -a "$LOG"
  done
fi
