#!/usr/bin/env bash
# Cross-compile deploy_cpp for aarch64 (a Jetson's CPU) on an x86_64 Debian host, then run the
# binary's error paths under qemu-user. CI runs it (.ci/run); so does `make cross-aarch64`.
#
#   1 tools     g++-aarch64-linux-gnu, qemu-user, cmake, make, file: apt-get installs the missing ones
#   2 libtorch  the aarch64 torch wheel from PyPI (pip download --platform), plus the two CUDA runtime
#               libraries its libtorch_cpu.so links (cudart, cupti), cached; headers and CPU
#               libraries unpacked into a site-packages-like folder (see docs/cross_aarch64.md)
#     target-libs  Debian's arm64 libssl-dev and libssl3 (OpenSSL's libcrypto, for SHA-256) and
#               nlohmann-json3-dev (headers): apt-get download (the arm64 architecture added to dpkg
#               when missing), unpacked into a prefix of the cache, never installed
#   3 configure deploy_cpp with toolchains/aarch64-linux-gnu.cmake, -DDEPTHPACK_OPENCV=OFF
#   4 build     every target CMakeLists.txt defines
#   5 elf       every executable and shared library built must be an ARM aarch64 ELF
#   6 qemu      depthpack_run under qemu-aarch64: --help, a missing manifest, x86_64 packages,
#               CUDA packages, and a package that is not a .pt2 (its sha256 by libcrypto, then
#               reached through ATen on aarch64)
# Each phase prints its time; any failure prints the end of its log and one line
# "cross_aarch64: FAILED: ...", exit 1. A second run reuses the wheels, the unpacked libtorch and
# the build folder (seconds, plus the qemu checks).
#
# Knobs: DP_CROSS_TORCH (torch==2.14.1, the version the Makefile pins), DP_CROSS_CACHE (wheels and
# unpacked libtorch; ${XDG_CACHE_HOME:-~/.cache}/depthpack-cross), DP_CROSS_BUILD (build/cross-aarch64),
# DP_CROSS_QEMU=0 (skip phase 6), DP_CROSS_PREFIX (aarch64-linux-gnu-), PYTHON (python3), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SPEC=${DP_CROSS_TORCH:-torch==2.14.1}
VERSION=${SPEC#torch==}
PREFIX=${DP_CROSS_PREFIX:-aarch64-linux-gnu-}
CACHE=${DP_CROSS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/depthpack-cross}
BUILD=${DP_CROSS_BUILD:-build/cross-aarch64}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
QEMU=${DP_CROSS_QEMU:-1}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
SITE=$CACHE/torch-$VERSION-aarch64        # <SITE>/torch/{include,lib,share}, <SITE>/nvidia/cu13/lib
DEPS=$CACHE/target-aarch64                # <DEPS>/include/{openssl,nlohmann}, <DEPS>/lib/libcrypto.so*
WHEELS=$CACHE/wheels
LOGS=$BUILD/logs
# the aarch64 wheels are manylinux_2_28 (torch) and older (nvidia-*); pip takes tags literally
PLATFORMS=()
for t in 2_28 2_27 2_26 2_25 2_24 2_17; do PLATFORMS+=(--platform "manylinux_${t}_aarch64"); done
PLATFORMS+=(--platform manylinux2014_aarch64)

T_ALL=$EPOCHREALTIME
T_PHASE=$T_ALL
PHASE=start
say() { echo "cross_aarch64: $*"; }
fail() { say "FAILED: $PHASE: $*"; exit 1; }
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
phase() { PHASE=$1; T_PHASE=$EPOCHREALTIME; }
done_phase() { say "$PHASE: $(secs "$T_PHASE") s${1:+ ($1)}"; }
# run a command with its output in $LOGS/$PHASE.log; on failure show the log's end, then fail
logged() {
  local log=$LOGS/$PHASE.log
  if ! "$@" >>"$log" 2>&1; then
    tail -n 30 "$log" | sed 's/^/    /'
    fail "\`$*\` exited non-zero (log: ${log#"$ROOT"/})"
  fi
}

[[ $SPEC == torch==* && $VERSION =~ ^[0-9][0-9A-Za-z.+]*$ ]] || { PHASE=args; fail "DP_CROSS_TORCH must read torch==X.Y.Z, got \"$SPEC\""; }
[ "$(uname -m)" = x86_64 ] || say "note: the host is $(uname -m), not x86_64; carrying on"
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log

# ---- 1 tools ---------------------------------------------------------------------------------------
phase tools
missing=()
command -v "${PREFIX}g++" >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v file >/dev/null || missing+=(file)
[ "$QEMU" = 0 ] || command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    fail "missing ${missing[*]}: apt-get install -y --no-install-recommends ${missing[*]} (as root), or set DP_CROSS_PREFIX"
  fi
  logged apt-get update -qq
  logged env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  done_phase "installed ${missing[*]}"
else
  done_phase "all present"
fi
"${PREFIX}g++" --version | head -1 | sed 's/^/    /'

# ---- 2 libtorch -----------------------------------------------------------------------------------
phase libtorch
if [ -f "$SITE/.complete" ]; then
  done_phase "cached: $SITE"
else
  mkdir -p "$WHEELS"
  PIP=("$PY" -m pip download -q --no-cache-dir --only-binary=:all: --python-version 3.11 "${PLATFORMS[@]}")
  find_wheel() { find "$WHEELS" -maxdepth 1 -name "torch-$VERSION-*aarch64.whl" | sort | tail -1; }
  whl=$(find_wheel)
  if [ -z "$whl" ]; then
    logged "${PIP[@]}" -d "$WHEELS" --no-deps "torch==$VERSION"
    whl=$(find_wheel)
    [ -n "$whl" ] || fail "pip saved no torch-$VERSION-*aarch64.whl in $WHEELS"
  fi
  # the CUDA runtime pieces libtorch_cpu.so needs, at the versions the wheel itself requires
  deps=$("$PY" - "$whl" <<'EOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:") or "extra ==" in line:
        continue
    req = line.split(":", 1)[1].split(";")[0].strip()
    name = re.match(r"[A-Za-z0-9._-]+", req).group(0)
    spec = re.sub(r"^[A-Za-z0-9._-]+(\[[^]]*\])?", "", req).strip()
    if name == "cuda-toolkit":                       # CUDA 13 wheels: one meta package with extras
        print(f"cuda-toolkit[cudart,cupti]{spec}")
    elif re.match(r"nvidia-cuda-(runtime|cupti)", name):  # CUDA 12 wheels: one package each
        print(f"{name}{spec}")
EOF
) || fail "cannot read the requirements of $whl"
  depdir=$WHEELS/deps-$VERSION
  if [ -n "$deps" ]; then
    mkdir -p "$depdir"
    mapfile -t reqs <<<"$deps"
    logged "${PIP[@]}" -d "$depdir" "${reqs[@]}"
  fi
  rm -rf "$SITE.tmp"
  logged "$PY" - "$whl" "$depdir" "$SITE.tmp" <<'EOF'
import glob, os, re, sys, zipfile
torch_whl, depdir, out = sys.argv[1:]
def unpack(whl, keep):
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if not n.endswith("/") and keep(n)]
        for n in names:
            z.extract(n, out)
    print(f"{os.path.basename(whl)}: {len(names)} files")
