#!/usr/bin/env bash
# The GPU run: one script per device call (the H200 machine's python3 holds torch 2.11 + triton 3.6).
#   PART=final OUT=DIR bash scripts/gpu_run.sh   # make demo (GPU recipe, cold caches), every GPU test, the
#                                                # benchmark's two target points (device tensors and host
#                                                # frames): the acceptance run, about 9 minutes
#   PART=measure OUT=DIR bash scripts/gpu_run.sh # the C++ frame loop, the fewer-kernels levers at B1 Q256,
#                                                # the kernel profile
#   PART=dev OUT=DIR bash scripts/gpu_run.sh     # the package-loading diagnosis and the GPU tests
#   PART=tests OUT=DIR bash scripts/gpu_run.sh   # every GPU test (pytest -m gpu -n 8), about 3.5 minutes
#   PART=demo OUT=DIR bash scripts/gpu_run.sh    # make demo alone, cold caches
#   PART=probe OUT=DIR bash scripts/gpu_run.sh   # the graphed training step, where a package's compile time
#                                                # goes, then make demo
#   PART=throughput OUT=DIR bash scripts/gpu_run.sh  # training images/s at scale, graphed step vs eager
#   PART=sweep OUT=DIR bash scripts/gpu_run.sh   # tile sweep of the fused block's kernels, then the ladder rows
#   PART=rows OUT=DIR bash scripts/gpu_run.sh    # the fused blocks' GPU tests and ladder rows alone
#   PART=blocks OUT=DIR bash scripts/gpu_run.sh  # the fused ViT blocks: their GPU tests, the ladder rows at B1 Q256
#                                                # and B8 Q512, the kernel profile, a .pt2 through the C++ runner
#   PART=hybrid OUT=DIR bash scripts/gpu_run.sh  # the hybrid blocks: GPU tests, two .pt2 through the C++ runner
#                                                # (its latency), the ladder rows, the kernel profile
#   PART=frameloop OUT=DIR bash scripts/gpu_run.sh  # the C++ frame loop with the levers, without and with
#                                                # the hybrid blocks; the hybrid's kernel profile at B8 Q512
#   PART=persistent OUT=DIR bash scripts/gpu_run.sh  # the persistent blocks: GPU tests beside a .pt2 through the
#                                                # C++ runner, ladder rows against the hybrid, the block's
#                                                # sweep (phases and barriers alone), the kernel profile
#   PART=attn OUT=DIR bash scripts/gpu_run.sh    # attn_proj at batch 1: the probe (parts, tiles) and Nsight
#                                                # Compute, then the kernels' GPU tests beside the hybrid's .pt2
#                                                # through the C++ runner, the ladder rows, the kernel profile
# Every step has its own time limit and writes as it goes; $OUT gets run.log (the summary, also printed)
# and results.tgz (every table, log and figure), since the device tool returns at most 8 files.
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_run}
PART=${PART:-final}
PY=${PY:-python3}
W=$(mktemp -d /tmp/gpu_run.XXXX)           # results, packed into $OUT/results.tgz at the end
CACHE=$W/cache                              # one compile cache shared by every step
mkdir -p "$OUT" "$W/logs"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor \
       TRITON_CACHE_DIR=$CACHE/triton
LOG=$OUT/run.log
T0=$(date +%s)
step() { echo "== +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
quiet() { grep -v -e 'DEBUG    torch' -e '%|' -e '^\s*$' -e 'it/s\]' ; }
finish() { tar czf "$OUT/results.tgz" -C "$W" --exclude=cache --exclude='*.pt2' --exclude='*.onnx' --exclude='cpp_build' --exclude='*.bgr' \
             --exclude='checkpoints' --exclude='*.safetensors' --exclude='scenes*' --exclude='pc_*' --exclude='pt_*' --exclude=train . 2>/dev/null; step "done (results.tgz: $(du -h "$OUT/results.tgz" | cut -f1))"; }
trap finish EXIT

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
  $PY -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
  nproc; g++ --version | head -1; git log --oneline -1 2>/dev/null; } 2>&1 | tee -a "$LOG"

