#!/usr/bin/env bash
# The focal-length measurement on a CPU (docs/accuracy.md, The focal length): three runs of the demo recipe at one
# equal budget (STEPS, default 2000), one after another, then packed AbsRel at Q = 16, 64 on 256
# held-out scenes of each run's own rig.
#   fixed      data.rig=fixed (the demo's robot camera)
#   varied     data.rig=varied, no focal input
#   focal      data.rig=varied, model.canonical_focal=45.7 (the fixed rig's 70-degree lens at 64 px)
#   lens       data.rig=lens (the fixed rig's mount and tilt, the varied rig's lenses), no focal input
#   lensfocal  data.rig=lens, model.canonical_focal=45.7       (RUNS="lens lensfocal" for these two)
# Usage: bash scripts/cpu_focal.sh [OUT=runs/focal]   (PY, STEPS, RUNS, THREADS override; 1 thread: a
# shared CPU runs one thread far better than two that wait on each other)
set -euo pipefail
OUT=${1:-runs/focal}
PY=${PY:-python}
STEPS=${STEPS:-2000}
RUNS=${RUNS:-"fixed varied focal"}
mkdir -p "$OUT"
for run in $RUNS; do
  case $run in
    fixed) extra="data.rig=fixed" ;;
    varied) extra="data.rig=varied" ;;
    focal) extra="data.rig=varied model.canonical_focal=45.7" ;;
    lens) extra="data.rig=lens" ;;
    lensfocal) extra="data.rig=lens model.canonical_focal=45.7" ;;
    *) echo "unknown run $run"; exit 1 ;;
  esac
  if [ ! -f "$OUT/$run/summary.json" ]; then
    echo "== train $run ($extra, $STEPS steps) $(date +%T)"
    /usr/bin/time -f "train $run wall %e s" $PY train/train.py --config configs/demo.yaml out_dir="$OUT/$run" \
      steps="$STEPS" eval_every=0 progress=false threads=${THREADS:-1} $extra > "$OUT/$run.train.log" 2>&1
  fi
  echo "== eval $run $(date +%T)"
  $PY -m depthpack.eval --checkpoint "$OUT/$run" --queries 16 64 --no-progress --figure-images 1 \
    --out "$OUT/$run/eval" data.num_val=256 > "$OUT/$run.eval.log" 2>&1
  if [ "$run" = focal ] || [ "$run" = lensfocal ]; then  # the same weights, no focal given (the default): what the input itself does
    $PY -m depthpack.eval --checkpoint "$OUT/$run" --queries 16 64 --no-progress --figure-images 0 \
      --focal default --out "$OUT/$run/eval_nofocal" data.num_val=256 > "$OUT/$run.eval_nofocal.log" 2>&1
  fi
done
echo "== done $(date +%T)"
