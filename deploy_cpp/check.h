// check.h: a Runner against a reference file (export's reference.safetensors, or the exporter's
// self-check files): its inputs through the packages, its depths within the manifest's tolerance.
#pragma once

#include <cstdint>
#include <string>

#include "io.h"
#include "runner.h"

namespace depthpack {

struct Check {
  bool ok = false;          // every |depth - ref| <= atol + rtol |ref|, and finite
  double max_abs_diff = 0;  // meters, over the depths and, where the reference holds one, the map
  int64_t points = 0;       // per batch row
  bool map = false;         // the glance's map was compared too (REF "map", packages with a map)
  bool map_only = false;    // ... and from the map-only package, no points (manifest "map" names one)
};

// REF holds "images" float32 [>=B,3,H,W] (frame packages: "frames" uint8 [>=B,h,w,3]), "points"
// float32 [>=B,Q,2], "depth" float32 [>=B,Q], optionally "focal" float32 [>=B] (one value in the
// first B rows; fed to packages with a focal input, else the manifest's default), and for packages with a
// map "map" float32 [>=B,rows,cols] (the map of the first chunk's buffer, and of a map-only call where
// the manifest has a map-only package); the first B rows are used.
Check check_reference(Runner& runner, const std::string& path);

// "" when a tensor file's images (frame packages: frames) fit the packages' input but for the
// number of rows, else what differs: "dtype U8, the packages take F32 (float32 RGB in [0,1])" or
// "shape [1,3,32,32], the packages take [N,3,64,64]".
std::string input_mismatch(const io::Tensor& t, const Manifest& m);

}  // namespace depthpack
