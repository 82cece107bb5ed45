// manifest.cpp: read_manifest mirrors depthpack.deploy.contract.read_manifest, plus the checks of
// the inputs by name that a runner building its input vector from the list needs.
#include "manifest.h"

#include <algorithm>
#include <cmath>

#include "io.h"

namespace depthpack {
namespace {

namespace fs = std::filesystem;
using Json = io::Json;
using Kind = Json::value_t;

// obj[key], which must exist and be of this kind (a number: integer or not)
const Json& need(const Json& obj, const std::string& key, Kind kind, const std::string& where) {
  if (!obj.is_object()) throw Error(where + ": expected an object");
  if (!obj.contains(key)) throw Error(where + ": missing key \"" + key + "\"");
  const Json& v = obj[key];
  const bool ok = kind == Kind::number_float ? v.is_number() : v.type() == kind;
  if (!ok) {
    const char* name = kind == Kind::number_float ? "number" : kind == Kind::array ? "list" : Json(kind).type_name();
    throw Error(where + ": \"" + key + "\" must be a " + name);
  }
  return v;
}

int64_t as_int(const Json& v, const std::string& where) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(1e12)) throw Error(where + ": expected a non-negative integer");
  return int64_t(v.get<uint64_t>());
}

std::vector<int64_t> int_list(const Json& v, const std::string& where) {
  if (!v.is_array()) throw Error(where + ": expected a list of integers");
  std::vector<int64_t> out;
  for (const Json& x : v) out.push_back(as_int(x, where));
  return out;
}

// A file beside the manifest: no folder, not "." or "..".
bool plain_name(const std::string& file) {
  return !file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos;
}

bool is_sha256(const std::string& hex) {
  return hex.size() == 64 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? "," : "") + std::to_string(s[k]);
  return out + "]";
}

std::vector<TensorSpec> specs(const Json& list, const std::string& where) {
  if (!list.is_array()) throw Error(where + ": expected a list of tensors");
  std::vector<TensorSpec> out;
  for (const Json& t : list)
    out.push_back({need(t, "name", Kind::string, where).get<std::string>(), need(t, "dtype", Kind::string, where).get<std::string>(),
                   int_list(need(t, "shape", Kind::array, where), where + ": shape")});
  return out;
}

// The spec an input of this name must have in bucket K; an unknown name is an error naming it.
TensorSpec expected(const std::string& name, const Manifest& m, int64_t K, const std::string& where) {
  const int64_t B = m.batch;
  if (name == "images") return {name, "float32", {B, 3, m.H, m.W}};
  if (name == "points") return {name, "float32", {B, K, 2}};
  if (name == "focal") return {name, "float32", {B}};
  if (name == "frames") {
    if (!m.frame_h) throw Error(where + ": input \"frames\" needs the manifest's \"frame\": {\"size\": [h, w], \"color\": ...}");
    return {name, "uint8", {B, m.frame_h, m.frame_w, 3}};
  }
  throw Error(where + ": input \"" + name + "\" is not one this runner can feed (images, frames, points, focal)");
}

void check_inputs(const Manifest& m, const Bucket& b, const std::string& where) {
  std::vector<std::string> names;
  for (const TensorSpec& t : b.inputs) {
    if (std::count(names.begin(), names.end(), t.name)) throw Error(where + ": input \"" + t.name + "\" listed twice");
    names.push_back(t.name);
    TensorSpec want = expected(t.name, m, b.capacity, where);
    if (t != want)
      throw Error(where + ": input \"" + t.name + "\" shape " + shape_str(t.shape) + " " + t.dtype + " differs from " +
                  shape_str(want.shape) + " " + want.dtype + " (from image_size, frame, batch_size and bucket)");
  }
  auto has = [&](const char* n) { return std::count(names.begin(), names.end(), n) > 0; };
  if (!has("points") || has("images") == has("frames"))
    throw Error(where + ": inputs " + describe(b.inputs) + " must hold \"points\" and one of \"images\", \"frames\"");
  std::vector<std::string> first;
  for (const TensorSpec& t : m.buckets.empty() ? b.inputs : m.buckets.front().inputs) first.push_back(t.name);
  if (first != names) throw Error(where + ": inputs " + describe(b.inputs) + " differ from those of the first bucket");
}

// A package's entry: its file beside the manifest, sha256 and inputs (checked by the caller).
Bucket package_entry(const Json& b, int64_t capacity, const fs::path& path, const std::string& wb) {
  Bucket bucket;
  bucket.capacity = capacity;
  const std::string file = need(b, "file", Kind::string, wb).get<std::string>();
  if (!plain_name(file)) throw Error(wb + ": file must be a plain file name, got \"" + file + "\"");
  bucket.file = path.parent_path() / file;
  bucket.sha256 = need(b, "sha256", Kind::string, wb).get<std::string>();
  if (!is_sha256(bucket.sha256)) throw Error(wb + ": sha256 must be 64 lowercase hex digits");
  bucket.inputs = specs(b["inputs"], wb + ": inputs");
  return bucket;
}

