#!/usr/bin/env bash
# One-way against shared glance stream on the CPU: B1 latency of the packed forward (python -m depthpack.bench, row
# fast: the default Predictor there) at Q 16, 64, 256 and 2048 (beyond the largest bucket: fast runs the prefix once,
# packed-eager every chunk whole), for the demo's model (64x64) and the CPU frontier's (128x128, glance 8x8),
# untrained (latency depends on the shapes, not the weights). Rows to docs/results/cpu_oneway.json.
#   bash scripts/cpu_oneway.sh            # PY=.venv/bin/python by default; W=/tmp/cpu_oneway for the work files
set -euo pipefail
PY=${PY:-.venv/bin/python}
W=${W:-/tmp/cpu_oneway}
mkdir -p "$W"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
declare -A MODEL=([demo]="" [frontier128]="model.img_size=[128,128] model.buckets=[16,32,64,128,256] model.glance_grid=[8,8]")
for m in demo frontier128; do
  for stream in oneway shared; do
    $PY - "$W/$m-$stream" ${MODEL[$m]} "model.glance_stream=$stream" <<'PYEOF'
import sys
from pathlib import Path
from depthpack.train.run_folder import untrained_checkpoint
untrained_checkpoint("configs/demo.yaml", Path(sys.argv[1]), sys.argv[2:])
PYEOF
  done
done
# alternating spells of the two streams, each its own process, so a drift of the machine's load lands on both
for spell in 1 2; do
  for m in demo frontier128; do
    for stream in oneway shared; do
      $PY -m depthpack.bench --checkpoint "$W/$m-$stream" --device cpu --pairs 1x16,1x64,1x256,1x2048 \
        --rows fast,packed-eager --seconds 0.5 --repeats 3 --out "$W/bench-$m-$stream-$spell" >"$W/bench-$m-$stream-$spell.log" 2>&1
    done
  done
done
$PY - "$W" <<'PYEOF'
import json, platform, subprocess, sys
from pathlib import Path
import torch
from depthpack.core.files import atomic_write_json
w, rows = Path(sys.argv[1]), []
for f in sorted(w.glob("bench-*-*-*/bench.json")):
    _, model, stream, spell = f.parent.name.split("-")
    for r in json.loads(f.read_text())["results"]:
        rows.append({"model": model, "stream": stream, "spell": int(spell), "queries": r["queries"], "row": r["row"],
                     "median_ms": r["median_ms"], "p90_ms": r["p90_ms"]})
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
atomic_write_json("docs/results/cpu_oneway.json", {
    "what": "B1 latency of the packed forward on the CPU, one-way against shared glance stream (scripts/cpu_oneway.sh: "
            "python -m depthpack.bench --device cpu, rows fast (the default Predictor: prefix once beyond the largest "
            "bucket) and packed-eager (every chunk whole), two alternating spells, untrained float32 models: the demo's "
            "64x64 and the CPU frontier's 128x128 with a glance of 8x8)",
    "info": {"cpu": f"{platform.machine()}, {torch.get_num_threads()} threads", "torch": torch.__version__,
             "commit": commit}, "rows": rows})
PYEOF
echo "rows in docs/results/cpu_oneway.json"
