#!/usr/bin/env bash
# GPU part of the export (issue 5), for the H200 through the device tool; run from the repo root,
# BEFORE scripts/gpu_cpp.sh (which reads the export folder and reuses the runner build):
#     bash scripts/gpu_export.sh && bash scripts/gpu_cpp.sh
#     DP_CHECKPOINT=runs/x bash scripts/gpu_export.sh       # a trained checkpoint instead of --preset vits
# Steps:
#   1. build deploy_cpp's runner into $DP_CPP_BUILD (default /tmp/dp_cpp_build, gpu_cpp.sh's folder):
#      on torch 2.11 + CUDA, loading a package from Python kills the process (SIGSEGV), so the
#      exporter's self-check falls back to this runner;
#   2. export vits bf16 CUDA to $DP_EXPORT_DIR (default /tmp/dp_export_vits), ONNX for one bucket;
#   3. Python-side check + latency (python -m depthpack.aoti --check --bench), which refuses cleanly
#      where loading crashes;
#   4. diagnosis: every way of loading a package, each in a child process, and a native backtrace of
#      the crash (cuda-gdb), to find its cause;
#   5. Predictor(backend="aoti") vs backend "graph" latency and parity, where Python can load packages.
# Output in $OUT (device tool) or /tmp/dp_export_logs: export.log (everything, readable),
# gpu_export.json (all results), segfault_bt.txt (the backtrace, when there is a crash).
# Knobs: DP_BUCKETS (default: the config's 64..1024), DP_ONNX_BUCKETS (64), DP_EXPORT_TIMEOUT (420 s),
#        DP_GDB (1: take the backtrace; 0 saves up to 150 s), DP_DIAG (1: step 4; 0 skips it), PYTHON.
# Time on the H200 (measured for 2 buckets, see the report): first bucket ~85 s (cold Inductor), then
# ~20 s a bucket; ONNX ~15 s; the diagnosis ~60 s; the backtrace up to 150 s.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DIR=${DP_EXPORT_DIR:-/tmp/dp_export_vits}
LOGS=${OUT:-/tmp/dp_export_logs}
BUILD=${DP_CPP_BUILD:-/tmp/dp_cpp_build}
mkdir -p "$LOGS"
LOG="$LOGS/export.log"
J="$LOGS/.parts"; mkdir -p "$J"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
SRC=(--preset vits)
[ -n "${DP_CHECKPOINT:-}" ] && SRC=(--checkpoint "$DP_CHECKPOINT")
BUCKETS=()
[ -n "${DP_BUCKETS:-}" ] && BUCKETS=(--buckets "$DP_BUCKETS")

$PY -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version(), \
torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))" 2>&1 | tee -a "$LOG"

say "== 1. C++ runner -> $BUILD (for the self-check fallback)"
t0=$(date +%s)
if [ ! -x "$BUILD/depthpack_run" ]; then
    PREFIX=$($PY -c "import torch; print(torch.utils.cmake_prefix_path)")
    { cmake -S deploy_cpp -B "$BUILD" -DCMAKE_PREFIX_PATH="$PREFIX" && cmake --build "$BUILD" -j "$(nproc)"; } >>"$LOG" 2>&1 \
        || say "runner build failed (gpu_cpp.sh diagnoses it); the self-check can only use Python"
fi
say "runner: $(ls "$BUILD/depthpack_run" 2>/dev/null || echo none) ($(( $(date +%s) - t0 )) s)"
RUNNER=()
[ -x "$BUILD/depthpack_run" ] && RUNNER=(--cpp-runner "$BUILD/depthpack_run")

say "== 2. export -> $DIR"
t0=$(date +%s)
timeout "${DP_EXPORT_TIMEOUT:-420}" $PY export/export.py "${SRC[@]}" --out "$DIR" --device cuda --dtype bfloat16 \
    "${BUCKETS[@]}" --onnx-buckets "${DP_ONNX_BUCKETS:-64}" --target h200 "${RUNNER[@]}" \
    >"$J/export.json" 2> >(grep --line-buffered -v '^AOTInductor\|copyreg\|return cls' >>"$LOG")
rc=$?
sleep 1
say "export exit $rc after $(( $(date +%s) - t0 )) s; folder: $DIR"
cat "$J/export.json" | tee -a "$LOG"
M="$DIR/manifest.json"
if [ $rc -ne 0 ]; then
    M="$DIR/.manifest.unchecked.json"  # built but not verified: still diagnose them
    [ -f "$M" ] || { say "export failed before any package was built"; exit 1; }
