// runner.cpp: depthpack::Runner. Preprocessing has one definition, shared with
// depthpack/core/preprocess.py: uint8 [h,w,3] -> float32 [3,h,w] RGB -> bilinear resize to (H, W)
// (align_corners=False, no antialias: ATen's upsample_bilinear2d, the kernel of Python's
// F.interpolate) -> / 255; points scaled by (W/w, H/h) in float32. Chunks follow
// depthpack.core.packing.chunk_plan and pad_points.
#include "runner.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "io.h"
#include "package.h"

#ifdef DEPTHPACK_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace depthpack {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// rows of a frame -> a contiguous [h,w,3] buffer, channels reversed when swap
void copy_frame(const Frame& f, uint8_t* dst, bool swap) {
  const size_t row = size_t(f.width) * 3;
  for (int64_t y = 0; y < f.height; ++y) {
    const uint8_t* s = f.data + y * f.row_bytes;
    uint8_t* d = dst + y * row;
    if (!swap) { std::memcpy(d, s, row); continue; }
    for (size_t x = 0; x < row; x += 3) d[x] = s[x + 2], d[x + 1] = s[x + 1], d[x + 2] = s[x];
  }
}

}  // namespace

struct Runner::Impl {
  Manifest m;
  c10::Device device;
  bool graph;
#ifdef DEPTHPACK_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;
#endif
  struct Slot {  // one bucket: its package, its static points, its input vector in call order
    std::unique_ptr<detail::Package> package;
    at::Tensor points;
    std::vector<at::Tensor> inputs;
  };
  std::map<int64_t, Slot> slots;
  std::optional<WeightsData> weights;  // manifest "weights": read after the first package is verified,
                                       // dropped once every package has copied its constants
  std::vector<int64_t> used;
  int64_t allocations = 0;
  at::Tensor image, focal;                        // device, shared by every bucket: images|frames, focal
  at::Tensor frame_host, frame_dev, frame_float;  // the frame at its own size (host pinned on CUDA)
  at::Tensor points_host, depth_host, focal_host; // staging of all chunks of a call (pinned on CUDA)
  at::Tensor map_host;                            // the first chunk's map (pinned on CUDA)
  std::vector<float> scaled;

  struct Guard {  // every call: inference mode; on CUDA the runner's device and stream
    c10::InferenceMode inference;
#ifdef DEPTHPACK_WITH_CUDA
    std::optional<c10::cuda::CUDAStreamGuard> on_stream;
    explicit Guard(Impl& r) { if (r.stream) on_stream.emplace(*r.stream); }
#else
    explicit Guard(Impl&) {}
#endif
  };

  Impl(const std::string& path, Options o)
      : m(read_manifest(path)), device(detail::pick_device(m, o.device_index)), graph(o.cuda_graph && device.is_cuda()) {
#ifdef DEPTHPACK_WITH_CUDA
    if (device.is_cuda()) stream = c10::cuda::getStreamFromPool(false, device.index());
#endif
    Guard g(*this);
    image = m.takes_frames() ? alloc({m.batch, m.frame_h, m.frame_w, 3}, at::kByte, false)
                             : alloc({m.batch, 3, m.H, m.W}, at::kFloat, false);
    if (m.has_input("focal")) focal = alloc({m.batch}, at::kFloat, false), focal_host = alloc({m.batch}, at::kFloat, true);
  }

