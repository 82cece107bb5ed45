// depthpack_run: metric depth at queried pixels from depthpack's AOTInductor packages (.pt2).
//
// Assumes: a directory written by export/export.py (manifest.json "depthpack-manifest/2" beside
// one package per capacity bucket, each taking images float32 [B,3,H,W] RGB in [0,1] and points
// float32 [B,K,2] (x, y) model pixels, returning depth float32 [B,K] meters); packages built for
// this machine's CPU architecture (and GPU compute capability); trusted packages: a .pt2 holds
// native code, and the sha256 check only proves a file is the one the manifest names.
// Preprocessing equals depthpack/preprocess.py: BGR->RGB, INTER_LINEAR resize to (W,H), /255,
// NCHW; points scaled by (W/w0, H/h0). The bucket is the smallest capacity >= the number of
// points; more points than the largest bucket run in chunks of the largest, each padded with
// copies of its first point. On CUDA each bucket's run is captured once in a CUDA graph
// (package loaded single-threaded) on a side stream and replayed. Any error: one line, exit 1.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#ifdef DEPTHPACK_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif
#ifdef DEPTHPACK_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <fcntl.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mini_json.h"

namespace {

namespace fs = std::filesystem;
using minijson::Value;

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage = R"(usage: depthpack_run --manifest DIR/manifest.json (--image IMG --points PTS.csv | --check REF) [options]

  --manifest PATH     manifest.json written by export/export.py (packages are found beside it)
  --image PATH        image file (needs a build with OpenCV), or a .safetensors file whose
                      "images" tensor [B,3,H,W] float32 RGB in [0,1] is used as is (no resize)
  --points PATH       CSV, one "x,y" per line in the image's original pixels; optional header
                      "x,y"; blank lines ignored; an empty file gives an empty result
  --out PATH          write "x,y,depth" here (default: stdout)
  --check REF         run on REF's images and points (e.g. reference.safetensors) and compare with
                      REF's depth within the manifest's tolerance; exit 1 on mismatch
  --bench N           time N runs of each bucket used; print median and p90 latency (ms)
  --no-graph          on CUDA, run the package directly instead of replaying a CUDA graph
  --device-index I    CUDA device (default 0)
  --help              this text
Reports (check, bench) go to stderr; errors are one line on stderr and exit code 1.
)";

struct Args {
  std::string manifest, image, points, out, check;
  int bench = 0, device_index = 0;
  bool graph = true;
};

// ---- small helpers --------------------------------------------------------------------------------
std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  return line.empty() ? s : line;
}

std::string read_file(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Fail(what + " " + path.string() + ": cannot be read (missing or no permission)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Value& need(const Value& obj, const std::string& key, Value::Kind kind, const std::string& where) {
  static const char* names[] = {"null", "bool", "number", "string", "array", "object"};
  if (obj.kind != Value::Kind::Object) throw Fail(where + ": expected an object");
  const Value* v = obj.find(key);
  if (!v) throw Fail(where + ": missing key \"" + key + "\"");
  if (v->kind != kind) throw Fail(where + ": \"" + key + "\" must be a " + names[int(kind)]);
  return *v;
}

int64_t as_int(const Value& v, const std::string& where) {
  if (v.kind != Value::Kind::Number || v.number != std::floor(v.number) || v.number < 0 || v.number > 1e12)
    throw Fail(where + ": expected a non-negative integer");
  return int64_t(v.number);
}

std::vector<int64_t> int_list(const Value& v, const std::string& where) {
  if (v.kind != Value::Kind::Array) throw Fail(where + ": expected a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : v.array) out.push_back(as_int(x, where));
  return out;
}

std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? "," : "") + std::to_string(s[k]);
  return out + "]";
}

// ---- manifest ---------------------------------------------------------------------------------------
struct Bucket {
  int64_t capacity = 0;
  fs::path file;
  std::string sha256;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  bool loaded = false;
#ifdef DEPTHPACK_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  at::Tensor s_images, s_points, s_depth;  // static buffers of the captured graph
};

