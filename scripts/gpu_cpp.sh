#!/usr/bin/env bash
# GPU part of the C++ runner (issue 5), for the H200 through the device tool. Run from the repo root
# AFTER scripts/gpu_export.sh (which writes the vits bf16 CUDA export to /tmp/dp_export_vits):
#     bash scripts/gpu_export.sh && bash scripts/gpu_cpp.sh
# 1. configures + builds deploy_cpp against this machine's torch (clear diagnostics if CMake cannot
#    find a CUDA piece, and one retry with whatever nvcc / nvrtc it can find on the machine);
# 2. --check parity with the reference file (eager Python outputs), with the CUDA graph and without;
# 3. --bench N for every bucket (Q = its capacity), with the CUDA graph and with --no-graph, and
#    graph vs no-graph outputs on the same points.
# Writes to $OUT (or /tmp/dp_cpp_logs): cpp_runner.json (GPU, torch, build time, parity, latencies, and
# Python's aoti latencies from gpu_export.sh's check_bench.json when it is there) and cpp_runner.log.
# Knobs: DP_EXPORT_DIR, DP_CPP_BUILD (build folder), DP_BENCH_N (default 1000), PYTHON.
set -uo pipefail
PY=${PYTHON:-python3}
DIR=${DP_EXPORT_DIR:-/tmp/dp_export_vits}
LOGS=${OUT:-/tmp/dp_cpp_logs}
BUILD=${DP_CPP_BUILD:-/tmp/dp_cpp_build}
N=${DP_BENCH_N:-1000}
mkdir -p "$LOGS" "$LOGS/cpp_runs"
LOG="$LOGS/cpp_runner.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
runlog() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

say "== machine"
runlog $PY -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', platform.python_version(), \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA', torch.cuda.get_device_capability(0) if torch.cuda.is_available() else '')"
runlog cmake --version | head -1
NVCC_PATH=$(command -v nvcc || true)
say "nvcc on PATH: ${NVCC_PATH:-none}; CUDA_HOME=${CUDA_HOME:-unset}"
[ -n "$NVCC_PATH" ] && runlog nvcc --version | tail -2
PREFIX=$($PY -c "import torch; print(torch.utils.cmake_prefix_path)")
SITE=$($PY -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")

diagnose() {  # what CMake needs for a CUDA build of libtorch, and where this machine has it
    say "-- diagnostics: nvcc, CUDA headers, cudart, nvrtc on this machine"
    ls -d /usr/local/cuda* 2>&1 | tee -a "$LOG"
    find / -xdev \( -name nvcc -o -name cuda_runtime_api.h -o -name 'libcudart.so*' -o -name 'libnvrtc.so*' \) \
        -not -path '/proc/*' 2>/dev/null | head -30 | tee -a "$LOG"
    [ -f "$BUILD/CMakeFiles/CMakeError.log" ] && tail -30 "$BUILD/CMakeFiles/CMakeError.log" | tee -a "$LOG"
}

say "== configure + build -> $BUILD"
t0=$(date +%s)
configure() { runlog cmake -S deploy_cpp -B "$BUILD" -DCMAKE_PREFIX_PATH="$PREFIX" "$@"; }
if ! configure; then
    diagnose
    # one retry with explicit pieces: the first real nvcc found, its toolkit, and any libnvrtc
    NVCC=$(find /usr/local /opt /usr/bin "$SITE" -xdev -name nvcc -type f 2>/dev/null | head -1)
    NVRTC=$(find /usr/local /opt /usr/lib "$SITE" -xdev -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -1)
    say "-- retry with nvcc=$NVCC nvrtc=$NVRTC"
    rm -rf "$BUILD"
    EXTRA=()
    [ -n "$NVCC" ] && EXTRA+=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDA_TOOLKIT_ROOT_DIR="$(dirname "$(dirname "$NVCC")")")
    [ -n "$NVRTC" ] && EXTRA+=(-DCUDA_nvrtc_LIBRARY="$NVRTC")
    configure "${EXTRA[@]}" || { say "CONFIGURE FAILED (see diagnostics above)"; BUILD_FAILED=1; }
fi
if [ -z "${BUILD_FAILED:-}" ]; then
    runlog cmake --build "$BUILD" -j "$(nproc)" || { say "BUILD FAILED"; BUILD_FAILED=1; }
fi
BUILD_S=$(( $(date +%s) - t0 ))
say "configure + build: ${BUILD_S} s"
BIN="$BUILD/depthpack_run"

if [ -z "${BUILD_FAILED:-}" ] && [ ! -f "$DIR/manifest.json" ]; then
    say "!! no export at $DIR (did gpu_export.sh run?): exporting the tiny preset to CUDA instead, to test the runner"
    DIR=/tmp/dp_export_tiny_cuda
    runlog timeout 400 $PY export/export.py --preset tiny --out "$DIR" --device cuda --buckets 8,16 >/dev/null