  at::Tensor alloc(at::IntArrayRef sizes, at::ScalarType dtype, bool host) {
    ++allocations;
    if (!host) return at::empty(sizes, at::TensorOptions().dtype(dtype).device(device));
    return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda()));
  }

  void* stream_handle() {
#ifdef DEPTHPACK_WITH_CUDA
    if (stream) return stream->stream();
#endif
    return nullptr;
  }

  void sync() {
#ifdef DEPTHPACK_WITH_CUDA
    if (stream) stream->synchronize();
#endif
  }

  const Bucket& bucket_for(int64_t q) const {  // the smallest that holds q points
    for (const Bucket& b : m.buckets)
      if (b.capacity >= q) return b;
    return m.buckets.back();
  }

  Slot& slot(const Bucket& b) {  // loaded on first use
    if (auto it = slots.find(b.capacity); it != slots.end()) return it->second;
    Slot s;
    s.package = std::make_unique<detail::Package>(m, b, device, graph);
    if (!weights) weights.emplace(m.weights);
    s.package->load_constants(*weights, device);
    if (b.capacity) s.points = alloc({m.batch, b.capacity, 2}, at::kFloat, false);  // the map-only package: none
    for (const TensorSpec& t : b.inputs) s.inputs.push_back(t.name == "points" ? s.points : t.name == "focal" ? focal : image);
    used.push_back(b.capacity);
    Slot& out = slots.emplace(b.capacity, std::move(s)).first->second;
    if (slots.size() == m.packages()) weights.reset();  // no package left to load: free the file's bytes
    return out;
  }

  // The frame into the shared image input: as it is (frame packages) or preprocessed (image packages).
  void stage_frame(const Frame& f) {
    const bool frames = m.takes_frames();
    if (frames && (f.height != m.frame_h || f.width != m.frame_w))
      throw Error("the frame is " + std::to_string(f.width) + "x" + std::to_string(f.height) + " but the packages take " +
                  std::to_string(m.frame_w) + "x" + std::to_string(m.frame_h) + " frames (manifest frame.size): re-export for this camera");
    if (!frame_host.defined() || frame_host.size(0) != f.height || frame_host.size(1) != f.width) {
      frame_host = alloc({f.height, f.width, 3}, at::kByte, true);
      frame_dev = device.is_cuda() && !frames ? alloc({f.height, f.width, 3}, at::kByte, false) : frame_host;
      if (!frames) frame_float = alloc({1, 3, f.height, f.width}, at::kFloat, false);
    }
    const bool want_bgr = frames && m.frame_bgr;
    copy_frame(f, frame_host.data_ptr<uint8_t>(), (f.order == Order::BGR) != want_bgr);
    at::Tensor row0 = image.narrow(0, 0, 1);
    if (frames) {
      row0[0].copy_(frame_host, /*non_blocking=*/true);
    } else {
      if (device.is_cuda()) frame_dev.copy_(frame_host, /*non_blocking=*/true);
      frame_float[0].copy_(frame_dev.permute({2, 0, 1}));  // uint8 HWC -> float32 CHW
      const int64_t size[2] = {m.H, m.W};
      at::upsample_bilinear2d_out(row0, frame_float, size, /*align_corners=*/false, std::nullopt, std::nullopt);
      row0.div_(255.0);
    }
    if (m.batch > 1) image.narrow(0, 1, m.batch - 1).copy_(row0.expand_as(image.narrow(0, 1, m.batch - 1)));
  }

  // The focal input of packages that take one: f (pixels of the caller's input) times scale (to the
  // packages' input pixels), else the manifest's default (already in them). Packages without a focal
  // input ignore f after the same check: a robot passes its camera's focal to every model.
  void stage_focal(std::optional<float> f, double scale) {
    if (f && (!std::isfinite(*f) || *f <= 0)) throw Error("focal length " + num(*f) + " must be a positive number of pixels");
    if (!focal.defined()) return;
    const std::optional<float> use = f ? std::optional<float>(float(double(*f) * scale)) : m.focal_default;
    if (!use) throw Error("the packages take a focal length: give one (--focal F) or export with a default (manifest \"focal\")");
    focal_host.fill_(*use);
    focal.copy_(focal_host, /*non_blocking=*/true);
  }

  // depth [rows,n] for points [rows,n,2] in the packages' pixels (rows 1: repeated over the batch), and
  // with map the first chunk's glance map [rows,map rows,map cols]. n = 0 with a map: the map-only package
  // where the manifest has one, else one point, centre (the input's centre in the packages' pixels).
  void run(const float* xy, int64_t rows, int64_t n, float* depth, float* map, const float* centre) {
    if (map && !m.has_map()) throw Error("a map was asked for, but these packages return none (manifest \"map\"): re-export "
                                         "a model trained with model.glance_depth");
    const bool map_only = n == 0 && map;
    if (map_only && m.map_package) return run_map(rows, map);
    const int64_t xy_rows = map_only ? 1 : rows;  // the centre, one point for every row
    if (map_only) xy = centre, n = 1;
    const int64_t B = m.batch, kmax = m.buckets.back().capacity, chunks = (n + kmax - 1) / kmax;
    if (n == 0) return;
    if (map && !map_host.defined()) map_host = alloc({B, m.map_rows, m.map_cols}, at::kFloat, true);
    if (!points_host.defined() || points_host.numel() < chunks * B * kmax * 2) {
      points_host = alloc({chunks * B * kmax * 2}, at::kFloat, true);
      depth_host = alloc({chunks * B * kmax}, at::kFloat, true);
    }
    try {
      for (int64_t c = 0; c < chunks; ++c) {  // chunk_plan: at most kmax points, the smallest bucket that holds them
        const int64_t s = c * kmax, cn = std::min(kmax, n - s), K = bucket_for(cn).capacity;
        Slot& slot_k = slot(bucket_for(cn));
        float* p = points_host.data_ptr<float>() + c * B * kmax * 2;
        for (int64_t r = 0; r < B; ++r) {  // pad_points: copies of the chunk's first point
          const float* src = xy + ((xy_rows == 1 ? 0 : r) * n + s) * 2;
          float* dst = p + r * K * 2;
          std::memcpy(dst, src, size_t(cn) * 2 * sizeof(float));
          for (int64_t i = cn; i < K; ++i) dst[2 * i] = src[0], dst[2 * i + 1] = src[1];
        }
        slot_k.points.copy_(points_host.narrow(0, c * B * kmax * 2, B * K * 2).view({B, K, 2}), /*non_blocking=*/true);
        const at::Tensor& d = slot_k.package->run(slot_k.inputs, stream_handle());
        depth_host.narrow(0, c * B * kmax, B * K).view({B, K}).copy_(d, /*non_blocking=*/true);
        if (map && c == 0) map_host.copy_(slot_k.package->map(), /*non_blocking=*/true);
      }
    } catch (...) {
      sync();  // no copy may still read or write the staging buffers when the caller goes on
      throw;
    }
    sync();  // the one synchronization of a call
    if (map) std::memcpy(map, map_host.data_ptr<float>(), size_t(rows * m.map_rows * m.map_cols) * sizeof(float));
    if (map_only) return;
    const float* dh = depth_host.data_ptr<float>();
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t s = c * kmax, cn = std::min(kmax, n - s), K = bucket_for(cn).capacity;
      for (int64_t r = 0; r < rows; ++r) std::memcpy(depth + r * n + s, dh + c * B * kmax + r * K, size_t(cn) * sizeof(float));
    }
  }

  // The map-only package: the map [rows,map rows,map cols] of the staged inputs, no points.
  void run_map(int64_t rows, float* map) {
    Slot& s = slot(*m.map_package);
    if (!map_host.defined()) map_host = alloc({m.batch, m.map_rows, m.map_cols}, at::kFloat, true);
    try {
      map_host.copy_(s.package->run(s.inputs, stream_handle()), /*non_blocking=*/true);
    } catch (...) {
      sync();
      throw;
    }
    sync();
    std::memcpy(map, map_host.data_ptr<float>(), size_t(rows * m.map_rows * m.map_cols) * sizeof(float));
  }
};