struct Manifest {
  int64_t H = 0, W = 0, batch = 0;
  std::string device, dtype, arch;
  std::optional<std::string> capability;
  double atol = 0, rtol = 0;
  std::vector<Bucket> buckets;  // ascending capacity
};

Manifest read_manifest(const fs::path& path) {
  std::string text = read_file(path, "manifest");
  Value j;
  try {
    j = minijson::parse(text);
  } catch (const std::runtime_error& e) {
    throw Fail("manifest " + path.string() + ": " + e.what());
  }
  const std::string w = "manifest " + path.string();
  if (need(j, "format", Value::Kind::String, w).string != "depthpack-manifest/2")
    throw Fail(w + ": format \"" + j.find("format")->string + "\" is not depthpack-manifest/2");
  Manifest m;
  auto hw = int_list(need(j, "image_size", Value::Kind::Array, w), w + ": image_size");
  if (hw.size() != 2 || hw[0] < 1 || hw[1] < 1) throw Fail(w + ": image_size must be [H, W]");
  m.H = hw[0], m.W = hw[1];
  m.batch = as_int(need(j, "batch_size", Value::Kind::Number, w), w + ": batch_size");
  if (m.batch < 1) throw Fail(w + ": batch_size must be >= 1");
  m.device = need(j, "device", Value::Kind::String, w).string;
  if (m.device != "cpu" && m.device != "cuda") throw Fail(w + ": device must be \"cpu\" or \"cuda\", got \"" + m.device + "\"");
  m.dtype = need(j, "dtype", Value::Kind::String, w).string;
  m.arch = need(j, "arch", Value::Kind::String, w).string;
  if (const Value* cc = j.find("compute_capability"); !cc || (cc->kind != Value::Kind::String && !cc->is_null()))
    throw Fail(w + ": \"compute_capability\" must be a string such as \"9.0\", or null");
  else if (!cc->is_null())
    m.capability = cc->string;
  const Value& tol = need(j, "tolerance", Value::Kind::Object, w);
  m.atol = need(tol, "atol", Value::Kind::Number, w + ": tolerance").number;
  m.rtol = need(tol, "rtol", Value::Kind::Number, w + ": tolerance").number;
  const Value& list = need(j, "buckets", Value::Kind::Array, w);
  if (list.array.empty()) throw Fail(w + ": no buckets");
  for (size_t k = 0; k < list.array.size(); ++k) {
    const Value& b = list.array[k];
    const std::string wb = w + ": buckets[" + std::to_string(k) + "]";
    Bucket bucket;
    bucket.capacity = as_int(need(b, "bucket", Value::Kind::Number, wb), wb + ": bucket");
    bucket.file = path.parent_path() / need(b, "file", Value::Kind::String, wb).string;
    bucket.sha256 = need(b, "sha256", Value::Kind::String, wb).string;
    if (bucket.capacity < 1 || (!m.buckets.empty() && bucket.capacity <= m.buckets.back().capacity))
      throw Fail(wb + ": capacities must be positive and ascending");
    // the shapes the package was exported with must be the ones this runner feeds
    const Value& in = need(b, "inputs", Value::Kind::Array, wb);
    std::vector<std::vector<int64_t>> want = {{m.batch, 3, m.H, m.W}, {m.batch, bucket.capacity, 2}};
    if (in.array.size() != 2) throw Fail(wb + ": expected 2 inputs (images, points)");
    for (size_t i = 0; i < 2; ++i)
      if (int_list(need(in.array[i], "shape", Value::Kind::Array, wb), wb) != want[i])
        throw Fail(wb + ": input " + std::to_string(i) + " shape " + shape_str(int_list(*in.array[i].find("shape"), wb)) +
                   " differs from " + shape_str(want[i]));
    m.buckets.push_back(std::move(bucket));
  }
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

// ---- inputs -------------------------------------------------------------------------------------------
struct Points {
  std::vector<std::pair<std::string, std::string>> text;  // as written, for the output CSV
  at::Tensor xy;                                          // [Q,2] float32, original pixels
};

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

Points read_points(const fs::path& path, int64_t h0, int64_t w0) {
  std::ifstream in(path);
  if (!in) throw Fail("points " + path.string() + ": cannot be read");
  Points p;
  std::vector<float> xy;
  std::string line;
  bool seen_data = false;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    line = trim(line);
    if (line.empty()) continue;
    const std::string where = "points " + path.string() + " line " + std::to_string(n);
    size_t comma = line.find(',');
    std::string sx = trim(line.substr(0, comma)), sy = comma == std::string::npos ? "" : trim(line.substr(comma + 1));
    if (!seen_data && sx == "x" && sy == "y") { seen_data = true; continue; }  // header
    seen_data = true;
    double x, y;
    if (comma == std::string::npos || !parse_number(sx, x) || !parse_number(sy, y))
      throw Fail(where + ": expected \"x,y\" (two numbers), got \"" + line + "\"");
    if (!std::isfinite(x) || !std::isfinite(y)) throw Fail(where + ": point is not finite");
    if (x < 0 || x >= double(w0) || y < 0 || y >= double(h0))
      throw Fail(where + ": point (" + sx + ", " + sy + ") is outside the " + std::to_string(w0) + "x" +
                 std::to_string(h0) + " image (need 0 <= x < " + std::to_string(w0) + ", 0 <= y < " + std::to_string(h0) + ")");
    p.text.emplace_back(sx, sy);
    xy.push_back(float(x));
    xy.push_back(float(y));
  }
  p.xy = torch::from_blob(xy.data(), {int64_t(xy.size() / 2), 2}, torch::kFloat32).clone();
  return p;
}

