#!/usr/bin/env bash
# Where a CUDA package's compile time goes: the demo model's four buckets exported cold, then again on
# the warm on-disk caches (in parallel processes; with Inductor's compile pool off; all in one process),
# with every g++ call timed. One H200 run, 3-5 minutes:
#   OUT=DIR bash scripts/gpu_export_timing.sh      -> DIR/export_timing.log (+ one log per export)
set -u -o pipefail
OUT=${OUT:-/tmp/export_timing}
PY=${PY:-python3}; EXTRA=${EXTRA:-}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/export_timing.XXXX)
LOG=$OUT/export_timing.log
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
       TORCHINDUCTOR_CACHE_DIR=$W/cache/inductor TRITON_CACHE_DIR=$W/cache/triton
REAL_CXX=$(command -v g++)
cat > "$W/gxx" <<GXX
#!/bin/sh
s=\$(date +%s%N); "$REAL_CXX" "\$@"; rc=\$?; e=\$(date +%s%N)
what=\$(printf '%s\n' "\$@" | grep -E '\.(cpp|h|hpp)$' | head -1 | sed 's#.*/##')
echo "\$(( (e - s) / 1000000 )) ms \${what:-link/other} \$(printf '%s ' "\$@" | grep -o -e ' -O[0-3s]' -e ' -shared' | tr '\n' ' ')" >> "\$GXX_LOG"
exit \$rc
GXX
chmod +x "$W/gxx"
$PY -c "from depthpack.demo import untrained_checkpoint; untrained_checkpoint('configs/demo.yaml', '$W/ckpt')" || exit 1
run() {  # NAME ENV... -- EXPORT_ARGS...
  local name=$1; shift; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local t0; t0=$(date +%s%N)
  env "${envs[@]}" CXX="$W/gxx" GXX_LOG="$OUT/gxx_$name.log" timeout 300 $PY export/export.py --checkpoint "$W/ckpt" \
    --out "$W/$name" --device "${DEVICE:-cuda}" $EXTRA "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms wall; $(tail -1 "$OUT/$name.log" | grep -o '"compile_s": {[^}]*}')" | tee -a "$LOG"
  sort -n "$OUT/gxx_$name.log" 2>/dev/null | tail -4 | sed 's/^/    g++ /' | tee -a "$LOG"
}
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader), $(nproc) cores" | tee -a "$LOG"
run cold_parallel X=1 --
run warm_parallel X=1 --
run warm_parallel_no_pool TORCHINDUCTOR_COMPILE_THREADS=1 --
run warm_one_process X=1 -- --compile-workers 1
