// package.cpp: loading, verifying and running one bucket's package; the device check.
#include "package.h"

#include <torch/cuda.h>

#include <filesystem>

#include "mini_json.h"

#ifdef DEPTHPACK_WITH_CUDA
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

}  // namespace

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
  if (*bucket != std::to_string(b.capacity))
    return "was built for bucket " + *bucket + ", the manifest lists it as bucket " + std::to_string(b.capacity) +
           " (a wrong bucket-to-file mapping; re-export)";
  std::vector<TensorSpec> got = parse_specs(*inputs, "depthpack.inputs metadata");
  if (got != b.inputs)
    return "takes inputs " + describe(got) + ", the manifest lists " + describe(b.inputs) + " for bucket " + std::to_string(b.capacity);
  return "";
}

Package::Package(const Manifest& m, const Bucket& b, c10::Device device, bool graph) : m_(m), b_(b), graph_(graph) {
  const std::string w = "package " + b.file.string();
  if (!std::filesystem::is_regular_file(b.file)) throw Error(w + ": no such file");
  const std::string got = minijson::sha256_file(b.file.string());
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
  if (std::string why = metadata_mismatch(loader_->get_metadata(), m, b); !why.empty()) throw Error(w + " " + why);
}

const at::Tensor& Package::run(const std::vector<at::Tensor>& inputs, void* stream) {
  if (!graph_) {
    out_ = loader_->run(inputs, stream)[0];
  } else {
#ifdef DEPTHPACK_WITH_CUDA
    if (!cuda_graph_) {  // capture once, on the runner's (non-default) stream, after a warm-up
      for (int k = 0; k < 3; ++k) loader_->run(inputs, stream);
      c10::cuda::getCurrentCUDAStream().synchronize();
      for (const at::Tensor& t : inputs) captured_.push_back(t.const_data_ptr());
      cuda_graph_ = std::make_unique<at::cuda::CUDAGraph>();
      cuda_graph_->capture_begin();
      out_ = loader_->run(inputs, stream)[0];
      cuda_graph_->capture_end();
    }
    for (size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k].const_data_ptr() != captured_[k]) throw Error("internal: a graph's input buffer moved");
    cuda_graph_->replay();
#endif
  }
  if (out_.sizes().vec() != std::vector<int64_t>{m_.batch, b_.capacity} || out_.scalar_type() != at::kFloat)
    throw Error("package " + b_.file.string() + " returned " + shape_str(out_.sizes()) + " " +
                std::string(c10::toString(out_.scalar_type())) + ", expected depth float32 [" +
                std::to_string(m_.batch) + "," + std::to_string(b_.capacity) + "]");
  return out_;
}

void Package::rerun(const std::vector<at::Tensor>& inputs, void* stream) {
#ifdef DEPTHPACK_WITH_CUDA
  if (cuda_graph_) return cuda_graph_->replay();
#endif
  out_ = loader_->run(inputs, stream)[0];
}

}  // namespace depthpack::detail