// One float32 tensor from a safetensors file: 8-byte little-endian header length, JSON header, data.
at::Tensor read_safetensor(const fs::path& path, const std::string& name) {
  const std::string where = "safetensors " + path.string();
  std::string bytes = read_file(path, "safetensors");
  if (bytes.size() < 8) throw Fail(where + ": too short for a safetensors file");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | uint8_t(bytes[k]);
  if (n > bytes.size() - 8) throw Fail(where + ": header length " + std::to_string(n) + " exceeds the file");
  Value header;
  try {
    header = minijson::parse(bytes.substr(8, n));
  } catch (const std::runtime_error& e) {
    throw Fail(where + ": header: " + e.what());
  }
  const Value& t = need(header, name, Value::Kind::Object, where);
  if (need(t, "dtype", Value::Kind::String, where + ": " + name).string != "F32")
    throw Fail(where + ": tensor \"" + name + "\" is " + t.find("dtype")->string + ", expected F32");
  auto shape = int_list(need(t, "shape", Value::Kind::Array, where + ": " + name), where + ": " + name + " shape");
  auto off = int_list(need(t, "data_offsets", Value::Kind::Array, where + ": " + name), where + ": " + name);
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  if (off.size() != 2 || off[1] - off[0] != numel * 4 || uint64_t(off[1]) > bytes.size() - 8 - n)
    throw Fail(where + ": tensor \"" + name + "\" has inconsistent data_offsets");
  at::Tensor out = torch::empty(shape, torch::kFloat32);
  std::memcpy(out.data_ptr(), bytes.data() + 8 + n + off[0], size_t(numel) * 4);  // little-endian host
  return out;
}

