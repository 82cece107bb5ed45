#!/usr/bin/env bash
# Runs of configs/frontier_gpu_beds.yaml (the resolution bed's levers) on one GPU inside one device call:
# trained and evaluated by python -m depthpack.frontier, all at once, one core each (a run cut by the time
# limit is left out, the finished ones evaluated); rows, figure and each run's summary and loss log to $OUT.
#   OUT=DIR RUNS='"NAME" "NAME" ...' bash scripts/gpu_beds.sh
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_beds_out}
PY=${PY:-python3}
W=${W:-/tmp/gpu_beds}
PLAN=${PLAN:-configs/frontier_gpu_beds.yaml}
mkdir -p "$OUT" "$W"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
T0=$(date +%s)
step() { echo "== +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/beds.log"; }
step "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader); $(git log --oneline -1 | cut -c1-60)"
eval "names=(${RUNS:-})"

# each trainer renders its own scenes on its core, as in the first sweep: a shared store rendered first by
# python -m depthpack.data.prerender on 16 cores did not finish 4000 scenes in 194 s on the H100 host (128 in 6 s)
only=(); [ ${#names[@]} -gt 0 ] && only=(--only "${names[@]}")
step "frontier: ${#names[@]} runs"
timeout "${FRONTIER_S:-450}" $PY -m depthpack.frontier --plan "$PLAN" --runs "$W/runs" --jobs "${JOBS:-16}" \
  --out "$W/frontier.json" --figure "$W/frontier.png" "${only[@]}" >"$W/frontier.log" 2>&1
step "frontier exit $?"
if [ ! -s "$W/frontier.json" ]; then  # cut by the timeout: the finished runs, evaluated
  timeout "${NO_TRAIN_S:-90}" $PY -m depthpack.frontier --plan "$PLAN" --runs "$W/runs" --jobs 16 --no-train \
    --out "$W/frontier.json" --figure "$W/frontier.png" "${only[@]}" >>"$W/frontier.log" 2>&1
  step "frontier --no-train exit $?"
fi
cp "$W"/frontier.json "$W"/frontier.png "$OUT"/ 2>/dev/null
grep -v "%|" "$W/frontier.log" | tail -30 | cut -c1-300 > "$OUT/frontier_tail.log"
(cd "$W/runs" && tar czf "$OUT/runs.tgz" */summary.json */log.csv */frontier_eval/eval.json 2>/dev/null)
for f in "$W"/runs/*/log.csv; do echo "$f: $(tail -1 "$f" | cut -c1-80)"; done 2>/dev/null | tee -a "$OUT/beds.log"
step "done"
