// check.cpp: check_reference of check.h.
#include "check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "io.h"

namespace depthpack {

Check check_reference(Runner& r, const std::string& path) {
  const Manifest& m = r.manifest();
  const bool frames = m.takes_frames();
  io::Safetensors ref(path);
  io::Tensor image = ref.get(frames ? "frames" : "images"), points = ref.get("points"), want = ref.get("depth");
  const int64_t B = m.batch;
  const std::vector<int64_t> item = frames ? std::vector<int64_t>{m.frame_h, m.frame_w, 3} : std::vector<int64_t>{3, m.H, m.W};
  if (image.shape.size() != 4 || image.shape[0] < B || std::vector<int64_t>(image.shape.begin() + 1, image.shape.end()) != item ||
      image.dtype != (frames ? "U8" : "F32"))
    throw Error("check " + path + ": its " + (frames ? "frames" : "images") + " do not fit the manifest");
  if (points.dtype != "F32" || want.dtype != "F32" || points.shape.size() != 3 || points.shape[0] < B || points.shape[2] != 2 ||
      want.shape != std::vector<int64_t>{points.shape[0], points.shape[1]})
    throw Error("check " + path + ": points / depth malformed");
  if (!frames) io::check_unit_range(image.f32, "check " + path);
  std::optional<float> focal;  // the runner feeds one focal per call: the reference's rows must agree
  if (m.has_input("focal") && ref.has("focal")) {
    io::Tensor f = ref.get("focal");
    if (f.dtype != "F32" || f.shape.size() != 1 || f.shape[0] < B || !std::equal(f.f32.begin() + 1, f.f32.begin() + B, f.f32.begin()))
      throw Error("check " + path + ": its focal must be float32 [>=B] with one value in the first B rows");
    focal = f.f32[0];
  }
  Check c;
  c.points = points.shape[1];
  std::vector<float> got(size_t(B * c.points));
  r.predict_inputs(frames ? (const void*)image.u8.data() : image.f32.data(), B, points.f32.data(), c.points, got.data(), focal);
  c.ok = true;
  for (size_t i = 0; i < got.size(); ++i) {  // row b of the reference's first B rows: same offsets
    const double d = std::abs(double(got[i]) - want.f32[i]);
    c.max_abs_diff = std::max(c.max_abs_diff, d);
    c.ok = c.ok && std::isfinite(got[i]) && d <= m.atol + m.rtol * std::abs(want.f32[i]);
  }
  return c;
}

}  // namespace depthpack
