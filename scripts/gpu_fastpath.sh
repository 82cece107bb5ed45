#!/usr/bin/env bash
# The fast path's GPU run (issue 4) on the H200 machine (its python3 holds torch 2.11 + triton 3.6).
#   OUT=DIR bash scripts/gpu_fastpath.sh              # PART=all: GPU tests + bench (about 10 min)
#   PART=tests OUT=DIR bash scripts/gpu_fastpath.sh   # GPU tests only (about 2.5 min)
#   PART=bench OUT=DIR bash scripts/gpu_fastpath.sh   # profile, compile time, ablations, sweep (about 8 min)
#   QUICK=1 ...                                       # bench: the two target points only
#   PART=targets OUT=DIR bash scripts/gpu_fastpath.sh # compile-time table + the rows at the two target
#                                                     # points (B1 Q256, B8 Q512) + the max-autotune row
# Leaves 5 files, docs-ready: $OUT/bench/{bench.json,bench.md,bench.png,profile.md} and $OUT/fastpath.log.
# Every step has its own time limit, and the sweep rewrites its outputs after each batch size, so a slow
# step cannot take the other steps' results with it.
set -u -o pipefail
OUT=${OUT:-/tmp/fastpath_out}
PART=${PART:-all}
mkdir -p "$OUT/bench"
LOG="$OUT/fastpath.log"
PY=${PY:-python3}
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/fastpath.XXXX)   # intermediate results (kept out of $OUT: it returns 8 files at most)
CACHE="$WORK/cache"                    # compile cache: empty for the cold compile, then shared by every step
export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor" TRITON_CACHE_DIR="$CACHE/triton"
step() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }
quiet() { grep -v -e 'DEBUG    torch' -e '%|' -e '^\s*$'; }
BENCH="$PY -m depthpack.bench --preset vits --dtype bfloat16 --cache-dir $CACHE"

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  $PY -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
  git rev-parse --short HEAD 2>/dev/null; } 2>&1 | tee -a "$LOG"

if [ "$PART" = all ] || [ "$PART" = tests ]; then
  step "GPU tests"
  TORCHINDUCTOR_CACHE_DIR="$WORK/testcache" TRITON_CACHE_DIR="$WORK/testcache/triton" \
  timeout ${TEST_S:-170} $PY -m pytest -m gpu tests/test_kernels.py tests/test_predictor.py -q -rfEs \
    --show-capture=no --tb=short 2>&1 | quiet | tee -a "$LOG"
fi

if [ "$PART" = all ] || [ "$PART" = bench ]; then
  [ "$PART" = all ] && SWEEP_S=${SWEEP_S:-250} || SWEEP_S=${SWEEP_S:-330}
  step "compile time per bucket: cold (empty cache) and warm (second process), vits bf16 batch 1, compile+graph"
  timeout ${CT_S:-150} $BENCH --rows none --batch 1 --compile-time --out "$WORK/ct" 2>&1 | quiet | tail -12 | tee -a "$LOG"

  step "profile of the packed forward (vits bf16 B1 Q256; eager and compiled; kernel off and on)"
  timeout ${PROFILE_S:-80} $PY -m depthpack.profiling --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --out "$OUT/bench" 2>&1 | quiet | grep -v '^\[{' | tee -a "$LOG"

  ABL="packed-graph,packed-compile+graph,packed-reduce-overhead,packed-graph+kernel,packed-compile+graph+kernel"
  step "ablations at the target points (B1 Q256, B8 Q512)"
  MERGE=""
  [ -f "$WORK/ct/bench.json" ] && MERGE="--merge-from $WORK/ct"
  timeout ${ABL1_S:-70} $BENCH --batch 1 --queries 256 --rows "$ABL" --seconds 0.3 --out "$WORK/abl1" $MERGE \
    2>&1 | quiet | tail -3 | tee -a "$LOG"
  [ -f "$WORK/abl1/bench.json" ] && MERGE="--merge-from $WORK/abl1"
  timeout ${ABL8_S:-80} $BENCH --batch 8 --queries 512 --rows "$ABL" --seconds 0.3 --out "$WORK/abl8" $MERGE \
    2>&1 | quiet | tail -3 | tee -a "$LOG"
  [ -f "$WORK/abl8/bench.json" ] && MERGE="--merge-from $WORK/abl8"

  ROWS="dense-eager,dense-graph,masked-eager,masked-graph,packed-eager,packed-compile,packed-graph,packed-compile+graph,packed-graph+kernel,dav2-eager,dav2-graph,dav2-compile+graph"
  if [ "${QUICK:-0}" = 1 ]; then
    step "sweep (quick: the target points)"
    timeout $SWEEP_S $BENCH --batch 1 --queries 256 --rows "$ROWS" --seconds 0.2 --out "$WORK/q1" $MERGE 2>&1 | quiet | tail -3 | tee -a "$LOG"
    [ -f "$WORK/q1/bench.json" ] && MERGE="--merge-from $WORK/q1"
    timeout $SWEEP_S $BENCH --batch 8 --queries 512 --rows "$ROWS" --seconds 0.2 --out "$OUT/bench" $MERGE 2>&1 | quiet | tee -a "$LOG"
  else
    step "sweep: batch 1,8 x queries 16,64,256,512,1024,4096"
    timeout $SWEEP_S $BENCH --batch 1,8 --queries 16,64,256,512,1024,4096 --rows "$ROWS" --seconds 0.12 \
      --out "$OUT/bench" $MERGE 2>&1 | quiet | tee -a "$LOG"
  fi
  if [ ! -f "$OUT/bench/bench.json" ] && [ -f "$WORK/abl8/bench.json" ]; then cp "$WORK/abl8"/bench.* "$OUT/bench/"; fi
fi
if [ "$PART" = targets ]; then  # each step merges the one before and leaves its result in $OUT/bench
  keep() { [ -f "$WORK/$1/bench.json" ] && cp "$WORK/$1"/bench.* "$OUT/bench/" && MERGE="--merge-from $WORK/$1"; true; }
  MERGE=""
  step "compile time per bucket: cold (empty cache) and warm (second process), vits bf16 batch 1, compile+graph"
  timeout ${CT_S:-200} $BENCH --rows none --batch 1 --compile-time --out "$WORK/ct" 2>&1 | quiet | tail -12 | tee -a "$LOG"
  keep ct
  ROWS="dense-eager,dense-graph,masked-eager,masked-graph,packed-eager,packed-compile,packed-graph,packed-compile+graph"
  step "the target points: B1 Q256 and B8 Q512"
  timeout ${PTS_S:-100} $BENCH --batch 1 --queries 256 --rows "$ROWS" --seconds 0.2 --out "$WORK/b1" $MERGE \
    2>&1 | quiet | tail -3 | tee -a "$LOG"
  keep b1
  timeout ${PTS_S:-100} $BENCH --batch 8 --queries 512 --rows "$ROWS" --seconds 0.2 --out "$WORK/b8" $MERGE \
    2>&1 | quiet | tail -3 | tee -a "$LOG"
  keep b8
  step "max-autotune (opt-in) at B1 Q256"
  timeout ${AT_S:-150} $BENCH --batch 1 --queries 256 --rows packed-autotune+graph --seconds 0.2 --out "$WORK/at" \
    $MERGE 2>&1 | quiet | tee -a "$LOG"
  keep at
fi
step "done"
rm -rf "$WORK"
