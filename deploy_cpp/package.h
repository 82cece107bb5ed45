// package.h (inside the library): one bucket's AOTInductor package, verified before it is trusted
// (sha256 against the manifest, then its own metadata: device, bucket, inputs, the constants it
// expects), given its constants from the export's weights file once each has been checked against
// that record, and run directly or replayed from a CUDA graph captured once with the runner's
// static input buffers.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef DEPTHPACK_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#endif

#include "manifest.h"
#include "weights.h"

namespace depthpack::detail {

// Refuse packages this machine or this build cannot run: CPU architecture, libtorch major.minor.
void check_built_for_here(const Manifest& m);
// The device of the packages, after checking that this build and machine can run them.
c10::Device pick_device(const Manifest& m, int device_index);

// "" when a package's own metadata agrees with its manifest entry, else what differs: its device,
// "depthpack.bucket" and "depthpack.inputs" (contract.PACKAGE_BUCKET / PACKAGE_INPUTS; a package
// without them is an older export: "re-export").
std::string metadata_mismatch(const std::unordered_map<std::string, std::string>& meta, const Manifest& m,
                              const Bucket& b);

class Package {
 public:
  // Verified and loaded, its constants record read; it cannot run before load_constants.
  Package(const Manifest& m, const Bucket& b, c10::Device device, bool graph);
  // Every constant the package names, from the weights file, each checked against the package's
  // record (dtype, shape, byte range) before it is copied in: the package keeps its own copy, so
  // weights may go after this.
  void load_constants(const WeightsData& weights, c10::Device device);
  // depth [B,K] on the device for inputs in the manifest's call order (the map-only package: its map
  // [B,rows,cols]). With a graph the inputs must be the same tensors on every call (static buffers):
  // the first call captures, later ones replay. The result stays valid until the next call.
  const at::Tensor& run(const std::vector<at::Tensor>& inputs, void* stream);
  const at::Tensor& map() const { return map_; }  // the glance's map [B,rows,cols] of the last run (manifest "map")
  void rerun(const std::vector<at::Tensor>& inputs, void* stream);  // for timing: replay or run again

 private:
  const Manifest& m_;
  const Bucket& b_;
  bool graph_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  ConstantSpecs constants_;  // its "depthpack.constants" metadata
  at::Tensor out_, map_;
  void keep(std::vector<at::Tensor> outs);  // the outputs of a run: depth, and the map where the manifest has one
  std::vector<const void*> captured_;  // data pointers of the inputs the graph was captured with
#ifdef DEPTHPACK_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> cuda_graph_;
#endif
};

}  // namespace depthpack::detail