// images [B,3,H,W] float32 in [0,1] at the model size, and the original (h0, w0).
std::pair<at::Tensor, std::pair<int64_t, int64_t>> load_image(const fs::path& path, const Manifest& m) {
  if (path.extension() == ".safetensors") {
    at::Tensor img = read_safetensor(path, "images");
    if (img.dim() != 4 || img.size(0) < 1 || img.size(1) != 3 || img.size(2) != m.H || img.size(3) != m.W)
      throw Fail("image " + path.string() + ": \"images\" is " + shape_str(img.sizes()) + ", expected [B,3," +
                 std::to_string(m.H) + "," + std::to_string(m.W) + "] (tensor files are not resized)");
    return {img.slice(0, 0, 1).repeat({m.batch, 1, 1, 1}), {m.H, m.W}};
  }
#ifdef DEPTHPACK_WITH_OPENCV
  if (!fs::is_regular_file(path)) throw Fail("image " + path.string() + ": no such file");
  cv::Mat bgr;
  {  // libpng/libjpeg print their own complaints to stderr: keep the error to our one line
    std::fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    try { bgr = cv::imread(path.string(), cv::IMREAD_COLOR); } catch (const cv::Exception&) {}
    if (saved >= 0) dup2(saved, 2), close(saved);
    if (null >= 0) close(null);
  }
  if (bgr.empty()) throw Fail("image " + path.string() + ": cannot be decoded as an image");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  const int64_t h0 = rgb.rows, w0 = rgb.cols;
  rgb = rgb.isContinuous() ? rgb : rgb.clone();
  // depthpack/core/preprocess.py's one definition: float RGB, bilinear (align_corners=false, no
  // antialias) to the model's size, / 255
  at::Tensor t = torch::from_blob(rgb.data, {1, h0, w0, 3}, torch::kUInt8).permute({0, 3, 1, 2}).to(torch::kFloat32);
  if (h0 != m.H || w0 != m.W)
    t = torch::nn::functional::interpolate(t, torch::nn::functional::InterpolateFuncOptions()
                                                  .size(std::vector<int64_t>{m.H, m.W})
                                                  .mode(torch::kBilinear)
                                                  .align_corners(false));
  t = t.div_(255.0)[0];
  return {t.unsqueeze(0).repeat({m.batch, 1, 1, 1}).contiguous(), {h0, w0}};
#else
  throw Fail("image " + path.string() + ": this build has no OpenCV, so --image must be a .safetensors file "
             "(e.g. export's reference.safetensors); rebuild with OpenCV to read image files");
#endif
}

// points [B,n,2] -> [B,K,2]: padded with copies of each image's first point (their depths are dropped)
at::Tensor pad_to(const at::Tensor& points, int64_t K) {
  const int64_t n = points.size(1);
  if (n >= K) return points.slice(1, 0, K).contiguous();
  return torch::cat({points, points.slice(1, 0, 1).expand({points.size(0), K - n, 2})}, 1).contiguous();
}

// ---- running the packages --------------------------------------------------------------------------------
struct Runner {
  Manifest& m;
  torch::Device device;
  bool graph;
#ifdef DEPTHPACK_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;
  void* stream_handle() { return stream ? (void*)stream->stream() : nullptr; }
#else
  void* stream_handle() { return nullptr; }
#endif

  Bucket& bucket_for(int64_t q) {
    for (auto& b : m.buckets)
      if (b.capacity >= q) return b;
    throw Fail("internal: no bucket for " + std::to_string(q) + " points");
  }

