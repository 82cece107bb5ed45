// package.cpp: loading, verifying and running one bucket's package; the device check.
#include "package.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <optional>

#include "io.h"

#ifdef DEPTHPACK_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace depthpack::detail {
namespace {

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  return line.empty() ? s : line;
}

std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? "," : "") + std::to_string(s[k]);
  return out + "]";
}

// the dtypes of weights.h by torch's name (the packages' records), with their ATen types
std::optional<at::ScalarType> scalar_type(const std::string& dtype) {
  static const std::pair<const char*, at::ScalarType> types[] = {
      {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}, {"float32", at::kFloat}, {"float64", at::kDouble},
      {"int64", at::kLong},        {"int32", at::kInt},    {"int16", at::kShort},   {"int8", at::kChar},
      {"uint8", at::kByte},        {"bool", at::kBool}};
  for (const auto& [name, type] : types)
    if (dtype == name) return type;
  return std::nullopt;
}

}  // namespace

// safetensors stores little-endian data, copied here byte for byte (x86_64 and aarch64 are)
static_assert(std::endian::native == std::endian::little, "safetensors weights need a little-endian host");

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

c10::Device pick_device(const Manifest& m, int device_index) {
  check_built_for_here(m);
  if (m.device == "cpu") return c10::Device(c10::kCPU);
#ifdef DEPTHPACK_WITH_CUDA
  if (!torch::cuda::is_available())
    throw Error("the packages are for CUDA but CUDA is not available on this machine (torch::cuda::is_available() is false)");
  if (device_index < 0 || device_index >= int(torch::cuda::device_count()))
    throw Error("device index " + std::to_string(device_index) + ": only " + std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, device_index);
  const std::string cc = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  if (m.capability && *m.capability != cc)
    throw Error("the packages were built for compute capability " + *m.capability + ", device " +
                std::to_string(device_index) + " is " + cc + ": export on a GPU of the same kind");
  return c10::Device(c10::kCUDA, c10::DeviceIndex(device_index));
#else
  throw Error("the packages are for CUDA but this runner was built against a libtorch without CUDA");
#endif
}

std::string metadata_mismatch(const std::unordered_map<std::string, std::string>& meta, const Manifest& m,
                              const Bucket& b) {
  auto get = [&](const char* key) { auto it = meta.find(key); return it == meta.end() ? nullptr : &it->second; };
  if (const std::string* dev = get("AOTI_DEVICE_KEY"); dev && *dev != m.device)
    return "holds code for " + *dev + ", the manifest says " + m.device;
  const std::string *bucket = get("depthpack.bucket"), *inputs = get("depthpack.inputs");
  if (!bucket || !inputs)
    return "has no depthpack.bucket / depthpack.inputs metadata (an older export): re-export it with this depthpack";
  if (*bucket != b.label())
    return "was built for bucket " + *bucket + ", the manifest lists it as bucket " + b.label() +
           " (a wrong bucket-to-file mapping; re-export)";
  std::vector<TensorSpec> got = parse_specs(*inputs, "depthpack.inputs metadata");
  if (got != b.inputs)
    return "takes inputs " + describe(got) + ", the manifest lists " + describe(b.inputs) + " for bucket " + b.label();
  return "";
}

Package::Package(const Manifest& m, const Bucket& b, c10::Device device, bool graph) : m_(m), b_(b), graph_(graph) {
  const std::string w = "package " + b.file.string();
  if (!std::filesystem::is_regular_file(b.file)) throw Error(w + ": no such file");
  const std::string got = io::sha256_file(b.file, "package");
  if (got != b.sha256)
    throw Error(w + ": sha256 " + got + " does not match the manifest's " + b.sha256 + " (corrupt or modified; re-export)");
  try {
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        b.file.string(), "model", /*run_single_threaded=*/graph, /*num_runners=*/1,
        device.is_cuda() ? device.index() : c10::DeviceIndex(-1));
  } catch (const c10::Error& e) {
    throw Error(w + ": cannot be loaded: " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw Error(w + ": cannot be loaded: " + first_line(e.what()));
  }
  const auto meta = loader_->get_metadata();
  if (std::string why = metadata_mismatch(meta, m, b); !why.empty()) throw Error(w + " " + why);
  // the record of the constants it expects (its sha256 vouches for it)
  const auto record = meta.find("depthpack.constants");
  if (record == meta.end())
    throw Error(w + " has no depthpack.constants metadata (exported by an older depthpack): re-export it with this depthpack");
  constants_ = parse_constant_specs(record->second, w + " depthpack.constants metadata");
}

