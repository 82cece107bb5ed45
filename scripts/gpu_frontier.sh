#!/usr/bin/env bash
# The frontier at scale on one H200, in calls of under 10 minutes that share the warm machine's /tmp.
#   OUT=DIR STEPS="render latency" RUNS="NAME ..." bash scripts/gpu_frontier.sh
# Steps:
#   render   the renderer at 420x560, batch 64, on the GPU (scripts/render_bench.py): scenes/s and its parts
#   latency  B1 Q256 of the new default layout beside today's 144 thumbnail anchors (python -m depthpack.bench,
#            row fast, untrained checkpoints: latency depends on the shapes, not the weights)
#   frontier the plan's runs named in RUNS (all when empty), trained and evaluated by python -m depthpack.frontier;
#            finished runs in $W/runs/PLAN are read, not trained again; rows, figure and runs.tgz (each run's
#            summary, loss log and evaluation) to $OUT; with NO_TRAIN_S, a frontier cut by FRONTIER_S evaluates
#            what finished
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_frontier_out}
PY=${PY:-python3}
W=${W:-/tmp/gpu_frontier}
PLAN=${PLAN:-configs/frontier_h200.yaml}
STEPS=${STEPS:-render latency frontier}
mkdir -p "$OUT" "$W"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/cache/inductor \
       TRITON_CACHE_DIR=$W/cache/triton
LOG=$OUT/frontier_run.log
T0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
step "machine: $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader); commit $($PY -c 'from depthpack.core.provenance import commit; print(commit())' 2>/dev/null)"

if has render; then
  step "renderer: 420x560, batch 64, cuda"
  timeout 90 $PY scripts/render_bench.py --size 420 560 --batch 64 --device cuda --repeats 5 >"$OUT/render.txt" 2>&1
  echo "render exit $?" | tee -a "$LOG"; tail -4 "$OUT/render.txt" | cut -c1-600 | tee -a "$LOG"
fi

if has latency; then
  for spec in "new:" "thumbnail:model.context=thumbnail model.anchor_grid=12 model.glance_depth=false model.query_head=direct"; do
    name=${spec%%:*}
    step "latency: $name layout, vits bf16 B1 Q256"
    timeout 150 $PY - "$W/lat_$name" ${spec#*:} <<'PYEOF' >>"$W/latency.log" 2>&1 || { echo "checkpoint failed"; continue; }
import sys
from pathlib import Path
from depthpack.train.run_folder import untrained_checkpoint
untrained_checkpoint("configs/scale.yaml", Path(sys.argv[1]), sys.argv[2:])
PYEOF
    timeout 150 $PY -m depthpack.bench --checkpoint "$W/lat_$name" --dtype bfloat16 --pairs 1x256 --rows fast \
      --seconds 0.3 --repeats 3 --cache-dir "$W/cache" --out "$OUT/bench_$name" >>"$W/latency.log" 2>&1
    echo "bench exit $?" | tee -a "$LOG"
    grep -E "^\| " "$OUT/bench_$name/bench.md" 2>/dev/null | head -6 | cut -c1-220 | tee -a "$LOG"
  done
fi

if has frontier; then
  only=()
  [ -n "${RUNS:-}" ] && { eval "names=($RUNS)"; only=(--only "${names[@]}"); }
  R=$W/runs/$(basename "$PLAN" .yaml)  # a plan's own run folders: plans that vary another share run names
  step "frontier: ${RUNS:-every run}"
  timeout "${FRONTIER_S:-420}" $PY -m depthpack.frontier --plan "$PLAN" --runs "$R" --jobs "${JOBS:-2}" \
    --out "$W/frontier.json" --figure "$W/frontier.png" "${only[@]}" >"$OUT/frontier.log" 2>&1
  rc=$?
  echo "frontier exit $rc" | tee -a "$LOG"
  if [ $rc -ne 0 ] && [ -n "${NO_TRAIN_S:-}" ]; then  # cut by the timeout: the runs that finished, evaluated
    timeout "$NO_TRAIN_S" $PY -m depthpack.frontier --plan "$PLAN" --runs "$R" --jobs "${JOBS:-2}" --no-train \
      --out "$W/frontier.json" --figure "$W/frontier.png" "${only[@]}" >>"$OUT/frontier.log" 2>&1
    echo "frontier --no-train exit $?" | tee -a "$LOG"
  fi
  cp "$W"/frontier.json "$W"/frontier.png "$OUT"/ 2>/dev/null; grep -v "%|" "$OUT/frontier.log" | tail -12 | cut -c1-300 | tee -a "$LOG"
  for f in "$R"/*/log.csv; do echo "$f: $(tail -1 "$f" | cut -c1-80)"; done 2>/dev/null | tee -a "$LOG"
  # each run's summary, loss log and evaluation (its training loss for the docs), without the checkpoints
  (cd "$R" && tar czf "$OUT/runs.tgz" */summary.json */log.csv */frontier_eval/eval.json 2>/dev/null)
fi
step "done"