Runner::Runner(const std::string& manifest_path, Options options) : impl_(std::make_unique<Impl>(manifest_path, options)) {}
Runner::~Runner() = default;

void Runner::predict(const Frame& f, const float* xy, int64_t n, float* depth, std::optional<float> focal, float* map) {
  Impl& r = *impl_;
  Impl::Guard guard(r);
  if (!f.data || f.height < 1 || f.width < 1 || f.row_bytes < f.width * 3)
    throw Error("predict: the frame must be uint8 [height,width,3] with row_bytes >= width*3 (got " + std::to_string(f.height) +
                "x" + std::to_string(f.width) + ", row_bytes " + std::to_string(f.row_bytes) + ")");
  if (n < 0 || (n > 0 && (!xy || !depth))) throw Error("predict: n must be >= 0, with xy and depth buffers");
  const bool frames = r.m.takes_frames();
  // image packages: points scaled to the model's pixels, float32 factors (W/w, H/h)
  const float sx = frames ? 1.0f : float(double(r.m.W) / double(f.width)), sy = frames ? 1.0f : float(double(r.m.H) / double(f.height));
  const float lim_x = frames ? float(f.width) : float(r.m.W), lim_y = frames ? float(f.height) : float(r.m.H);
  r.scaled.resize(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    const float x = xy[2 * i], y = xy[2 * i + 1];
    if (!std::isfinite(x) || !std::isfinite(y)) throw Error("point " + std::to_string(i) + " is not finite");
    if (x < 0 || x >= float(f.width) || y < 0 || y >= float(f.height))
      throw Error("point " + std::to_string(i) + " (" + num(x) + ", " + num(y) + ") is outside the " + std::to_string(f.width) +
                  "x" + std::to_string(f.height) + " frame (need 0 <= x < width, 0 <= y < height)");
    r.scaled[2 * i] = x * sx, r.scaled[2 * i + 1] = y * sy;
    if (r.scaled[2 * i] >= lim_x || r.scaled[2 * i + 1] >= lim_y)
      throw Error("point " + std::to_string(i) + " (" + num(x) + ", " + num(y) + ") lands on the image border after scaling to " +
                  std::to_string(r.m.W) + "x" + std::to_string(r.m.H));
  }
  // image packages: the frame's focal scaled to the model's pixels (core.preprocess.scale_focal)
  r.stage_focal(focal, frames ? 1.0 : std::sqrt((double(r.m.W) / double(f.width)) * (double(r.m.H) / double(f.height))));
  r.stage_frame(f);
  const float centre[2] = {float(double(f.width) / 2) * sx, float(double(f.height) / 2) * sy};  // scaled as the points
  r.run(r.scaled.data(), 1, n, depth, map, centre);
}