# headers, and the CPU libraries: not libtorch_cuda / c10_cuda / nvshmem / nvrtc (CUDA, GBs of
# dependencies), not libtorch_python; torch.libs holds vendored libraries in some wheels
cuda_or_python = re.compile(r"cuda|nvshmem|nvrtc|python")
unpack(torch_whl, lambda n: n.startswith("torch/include/") or n.startswith("torch.libs/")
       or (n.startswith("torch/lib/") and ".so" in n and not cuda_or_python.search(os.path.basename(n))))
for whl in sorted(glob.glob(os.path.join(depdir, "nvidia_*.whl"))):
    unpack(whl, lambda n: re.search(r"/lib/lib(cudart|cupti)\.so", n) is not None)
EOF
  mkdir -p "$SITE.tmp/torch/share/cmake/Torch"
  rm -rf "$SITE" && mv "$SITE.tmp" "$SITE" && touch "$SITE/.complete"
  done_phase "$(basename "$whl")${deps:+ + ${deps//$'\n'/ }}, unpacked to $SITE ($(du -sh "$SITE" | cut -f1))"
fi
# the CPU-only TorchConfig.cmake (why: in the file); copied on every run so that edits take effect
mkdir -p "$SITE/torch/share/cmake/Torch"
cmp -s deploy_cpp/toolchains/TorchConfig-cpu-only.cmake "$SITE/torch/share/cmake/Torch/TorchConfig.cmake" ||
  cp deploy_cpp/toolchains/TorchConfig-cpu-only.cmake "$SITE/torch/share/cmake/Torch/TorchConfig.cmake"

