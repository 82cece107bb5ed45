#!/usr/bin/env bash
# Build depthpack_run and robot_loop with AddressSanitizer and UndefinedBehaviorSanitizer (g++) and
# run the C++ runner's tests (tests/deploy/test_cpp_runner.py) on that build: every parity, frame,
# error and weights case then runs under the sanitizers. CI runs it (.ci/run); so does `make asan`.
# A sanitizer report exits 86 (ASan, LeakSanitizer) or 87 (UBSan), a code no test accepts, and its
# first lines are in the failing test's message. Prints each phase's time and pytest's summary;
# exit 1 on any failure.
#
# Knobs: ASAN_BUILD (build/asan), PY (.venv/bin/python), DEPTHPACK_EXPORTS (exports to reuse, as
# make test left them: .ci/run passes the folder), PYTEST_ARGS (more pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${ASAN_BUILD:-build/asan}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
PY=${PY:-.venv/bin/python}
say() { echo "asan: $*"; }
fail() { say "FAILED: $*"; exit 1; }
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'; }
mkdir -p "$BUILD"
T_ALL=$EPOCHREALTIME

t=$EPOCHREALTIME
# -O1: what the sanitizers are meant for, and libtorch's headers compile much faster than at -O3
FLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1"
if ! { cmake -S deploy_cpp -B "$BUILD" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$FLAGS" \
         -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
         -DCMAKE_PREFIX_PATH="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')" &&
       cmake --build "$BUILD" -j "$(nproc)" --target depthpack_run robot_loop; } >"$BUILD/build.log" 2>&1; then
  tail -30 "$BUILD/build.log"
  fail "the sanitizer build failed (log: ${BUILD#"$ROOT"/}/build.log)"
fi
say "build: $(secs "$t") s ($FLAGS)"

# detect_leaks: LeakSanitizer at exit; exitcode / halt_on_error: a report fails the process with a
# code of its own
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:exitcode=86:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:exitcode=87:print_stacktrace=1}
t=$EPOCHREALTIME
# left to make test: the build without OpenCV (it compiles another runner, not this one) and the
# hypothesis cases of the CSV and image readers (the fuzz targets read far more inputs)
rc=0
DEPTHPACK_RUN="$BUILD/depthpack_run" "$PY" -m pytest -q -p no:cacheprovider tests/deploy/test_cpp_runner.py \
  -k "not test_build_without_opencv and not test_csv_reader_answers_or_fails_cleanly and not test_image_reader_fails_cleanly_on_garbage" \
  ${PYTEST_ARGS:-} || rc=$?
say "tests: $(secs "$t") s, pytest exit $rc"
[ "$rc" = 0 ] || fail "tests/deploy/test_cpp_runner.py on the ASan/UBSan build (exit $rc)"
say "OK: total $(secs "$T_ALL") s"