// "map"'s map-only package (contract._check_map_package): format 5, a one-way model, every key, the
// buckets' inputs without the points -> the map.
void read_map_package(const Json& j, Manifest& m, const std::string& w) {
  if (!j.contains("map") || !j["map"].is_object()) return;
  const Json& mp = j["map"];
  std::vector<std::string> present, missing;
  for (const char* key : kMapPackageKeys) (mp.contains(key) ? present : missing).push_back(key);
  if (present.empty()) return;
  const std::string wm = w + ": map";
  if (j["format"] != kFormat)
    throw Error(wm + ": a map-only package needs format " + kFormat + ", this is " + j["format"].get<std::string>());
  if (!missing.empty()) throw Error(wm + ": missing key \"" + missing.front() + "\" of the map-only package");
  const Json& mc = j["model_config"];
  if (!mc.is_object() || !mc.contains("glance_stream") || mc["glance_stream"] != "oneway")
    throw Error(wm + ": a map-only package needs the one-way glance stream (model_config.glance_stream \"oneway\")");
  Bucket b = package_entry(mp, 0, m.path, wm);
  std::vector<TensorSpec> want_in;
  for (const TensorSpec& t : m.buckets.front().inputs)
    if (t.name != "points") want_in.push_back(t);
  const std::vector<TensorSpec> out = specs(mp["outputs"], wm + ": outputs"),
                                want_out = {{"map", "float32", {m.batch, m.map_rows, m.map_cols}}};
  if (b.inputs != want_in || out != want_out)
    throw Error(wm + ": the map-only package's tensors " + describe(b.inputs) + " -> " + describe(out) + " are not " +
                describe(want_in) + " -> " + describe(want_out) + " (the buckets' inputs without the points)");
  m.map_package = std::move(b);
}

void read_optional(const Json& j, Manifest& m, const std::string& w) {
  if (j.contains("frame") && !j["frame"].is_null()) {
    const Json& f = j["frame"];
    auto hw = int_list(need(f, "size", Kind::array, w + ": frame"), w + ": frame: size");
    if (hw.size() != 2 || hw[0] < 1 || hw[1] < 1 || hw[0] > 1 << 16 || hw[1] > 1 << 16)
      throw Error(w + ": frame: size must be [h, w], each in [1, 65536]");
    m.frame_h = hw[0], m.frame_w = hw[1];
    const std::string color = need(f, "color", Kind::string, w + ": frame").get<std::string>();
    if (color != "bgr" && color != "rgb") throw Error(w + ": frame: color must be \"bgr\" or \"rgb\", got \"" + color + "\"");
    m.frame_bgr = color == "bgr";
  }
  if (j.contains("focal") && !j["focal"].is_null()) {
    const Json& f = j["focal"];
    const Json* d = f.is_object() && f.contains("default") ? &f["default"] : nullptr;
    // a float32 focal: finite and > 0 after the conversion too
    if (!d || (!d->is_null() && (!d->is_number() || !(d->get<double>() > 0) || !(d->get<double>() < 1e7))))
      throw Error(w + ": focal must be {\"default\": f} with 0 < f < 1e7 pixels, or null");
    if (!d->is_null()) m.focal_default = float(d->get<double>());
  }
  if (j.contains("map") && !j["map"].is_null()) {
    auto rc = int_list(need(j["map"], "size", Kind::array, w + ": map"), w + ": map: size");
    if (rc.size() != 2 || rc[0] < 1 || rc[1] < 1 || rc[0] > kMaxSize || rc[1] > kMaxSize)
      throw Error(w + ": map: size must be [rows, cols], each in [1, " + std::to_string(kMaxSize) + "]");
    m.map_rows = rc[0], m.map_cols = rc[1];
  }
}

}  // namespace

bool Manifest::has_input(const std::string& name) const {
  for (const TensorSpec& t : buckets.front().inputs)
    if (t.name == name) return true;
  return false;
}

std::string describe(const std::vector<TensorSpec>& specs) {
  std::string out = "[";
  for (size_t k = 0; k < specs.size(); ++k)
    out += (k ? ", " : "") + specs[k].name + " " + specs[k].dtype + " " + shape_str(specs[k].shape);
  return out + "]";
}

std::vector<TensorSpec> parse_specs(const std::string& json, const std::string& where) {
  return specs(io::parse_json(json, where), where);
}

Manifest read_manifest(const fs::path& path) { return parse_manifest(io::read_file(path, "manifest", io::kManifestCap), path); }

