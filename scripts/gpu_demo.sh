#!/usr/bin/env bash
# On a GPU machine through the device tool (its python3 holds torch 2.11): the GPU tests, then the
# README's `make demo` exactly as a user types it.
#   OUT=DIR bash scripts/gpu_demo.sh              # PART=all: tests (~4 min) + demo (~6 min)
#   PART=tests | PART=demo OUT=DIR bash scripts/gpu_demo.sh
# Leaves in $OUT: gpu_tests.log, demo.log, report.md and demo.tgz (runs/demo without checkpoints,
# packages and build folders: the report, its figures, tables and logs).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_demo_out}
PART=${PART:-all}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%T) $*" | tee -a "$OUT/steps.log"; }
step "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader | paste -sd, -); $(python3 -c 'import torch; print(torch.__version__)')"
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  step "GPU tests (pytest -m gpu: Predictor no-sync/recapture/memory, kernel switch, C++ CUDA graph, torchrun NCCL)"
  PYTHONPATH=. timeout ${TEST_S:-300} python3 -m pytest -m gpu tests -q -rfEs -p no:cacheprovider --tb=short 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -15
fi
if [ "$PART" = all ] || [ "$PART" = demo ]; then
  step "make demo"
  rm -rf runs/demo
  timeout ${DEMO_S:-560} make demo 2>&1 | tr '\r' '\n' | grep -v -e '%|' -e '^\s*$' > "$OUT/demo.log"
  echo "make demo exit ${PIPESTATUS[0]}" | tee -a "$OUT/steps.log"
  tail -25 "$OUT/demo.log"
  [ -f runs/demo/report.md ] && cp runs/demo/report.md "$OUT/"
  tar czf "$OUT/demo.tgz" --exclude='runs/demo/train/checkpoints' --exclude='runs/demo/export/*.pt2' \
    --exclude='runs/demo/export/*.onnx*' --exclude='runs/demo/cpp_build' runs/demo 2>/dev/null
fi
step "done"