void Runner::predict_inputs(const void* image, int64_t rows, const float* xy, int64_t n, float* depth,
                            std::optional<float> focal, float* map) {
  Impl& r = *impl_;
  Impl::Guard guard(r);
  const Manifest& m = r.m;
  if (!image || (rows != 1 && rows != m.batch) || n < 0 || (n > 0 && (!xy || !depth)))
    throw Error("predict_inputs: rows must be 1 or the batch " + std::to_string(m.batch) + ", n >= 0, with buffers");
  const float lim_x = float(m.takes_frames() ? m.frame_w : m.W), lim_y = float(m.takes_frames() ? m.frame_h : m.H);
  for (int64_t i = 0; i < rows * n; ++i)
    if (!(xy[2 * i] >= 0 && xy[2 * i] < lim_x && xy[2 * i + 1] >= 0 && xy[2 * i + 1] < lim_y))
      throw Error("points[" + std::to_string(i / n) + "][" + std::to_string(i % n) + "] (" + num(xy[2 * i]) + ", " +
                  num(xy[2 * i + 1]) + ") is outside the " + num(lim_x) + "x" + num(lim_y) + " image, or not finite");
  std::vector<int64_t> shape = r.image.sizes().vec();
  shape[0] = rows;
  r.stage_focal(focal, 1.0);
  r.image.copy_(at::from_blob(const_cast<void*>(image), shape, r.image.scalar_type()).expand_as(r.image));
  const float centre[2] = {lim_x / 2, lim_y / 2};
  r.run(xy, rows, n, depth, map, centre);
}

std::vector<double> Runner::bench(int64_t bucket, int runs) {
  Impl& r = *impl_;
  Impl::Guard guard(r);
  auto it = r.slots.find(bucket);
  if (it == r.slots.end()) throw Error("bench: bucket " + std::to_string(bucket) + " has not run yet");
  Impl::Slot& s = it->second;
  auto once = [&] { s.package->rerun(s.inputs, r.stream_handle()); };
  for (int k = 0; k < 10; ++k) once();
  r.sync();
  std::vector<double> ms;
#ifdef DEPTHPACK_WITH_CUDA
  if (r.stream) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start), cudaEventCreate(&stop);
    auto st = cudaStream_t(r.stream_handle());
    for (int k = 0; k < runs; ++k) {
      cudaEventRecord(start, st);
      once();
      cudaEventRecord(stop, st);
      cudaEventSynchronize(stop);
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    cudaEventDestroy(start), cudaEventDestroy(stop);
    return ms;
  }
#endif
  for (int k = 0; k < runs; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    once();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

std::string build_info() {
#ifdef DEPTHPACK_WITH_CUDA
  const char* cuda = "cuda=1";
#else
  const char* cuda = "cuda=0";
#endif
  return std::string("libtorch=") + TORCH_VERSION + " " + cuda + " " + io::readers();
}

const Manifest& Runner::manifest() const { return impl_->m; }
std::pair<int64_t, int64_t> Runner::map_size() const { return {impl_->m.map_rows, impl_->m.map_cols}; }
std::string Runner::device() const { return impl_->device.str(); }
bool Runner::graphs() const { return impl_->graph; }
std::vector<int64_t> Runner::buckets_used() const { return impl_->used; }
int64_t Runner::allocations() const { return impl_->allocations; }

}  // namespace depthpack
