#!/usr/bin/env bash
# The C++ frame loop on the GPU: vits bf16 packages for bucket 256, as image packages (the runner
# preprocesses on the device) and as frame packages (640x480 bgr8 in, preprocessing inside); 60 raw
# 640x480 bgr8 frames from a file, 256 points each; depthpack_run --raw reports the latency of
# Runner::predict, with and without the read.
#   bash scripts/cpp_frame_loop.sh DIR     # results in DIR/cpp_loop
# The runner: $DEPTHPACK_RUN, else DIR/cpp_build/depthpack_run (where scripts/gpu_run.sh builds it in its
# work folder), else deploy_cpp/build/depthpack_run (where docs/install.md builds it).
#   CPP_KINDS="images frames" (default both), CPP_EXPORT_ARGS="--recipe reference" (more export flags: here, the
#   reference model instead of the fast recipe), CPP_TAG=NAME (results in DIR/cpp_loop_NAME)
set -u -o pipefail
W=${1:?usage: bash scripts/cpp_frame_loop.sh DIR}
PY=${PY:-python3}
RUN=${DEPTHPACK_RUN:-$W/cpp_build/depthpack_run}
[ -x "$RUN" ] || RUN=deploy_cpp/build/depthpack_run
L=$W/cpp_loop${CPP_TAG:+_$CPP_TAG}
mkdir -p "$L"
KINDS=${CPP_KINDS:-images frames}
read -r -a EXPORT_ARGS <<< "${CPP_EXPORT_ARGS:-}"
for kind in $KINDS; do
  extra=$([ $kind = frames ] && echo "--frame-size 640x480 --frame-format bgr8")
  timeout 240 $PY export/export.py --preset vits --dtype bfloat16 --device cuda --buckets 256 \
    --out "$L/vits_$kind" $extra "${EXPORT_ARGS[@]}" >"$L/export_$kind.log" 2>&1 &
done
$PY - "$L" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
with open(f"{d}/frames.bgr", "wb") as f:
    for _ in range(60):
        f.write(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8).tobytes())
pts = np.stack([rng.uniform(0, 639.9, 256), rng.uniform(0, 479.9, 256)], -1)
np.savetxt(f"{d}/points.csv", pts, delimiter=",", header="x,y", comments="", fmt="%.3f")
PYEOF
wait
for kind in $KINDS; do
  echo "export $kind: $(tail -1 "$L/export_$kind.log" | cut -c1-160)"
  [ -f "$L/vits_$kind/manifest.json" ] || continue
  "$RUN" --manifest "$L/vits_$kind/manifest.json" --raw "$L/frames.bgr" --frame-size 640x480 \
    --points "$L/points.csv" --out "$L/depth_$kind.csv" 2>"$L/loop_$kind.log"
  echo "C++ loop, $kind packages (CUDA graph): $(grep '^frames ' "$L/loop_$kind.log")"
done
