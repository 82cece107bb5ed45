// runner.h: depthpack::Runner, metric depth at queried pixels of camera frames from an export
// folder (manifest.json + one AOTInductor package per bucket). This header needs no libtorch.
//
//   depthpack::Runner runner("/opt/depthpack/vits/manifest.json");   // verifies the manifest
//   runner.predict({bgr, h, w, row_bytes, depthpack::Order::BGR}, xy, n, depth);   // every frame
//
// The manifest is read and verified once; a bucket's package is verified (sha256, its own
// metadata) and loaded on its first use, given its constants from the export's weights file
// (manifest "weights": verified and read once, with the first package; each constant checked
// against the package's record of its dtype and shape), and on CUDA its run is captured once in a
// CUDA graph.
// Buffers (pinned host staging, device inputs, outputs) are allocated on first use per bucket and
// frame size; later calls of the same sizes allocate none of them: copies are asynchronous on the
// runner's stream with one synchronization at the end. Not thread-safe: one Runner per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "manifest.h"

#ifdef DEPTHPACK_WITH_OPENCV
#include <opencv2/core.hpp>
#endif

namespace depthpack {

enum class Order { BGR, RGB };

// A uint8 frame [height, width, 3]; rows row_bytes apart (>= width * 3), channels in `order`.
struct Frame {
  const uint8_t* data = nullptr;
  int64_t height = 0, width = 0, row_bytes = 0;
  Order order = Order::BGR;
};

struct Options {
  int device_index = 0;     // CUDA packages: which GPU
  bool cuda_graph = true;   // CUDA packages: replay a captured graph (false: call the package)
};

class Runner {
 public:
  explicit Runner(const std::string& manifest_path, Options options = {});
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // depth[i] (meters) at (xy[2i], xy[2i+1]), pixels of this frame, for i < n. Image packages get
  // the frame resized to the model's size and the points scaled; frame packages get both as they
  // are. focal: the frame's focal length sqrt(fx * fy) in this frame's pixels (scaled to the model's
  // pixels for image packages, as the points are; default: the manifest's "focal" default). It must
  // be finite and > 0; packages without a focal input ignore it. map: where to write the glance's
  // depth map [rows,cols] (map_size(); meters, row-major) from the same call, or null; packages
  // without one (manifest "map") refuse a map buffer. n = 0 with a map: the map alone, from the
  // map-only package where the manifest has one (a one-way model), else from one point, the frame's
  // centre (w/2, h/2), as Python's Predictor runs it. Throws depthpack::Error on bad input, naming it.
  void predict(const Frame& frame, const float* xy, int64_t n, float* depth, std::optional<float> focal = {},
               float* map = nullptr);
#ifdef DEPTHPACK_WITH_OPENCV
  void predict(const cv::Mat& bgr, const float* xy, int64_t n, float* depth, std::optional<float> focal = {},
               float* map = nullptr) {
    if (bgr.type() != CV_8UC3) throw Error("predict: the cv::Mat must be uint8 with 3 channels (CV_8UC3)");
    predict({bgr.data, bgr.rows, bgr.cols, int64_t(bgr.step[0]), Order::BGR}, xy, n, depth, focal, map);
  }
#endif

  // The packages' own input, already preprocessed: `rows` (1: repeated over the batch, or the
  // batch) of "images" float32 [3,H,W] RGB in [0,1] at the model's size, or of "frames" uint8
  // [h,w,3] in the manifest's channel order; xy [rows,n,2] and focal in those pixels; depth [rows,n];
  // map [rows,map rows,map cols] or null (n = 0: as predict's, the centre of the packages' input).
  void predict_inputs(const void* image, int64_t rows, const float* xy, int64_t n, float* depth,
                      std::optional<float> focal = {}, float* map = nullptr);

  // (rows, cols) of the glance's depth map the packages return; (0, 0) when they return none.
  std::pair<int64_t, int64_t> map_size() const;

  // Milliseconds of `runs` calls of one bucket with the inputs of the last predict in place: the
  // graph's replay (or the package's run), timed with CUDA events on the runner's stream.
  std::vector<double> bench(int64_t bucket, int runs);

  const Manifest& manifest() const;
  std::string device() const;                // "cpu" or "cuda:I"
  bool graphs() const;                       // replaying CUDA graphs
  std::vector<int64_t> buckets_used() const; // in first-use order
  int64_t allocations() const;               // buffers this runner has allocated so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What this build of the library has: "libtorch=2.14.1 cuda=0|1 opencv=0|1 videoio=0|1".
std::string build_info();

}  // namespace depthpack
