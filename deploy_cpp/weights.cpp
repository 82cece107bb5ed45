// weights.cpp: the weights file and the constants records of weights.h.
#include "weights.h"

#include <tuple>

namespace depthpack {
namespace {

struct Dtype {
  const char *torch, *safetensors;
  uint64_t size;
};
// the dtypes the exporter can write: torch's name (the packages' records), safetensors' name
constexpr Dtype kDtypes[] = {{"bfloat16", "BF16", 2}, {"float16", "F16", 2}, {"float32", "F32", 4}, {"float64", "F64", 8},
                             {"int64", "I64", 8},     {"int32", "I32", 4},   {"int16", "I16", 2},   {"int8", "I8", 1},
                             {"uint8", "U8", 1},      {"bool", "BOOL", 1}};

const Dtype* by_safetensors(const std::string& name) {
  for (const Dtype& d : kDtypes)
    if (name == d.safetensors) return &d;
  return nullptr;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? "," : "") + std::to_string(s[k]);
  return out + "]";
}

}  // namespace

uint64_t item_size(const std::string& torch_dtype) {
  for (const Dtype& d : kDtypes)
    if (torch_dtype == d.torch) return d.size;
  return 0;
}

std::string weight_dtypes() {
  std::string out;
  for (const Dtype& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.torch);
  return out;
}

ConstantSpecs parse_constant_specs(const std::string& json, const std::string& where) {
  const io::Json j = io::parse_json(json, where);
  if (!j.is_object()) throw Error(where + ": expected a JSON object {fqn: {\"dtype\", \"shape\"}}");
  ConstantSpecs out;
  for (const auto& [fqn, spec] : j.items()) {
    const std::string w = where + ": constant \"" + fqn + "\"";
    if (!spec.is_object() || !spec.contains("dtype") || !spec["dtype"].is_string() || !spec.contains("shape") ||
        !spec["shape"].is_array())
      throw Error(w + ": expected {\"dtype\": a string, \"shape\": a list}");
    ConstantSpec c{spec["dtype"].get<std::string>(), {}};
    if (!item_size(c.dtype)) throw Error(w + ": dtype \"" + c.dtype + "\" is not one of " + weight_dtypes());
    for (const io::Json& s : spec["shape"]) {
      if (!s.is_number_unsigned() || s.get<uint64_t>() > uint64_t(1e12)) throw Error(w + ": shape must be non-negative integers");
      c.shape.push_back(int64_t(s.get<uint64_t>()));
    }
    out.emplace(fqn, std::move(c));
  }
  return out;
}

WeightsData::WeightsData(const WeightsFile& file) : where_("weights " + file.file.string()) {
  bytes_ = io::read_file(file.file, "weights", io::kWeightsCap);
  // the bytes that are parsed are the bytes that are hashed: checked before anything is read out
  if (const std::string got = io::sha256_hex(bytes_); got != file.sha256)
    throw Error(where_ + ": sha256 " + got + " does not match the manifest's " + file.sha256 + " (corrupt or modified; re-export)");
  std::tie(header_, data_start_) = io::safetensors_header(bytes_, where_);
}

WeightsData::WeightsData(std::string bytes, const std::string& where) : where_(where), bytes_(std::move(bytes)) {
  std::tie(header_, data_start_) = io::safetensors_header(bytes_, where_);
}

std::string_view WeightsData::get(const std::string& fqn, const ConstantSpec& want, const std::string& package) const {
  const std::string what = "constant \"" + fqn + "\"", hint = " (the weights are not this export's; re-export)";
  if (fqn == "__metadata__" || !header_.contains(fqn)) throw Error(where_ + " lacks " + what + " that " + package + " needs" + hint);
  const io::Json& entry = header_[fqn];
  const std::string dtype = entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() ? entry["dtype"].get<std::string>() : "";
  const Dtype* d = by_safetensors(dtype);
  if (!d) throw Error(where_ + ": " + what + ": dtype must be one of " + weight_dtypes() + " (safetensors names), " + package + " needs " + want.dtype);
  if (d->torch != want.dtype)
    throw Error(where_ + " hold " + what + " as " + d->torch + ", " + package + " expects " + want.dtype + hint);
  auto size = [](const std::string& st) { const Dtype* t = by_safetensors(st); return t ? t->size : 0; };
  const io::TensorSlice s = io::safetensors_slice(entry, where_ + ": " + what + " (for " + package + ")", bytes_.size() - data_start_,
                                                  size, "one of the safetensors dtypes");
  if (s.shape != want.shape)
    throw Error(where_ + " hold " + what + " with shape " + shape_str(s.shape) + ", " + package + " expects " + shape_str(want.shape) + hint);
  return std::string_view(bytes_).substr(data_start_ + s.offset, s.size);
}

}  // namespace depthpack