# ---- 2b target libraries: libcrypto for aarch64, nlohmann/json's headers (Debian's packages) -------
phase target-libs
if [ -f "$DEPS/.complete" ]; then
  done_phase "cached: $DEPS"
else
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || fail "needs apt-get and dpkg-deb (Debian) to fetch libssl-dev:arm64"
  debs=(libssl-dev:arm64 libssl3:arm64 nlohmann-json3-dev)
  rm -rf "$DEPS.tmp" && mkdir -p "$DEPS.tmp/debs"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    [ "$(id -u)" = 0 ] || fail "dpkg does not know arm64: dpkg --add-architecture arm64 && apt-get update (as root), then run again"
    logged dpkg --add-architecture arm64
    logged apt-get update -qq
  fi
  # the arm64 package lists may be missing (architecture added earlier, no update since): update once
  ( cd "$DEPS.tmp/debs" && apt-get download "${debs[@]}" ) >>"$LOGS/$PHASE.log" 2>&1 ||
    { logged apt-get update -qq; ( cd "$DEPS.tmp/debs" && logged apt-get download "${debs[@]}" ); }
  for deb in "$DEPS.tmp"/debs/*.deb; do logged dpkg-deb -x "$deb" "$DEPS.tmp/root"; done
  R=$DEPS.tmp/root/usr
  mkdir -p "$DEPS.tmp/include/openssl" "$DEPS.tmp/lib"
  # the arch-independent headers and the two of aarch64 (configuration.h, opensslconf.h) in one folder
  cp -r "$R/include/openssl/." "$R/include/aarch64-linux-gnu/openssl/." "$DEPS.tmp/include/openssl/"
  cp -r "$R/include/nlohmann" "$DEPS.tmp/include/"
  cp -a "$R"/lib/aarch64-linux-gnu/libcrypto.so* "$DEPS.tmp/lib/"
  rm -rf "$DEPS.tmp/debs" "$DEPS.tmp/root" "$DEPS" && mv "$DEPS.tmp" "$DEPS" && touch "$DEPS/.complete"
  done_phase "$(cd "$DEPS" && ls lib | tr '\n' ' ')+ headers, in $DEPS"
fi

# ---- 3 configure, 4 build -------------------------------------------------------------------------
phase configure
logged cmake -S deploy_cpp -B "$BUILD" \
  -DCMAKE_TOOLCHAIN_FILE="$ROOT/deploy_cpp/toolchains/aarch64-linux-gnu.cmake" \
  -DDP_CROSS_PREFIX="$PREFIX" \
  -DCMAKE_PREFIX_PATH="$SITE/torch/share/cmake;$DEPS" \
  -DCMAKE_BUILD_TYPE=Release \
  -DDEPTHPACK_OPENCV=OFF
done_phase

phase build
logged cmake --build "$BUILD" -j "$JOBS"
done_phase

# ---- 5 elf: what was built is for aarch64 ----------------------------------------------------------
phase elf
built=()
while IFS= read -r f; do
  file -b "$f" | grep -q '^ELF' && built+=("$f")
done < <(find "$BUILD" -path "$BUILD/CMakeFiles" -prune -o -type f \( -perm -u+x -o -name '*.so*' \) -print | sort)
[ ${#built[@]} -gt 0 ] || fail "no ELF executable or shared library in ${BUILD#"$ROOT"/}"
RUNNER=
for f in "${built[@]}"; do
  desc=$(file -b "$f")
  echo "    ${f#"$ROOT"/}: ${desc%%, BuildID*}"
  [[ $desc == *"ARM aarch64"* ]] || fail "${f#"$ROOT"/} is not an ARM aarch64 ELF: $desc"
  [ "$(basename "$f")" = depthpack_run ] && RUNNER=$f
done
[ -n "$RUNNER" ] || fail "no depthpack_run among the built files"
done_phase "${#built[@]} file(s), all ARM aarch64"

# ---- 6 qemu: the runner's error paths, run ---------------------------------------------------------
phase qemu
if [ "$QEMU" = 0 ]; then
  say "qemu: skipped (DP_CROSS_QEMU=0)"
elif ! command -v qemu-aarch64 >/dev/null; then
  fail "qemu-aarch64 not found (apt-get install qemu-user, or DP_CROSS_QEMU=0 to skip)"
else
  Q=$BUILD/qemu-check
  rm -rf "$Q" && mkdir -p "$Q"
  # The guest's root: the cross sysroot (its loader and libc) plus what an aarch64 Linux shows
  # in /proc/cpuinfo and /sys for a Jetson Orin's cores (Cortex-A78AE). qemu-user 7.2 passes the
  # host's x86 /proc/cpuinfo through, and libtorch's cpuinfo, finding no ARM core there, crashes
  # (SIGSEGV in cpuinfo_arm_linux_init) on the first ATen kernel; qemu's -L serves these files instead.
  TARGET_ROOT=/usr/aarch64-linux-gnu
  GUEST=$Q/root
  mkdir -p "$GUEST/proc" "$GUEST/sys/devices/system/cpu"
  for e in "$TARGET_ROOT"/*; do ln -s "$e" "$GUEST/$(basename "$e")"; done
  ncpu=$(nproc)
  for ((i = 0; i < ncpu; i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd42\nCPU revision\t: 1\n\n' "$i" >>"$GUEST/proc/cpuinfo"
    mkdir -p "$GUEST/sys/devices/system/cpu/cpu$i/regs/identification"
    echo 0x00000000410fd421 >"$GUEST/sys/devices/system/cpu/cpu$i/regs/identification/midr_el1"
  done
  echo "0-$((ncpu - 1))" | tee "$GUEST/sys/devices/system/cpu/possible" >"$GUEST/sys/devices/system/cpu/present"

  # A package folder: one "package" that is not a .pt2 (its sha256 right), a weights file, a
  # manifest per case, a 28x28 tensor image and two points.
  printf 'not a .pt2 package\n' >"$Q/depthpack_k8.pt2"
  SHA=$(sha256sum "$Q/depthpack_k8.pt2" | cut -d' ' -f1)
  printf '\0\0\0\0\0\0\0\0' >"$Q/weights.safetensors"
  WSHA=$(sha256sum "$Q/weights.safetensors" | cut -d' ' -f1)
  # the format the runner reads (deploy_cpp/manifest.h, held to the contract by a test)
  FORMAT=$(sed -n 's/.*kFormat = "\(.*\)";.*/\1/p' "$ROOT/deploy_cpp/manifest.h")
  manifest() {  # arch device
    cat <<EOF
{"format": "$FORMAT", "preset": null, "model_config": {}, "image_size": [28, 28], "patch_size": 7,
 "batch_size": 1, "device": "$2", "compute_capability": $([ "$2" = cuda ] && echo '"8.7"' || echo null),
 "arch": "$1", "dtype": "float32", "torch_version": "$VERSION", "min_depth": 0.1, "max_depth": 20.0,
 "frame": null, "preprocess": {}, "tolerance": {"atol": 0.001, "rtol": 0.001},
 "buckets": [{"bucket": 8, "file": "depthpack_k8.pt2", "sha256": "$SHA",
              "inputs": [{"name": "images", "shape": [1, 3, 28, 28], "dtype": "float32"},
                         {"name": "points", "shape": [1, 8, 2], "dtype": "float32"}],
              "outputs": [{"name": "depth", "shape": [1, 8], "dtype": "float32"}]}],
 "reference": {"file": "reference.safetensors", "sha256": "$SHA"},
 "weights": {"file": "weights.safetensors", "sha256": "$WSHA"}}
EOF
  }
  manifest x86_64 cpu >"$Q/manifest_x86_64.json"
  manifest aarch64 cuda >"$Q/manifest_cuda.json"
  manifest aarch64 cpu >"$Q/manifest.json"
  "$PY" - "$Q/image.safetensors" <<'EOF'
