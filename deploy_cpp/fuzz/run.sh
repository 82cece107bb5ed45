#!/usr/bin/env bash
# Fuzz the runner's readers with libFuzzer (clang, with ASan and UBSan): every target that
# fuzz/CMakeLists.txt builds, FUZZ_SECONDS each, from its committed corpus (corpus/<target>/) and
# regressions (regressions/<target>/). CI runs it (.ci/run); so does `make fuzz`.
#
#   1 clang     clang++ (or clang++-14, -16, -19) that links -fsanitize=fuzzer; apt-get installs
#               clang-14 and libclang-rt-14-dev when there is none (as root)
#   2 build     deploy_cpp with -DDEPTHPACK_FUZZ=ON: the readers and the targets, no libtorch
#   3 fuzz      the targets, FUZZ_JOBS at once; new inputs go to <build>/found/<target>/
# One line per target: executions, seconds, corpus; then "fuzz: OK: ..." or, on a finding (a
# crash, a sanitizer report, an exception other than depthpack::Error, a timeout), the end of its
# report, the input kept as <build>/findings/<target>-crash-..., and "fuzz: FAILED: ...", exit 1.
# Fix it, then copy the input into regressions/<target>/: tests/deploy/test_cpp_fuzz.py replays it.
#
# Knobs: FUZZ_SECONDS (60), FUZZ_JOBS (nproc), FUZZ_BUILD (build/fuzz), FUZZ_CXX (a clang++),
# FUZZ_MERGE=1 (afterwards, add to corpus/<target>/ the inputs of up to 2 KiB that libFuzzer's
# merge keeps for their coverage: how the committed corpus grows, small).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SECS=${FUZZ_SECONDS:-60}
BUILD=${FUZZ_BUILD:-build/fuzz}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
JOBS=${FUZZ_JOBS:-$(nproc)}
FUZZ=$ROOT/deploy_cpp/fuzz
T_ALL=$EPOCHREALTIME
say() { echo "fuzz: $*"; }
fail() { say "FAILED: $*"; exit 1; }
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'; }
mkdir -p "$BUILD/logs"

# ---- 1 clang ------------------------------------------------------------------------------------
links_fuzzer() { echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long) { return 0; }' |
  "$1" -x c++ -fsanitize=fuzzer,address,undefined - -o "$BUILD/logs/probe" >/dev/null 2>&1; }
find_clang() {
  for c in ${FUZZ_CXX:-} clang++ clang++-14 clang++-16 clang++-19; do
    command -v "$c" >/dev/null && links_fuzzer "$c" && { command -v "$c"; return 0; }
  done
  return 1
}
if ! CLANG=$(find_clang); then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    fail "no clang++ that links -fsanitize=fuzzer: apt-get install clang-14 libclang-rt-14-dev (as root), or set FUZZ_CXX"
  fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev) \
    >"$BUILD/logs/apt.log" 2>&1 || { tail -20 "$BUILD/logs/apt.log"; fail "apt-get install clang-14 libclang-rt-14-dev failed"; }
  CLANG=$(find_clang) || fail "clang-14 installed, but it does not link -fsanitize=fuzzer"
fi
say "compiler $("$CLANG" --version | head -1)"

# ---- 2 build ------------------------------------------------------------------------------------
t=$EPOCHREALTIME
if ! { cmake -S deploy_cpp -B "$BUILD" -DDEPTHPACK_FUZZ=ON -DCMAKE_CXX_COMPILER="$CLANG" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$BUILD" -j "$(nproc)"; } >"$BUILD/logs/build.log" 2>&1; then
  tail -30 "$BUILD/logs/build.log"
  fail "the fuzz targets do not build (log: ${BUILD#"$ROOT"/}/logs/build.log)"
fi
TARGETS=()
for f in "$BUILD"/fuzz/fuzz_*; do [ -x "$f" ] && TARGETS+=("$(basename "$f" | sed 's/^fuzz_//')"); done
[ ${#TARGETS[@]} -gt 0 ] || fail "no fuzz target was built"
say "build: $(secs "$t") s (${TARGETS[*]})"

# ---- 3 fuzz -------------------------------------------------------------------------------------
fuzz_one() {  # target: runs it for SECS seconds; its log and exit code in logs/
  local t=$1 dirs=("$BUILD/found/$1" "$FUZZ/corpus/$1")
  [ -d "$FUZZ/regressions/$t" ] && dirs+=("$FUZZ/regressions/$t")
  mkdir -p "$BUILD/found/$t" "$BUILD/findings"
  rc=0
  "$BUILD/fuzz/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD/findings/$t-" "${dirs[@]}" >"$BUILD/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$BUILD/logs/$t.rc"
}
t=$EPOCHREALTIME
running=0
for target in "${TARGETS[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
  fuzz_one "$target" &
  running=$((running + 1))
done
wait
total=0
failed=()
for target in "${TARGETS[@]}"; do
  log=$BUILD/logs/$target.log
  rc=$(cat "$BUILD/logs/$target.rc")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  seeds=$(find "$FUZZ/corpus/$target" -type f | wc -l)
  found=$(find "$BUILD/found/$target" -type f | wc -l)
  if [ "$rc" = 0 ] && [ -n "$execs" ]; then
    total=$((total + execs))
    say "$target: ${execs} executions in ${took:-?} s, corpus ${seeds} committed + ${found} found, no finding"
  else
    failed+=("$target")
    say "$target: exit $rc; the end of its report:"
    grep -v '^#[0-9]' "$log" | tail -40 | sed 's/^/    /'
    ls "$BUILD/findings/$target-"* 2>/dev/null | sed 's/^/    input: /' || true
  fi
done
[ ${#failed[@]} -eq 0 ] || fail "${failed[*]}: a finding (inputs in ${BUILD#"$ROOT"/}/findings/, logs in ${BUILD#"$ROOT"/}/logs/)"

if [ "${FUZZ_MERGE:-0}" = 1 ]; then
  for target in "${TARGETS[@]}"; do
    merged=$BUILD/merged/$target  # a copy of the corpus, then what of found/ adds coverage to it
    rm -rf "$merged" && mkdir -p "$merged" && cp "$FUZZ/corpus/$target"/* "$merged/"
    "$BUILD/fuzz/fuzz_$target" -merge=1 "$merged" "$BUILD/found/$target" >"$BUILD/logs/$target.merge.log" 2>&1 ||
      fail "merging $target's inputs failed (log: ${BUILD#"$ROOT"/}/logs/$target.merge.log)"
    added=0
    for f in $(find "$merged" -type f -size -2049c); do
      [ -e "$FUZZ/corpus/$target/$(basename "$f")" ] || { cp "$f" "$FUZZ/corpus/$target/"; added=$((added + 1)); }
    done
    say "$target: corpus/$target +$added inputs (new coverage, up to 2 KiB each)"
  done
fi
say "OK: ${#TARGETS[@]} targets, ${total} executions, ${SECS} s each, ${JOBS} at once; total $(secs "$T_ALL") s"
