#!/usr/bin/env bash
# Build depthpack_run and robot_loop with AddressSanitizer and UndefinedBehaviorSanitizer (g++) and
# run the C++ runner's tests (tests/deploy/test_cpp_runner.py) on that build: every parity, frame,
# error and weights case then runs under the sanitizers. CI runs it (.ci/run); so does `make asan`.
# A sanitizer report exits 86 (ASan, LeakSanitizer) or 87 (UBSan), a code no test accepts, and its
# first lines are in the failing test's message. Prints each phase's time and pytest's summary;
# exit 1 on any failure.
#
# Knobs: ASAN_BUILD (build/asan), PY (.venv/bin/python), DEPTHPACK_EXPORTS (exports to reuse, as
# make test left them: .ci/run passes the folder; default <build>/exports), PYTEST_ARGS (more
# pytest arguments).
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
export DEPTHPACK_RUN=$BUILD/depthpack_run
export DEPTHPACK_EXPORTS=${DEPTHPACK_EXPORTS:-$BUILD/exports}
mkdir -p "$DEPTHPACK_EXPORTS"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
TESTS=tests/deploy/test_cpp_runner.py
# left to make test: the build without OpenCV (it compiles another runner, not this one), the
# hypothesis cases of the CSV and image readers and the manifest's missing keys one by one (the fuzz
# targets read far more inputs of those readers)
SKIP="test_build_without_opencv or test_csv_reader_answers_or_fails_cleanly or test_image_reader_fails_cleanly_on_garbage"
SKIP="$SKIP or test_runner_refuses_what_pythons_read_manifest_refuses"
# the tests whose fixtures export (once, or found in DEPTHPACK_EXPORTS), then the rest in two processes
# at once: each runner process is mostly one core's work
FIRST="test_check_reference_passes or test_frame_packages_check_reference or test_focal_packages_check_the_references_focal"
t=$EPOCHREALTIME
rc=0
"${PYTEST[@]}" "$TESTS" -k "($FIRST) and not ($SKIP)" ${PYTEST_ARGS:-} >"$BUILD/tests-0.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || grep -E "^(FAILED|ERROR)|Error|error:" "$BUILD/tests-0.log" | head -20 | sed 's/^/    /'
tail -1 "$BUILD/tests-0.log" | sed 's/^/    exports: /'
"${PYTEST[@]}" "$TESTS" --collect-only -k "not ($FIRST) and not ($SKIP)" | grep '::' >"$BUILD/tests.txt" || true
for half in 1 2; do
  mapfile -t ids < <(awk -v h="$half" 'NR % 2 == h % 2' "$BUILD/tests.txt")
  ( r=0; "${PYTEST[@]}" "${ids[@]}" ${PYTEST_ARGS:-} >"$BUILD/tests-$half.log" 2>&1 || r=$?
    echo "$r" >"$BUILD/tests-$half.rc" ) &
done
wait
for half in 1 2; do
  r=$(cat "$BUILD/tests-$half.rc")
  [ "$r" = 0 ] || { rc=$r; grep -E "^(FAILED|ERROR)|Error|error:" "$BUILD/tests-$half.log" | head -20 | sed 's/^/    /'; }
  tail -1 "$BUILD/tests-$half.log" | sed "s/^/    half $half: /"
done
[ -s "$BUILD/tests.txt" ] || { rc=1; say "no test collected"; }
say "tests: $(secs "$t") s ($(wc -l <"$BUILD/tests.txt") tests in two halves, logs in ${BUILD#"$ROOT"/}/tests-*.log)"
[ "$rc" = 0 ] || fail "tests/deploy/test_cpp_runner.py on the ASan/UBSan build (pytest exit $rc)"
say "OK: total $(secs "$T_ALL") s"