import json, struct, sys
n = 3 * 28 * 28
head = json.dumps({"images": {"dtype": "F32", "shape": [1, 3, 28, 28], "data_offsets": [0, 4 * n]}}).encode()
head += b" " * (-len(head) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(head)) + head + struct.pack(f"<{n}f", *[0.5] * n))
EOF
  printf 'x,y\n3,4\n20.5,11\n' >"$Q/points.csv"

  LIBS=$SITE/torch/lib:$DEPS/lib
  for d in "$SITE"/nvidia/*/lib; do LIBS=$LIBS:$d; done
  RUN=(qemu-aarch64 -L "$GUEST" -E "LD_LIBRARY_PATH=$LIBS" "$RUNNER")
  # case NAME RC PATTERN ARGS...: exit code RC; for RC 0 stdout starts with PATTERN and stderr is
  # empty, otherwise stderr is exactly one line "depthpack_run: error: ..." matching PATTERN.
  # Each run spends ~10 s of emulation loading libtorch_cpu.so: all run at once, then are judged.
  CASES=()
  case_() {
    local name=$1
    CASES+=("$1|$2|$3|${*:4}")
    shift 3
    ( t=$EPOCHREALTIME; rc=0
      cd "$Q" && "${RUN[@]}" "$@" >"$Q/$name.out" 2>"$Q/$name.err" || rc=$?
      echo "$rc $(secs "$t")" >"$Q/$name.rc" ) &
  }
  case_ help 0 '^usage: depthpack_run' --help
  case_ no-manifest 1 'missing/manifest\.json: cannot be read' --manifest missing/manifest.json --check ref.safetensors
  case_ x86-packages 1 'packages were built for x86_64, this machine is aarch64' --manifest manifest_x86_64.json --check ref.safetensors
  case_ cuda-packages 1 'the packages are for CUDA but this runner was built against a libtorch without CUDA' --manifest manifest_cuda.json --check ref.safetensors
  case_ not-a-pt2 1 'depthpack_k8\.pt2: cannot be loaded' --manifest manifest.json --image image.safetensors --points points.csv
  wait
  passed=0
  for c in "${CASES[@]}"; do
    IFS='|' read -r name want_rc pattern args <<<"$c"
    read -r rc took <"$Q/$name.rc"
    ok=1
    if [ "$rc" != "$want_rc" ]; then ok=0
    elif [ "$want_rc" = 0 ]; then
      { [ ! -s "$Q/$name.err" ] && head -1 "$Q/$name.out" | grep -qE "$pattern"; } || ok=0
    else
      { [ "$(wc -l <"$Q/$name.err")" = 1 ] && grep -qE "^depthpack_run: error: .*$pattern" "$Q/$name.err"; } || ok=0
    fi
    if [ $ok = 1 ]; then
      passed=$((passed + 1))
      printf '    ok   %-13s exit %s, %s s: %s\n' "$name" "$rc" "$took" \
        "$(if [ "$want_rc" = 0 ]; then head -1 "$Q/$name.out"; else cat "$Q/$name.err"; fi | cut -c1-150)"
    else
      printf '    FAIL %-13s exit %s (want %s); stderr:\n' "$name" "$rc" "$want_rc"
      sed 's/^/        /' "$Q/$name.err" | head -20
      fail "depthpack_run $args under qemu: want exit $want_rc and \"$pattern\" (outputs in ${Q#"$ROOT"/})"
    fi
  done
  done_phase "$passed checks passed"
fi

say "OK: ${RUNNER#"$ROOT"/} is an ARM aarch64 build against torch $VERSION; total $(secs "$T_ALL") s"
