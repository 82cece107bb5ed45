#!/usr/bin/env bash
# Runs of configs/frontier_gpu_beds.yaml (the resolution bed's levers) on one GPU inside one device call:
# every distinct scene set rendered once on every core into a shared store, then the runs trained and
# evaluated by python -m depthpack.frontier, all at once, one core each; rows, figure and each run's summary
# and loss log to $OUT.
#   OUT=DIR RUNS='"NAME" "NAME" ...' bash scripts/gpu_beds.sh
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_beds_out}
PY=${PY:-python3}
W=${W:-/tmp/gpu_beds}
PLAN=${PLAN:-configs/frontier_gpu_beds.yaml}
mkdir -p "$OUT" "$W/stores"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
T0=$(date +%s)
step() { echo "== +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/beds.log"; }
step "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader); $(git log --oneline -1 | cut -c1-60)"
eval "names=(${RUNS:-})"

# the plan with the shared store, and one prerender command line per distinct scene set of the chosen runs
$PY - "$PLAN" "$W" "${names[@]}" <<'PYEOF' > "$W/prerender.txt"
import sys, yaml
plan_path, w, names = sys.argv[1], sys.argv[2], sys.argv[3:]
plan = yaml.safe_load(open(plan_path))
plan["common"] = [*plan["common"], f"data.cache_dir={w}/stores"]
yaml.safe_dump(plan, open(f"{w}/plan.yaml", "w"), sort_keys=False)
size = next(o.split("=", 1)[1] for o in plan["common"] if o.startswith("data_size="))
seen = set()
for r in plan["runs"]:
    if names and r["name"] not in names:
        continue
    data = tuple(o for o in [*plan["common"], *r.get("overrides", [])] if o.startswith("data."))
    if data not in seen:
        seen.add(data)
        print(" ".join([f"--config {plan['base']}", *data, f"model.img_size={size}"]))
PYEOF
while read -r line; do
  step "prerender $line"
  eval "timeout 200 $PY -m depthpack.data.prerender --processes $(nproc) $line" >>"$OUT/beds.log" 2>&1 || step "prerender failed"
done < "$W/prerender.txt"

only=(); [ ${#names[@]} -gt 0 ] && only=(--only "${names[@]}")
step "frontier: ${#names[@]} runs"
timeout "${FRONTIER_S:-450}" $PY -m depthpack.frontier --plan "$W/plan.yaml" --runs "$W/runs" --jobs "${JOBS:-16}" \
  --out "$W/frontier.json" --figure "$W/frontier.png" "${only[@]}" >"$W/frontier.log" 2>&1
step "frontier exit $?"
if [ ! -s "$W/frontier.json" ]; then  # cut by the timeout: the finished runs, evaluated
  timeout "${NO_TRAIN_S:-90}" $PY -m depthpack.frontier --plan "$W/plan.yaml" --runs "$W/runs" --jobs 16 --no-train \
    --out "$W/frontier.json" --figure "$W/frontier.png" "${only[@]}" >>"$W/frontier.log" 2>&1
  step "frontier --no-train exit $?"
fi
cp "$W"/frontier.json "$W"/frontier.png "$OUT"/ 2>/dev/null
grep -v "%|" "$W/frontier.log" | tail -30 | cut -c1-300 > "$OUT/frontier_tail.log"
(cd "$W/runs" && tar czf "$OUT/runs.tgz" */summary.json */log.csv */frontier_eval/eval.json 2>/dev/null)
for f in "$W"/runs/*/log.csv; do echo "$f: $(tail -1 "$f" | cut -c1-80)"; done 2>/dev/null | tee -a "$OUT/beds.log"
step "done"
