// fuzz_points: the points CSV reader (parse_points, then check_points against a 64x64 image) on
// arbitrary bytes. Seeds: real exports' reference_points.csv.
#include <cmath>

#include "harness.h"
#include "io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depthpack;
  fuzz::answer([&] {
    const io::Points p = io::parse_points(fuzz::bytes(data, size), "points.csv");
    if (p.xy.size() != 2 * p.text.size() || p.line.size() != p.text.size()) __builtin_trap();
    for (float v : p.xy)
      if (!std::isfinite(v)) __builtin_trap();  // accepted points are finite float32
    io::check_points(p, "points.csv", 64, 64);
  });
  return 0;
}
