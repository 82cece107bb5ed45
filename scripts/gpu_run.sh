#!/usr/bin/env bash
# The GPU run: one device call (the H200 machine's python3 holds torch 2.11 + triton 3.6), under 10 minutes.
#   OUT=DIR bash scripts/gpu_run.sh                 # everything below
#   STEPS="build tests bench" OUT=DIR bash scripts/gpu_run.sh   # some of it
# Steps, each with its own time limit, writing as it goes:
#   build   the C++ runner (in the background from the start; the tests and the cpp step use it)
#   tests   every GPU test (pytest -m gpu)
#   bench   the benchmark at B1 Q256 and B8 Q512 (vits bf16): the default Predictor beside the best rows the
#           ladder can make, the baselines, camera frames from the host; then a B16 Q256 point
#   roofline  the per-kernel roofline of the default Predictor's B8 Q512 forward (scripts/roofline.py)
#   cpp     a vits bf16 export with the default recipe, checked and timed by the C++ runner (CPP_POINTS, BxQ);
#           CPP_FRAMES=Q adds B1 packages of 640x480 bgr8 frames and times the runner's raw frame loop
#   bag     python -m depthpack.bag run over a synthetic recording with the default Predictor: per-frame latency
# $OUT gets run.log (the summary, also printed) and results.tgz (every table, log and figure).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_run}
PY=${PY:-python3}
STEPS=${STEPS:-build tests bench roofline cpp bag}
W=$(mktemp -d /tmp/gpu_run.XXXX)
CACHE=$W/cache  # one compile cache for every step
mkdir -p "$OUT" "$W/logs"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor \
       TRITON_CACHE_DIR=$CACHE/triton
LOG=$OUT/run.log
T0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
finish() { tar czf "$OUT/results.tgz" -C "$W" --exclude=cache --exclude='*.pt2' --exclude='*.onnx' --exclude=cpp_build \
             --exclude='*.safetensors' --exclude='*.bgr' --exclude='*.mcap' --exclude='rec*' . 2>/dev/null
           step "done (results.tgz: $(du -h "$OUT/results.tgz" | cut -f1))"; }
trap finish EXIT

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
  $PY -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
  echo "$(nproc) cores; $(git log --oneline -1 2>/dev/null)"; git status --short 2>/dev/null | head -5; } 2>&1 | tee -a "$LOG"

if has build || has tests || has cpp; then  # the C++ runner, built once in the background
  ( cmake -S deploy_cpp -B "$W/cpp_build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')" >"$W/logs/cpp_build.log" 2>&1 \
      && timeout 400 cmake --build "$W/cpp_build" -j "$(nproc)" >>"$W/logs/cpp_build.log" 2>&1 ) &
  BUILD_PID=$!
fi
runner() {  # wait for the build once; export DEPTHPACK_RUN when it worked
  if [ -n "${BUILD_PID:-}" ]; then
    wait "$BUILD_PID" && [ -x "$W/cpp_build/depthpack_run" ] && export DEPTHPACK_RUN=$W/cpp_build/depthpack_run
    step "C++ runner build: ${DEPTHPACK_RUN:-FAILED: $(tail -3 "$W/logs/cpp_build.log" | tr '\n' ' ')}"
    BUILD_PID=
  fi
}

if has tests; then
  runner
  step "pytest -m gpu"
  timeout "${TEST_S:-330}" $PY -m pytest -m gpu ${TEST_PATHS:-tests} -q -rfEs -p no:cacheprovider --tb=short -n "${XDIST:-8}" \
    --dist load --durations=15 --junitxml="$W/gpu_tests.xml" >"$W/logs/gpu_tests.log" 2>&1
  echo "pytest exit $?" | tee -a "$LOG"
  $PY - "$W/gpu_tests.xml" "$OUT/gpu_tests.json" <<'PYEOF'  # every GPU test: outcome, seconds, why skipped
import json, subprocess, sys, torch, triton, xml.etree.ElementTree as ET
tests = []
for c in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    bad = c.find("failure") if c.find("failure") is not None else c.find("error")
    skip = c.find("skipped")
    row = {"test": f"{c.get('classname')}::{c.get('name')}", "seconds": round(float(c.get("time", 0)), 1),
           "outcome": "failed" if bad is not None else "skipped" if skip is not None else "passed"}
    if skip is not None or bad is not None:
        row["why"] = ((skip if skip is not None else bad).get("message") or "")[:300]
    tests.append(row)
n = {o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "skipped")}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
json.dump({"what": "every GPU test (pytest -m gpu -n 8 over tests/) on one device call (scripts/gpu_run.sh)",
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "commit": commit, **n, "tests": sorted(tests, key=lambda t: t["test"])}, open(sys.argv[2], "w"), indent=1)
PYEOF
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$W/logs/gpu_tests.log" | tail -30 | tee -a "$LOG"
fi

