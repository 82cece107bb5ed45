# fuzz.cmake: included by CMakeLists.txt with -DDEPTHPACK_FUZZ=ON, before the readers' target, so
# that the readers are built with the same instrumentation as the fuzz targets.
# clang: libFuzzer (coverage), ASan and UBSan; every target links libFuzzer's main (fuzz/run.sh).
# Another compiler (g++): ASan and UBSan, and a main that replays files (replay.cpp): the corpus and
# the regressions as a test (tests/deploy/test_cpp_fuzz.py), on machines without clang.
set(DP_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(DP_FUZZ_ENGINE libfuzzer)
  add_compile_options(-fsanitize=fuzzer-no-link ${DP_SANITIZE})
else()
  set(DP_FUZZ_ENGINE replay)
  add_compile_options(${DP_SANITIZE})
endif()
add_link_options(-fsanitize=address,undefined)
message(STATUS "depthpack: fuzz targets with ${DP_FUZZ_ENGINE} (${CMAKE_CXX_COMPILER_ID}), ASan and UBSan")
