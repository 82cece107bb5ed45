// check.h: a Runner against a reference file (export's reference.safetensors, or the exporter's
// self-check files): its inputs through the packages, its depths within the manifest's tolerance.
#pragma once

#include <cstdint>
#include <string>

#include "runner.h"

namespace depthpack {

struct Check {
  bool ok = false;          // every |depth - ref| <= atol + rtol |ref|, and finite
  double max_abs_diff = 0;  // meters
  int64_t points = 0;       // per batch row
};

// REF holds "images" float32 [>=B,3,H,W] (frame packages: "frames" uint8 [>=B,h,w,3]), "points"
// float32 [>=B,Q,2], "depth" float32 [>=B,Q], optionally "focal" float32 [>=B] (one value in the
// first B rows; fed to packages with a focal input, else the manifest's default); the first B rows are used.
Check check_reference(Runner& runner, const std::string& path);

}  // namespace depthpack