if has bench; then
  step "benchmark: vits bf16, B1 Q256 and B8 Q512"
  timeout "${BENCH_S:-240}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --pairs 1x256,8x512 \
    --rows ${BENCH_ROWS:-fast,fast@frames,masked-graph,dense-graph,dense-fast,packed-graph,packed-compile+graph,+count-selection,+gelu-epilogue,+combo-kernels,+hybrid-blocks} \
    --seconds 0.3 --repeats 3 --cache-dir "$CACHE" --out "$W/bench" >"$W/logs/bench.log" 2>&1
  echo "bench exit $?" | tee -a "$LOG"
  grep -E "^\| vits|^\| point|^\| .* B[0-9]+ Q|failed" "$W/bench/bench.md" 2>/dev/null | cut -c1-240 | tee -a "$LOG"
  if [ "${BENCH16:-1}" = 1 ]; then
    step "benchmark: B16 Q256 (the trend)"
    timeout "${BENCH16_S:-90}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --pairs 16x256 --rows fast,dense-fast \
      --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/bench16" >"$W/logs/bench16.log" 2>&1
    echo "bench16 exit $?" | tee -a "$LOG"
    grep -E "^\| vits" "$W/bench16/bench.md" 2>/dev/null | cut -c1-200 | tee -a "$LOG"
  fi
fi

if has roofline; then
  step "roofline: vits bf16 B8 Q512, the default Predictor"
  timeout "${ROOFLINE_S:-120}" $PY scripts/roofline.py --preset vits --batch 8 --queries 512 --out "$W/roofline" \
    >"$W/logs/roofline.log" 2>&1
  echo "roofline exit $?" | tee -a "$LOG"
  grep -E "^Ceilings|^\| (gemm|attention|triton|select|layernorm)" "$W/roofline/roofline.md" 2>/dev/null | cut -c1-300 | tee -a "$LOG"
fi

if has cpp; then
  runner
  for bq in ${CPP_POINTS:-1x256 8x512}; do
    b=${bq%x*} k=${bq#*x}
    step "export vits (default recipe, batch $b, bucket $k) and the C++ runner's check and latency"
    timeout "${EXPORT_S:-200}" $PY -m depthpack.export --preset vits --device cuda --batch $b --buckets $k \
      --out "$W/export_b$b" >"$W/logs/export_b$b.log" 2>&1
    echo "export exit $?: $(grep -v -e DEBUG -e '%|' "$W/logs/export_b$b.log" | tail -1 | cut -c1-300)" | tee -a "$LOG"
    [ -n "${DEPTHPACK_RUN:-}" ] && [ -f "$W/export_b$b/manifest.json" ] && timeout 90 "$DEPTHPACK_RUN" \
      --manifest "$W/export_b$b/manifest.json" --check "$W/export_b$b/reference.safetensors" --bench 300 2>&1 | tail -3 | tee -a "$LOG"
  done
  if [ -n "${CPP_FRAMES:-}" ]; then  # the input fold: B1 packages that take 640x480 bgr8 frames, a raw stream through them
    k=${CPP_FRAMES}
    step "export vits (default recipe, batch 1, bucket $k, 640x480 bgr8 frames) and the C++ frame loop"
    timeout "${EXPORT_S:-200}" $PY -m depthpack.export --preset vits --device cuda --batch 1 --buckets $k \
      --frame-size 640x480 --frame-format bgr8 --out "$W/export_frames" >"$W/logs/export_frames.log" 2>&1
    echo "export exit $?: $(grep -v -e DEBUG -e '%|' "$W/logs/export_frames.log" | tail -1 | cut -c1-300)" | tee -a "$LOG"
    $PY -c "import numpy as np, sys; r = np.random.default_rng(0); np.savetxt(sys.argv[1], r.uniform([0, 0], [639, 479], ($k, 2)), fmt='%.2f', delimiter=','); r.integers(0, 256, (300, 480, 640, 3), dtype=np.uint8).tofile(sys.argv[2])" \
      "$W/frame_points.csv" "$W/frames.bgr"
    [ -n "${DEPTHPACK_RUN:-}" ] && [ -f "$W/export_frames/manifest.json" ] && timeout 90 "$DEPTHPACK_RUN" \
      --manifest "$W/export_frames/manifest.json" --raw "$W/frames.bgr" --frame-size 640x480 --points "$W/frame_points.csv" \
      --out "$W/frame_depths.csv" 2>&1 | tail -3 | tee -a "$LOG"
  fi
fi

if has bag; then  # the GPU image lacks rosbags: carry its wheel (.whl, device README) and PYTHONPATH it
  step "a synthetic recording through python -m depthpack.bag run (default Predictor, random vits weights)"
  timeout "${BAG_S:-150}" $PY - "$W" >"$W/logs/bag.log" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
from depthpack import create_model
from depthpack.bag import demo_recording, report_text, run_recording
from depthpack.core.files import atomic_write_json
w = Path(sys.argv[1])
model = create_model("vits", img_size=(420, 560)).eval()  # latency does not depend on the weights' values
rec = demo_recording(w / "rec.mcap", model.cfg, frames=80, seed=0, size=(480, 640))
report = run_recording(rec["bag"], w / "rec_out", model=model, device="cuda")
atomic_write_json(w / "bag_report.json", report)
print(report_text(report))
PYEOF
  echo "bag exit $?" | tee -a "$LOG"; tail -4 "$W/logs/bag.log" | cut -c1-400 | tee -a "$LOG"
fi
