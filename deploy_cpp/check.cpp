// check.cpp: check_reference of check.h.
#include "check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "io.h"

namespace depthpack {
namespace {

std::string shape_str(const std::vector<int64_t>& s, bool rows_n) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? "," : "") + (k == 0 && rows_n ? "N" : std::to_string(s[k]));
  return out + "]";
}

}  // namespace

std::string input_mismatch(const io::Tensor& t, const Manifest& m) {
  const bool frames = m.takes_frames();
  const std::vector<int64_t> want = frames ? std::vector<int64_t>{0, m.frame_h, m.frame_w, 3} : std::vector<int64_t>{0, 3, m.H, m.W};
  if (t.dtype != (frames ? "U8" : "F32"))
    return "dtype " + t.dtype + ", the packages take " + (frames ? "U8 (uint8 frames)" : "F32 (float32 RGB in [0,1])");
  if (t.shape.size() != 4 || !std::equal(t.shape.begin() + 1, t.shape.end(), want.begin() + 1))
    return "shape " + shape_str(t.shape, false) + ", the packages take " + shape_str(want, true);
  return "";
}

Check check_reference(Runner& r, const std::string& path) {
  const Manifest& m = r.manifest();
  const bool frames = m.takes_frames();
  io::Safetensors ref(path);
  io::Tensor image = ref.get(frames ? "frames" : "images"), points = ref.get("points"), want = ref.get("depth");
  const int64_t B = m.batch;
  if (const std::string why = input_mismatch(image, m); !why.empty())
    throw Error("check " + path + ": its " + (frames ? "frames" : "images") + " do not fit the packages: " + why);
  if (image.shape[0] < B)
    throw Error("check " + path + ": its " + (frames ? "frames" : "images") + " hold " + std::to_string(image.shape[0]) +
                " rows, the packages' batch is " + std::to_string(B));
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
  const size_t n = size_t(B * c.points);  // a NaN reference would compare as "max abs diff 0 ... MISMATCH"
  const auto bad = std::count_if(want.f32.begin(), want.f32.begin() + n, [](float v) { return !std::isfinite(v); });
  if (bad) throw Error("check " + path + ": its depth holds " + std::to_string(bad) + " values that are not finite (NaN or inf): not a reference");
  std::vector<float> got(n), got_map;
  std::vector<float> want_map;
  if (m.has_map() && ref.has("map")) {
    io::Tensor rm = ref.get("map");
    if (rm.dtype != "F32" || rm.shape.size() != 3 || rm.shape[0] < B || rm.shape[1] != m.map_rows || rm.shape[2] != m.map_cols)
      throw Error("check " + path + ": its map must be float32 [>=B," + std::to_string(m.map_rows) + "," + std::to_string(m.map_cols) + "]");
    want_map.assign(rm.f32.begin(), rm.f32.begin() + B * m.map_rows * m.map_cols);
    got_map.resize(want_map.size());
    c.map = true;
  }
  r.predict_inputs(frames ? (const void*)image.u8.data() : image.f32.data(), B, points.f32.data(), c.points, got.data(), focal,
                   c.map ? got_map.data() : nullptr);
  c.ok = true;
  auto compare = [&](const std::vector<float>& a, const float* e) {  // row b of the first B rows: same offsets
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::isfinite(a[i]) ? std::abs(double(a[i]) - e[i]) : INFINITY;  // a NaN answer: inf, never 0
      c.max_abs_diff = std::max(c.max_abs_diff, d);
      c.ok = c.ok && std::isfinite(a[i]) && d <= m.atol + m.rtol * std::abs(e[i]);
    }
  };
  compare(got, want.f32.data());
  if (c.map) compare(got_map, want_map.data());
  if (c.map && m.map_package) {  // the same map with no points, from the map-only package
    r.predict_inputs(frames ? (const void*)image.u8.data() : image.f32.data(), B, nullptr, 0, nullptr, focal, got_map.data());
    compare(got_map, want_map.data());
    c.map_only = true;
  }
  return c;
}

}  // namespace depthpack