build_runner() {  # the C++ runner, built once; the tests and the demo use it ($DEPTHPACK_RUN)
  step "C++ runner build"
  cmake -S deploy_cpp -B "$W/cpp_build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')" >"$W/logs/cpp_build.log" 2>&1 \
    && timeout 300 cmake --build "$W/cpp_build" -j "$(nproc)" >>"$W/logs/cpp_build.log" 2>&1 \
    && export DEPTHPACK_RUN=$W/cpp_build/depthpack_run && echo "built $DEPTHPACK_RUN" | tee -a "$LOG" \
    || { echo "C++ build FAILED"; tail -20 "$W/logs/cpp_build.log"; } | tee -a "$LOG"
}

gpu_tests() {  # every GPU test (the 2-GPU torchrun test skips on one GPU)
  step "pytest -m gpu ${*:-tests}"
  timeout "${TEST_S:-330}" $PY -m pytest -m gpu ${*:-tests} -q -rfEs -p no:cacheprovider --tb=short \
    -n "${XDIST:-8}" --dist load --durations=15 --junitxml="$W/gpu_tests.xml" >"$W/logs/gpu_tests.log" 2>&1
  echo "pytest exit $?" | tee -a "$LOG"
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|^[0-9.]+s (call|setup)" "$W/logs/gpu_tests.log" | tail -40 | tee -a "$LOG"
}

export_pkg() {  # export_pkg NAME SWITCHES: a vits bf16 .pt2 (bucket 256, combo kernels) into $W/export_NAME
  timeout "${EXPORT_S:-300}" $PY export/export.py --preset vits --dtype bfloat16 --device cuda --buckets 256 \
    --switches "$2" --inductor combo_kernels=true --cpp-runner "$W/cpp_build/depthpack_run" \
    --out "$W/export_$1" >"$W/logs/export_$1.log" 2>&1
}

check_pkg() {  # check_pkg NAME: the export's last lines, then the C++ runner's check and latency on it
  step "export $1: $(grep -v -e DEBUG -e '%|' "$W/logs/export_$1.log" | tail -2 | cut -c1-250 | tr '\n' ' ')"
  [ -f "$W/export_$1/manifest.json" ] && timeout 60 "$W/cpp_build/depthpack_run" --manifest "$W/export_$1/manifest.json" \
    --check "$W/export_$1/reference.safetensors" --bench 500 2>&1 | tail -3 | tee -a "$LOG"
}

if [ "$PART" = dev ]; then
  build_runner > "$W/logs/build_runner.out" 2>&1 &  # overlaps the diagnosis (GPU, one core)
  BUILD_PID=$!
  step "loading a .pt2 from Python: packages with the C++ runtime linked in, and without"
  for rt in static dynamic; do
    flag=$([ $rt = dynamic ] && echo --dynamic-cxx-runtime || echo --no-bindings)
    timeout 240 $PY scripts/aoti_diagnose.py --build-tiny "$W/tiny_$rt" --device cuda $flag --out "$W/diagnose_$rt.json" \
      >"$W/logs/diagnose_$rt.log" 2>&1; echo "diagnose $rt exit $?" | tee -a "$LOG"
    [ -f "$W/diagnose_$rt.json" ] && $PY -c "import json; r=json.load(open('$W/diagnose_$rt.json')); \
print('$rt', {k: v['returncode'] for k, v in r['runs'].items()}); b=r.get('bindings_plain'); \
b and print('  providers', b['cxx_symbol_providers'], 'from another library:', b['n_from_another_library']); \
b and print('  e.g.', list(b['cxx_symbols_from_another_library'].items())[:6])" | tee -a "$LOG" \
      || tail -5 "$W/logs/diagnose_$rt.log" | tee -a "$LOG"
  done
  wait $BUILD_PID; cat "$W/logs/build_runner.out" | tee -a "$LOG"
  [ -x "$W/cpp_build/depthpack_run" ] && export DEPTHPACK_RUN=$W/cpp_build/depthpack_run
  TEST_S=${TEST_S:-240} gpu_tests tests
  step "the fewer-kernels levers at B1 Q256 (vits bf16), each the previous row plus one switch"
  timeout "${LEVERS_S:-120}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --rows levers,masked-eager --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/levers" 2>&1 | quiet \
    | grep -E '^\| vits|failed|^\{' | cut -c1-260 | tee -a "$LOG"
  step "kernel profile (vits bf16 B1 Q256)"
  timeout "${PROFILE_S:-60}" $PY -m depthpack.bench.profile --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --fused-embed off --out "$W/profile" 2>&1 | quiet | grep -E 'kernels per forward|^\| [a-z]' | head -20 | tee -a "$LOG"
fi

