// manifest.cpp: read_manifest mirrors depthpack.deploy.contract.read_manifest, plus the checks of
// the inputs by name that a runner building its input vector from the list needs.
#include "manifest.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "io.h"
#include "mini_json.h"

namespace depthpack {
namespace {

namespace fs = std::filesystem;
using minijson::Value;

const Value& need(const Value& obj, const std::string& key, Value::Kind kind, const std::string& where) {
  static const char* names[] = {"null", "bool", "number", "string", "list", "object"};
  if (obj.kind != Value::Kind::Object) throw Error(where + ": expected an object");
  const Value* v = obj.find(key);
  if (!v) throw Error(where + ": missing key \"" + key + "\"");
  if (v->kind != kind) throw Error(where + ": \"" + key + "\" must be a " + names[int(kind)]);
  return *v;
}

int64_t as_int(const Value& v, const std::string& where) {
  if (v.kind != Value::Kind::Number || v.number != std::floor(v.number) || v.number < 0 || v.number > 1e12)
    throw Error(where + ": expected a non-negative integer");
  return int64_t(v.number);
}

std::vector<int64_t> int_list(const Value& v, const std::string& where) {
  if (v.kind != Value::Kind::Array) throw Error(where + ": expected a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : v.array) out.push_back(as_int(x, where));
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

std::vector<TensorSpec> specs(const Value& list, const std::string& where) {
  if (list.kind != Value::Kind::Array) throw Error(where + ": expected a list of tensors");
  std::vector<TensorSpec> out;
  for (const Value& t : list.array)
    out.push_back({need(t, "name", Value::Kind::String, where).string, need(t, "dtype", Value::Kind::String, where).string,
                   int_list(need(t, "shape", Value::Kind::Array, where), where + ": shape")});
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

void read_optional(const Value& j, Manifest& m, const std::string& w) {
  if (const Value* f = j.find("frame"); f && !f->is_null()) {
    auto hw = int_list(need(*f, "size", Value::Kind::Array, w + ": frame"), w + ": frame: size");
    if (hw.size() != 2 || hw[0] < 1 || hw[1] < 1) throw Error(w + ": frame: size must be [h, w]");
    m.frame_h = hw[0], m.frame_w = hw[1];
    const std::string& color = need(*f, "color", Value::Kind::String, w + ": frame").string;
    if (color != "bgr" && color != "rgb") throw Error(w + ": frame: color must be \"bgr\" or \"rgb\", got \"" + color + "\"");
    m.frame_bgr = color == "bgr";
  }
  if (const Value* f = j.find("focal"); f && !f->is_null()) {
    const Value* d = f->kind == Value::Kind::Object ? f->find("default") : nullptr;
    if (!d || (!d->is_null() && (d->kind != Value::Kind::Number || !(d->number > 0))))
      throw Error(w + ": focal must be {\"default\": f} with f > 0 pixels, or null");
    if (!d->is_null()) m.focal_default = float(d->number);
  }
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
  try {
    return specs(minijson::parse(json), where);
  } catch (const std::runtime_error& e) {
    throw Error(where + ": " + e.what());
  }
}

Manifest read_manifest(const fs::path& path) {
  const std::string w = "manifest " + path.string();
  Value j;
  try {
    j = minijson::parse(io::read_file(path, "manifest", io::kManifestCap));
  } catch (const Error&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw Error(w + ": " + e.what());
  }
  const Value* format = j.kind == Value::Kind::Object ? j.find("format") : nullptr;
  if (!format || format->kind != Value::Kind::String || format->string != kFormat)
    throw Error(w + ": not a " + kFormat + " manifest (format " + (format && format->kind == Value::Kind::String ? "\"" + format->string + "\"" : "missing") + "); re-export with this depthpack");
  std::vector<std::string> missing;
  for (const char* key : kRequiredKeys)
    if (!j.find(key)) missing.push_back(std::string("\"") + key + "\"");
  if (!missing.empty()) {
    std::string list;
    for (const auto& k : missing) list += (list.empty() ? "" : ", ") + k;
    throw Error(w + ": missing key" + (missing.size() > 1 ? "s " : " ") + list);
  }
  Manifest m;
  m.path = path;
  auto hw = int_list(need(j, "image_size", Value::Kind::Array, w), w + ": image_size");
  if (hw.size() != 2 || hw[0] < 1 || hw[1] < 1) throw Error(w + ": image_size must be [H, W]");
  m.H = hw[0], m.W = hw[1];
  m.batch = as_int(need(j, "batch_size", Value::Kind::Number, w), w + ": batch_size");
  if (m.batch < 1) throw Error(w + ": batch_size must be a positive integer");
  m.device = need(j, "device", Value::Kind::String, w).string;
  if (m.device != "cpu" && m.device != "cuda") throw Error(w + ": device must be \"cpu\" or \"cuda\", got \"" + m.device + "\"");
  m.dtype = need(j, "dtype", Value::Kind::String, w).string;
  m.arch = need(j, "arch", Value::Kind::String, w).string;
  m.torch_version = need(j, "torch_version", Value::Kind::String, w).string;
  if (const Value* cc = j.find("compute_capability"); cc->kind == Value::Kind::String) m.capability = cc->string;
  else if (!cc->is_null()) throw Error(w + ": \"compute_capability\" must be a string such as \"9.0\", or null");
  const Value& tol = need(j, "tolerance", Value::Kind::Object, w);
  m.atol = need(tol, "atol", Value::Kind::Number, w + ": tolerance").number;
  m.rtol = need(tol, "rtol", Value::Kind::Number, w + ": tolerance").number;
  read_optional(j, m, w);
  const Value& list = need(j, "buckets", Value::Kind::Array, w);
  if (list.array.empty()) throw Error(w + ": buckets must list at least one package");
  for (size_t k = 0; k < list.array.size(); ++k) {
    const Value& b = list.array[k];
    const std::string wb = w + ": buckets[" + std::to_string(k) + "]";
    for (const char* key : kBucketKeys)
      if (b.kind != Value::Kind::Object || !b.find(key)) throw Error(wb + ": missing key \"" + key + "\"");
    Bucket bucket;
    bucket.capacity = as_int(need(b, "bucket", Value::Kind::Number, wb), wb + ": bucket");
    if (bucket.capacity < 1 || (!m.buckets.empty() && bucket.capacity <= m.buckets.back().capacity))
      throw Error(wb + ": buckets must be positive and ascending");
    const std::string& file = need(b, "file", Value::Kind::String, wb).string;
    if (!plain_name(file)) throw Error(wb + ": file must be a plain file name, got \"" + file + "\"");
    bucket.file = path.parent_path() / file;
    bucket.sha256 = need(b, "sha256", Value::Kind::String, wb).string;
    if (!is_sha256(bucket.sha256)) throw Error(wb + ": sha256 must be 64 lowercase hex digits");
    bucket.inputs = specs(*b.find("inputs"), wb + ": inputs");
    check_inputs(m, bucket, wb);
    std::vector<TensorSpec> out = specs(*b.find("outputs"), wb + ": outputs");
    if (out != std::vector<TensorSpec>{{"depth", "float32", {m.batch, bucket.capacity}}})
      throw Error(wb + ": outputs " + describe(out) + " differ from [depth float32 " + shape_str({m.batch, bucket.capacity}) + "]");
    m.buckets.push_back(std::move(bucket));
  }
  const Value& ref = need(j, "reference", Value::Kind::Object, w);
  need(ref, "file", Value::Kind::String, w + ": reference"), need(ref, "sha256", Value::Kind::String, w + ": reference");
  // "weights": null (compiled into each package) or {"file": a plain name, "sha256": hex}
  if (const Value& wt = *j.find("weights"); !wt.is_null()) {
    const Value* file = wt.kind == Value::Kind::Object ? wt.find("file") : nullptr;
    const Value* sha = wt.kind == Value::Kind::Object ? wt.find("sha256") : nullptr;
    if (!file || file->kind != Value::Kind::String || !plain_name(file->string) || !sha ||
        sha->kind != Value::Kind::String || !is_sha256(sha->string))
      throw Error(w + ": \"weights\" must be null or {\"file\": a plain file name, \"sha256\": 64 lowercase hex digits}");
    m.weights = WeightsFile{path.parent_path() / file->string, sha->string};
  }
  return m;
}

void check_built_for_here(const Manifest& m) {
  if (m.arch != this_arch())
    throw Error("the packages were built for " + m.arch + ", this machine is " + this_arch() +
                ": a .pt2 holds native code for one CPU architecture; export on this machine (see deploy_cpp/README.md)");
  const std::string built = m.torch_version.substr(0, m.torch_version.find('+'));
  const std::string mm = built.substr(0, built.find('.', built.find('.') + 1));
  const std::string here = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  if (mm != here)
    throw Error("the packages were built with torch " + m.torch_version + ", this runner with libtorch " + TORCH_VERSION +
                ": AOTInductor packages are tied to the torch they were built with; export with torch " + here +
                ".x or rebuild the runner against libtorch " + mm);
}

}  // namespace depthpack