// A package exported without its weights runs on unset memory (a crash) until its constants are
// loaded, and load_constants copies each tensor's bytes into the package's own buffer: every
// constant it names must be in the weights with the dtype and shape of its record.
void Package::load_constants(const WeightsData& weights, c10::Device device) {
  const std::string w = "package " + b_.file.string();
  std::unordered_map<std::string, at::Tensor> subset;
  try {
    std::unordered_map<std::string, int32_t> compiled;  // FQN -> the dtype its code takes (c10::ScalarType)
    auto* runner = loader_->get_runner();
    const auto fqns = runner->getConstantNamesToOriginalFQNs();
    for (const auto& [name, dtype] : runner->getConstantNamesToDtypes())
      if (auto it = fqns.find(name); it != fqns.end()) compiled[it->second] = dtype;
    for (const std::string& fqn : loader_->get_constant_fqns()) {
      const auto spec = constants_.find(fqn);
      if (spec == constants_.end())
        throw Error(w + " takes constant \"" + fqn + "\" that its depthpack.constants metadata does not list: re-export");
      if (auto d = compiled.find(fqn); d != compiled.end() && scalar_type(spec->second.dtype) != c10::ScalarType(d->second))
        throw Error(w + " takes constant \"" + fqn + "\" as " + std::string(c10::toString(c10::ScalarType(d->second))) +
                    ", its depthpack.constants metadata says " + spec->second.dtype + ": re-export");
      const std::string_view bytes = weights.get(fqn, spec->second, w);
      at::Tensor cpu = at::empty(spec->second.shape, at::TensorOptions().dtype(*scalar_type(spec->second.dtype)));
      if (!bytes.empty()) std::memcpy(cpu.data_ptr(), bytes.data(), bytes.size());
      subset.emplace(fqn, cpu.to(device));
    }
    loader_->load_constants(subset, /*use_inactive=*/false, /*check_full_update=*/true);
#ifdef DEPTHPACK_WITH_CUDA
    // the copies are cudaMemcpy on the legacy default stream: device to device they may still be
    // running when it returns, and the runner's non-blocking stream is not ordered after them
    if (m_.device == "cuda") c10::cuda::device_synchronize();
#endif
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw Error(w + ": cannot load its constants from weights " + m_.weights.file.string() + ": " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw Error(w + ": cannot load its constants from weights " + m_.weights.file.string() + ": " + first_line(e.what()));
  }
}

void Package::keep(std::vector<at::Tensor> outs) {
  const bool map_only = b_.capacity == 0;  // the map-only package: the map alone
  const size_t want = !map_only && m_.has_map() ? 2 : 1;
  if (outs.size() != want)
    throw Error("package " + b_.file.string() + " returned " + std::to_string(outs.size()) + " outputs, the manifest lists " +
                std::to_string(want));
  if (map_only) map_ = outs[0];
  else out_ = outs[0];
  if (want == 2) map_ = outs[1];
}

const at::Tensor& Package::run(const std::vector<at::Tensor>& inputs, void* stream) {
  if (!graph_) {
    keep(loader_->run(inputs, stream));
  } else {
#ifdef DEPTHPACK_WITH_CUDA
    if (!cuda_graph_) {  // capture once, on the runner's (non-default) stream, after a warm-up
      for (int k = 0; k < 3; ++k) loader_->run(inputs, stream);
      c10::cuda::getCurrentCUDAStream().synchronize();
      for (const at::Tensor& t : inputs) captured_.push_back(t.const_data_ptr());
      cuda_graph_ = std::make_unique<at::cuda::CUDAGraph>();
      cuda_graph_->capture_begin();
      keep(loader_->run(inputs, stream));
      cuda_graph_->capture_end();
    }
    for (size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k].const_data_ptr() != captured_[k]) throw Error("internal: a graph's input buffer moved");
    cuda_graph_->replay();
#endif
  }
  if (b_.capacity && (out_.sizes().vec() != std::vector<int64_t>{m_.batch, b_.capacity} || out_.scalar_type() != at::kFloat))
    throw Error("package " + b_.file.string() + " returned " + shape_str(out_.sizes()) + " " +
                std::string(c10::toString(out_.scalar_type())) + ", expected depth float32 [" +
                std::to_string(m_.batch) + "," + std::to_string(b_.capacity) + "]");
  if (m_.has_map() && (map_.sizes().vec() != std::vector<int64_t>{m_.batch, m_.map_rows, m_.map_cols} || map_.scalar_type() != at::kFloat))
    throw Error("package " + b_.file.string() + " returned a map " + shape_str(map_.sizes()) + ", expected float32 [" +
                std::to_string(m_.batch) + "," + std::to_string(m_.map_rows) + "," + std::to_string(m_.map_cols) + "]");
  return b_.capacity ? out_ : map_;
}

void Package::rerun(const std::vector<at::Tensor>& inputs, void* stream) {
#ifdef DEPTHPACK_WITH_CUDA
  if (cuda_graph_) return cuda_graph_->replay();
#endif
  keep(loader_->run(inputs, stream));
}

}  // namespace depthpack::detail
