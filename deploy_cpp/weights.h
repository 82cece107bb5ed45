// weights.h: the export's weights file (manifest "weights"), read and verified once, and each
// constant a package attaches checked against the package's own record of it (its metadata
// "depthpack.constants": name, dtype, shape) before a byte of it is handed over. A file whose
// sha256 matches but whose tensors do not fit the packages (another shape, dtype or size) is
// refused here, naming the constant and the package. No libtorch here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io.h"
#include "manifest.h"

namespace depthpack {

// One constant as a package expects it: dtype by torch's name ("float32", "bfloat16", ...), shape.
struct ConstantSpec {
  std::string dtype;
  std::vector<int64_t> shape;
  bool operator==(const ConstantSpec&) const = default;
};
using ConstantSpecs = std::map<std::string, ConstantSpec>;  // by FQN

// A package's "depthpack.constants" metadata, JSON {fqn: {"dtype": ..., "shape": [...]}}: every
// dtype one this runner knows (weight_dtypes), every shape of non-negative integers.
ConstantSpecs parse_constant_specs(const std::string& json, const std::string& where);
std::string weight_dtypes();  // the dtypes a weights file may hold, for messages

// Bytes per element of a dtype by torch's name, 0 for one this runner does not know.
uint64_t item_size(const std::string& torch_dtype);

class WeightsData {
 public:
  // Reads the file (up to io::kWeightsCap), checks its sha256 against the manifest's before
  // anything in it is parsed, then parses its header.
  explicit WeightsData(const WeightsFile& file);
  WeightsData(std::string bytes, const std::string& where);  // no sha256 check (the fuzz targets)

  // The bytes of constant fqn, after checking that the file holds it with exactly the dtype and
  // shape `want` says, its data_offsets inside the data area and numel * item size long; an Error
  // naming the constant, this file and `package` otherwise.
  std::string_view get(const std::string& fqn, const ConstantSpec& want, const std::string& package) const;

 private:
  std::string where_;
  std::string bytes_;
  io::Json header_;
  uint64_t data_start_ = 0;
};

}  // namespace depthpack