Manifest parse_manifest(const std::string& text, const fs::path& path) {
  const std::string w = "manifest " + path.string();
  const Json j = io::parse_json(text, w);
  const Json* format = j.is_object() && j.contains("format") ? &j["format"] : nullptr;
  if (!format || !format->is_string() || (*format != kFormat && *format != kFormatShared && *format != kFormatNoMap))
    throw Error(w + ": not a " + kFormat + " manifest (format " + (format && format->is_string() ? format->dump() : "missing") +
                "); re-export with this depthpack");
  std::vector<std::string> missing;
  for (const char* key : kRequiredKeys)
    if (!j.contains(key)) missing.push_back(std::string("\"") + key + "\"");
  if (!missing.empty()) {
    std::string list;
    for (const auto& k : missing) list += (list.empty() ? "" : ", ") + k;
    throw Error(w + ": missing key" + (missing.size() > 1 ? "s " : " ") + list);
  }
  Manifest m;
  m.path = path;
  auto hw = int_list(need(j, "image_size", Kind::array, w), w + ": image_size");
  if (hw.size() != 2 || hw[0] < 1 || hw[1] < 1 || hw[0] > kMaxSize || hw[1] > kMaxSize)
    throw Error(w + ": image_size must be [H, W], each in [1, " + std::to_string(kMaxSize) + "]");
  m.H = hw[0], m.W = hw[1];
  const int64_t patch = as_int(need(j, "patch_size", Kind::number_unsigned, w), w + ": patch_size");
  if (patch < 1 || m.H % patch || m.W % patch) throw Error(w + ": patch_size must be a positive integer that divides image_size");
  m.batch = as_int(need(j, "batch_size", Kind::number_unsigned, w), w + ": batch_size");
  if (m.batch < 1 || m.batch > kMaxBatch) throw Error(w + ": batch_size must be an integer in [1, " + std::to_string(kMaxBatch) + "]");
  m.device = need(j, "device", Kind::string, w).get<std::string>();
  if (m.device != "cpu" && m.device != "cuda") throw Error(w + ": device must be \"cpu\" or \"cuda\", got \"" + m.device + "\"");
  m.dtype = need(j, "dtype", Kind::string, w).get<std::string>();
  m.arch = need(j, "arch", Kind::string, w).get<std::string>();
  m.torch_version = need(j, "torch_version", Kind::string, w).get<std::string>();
  if (const Json& cc = j["compute_capability"]; cc.is_string()) m.capability = cc.get<std::string>();
  else if (!cc.is_null()) throw Error(w + ": \"compute_capability\" must be a string such as \"9.0\", or null");
  const Json& tol = need(j, "tolerance", Kind::object, w);
  m.atol = need(tol, "atol", Kind::number_float, w + ": tolerance").get<double>();
  m.rtol = need(tol, "rtol", Kind::number_float, w + ": tolerance").get<double>();
  if (!(m.atol >= 0) || !(m.rtol >= 0)) throw Error(w + ": tolerance: atol and rtol must be >= 0");
  read_optional(j, m, w);
  const Json& list = need(j, "buckets", Kind::array, w);
  if (list.empty()) throw Error(w + ": buckets must list at least one package");
  const int64_t patches = (m.H / patch) * (m.W / patch);
  for (size_t k = 0; k < list.size(); ++k) {
    const Json& b = list[k];
    const std::string wb = w + ": buckets[" + std::to_string(k) + "]";
    for (const char* key : kBucketKeys)
      if (!b.is_object() || !b.contains(key)) throw Error(wb + ": missing key \"" + key + "\"");
    const int64_t capacity = as_int(need(b, "bucket", Kind::number_unsigned, wb), wb + ": bucket");
    if (capacity < 1 || capacity > patches || (!m.buckets.empty() && capacity <= m.buckets.back().capacity))
      throw Error(wb + ": buckets must be ascending integers in [1, " + std::to_string(patches) + "] (the image's patches)");
    Bucket bucket = package_entry(b, capacity, path, wb);
    check_inputs(m, bucket, wb);
    std::vector<TensorSpec> out = specs(b["outputs"], wb + ": outputs");
    std::vector<TensorSpec> want = {{"depth", "float32", {m.batch, bucket.capacity}}};
    if (m.has_map()) want.push_back({"map", "float32", {m.batch, m.map_rows, m.map_cols}});
    if (out != want) throw Error(wb + ": outputs " + describe(out) + " differ from " + describe(want));
    m.buckets.push_back(std::move(bucket));
  }
  read_map_package(j, m, w);
  const Json& ref = need(j, "reference", Kind::object, w);
  need(ref, "file", Kind::string, w + ": reference"), need(ref, "sha256", Kind::string, w + ": reference");
  // "weights": {"file": a plain name, "sha256": hex}; null was the older layout, weights compiled into each package
  const Json& wt = j["weights"];
  if (wt.is_null())
    throw Error(w + ": \"weights\" is null: packages with their weights inside (an older export) are not run by this runner; "
                "re-export with this depthpack (weights beside the packages)");
  const bool ok = wt.is_object() && wt.contains("file") && wt["file"].is_string() && plain_name(wt["file"].get<std::string>()) &&
                  wt.contains("sha256") && wt["sha256"].is_string() && is_sha256(wt["sha256"].get<std::string>());
  if (!ok) throw Error(w + ": \"weights\" must be {\"file\": a plain file name, \"sha256\": 64 lowercase hex digits}");
  m.weights = WeightsFile{path.parent_path() / wt["file"].get<std::string>(), wt["sha256"].get<std::string>()};
  return m;
}

std::string this_arch() {
#if defined(__x86_64__) || defined(_M_X64)
  return "x86_64";
#elif defined(__aarch64__) || defined(_M_ARM64)
  return "aarch64";
#else
  return "unknown";
#endif
}

}  // namespace depthpack