if [ "$PART" = tests ]; then  # every GPU test in one run, nothing else
  build_runner
  TEST_S=${TEST_S:-200} gpu_tests tests
fi

demo() {  # make demo on a cold machine (no compile cache), as a new user meets it; the report into $W/demo
  step "make demo (the GPU recipe), cold compile caches, as a new user meets it"
  rm -rf runs/demo
  local t0; t0=$(date +%s%N)
  timeout "${DEMO_S:-230}" make demo >"$W/logs/demo.log" 2>&1
  echo "make demo exit $?, $(( ($(date +%s%N) - t0) / 1000000 )) ms as a user's clock sees it" | tee -a "$LOG"
  grep -E "^=== .*done in|demo:|report:" "$W/logs/demo.log" | tee -a "$LOG"
  mkdir -p "$W/demo" && [ -d runs/demo ] && (cd runs/demo && cp -r --parents report.md logs eval bench selection.png \
    export/manifest.json "$W/demo/" 2>/dev/null)
}

if [ "$PART" = demo ]; then demo; fi

if [ "$PART" = probe ]; then  # the graphed training step (tests, the demo's training alone), one package's
  # compile cold and alone under three settings (where its time goes), then make demo
  TEST_S=${TEST_S:-120} XDIST=2 gpu_tests tests/train/test_device_data.py
  step "the demo's training alone: the GPU recipe with the graphed step"
  timeout "${TRAIN_S:-150}" $PY train/train.py --config configs/demo.yaml out_dir="$W/train" threads=0 graph=true \
    data.cache_dir="$W/scenes" data.device_cache=true ckpt_every=2300 eval_every=0 progress=false >"$W/logs/train.log" 2>&1
  echo "train exit $?" | tee -a "$LOG"; tail -1 "$W/logs/train.log" | cut -c1-900 | tee -a "$LOG"
  for v in base:{} threads1:{} threads1_no_pointwise_tuning:'{"triton.autotune_pointwise": false}'; do
    name=${v%%:*}; cfgs=${v#*:}
    step "one package (bucket 64) compiled cold and alone: $name $cfgs"
    env $([ "${name#threads1}" != "$name" ] && echo TORCHINDUCTOR_COMPILE_THREADS=1) TORCHINDUCTOR_CACHE_DIR="$W/pc_$name" \
      TRITON_CACHE_DIR="$W/pt_$name" timeout "${PROBE_S:-100}" $PY scripts/aoti_compile_probe.py --configs "$cfgs" \
      --out "$W/probe_$name.json" >"$W/logs/probe_$name.log" 2>&1; echo "probe exit $?" | tee -a "$LOG"
    grep -E '^\{"configs"|^(compile_fx_inner|GraphLowering.codegen|Scheduler.codegen|AotCodeCompiler.compile|aoti_precompile_header|compile_file|async_compile|GraphLowering.compile_to_fn|create_aot_dispatcher_function|_recursive_joint_graph_passes|GraphLowering.run)' \
      "$W/logs/probe_$name.log" | cut -c1-200 | tee -a "$LOG"
  done
  demo
fi

if [ "$PART" = final ]; then  # issue 14's one run: make demo on a cold machine, every GPU test, the two target points
  demo
  if [ -x runs/demo/cpp_build/depthpack_run ]; then export DEPTHPACK_RUN=$PWD/runs/demo/cpp_build/depthpack_run; else build_runner; fi
  TEST_S=${TEST_S:-210} gpu_tests tests
  step "the benchmark's two target points (vits bf16): device tensors and host camera frames"
  timeout "${BENCH_S:-100}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --pairs 1x256,8x512 \
    --rows masked-eager,masked-graph,packed-graph,packed-compile+graph,packed-compile+graph@frames \
    --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/targets" 2>&1 | quiet \
    | grep -E '^\| vits .* (256|512) |failed|^\{' | cut -c1-260 | tee -a "$LOG"
fi

if [ "$PART" = throughput ]; then  # training images/s of vits 420x560 (configs/scale.yaml), graphed step vs eager
  for g in true false; do
    step "training throughput, configs/scale.yaml on 512 cached scenes, graph=$g, batch 16 and 64"
    timeout "${THR_S:-170}" $PY -m depthpack.train.throughput --config configs/scale.yaml data.num_samples=512 \
      data.cache_dir="$W/scenes_scale" graph=$g --batch 16 64 --seconds "${THR_SECONDS:-12}" \
      --out "$W/throughput_graph_$g.json" >"$W/logs/throughput_graph_$g.log" 2>&1; echo "throughput exit $?" | tee -a "$LOG"
    grep '^{"steps"' "$W/logs/throughput_graph_$g.log" | cut -c1-420 | tee -a "$LOG"
  done
fi

if [ "$PART" = frames ]; then  # the frame path in Python and C++, the first levers (a short run)
  build_runner
  TEST_S=${TEST_S:-60} XDIST=2 gpu_tests tests/runtime/test_frames.py
  step "B1 Q256 and B8 Q512 (vits bf16): device tensors and host camera frames"
  timeout "${BENCH_S:-140}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --batch 1,8 --queries 256,512 \
    --rows ${FRAME_ROWS:-packed-graph,packed-compile+graph,packed-compile+graph@frames} \
    --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/targets" 2>&1 | quiet \
    | grep -E '^\| vits .* (256|512) |failed|^\{' | cut -c1-240 | tee -a "$LOG"
  step "the C++ frame loop (vits bf16, bucket 256, 640x480 bgr8 raw frames)"
  timeout "${CPP_S:-150}" bash scripts/cpp_frame_loop.sh "$W" 2>&1 | tail -8 | tee -a "$LOG"
  [ "${LEVERS_S:-70}" -gt 0 ] || exit 0
  step "the first fewer-kernels levers at B1 Q256"
  timeout "${LEVERS_S:-70}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --rows lever-count-selection,lever-mlp-epilogue,lever-combo-kernels --seconds 0.3 --repeats 2 \
    --cache-dir "$CACHE" --out "$W/levers" 2>&1 | quiet | grep -E '^\| vits|failed|^\{' | cut -c1-240 | tee -a "$LOG"
fi

if [ "$PART" = measure ]; then  # what run 4 of 2026-12-02 left unmeasured: B8 Q512, the C++ frame loop, levers, profile
  build_runner
  step "the C++ frame loop (background: two vits bf16 bucket-256 exports, then 60 raw 640x480 bgr8 frames each)"
  ( timeout "${CPP_S:-240}" bash scripts/cpp_frame_loop.sh "$W" > "$W/logs/cpp_loop.out" 2>&1 ) &
  CPP_PID=$!
  TEST_S=${TEST_S:-120} XDIST=4 gpu_tests tests/runtime/test_frames.py tests/train/test_device_data.py
  wait $CPP_PID; echo "cpp loop exit $?" | tee -a "$LOG"; tail -6 "$W/logs/cpp_loop.out" | tee -a "$LOG"
  step "B8 Q512 (vits bf16): masked and packed graphs, compiled, and from host camera frames"
  timeout "${BENCH_S:-110}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --batch 8 --queries 512 \
    --rows masked-graph,packed-graph,packed-compile+graph,packed-compile+graph@frames \
    --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/targets_b8" 2>&1 | quiet \
    | grep -E '^\| vits|failed|^\{' | cut -c1-260 | tee -a "$LOG"
  step "the fewer-kernels levers at B1 Q256 (vits bf16), each the previous row plus one switch"
  timeout "${LEVERS_S:-170}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --rows levers --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/levers" 2>&1 \
    | quiet | grep -E '^\| vits|failed|^\{' | cut -c1-260 | tee -a "$LOG"
  [ "${PROFILE_S:-60}" -gt 0 ] || exit 0
  step "kernel profile (vits bf16 B1 Q256)"
  timeout "${PROFILE_S:-60}" $PY -m depthpack.bench.profile --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --fused-embed off --out "$W/profile" 2>&1 | quiet | grep -E 'kernels per forward|^\| [a-z]' | head -20 | tee -a "$LOG"
fi

ladder_rows() {  # ladder_rows DIR ROWS LIMIT: the ladder's ROWS (vits bf16, B1 Q256 and B8 Q512) into $W/DIR
  step "ladder rows (vits bf16): $2"
  timeout "${BENCH_S:-$3}" $PY -m depthpack.bench --preset vits --dtype bfloat16 --pairs 1x256,8x512 --rows "$2" \
    --seconds 0.3 --repeats 2 --cache-dir "$CACHE" --out "$W/$1" 2>&1 | quiet \
    | grep -E '^\| vits|failed|^\{' | cut -c1-260 | tee -a "$LOG"
}

profile_b1() {  # profile_b1 DIR LIMIT ARGS...: the kernel profile of vits bf16 B1 Q256 with ARGS into $W/DIR
  local dir=$1 limit=$2; shift 2
  step "kernel profile (vits bf16 B1 Q256): $*"
  timeout "${PROFILE_S:-$limit}" $PY -m depthpack.bench.profile --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --fused-embed off "$@" --out "$W/$dir" 2>&1 | quiet | grep -E 'kernels per forward|^\| ' | head -44 | tee -a "$LOG"
}

fused_block_rows() {  # $1: folder under $W, $2: default time limit; the fused blocks' ladder rows, B1 Q256 and B8 Q512
  ladder_rows "$1" packed-compile+graph,lever-count-selection,lever-fused-blocks,lever-fused-blocks+embed,lever-fused-blocks+combo "$2"
}

if [ "$PART" = blocks ]; then  # issue 12's fused blocks: tests (beside the runner's build and a .pt2), rows, profile
  ( build_runner && step "export vits bf16 bucket 256, fused_blocks, C++ check (background, beside the tests)" \
    && timeout "${EXPORT_S:-300}" $PY export/export.py --preset vits --dtype bfloat16 --device cuda --buckets 256 \
      --switches selection=count,fused_blocks=true --cpp-runner "$W/cpp_build/depthpack_run" --out "$W/export_blocks" \
      >"$W/logs/export_blocks.log" 2>&1; echo "export exit $?" ) > "$W/logs/build_export.out" 2>&1 &
  BG_PID=$!
  TEST_S=${TEST_S:-240} XDIST=4 gpu_tests tests/core/test_kernels.py \
    tests/runtime/test_predictor.py::test_gpu_backends_match_eager_no_sync_no_recapture
  wait $BG_PID; cat "$W/logs/build_export.out" | tee -a "$LOG"
  grep -v -e DEBUG -e '%|' "$W/logs/export_blocks.log" | tail -8 | cut -c1-300 | tee -a "$LOG"
  fused_block_rows blocks 200
  step "kernel profile (vits bf16 B1 Q256), fused blocks on"
  timeout "${PROFILE_S:-80}" $PY -m depthpack.bench.profile --preset vits --dtype bfloat16 --batch 1 --queries 256 \
    --fused-embed off --fused-blocks on --out "$W/profile_blocks" 2>&1 | quiet \
    | grep -E 'kernels per forward|^\| ' | head -44 | tee -a "$LOG"
fi

if [ "$PART" = sweep ]; then  # the fused block's kernels: each tile candidate timed alone, B1 Q256 and B8 Q512
  step "tile sweep of the fused block's four kernels (vits bf16)"
  timeout "${SWEEP_S:-300}" $PY scripts/block_kernel_sweep.py --out "$W/sweep" > "$W/logs/sweep.log" 2>&1
  echo "sweep exit $?" | tee -a "$LOG"
  grep -E '^(B[0-9]|- B)' "$W/logs/sweep.log" | tee -a "$LOG"
  tail -5 "$W/logs/sweep.log" | grep -i error | tee -a "$LOG"
fi

if [ "$PART" = hybrid ]; then  # issue 12's hybrid blocks: GPU tests beside two .pt2 exports (the best Inductor
  # levers, and the same + fused_blocks=hybrid), then on a quiet host the C++ runner's latency on each, the
  # ladder rows at B1 Q256 and B8 Q512, and the kernel profile
  ( build_runner
    export_pkg levers selection=count,mlp_epilogue=true &
    export_pkg hybrid selection=count,mlp_epilogue=true,fused_blocks=hybrid &
    wait ) > "$W/logs/build_export.out" 2>&1 &
  BG_PID=$!
  TEST_S=${TEST_S:-200} XDIST=4 gpu_tests tests/core/test_kernels.py \
    tests/runtime/test_predictor.py::test_gpu_backends_match_eager_no_sync_no_recapture
  wait $BG_PID; cat "$W/logs/build_export.out" | tee -a "$LOG"
  check_pkg levers
  check_pkg hybrid
  ladder_rows hybrid packed-compile+graph,lever-mlp-epilogue,lever-combo-kernels,lever-fused-blocks,lever-hybrid-blocks,lever-hybrid-blocks+combo 220
  profile_b1 profile_hybrid 70 --fused-blocks hybrid --mlp-epilogue on
fi

if [ "$PART" = frameloop ]; then  # the robot's latency: the C++ frame loop (640x480 bgr8 frames from the host,
  # frame packages) with the best Inductor levers, then the same + hybrid blocks; then the B8 profile
  build_runner
  for v in "levers:--switches selection=count,mlp_epilogue=true --inductor combo_kernels=true" \
           "hybrid:--switches selection=count,mlp_epilogue=true,fused_blocks=hybrid --inductor combo_kernels=true"; do
    step "the C++ frame loop, frame package, ${v%%:*}: ${v#*:}"
    CPP_KINDS=frames CPP_TAG=${v%%:*} CPP_EXPORT_ARGS="${v#*:}" timeout "${CPP_S:-170}" bash scripts/cpp_frame_loop.sh "$W" \
      2>&1 | tail -3 | tee -a "$LOG"
  done
  step "kernel profile (vits bf16 B8 Q512), hybrid blocks + mlp epilogue"
  timeout "${PROFILE_S:-90}" $PY -m depthpack.bench.profile --preset vits --dtype bfloat16 --batch 8 --queries 512 \
    --fused-embed off --fused-blocks hybrid --mlp-epilogue on --out "$W/profile_hybrid_b8" 2>&1 | quiet \
    | grep -E 'kernels per forward|^\| ' | head -70 | tee -a "$LOG"
fi

if [ "$PART" = rows ]; then  # the fused blocks' GPU tests, then the ladder rows at B1 Q256 and B8 Q512
  TEST_S=${TEST_S:-120} XDIST=4 gpu_tests tests/core/test_kernels.py
  fused_block_rows rows 150
fi

if [ "$PART" = persistent ]; then  # issue 12's persistent blocks (one launch a block): the kernels' GPU tests beside
  # the runner's build and a .pt2 with them, then on a quiet host the C++ runner's latency, the ladder rows
  # (plain, counting selection, the hybrid's best row, persistent blocks with and without combo) and the profile
  ( build_runner
    export_pkg persistent selection=count,fused_blocks=persistent
    echo "export exit $?" ) > "$W/logs/build_export.out" 2>&1 &
  BG_PID=$!
  TEST_S=${TEST_S:-200} XDIST=4 gpu_tests tests/core/test_kernels.py
  wait $BG_PID; cat "$W/logs/build_export.out" | tee -a "$LOG"
  check_pkg persistent
  ladder_rows persistent packed-compile+graph,lever-count-selection,lever-hybrid-blocks+combo,lever-persistent-blocks,lever-persistent-blocks+combo 220
  step "the persistent block alone (B1, 321 tokens): tile variants, each phase alone, the barriers alone"
  timeout "${SWEEP_S:-120}" $PY scripts/block_kernel_sweep.py --persistent --cases 1x321 --out "$W/persistent_sweep" \
    2>&1 | grep -E '^\| 1 |persistent_tiles' | tee -a "$LOG"
  profile_b1 profile_persistent 70 --fused-blocks persistent
fi

if [ "$PART" = attn ]; then  # issue 12's attention at batch 1: where attn_proj's time goes, its tiles, then what
  # the chosen tiles give the whole forward (hybrid and persistent rows, the hybrid .pt2 from C++)
  step "attn_proj probe (B1, 321 tokens): parts and tiles"
  mkdir -p "$W/attn_probe"
  timeout "${PROBE_S:-150}" $PY scripts/attn_probe.py --out "$W/attn_probe" 2>&1 | grep -E '^\|' | head -24 | tee -a "$LOG"
  step "Nsight Compute on attn_proj at its tiles"
  timeout 90 bash scripts/attn_probe_ncu.sh >"$W/attn_probe/ncu.txt" 2>&1
  grep -E "Duration|Elapsed Cycles|SM Frequency|Achieved Occupancy|Issued Warp|Registers Per|Dynamic Shared" \
    "$W/attn_probe/ncu.txt" | tee -a "$LOG"
  ( build_runner
    export_pkg hybrid selection=count,mlp_epilogue=true,fused_blocks=hybrid
    echo "export exit $?" ) > "$W/logs/build_export.out" 2>&1 &
  BG_PID=$!
  TEST_S=${TEST_S:-200} XDIST=4 gpu_tests tests/core/test_kernels.py
  wait $BG_PID; cat "$W/logs/build_export.out" | tee -a "$LOG"
  check_pkg hybrid
  ladder_rows ladder packed-compile+graph,lever-hybrid-blocks+combo,lever-persistent-blocks+combo 200
  profile_b1 profile_hybrid 70 --fused-blocks hybrid --mlp-epilogue on
fi