fi

say "== 3. Python: check + latency (plain and CUDA graph) per package"
timeout 300 $PY -m depthpack.aoti --check "$M" --bench 200 >"$J/check_bench.json" 2>>"$LOG"
say "exit $?"; cat "$J/check_bench.json" | tee -a "$LOG"

if [ "${DP_DIAG:-1}" = 1 ]; then
say "== 4. diagnosis: each way of loading a package, in its own child process"
timeout 240 $PY -m depthpack.aoti --check "$M" --diagnose --probes \
    binding,binding_before_cuda_init,binding_rtld_global,container_runner \
    >"$J/diagnose.json" 2>>"$LOG"
$PY - "$J/diagnose.json" <<'EOF' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for name, p in d["probes"].items():
    print(f"  {name:34s} {'ok' if p['returncode'] == 0 else p.get('signal') or 'exit %s' % p['returncode']}")
EOF
if [ "${DP_GDB:-1}" = 1 ] && command -v cuda-gdb >/dev/null && grep -q '"signal"' "$J/diagnose.json"; then
    say "-- native backtrace of the crash (cuda-gdb) -> segfault_bt.txt"
    timeout 150 cuda-gdb -q -batch -ex "set pagination off" -ex "set confirm off" -ex run -ex "bt 40" \
        -ex "info sharedlibrary" --args $PY -m depthpack.aoti --probe binding --check "$M" >"$LOGS/segfault_bt.txt" 2>&1
    grep -m 25 '^#' "$LOGS/segfault_bt.txt" | tee -a "$LOG"
fi

fi

if [ $rc -eq 0 ]; then
    say "== 5. Predictor backend aoti vs graph (same weights)"
    DIR="$DIR" timeout 300 $PY - >"$J/predictor.json" 2>>"$LOG" <<'EOF'
import json, os, torch
from depthpack.export import load_for_export
res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": []}
try:
    from depthpack.predictor import Predictor
    m = json.load(open(os.path.join(os.environ["DIR"], "manifest.json")))
    aoti = Predictor(packages=os.path.join(os.environ["DIR"], "manifest.json"), device="cuda", backend="aoti")
    aoti.warmup()
except Exception as e:  # noqa: BLE001 - recorded, e.g. the clean refusal where loading crashes
    print(json.dumps(dict(res, aoti_error=f"{type(e).__name__}: {e}"))); raise SystemExit
ref = None
if m["preset"]:  # the export's seeded weights, eager in CUDA graphs
    model = load_for_export(preset=m["preset"], seed=0)[0]
    model.cfg.buckets = tuple(b["capacity"] for b in m["buckets"])
    ref = Predictor(model, device="cuda", dtype=torch.bfloat16, backend="graph")
    ref.warmup()
H, W = m["image_size"]
g = torch.Generator().manual_seed(1)
images = torch.rand(1, 3, H, W, generator=g).cuda()
for b in m["buckets"]:
    k = b["capacity"]
    pts = torch.rand(1, k, 2, generator=g) * torch.tensor([W - 1, H - 1])
    row, outs = {"capacity": k}, {}
    for name, p in (("aoti", aoti), ("graph", ref)):
        if p is None:
            continue
        for _ in range(10):
            outs[name] = p.predict(images, pts)
        ts = []
        for _ in range(200):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); p.predict(images, pts); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
        ts.sort()
        row[f"{name}_median_ms"], row[f"{name}_p90_ms"] = ts[100], ts[180]
    if len(outs) == 2:
        row["max_abs_diff_m"] = float((outs["aoti"] - outs["graph"]).abs().max())
    res["rows"].append(row)
print(json.dumps(res))
EOF
    cat "$J/predictor.json" | tee -a "$LOG"
fi

$PY - "$J" "$LOGS/gpu_export.json" "$rc" <<'EOF'
import json, os, sys
parts, out, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
res = {"export_exit": rc}
for name in ("export", "check_bench", "diagnose", "predictor"):
    f = os.path.join(parts, name + ".json")
    lines = [ln for ln in open(f).read().splitlines() if ln.startswith("{")] if os.path.exists(f) else []
    res[name] = json.loads(lines[-1]) if lines else None
json.dump(res, open(out, "w"), indent=1)
EOF
rm -rf "$J"
say "export folder: $DIR  (results: $LOGS/gpu_export.json)"
exit $rc