fi

if [ -z "${BUILD_FAILED:-}" ] && [ -f "$DIR/manifest.json" ]; then
    M="$DIR/manifest.json"; REF="$DIR/reference.safetensors"
    say "== parity: --check $REF (CUDA graph, then --no-graph)"
    runlog timeout 300 "$BIN" --manifest "$M" --check "$REF"; say "exit $?"
    runlog timeout 300 "$BIN" --manifest "$M" --check "$REF" --no-graph; say "exit $?"
    for K in $($PY -c "import json,sys; print(' '.join(str(b['capacity']) for b in json.load(open(sys.argv[1]))['buckets']))" "$M"); do
        P="$LOGS/cpp_runs/points_k$K.csv"
        $PY - "$M" "$K" "$P" <<'EOF'
import json, sys, numpy as np
m = json.load(open(sys.argv[1])); H, W = m["image_size"]; k = int(sys.argv[2])
pts = np.random.default_rng(k).random((k, 2)) * [W - 1, H - 1]  # model pixels = the tensor image's pixels
with open(sys.argv[3], "w") as f:
    f.write("x,y\n" + "".join(f"{x:.3f},{y:.3f}\n" for x, y in pts))
EOF
        say "== bucket $K: --bench $N (CUDA graph, then --no-graph)"
        s0=$(date +%s%N)
        runlog timeout 500 "$BIN" --manifest "$M" --image "$REF" --points "$P" --out "$LOGS/cpp_runs/depth_k${K}_graph.csv" --bench "$N"
        say "exit $? wall $(( ($(date +%s%N) - s0) / 1000000 )) ms (load + capture + $N runs)"
        runlog timeout 500 "$BIN" --manifest "$M" --image "$REF" --points "$P" --out "$LOGS/cpp_runs/depth_k${K}_nograph.csv" --bench "$N" --no-graph
        say "exit $?"
    done
fi

say "== summary -> $LOGS/cpp_runner.json"
$PY - "$LOG" "$LOGS" "$DIR" "$BUILD_S" "${BUILD_FAILED:-0}" <<'EOF' | tee -a "$LOG"
import json, os, re, subprocess, sys
import numpy as np
import torch
log, logs, d, build_s, failed = sys.argv[1:6]
text = open(log).read()
res = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
       "torch": torch.__version__, "cuda": torch.version.cuda, "export_dir": d,
       "build_s": int(build_s), "build_ok": failed == "0",
       "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None,
       "check": [], "bench": [], "graph_vs_no_graph_max_abs_diff": {}}
for m in re.finditer(r"check (\S+): (\d+) points, max abs diff (\S+) \(atol (\S+), rtol (\S+)\): (\w+)", text):
    res["check"].append({"ref": m[1], "points": int(m[2]), "max_abs_diff": float(m[3]), "atol": float(m[4]),
                         "rtol": float(m[5]), "ok": m[6] == "OK"})
for m in re.finditer(r"bench capacity=(\d+) device=(\S+) graph=(\d) runs=(\d+) median_ms=(\S+) p90_ms=(\S+)", text):
    res["bench"].append({"capacity": int(m[1]), "device": m[2], "cuda_graph": m[3] == "1", "runs": int(m[4]),
                         "median_ms": float(m[5]), "p90_ms": float(m[6])})
for f in sorted(os.listdir(os.path.join(logs, "cpp_runs"))):
    k = re.match(r"depth_k(\d+)_graph.csv", f)
    other = os.path.join(logs, "cpp_runs", f"depth_k{k[1]}_nograph.csv") if k else None
    if k and os.path.exists(other):
        a, b = (np.loadtxt(os.path.join(logs, "cpp_runs", g), delimiter=",", skiprows=1, ndmin=2) for g in (f, other))
        res["graph_vs_no_graph_max_abs_diff"][k[1]] = float(np.abs(a[:, 2] - b[:, 2]).max()) if a.shape == b.shape else None
py = os.path.join(logs, "check_bench.json")  # Python's aoti backend on the same packages (gpu_export.sh)
if os.path.exists(py):
    try:
        lines = [ln for ln in open(py).read().splitlines() if ln.strip().startswith("{")]
        res["python_aoti_latency"] = json.loads(lines[-1]).get("latency")
    except Exception as e:  # a summary must not die on someone else's format
        res["python_aoti_latency"] = f"unreadable: {e}"
json.dump(res, open(os.path.join(logs, "cpp_runner.json"), "w"), indent=1)
print(json.dumps(res))
EOF