  void load(Bucket& b) {
    if (b.loaded) return;
    if (!fs::is_regular_file(b.file)) throw Fail("package " + b.file.string() + ": no such file");
    std::string got = minijson::sha256_file(b.file.string());
    if (got != b.sha256)
      throw Fail("package " + b.file.string() + ": sha256 " + got + " does not match the manifest's " + b.sha256 +
                 " (corrupt or modified; re-export)");
    try {
      b.loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          b.file.string(), "model", /*run_single_threaded=*/graph, /*num_runners=*/1,
          device.is_cuda() ? c10::DeviceIndex(device.index()) : c10::DeviceIndex(-1));
    } catch (const c10::Error& e) {
      throw Fail("package " + b.file.string() + ": cannot be loaded: " + first_line(e.what_without_backtrace()));
    } catch (const std::exception& e) {
      throw Fail("package " + b.file.string() + ": cannot be loaded: " + first_line(e.what()));
    }
    b.loaded = true;
  }

  // The core: depth [B,K] for images [B,3,H,W] and points [B,K,2], both on the device.
  at::Tensor run(Bucket& b, const at::Tensor& images, const at::Tensor& points) {
    load(b);
    if (!graph) return b.loader->run({images, points}, stream_handle())[0];
    stage(b, images, points);
    replay(b);
    return b.s_depth;
  }

  // CUDA graph: capture the package's run once per bucket (static buffers), then copy inputs in.
  void stage(Bucket& b, const at::Tensor& images, const at::Tensor& points) {
#ifdef DEPTHPACK_WITH_CUDA
    if (!b.graph) {
      b.s_images = images.clone();
      b.s_points = points.clone();
      for (int k = 0; k < 3; ++k) b.loader->run({b.s_images, b.s_points}, stream_handle());  // warm-up
      stream->synchronize();
      b.graph = std::make_unique<at::cuda::CUDAGraph>();
      b.graph->capture_begin();
      b.s_depth = b.loader->run({b.s_images, b.s_points}, stream_handle())[0];
      b.graph->capture_end();
    }
#endif
    b.s_images.copy_(images);
    b.s_points.copy_(points);
  }

  void replay(Bucket& b) {
#ifdef DEPTHPACK_WITH_CUDA
    b.graph->replay();
#endif
  }

  // depth [B,Q] float32 on the CPU; chunks of the largest bucket, each padded with its first point.
  at::Tensor predict(const at::Tensor& images, const at::Tensor& points, std::vector<Bucket*>* used = nullptr) {
    const int64_t Q = points.size(1), kmax = m.buckets.back().capacity;
    if (Q == 0) return torch::zeros({points.size(0), 0});
    at::Tensor img = images.to(device).contiguous();
    std::vector<at::Tensor> outs;
    for (int64_t s = 0; s < Q; s += kmax) {
      const int64_t n = std::min(kmax, Q - s);
      Bucket& b = bucket_for(n);
      at::Tensor depth = run(b, img, pad_to(points.slice(1, s, s + n), b.capacity).to(device));
      outs.push_back(depth.slice(1, 0, n).to(torch::kCPU, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true));
      if (used && std::find(used->begin(), used->end(), &b) == used->end()) used->push_back(&b);
    }
    return torch::cat(outs, 1);
  }

  // N timed runs of one bucket (with a graph: its replay, inputs already staged): sorted ms.
  std::vector<double> bench(Bucket& b, const at::Tensor& images, const at::Tensor& points, int n) {
    for (int k = 0; k < 10; ++k) run(b, images, points);  // warm-up (and capture)
    auto once = [&] { graph ? replay(b) : (void)run(b, images, points); };
    std::vector<double> ms;
#ifdef DEPTHPACK_WITH_CUDA
    if (device.is_cuda()) {
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      auto s = (cudaStream_t)stream_handle();
      for (int k = 0; k < n; ++k) {
        cudaEventRecord(start, s);
        once();
        cudaEventRecord(stop, s);
        cudaEventSynchronize(stop);
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        ms.push_back(t);
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
#endif
    if (!device.is_cuda())
      for (int k = 0; k < n; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        once();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    std::sort(ms.begin(), ms.end());
    return ms;
  }
};

Args parse_args(int argc, char** argv) {
  Args a;
  auto value = [&](int& k) -> std::string {
    if (k + 1 >= argc) throw Fail(std::string(argv[k]) + " needs a value (see --help)");
    return argv[++k];
  };
  auto integer = [&](int& k, int lo) {
    std::string flag = argv[k], v = value(k);
    double x;
    if (!parse_number(v, x) || x != std::floor(x) || x < lo || x > 1e9) throw Fail(flag + " must be an integer >= " + std::to_string(lo) + ", got \"" + v + "\"");
    return int(x);
  };
  for (int k = 1; k < argc; ++k) {
    std::string f = argv[k];
    if (f == "--help" || f == "-h") { std::cout << kUsage; std::exit(0); }
    else if (f == "--manifest") a.manifest = value(k);
    else if (f == "--image") a.image = value(k);
    else if (f == "--points") a.points = value(k);
    else if (f == "--out") a.out = value(k);
    else if (f == "--check") a.check = value(k);
    else if (f == "--bench") a.bench = integer(k, 1);
    else if (f == "--device-index") a.device_index = integer(k, 0);
    else if (f == "--no-graph") a.graph = false;
    else throw Fail("unknown argument \"" + f + "\" (see --help)");
  }
  if (a.manifest.empty()) throw Fail("--manifest is required (see --help)");
  if (a.check.empty() && (a.image.empty() || a.points.empty())) throw Fail("give --image and --points, or --check REF (see --help)");
  return a;
}


// The device of the packages, after checking that this machine can run them.
torch::Device pick_device(const Manifest& m, const Args& a) {
  if (m.arch != this_arch())
    throw Fail("packages were built for " + m.arch + ", this machine is " + this_arch() + ": export on this machine (see deploy_cpp/README.md)");
  if (m.device == "cpu") return torch::kCPU;
#ifdef DEPTHPACK_WITH_CUDA
  if (!torch::cuda::is_available())
    throw Fail("the packages are for CUDA but CUDA is not available on this machine (torch::cuda::is_available() is false)");
  if (a.device_index >= int(torch::cuda::device_count()))
    throw Fail("--device-index " + std::to_string(a.device_index) + ": only " + std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, a.device_index);
  std::string cc = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  if (m.capability && *m.capability != cc)
    throw Fail("packages were built for compute capability " + *m.capability + ", device " + std::to_string(a.device_index) + " is " + cc);
  return torch::Device(torch::kCUDA, c10::DeviceIndex(a.device_index));
#else
  throw Fail("the packages are for CUDA but this runner was built against a libtorch without CUDA");
#endif
}

void print_bench(Runner& r, Bucket& b, const at::Tensor& images, const at::Tensor& points, int n) {
  auto ms = r.bench(b, images.to(r.device), pad_to(points, b.capacity).to(r.device), n);
  auto pct = [&](double q) { return ms[std::min(ms.size() - 1, size_t(q * double(ms.size() - 1) + 0.5))]; };
  std::fprintf(stderr, "bench bucket=%lld device=%s graph=%d runs=%d median_ms=%.4f p90_ms=%.4f\n",
               (long long)b.capacity, r.device.str().c_str(), int(r.graph), n, pct(0.5), pct(0.9));
}

// --check REF: the runner's depths against REF's (eager) depths, within the manifest's tolerance.
bool check_reference(Runner& r, const Args& a) {
  const Manifest& m = r.m;
  at::Tensor images = read_safetensor(a.check, "images"), points = read_safetensor(a.check, "points"), ref = read_safetensor(a.check, "depth");
  if (images.dim() != 4 || images.size(0) < m.batch || images.size(1) != 3 || images.size(2) != m.H || images.size(3) != m.W)
    throw Fail("check " + a.check + ": images " + shape_str(images.sizes()) + " do not fit the manifest");
  if (points.dim() != 3 || points.size(0) < m.batch || points.size(2) != 2 || ref.dim() != 2 || ref.size(1) != points.size(1))
    throw Fail("check " + a.check + ": points " + shape_str(points.sizes()) + " / depth " + shape_str(ref.sizes()) + " malformed");
  images = images.slice(0, 0, m.batch), points = points.slice(0, 0, m.batch), ref = ref.slice(0, 0, m.batch);
  at::Tensor x = points.select(2, 0), y = points.select(2, 1);
  if (!(x.ge(0) & x.lt(m.W) & y.ge(0) & y.lt(m.H)).all().item<bool>())
    throw Fail("check " + a.check + ": points outside the " + std::to_string(m.W) + "x" + std::to_string(m.H) + " image");
  std::vector<Bucket*> used;
  at::Tensor depth = r.predict(images, points, &used);
  double diff = points.size(1) ? (depth - ref).abs().max().item<double>() : 0.0;
  bool ok = torch::allclose(depth, ref, m.rtol, m.atol);
  std::fprintf(stderr, "check %s: %lld points, max abs diff %.3g (atol %g, rtol %g): %s\n", a.check.c_str(),
               (long long)points.size(1), diff, m.atol, m.rtol, ok ? "OK" : "MISMATCH");
  for (Bucket* b : used)
    if (a.bench) print_bench(r, *b, images, points, a.bench);
  return ok;
}

void write_depths(const Args& a, const Points& pts, const at::Tensor& depth) {
  std::ofstream file;
  if (!a.out.empty()) {
    file.open(a.out);
    if (!file) throw Fail("--out " + a.out + ": cannot be written");
  }
  std::ostream& os = a.out.empty() ? std::cout : file;
  os << "x,y,depth\n";
  at::Tensor d = depth.select(0, 0).contiguous();  // image 0 (every row of the batch holds the same image)
  char buf[32];
  for (size_t k = 0; k < pts.text.size(); ++k) {
    std::snprintf(buf, sizeof buf, "%.9g", d[int64_t(k)].item<float>());
    os << pts.text[k].first << "," << pts.text[k].second << "," << buf << "\n";
  }
  os.flush();
  if (!os) throw Fail("writing the depths failed");
}

int run_main(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  Manifest m = read_manifest(a.manifest);
  Runner r{m, pick_device(m, a), a.graph};
  r.graph = r.graph && r.device.is_cuda();
  c10::InferenceMode guard;
#ifdef DEPTHPACK_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;  // graphs are captured on a non-default stream
  if (r.device.is_cuda()) {
    c10::cuda::set_device(r.device.index());
    r.stream = c10::cuda::getStreamFromPool(false, r.device.index());
    stream_guard.emplace(*r.stream);
  }
#endif
  if (!a.check.empty() && !check_reference(r, a)) return 1;
  if (a.image.empty()) return 0;

  auto [images, orig] = load_image(a.image, m);
  auto [h0, w0] = orig;
  Points pts = read_points(a.points, h0, w0);
  // (x, y) original -> model pixels, as preprocess.scale_points: float32 factors W/w0, H/h0
  at::Tensor scale = torch::tensor({float(double(m.W) / double(w0)), float(double(m.H) / double(h0))});
  at::Tensor xy = (pts.xy * scale).unsqueeze(0).repeat({m.batch, 1, 1}).contiguous();  // [B,Q,2]
  if (xy.numel() && ((xy.select(2, 0) >= m.W).any().item<bool>() || (xy.select(2, 1) >= m.H).any().item<bool>()))
    throw Fail("points " + a.points + ": a point lands on the image border after scaling to " + std::to_string(m.W) + "x" + std::to_string(m.H));
  at::Tensor depth = r.predict(images, xy);  // [B,Q]
  write_depths(a, pts, depth);
  if (a.bench && xy.size(1)) print_bench(r, r.bucket_for(std::min(xy.size(1), m.buckets.back().capacity)), images, xy, a.bench);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const Fail& e) {
    std::fprintf(stderr, "depthpack_run: error: %s\n", e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "depthpack_run: error: %s\n", first_line(e.what_without_backtrace()).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depthpack_run: error: %s\n", first_line(e.what()).c_str());
  }
  return 1;
}
