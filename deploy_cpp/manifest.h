// manifest.h: manifest.json of an export folder, parsed and verified per the contract
// (depthpack/deploy/contract.py). tests/deploy/test_cpp_runner.py holds the marked declarations
// below to contract.FORMAT, FORMAT_SHARED, FORMAT_NO_MAP, REQUIRED_KEYS, BUCKET_KEYS, MAP_PACKAGE_KEYS
// and MAP_BUCKET.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace depthpack {

// Every refusal of the library: one line naming the file or value and what is wrong. Control
// characters (of a name or a file's text quoted in it) are written as \xNN, so it stays one line.
struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(one_line(what)) {}
  static std::string one_line(const std::string& s) {
    std::string out;
    for (const char ch : s) {
      const unsigned char c = static_cast<unsigned char>(ch);
      if (c >= 0x20 && c != 0x7f) { out += ch; continue; }
      const char* hex = "0123456789abcdef";
      out += "\\x", out += hex[c >> 4], out += hex[c & 15];
    }
    return out;
  }
};

// contract: FORMAT
inline constexpr const char* kFormat = "depthpack-manifest/5";
// contract: FORMAT_SHARED
inline constexpr const char* kFormatShared = "depthpack-manifest/4";  // shared-stream packages, no map-only package
// contract: FORMAT_NO_MAP
inline constexpr const char* kFormatNoMap = "depthpack-manifest/3";
// contract: REQUIRED_KEYS
inline constexpr std::array<const char*, 19> kRequiredKeys = {
    "format", "preset", "model_config", "image_size", "patch_size", "batch_size", "device",
    "compute_capability", "arch", "dtype", "torch_version", "min_depth", "max_depth", "frame",
    "preprocess", "tolerance", "buckets", "reference", "weights"};
// contract: BUCKET_KEYS
inline constexpr std::array<const char*, 5> kBucketKeys = {"bucket", "file", "sha256", "inputs", "outputs"};
// contract: MAP_PACKAGE_KEYS
inline constexpr std::array<const char*, 4> kMapPackageKeys = {"file", "sha256", "inputs", "outputs"};
// contract: MAP_BUCKET
inline constexpr const char* kMapBucket = "map";  // the map-only package's depthpack.bucket metadata
inline constexpr int64_t kMaxSize = 1 << 14, kMaxBatch = 1 << 12;  // contract.MAX_SIZE, MAX_BATCH

// One tensor a package takes or returns: "images" float32 [B,3,H,W], "frames" uint8 [B,h,w,3],
// "points" float32 [B,K,2], "focal" float32 [B]; "depth" float32 [B,K], "map" float32 [B,rows,cols].
struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
  bool operator==(const TensorSpec&) const = default;
};

struct Bucket {
  int64_t capacity = 0;             // K: points per call; 0: the map-only package (no points, returns the map)
  std::filesystem::path file;       // the .pt2 beside the manifest
  std::string sha256;
  std::vector<TensorSpec> inputs;   // in call order
  std::string label() const { return capacity ? std::to_string(capacity) : kMapBucket; }  // its depthpack.bucket
};

// The packages' shared weights (manifest "weights"): a safetensors file beside the manifest whose
// entries are named by the packages' constant FQNs. The packages hold no weights of their own, and
// the runner loads them into each package before its first run (weights.h).
struct WeightsFile {
  std::filesystem::path file;
  std::string sha256;
};

struct Manifest {
  std::filesystem::path path;
  int64_t H = 0, W = 0, batch = 0;  // the model's image size; the packages' batch B
  std::string device, dtype, arch, torch_version;
  std::optional<std::string> capability;  // CUDA compute capability such as "9.0"
  double atol = 0, rtol = 0;              // |package - eager| <= atol + rtol |eager|
  int64_t frame_h = 0, frame_w = 0;       // frame packages: the raw frame size they take ("frame";
                                          // null for packages that take images)
  bool frame_bgr = true;                  //   and its channel order
  std::optional<float> focal_default;     // "focal": {"default": f}
  int64_t map_rows = 0, map_cols = 0;     // "map": {"size": [rows, cols]}: the packages' second output,
                                          // the glance's depth map (0: none, or a format 3 manifest)
  std::vector<Bucket> buckets;            // ascending capacity; the same inputs but "points" in each
  std::optional<Bucket> map_package;      // "map": {"file", "sha256", "inputs", "outputs"} (format 5, a one-way
                                          // model): the map alone, the buckets' inputs without the points
  WeightsFile weights;                    // "weights": null (weights inside, an older export) is refused

  bool has_input(const std::string& name) const;
  bool takes_frames() const { return has_input("frames"); }
  bool has_map() const { return map_rows > 0; }
  size_t packages() const { return buckets.size() + (map_package ? 1 : 0); }
};

// The manifest at path with every key a runner relies on checked; an Error names the file and key.
Manifest read_manifest(const std::filesystem::path& path);
Manifest parse_manifest(const std::string& text, const std::filesystem::path& path);  // text: the file's bytes

// Tensor specs from JSON text (a package's "depthpack.inputs" metadata); Error on anything else.
std::vector<TensorSpec> parse_specs(const std::string& json, const std::string& where);
std::string describe(const std::vector<TensorSpec>& specs);  // [images float32 [1,3,64,64], ...]

std::string this_arch();  // "x86_64", "aarch64" or "unknown": what the manifest's "arch" must say

}  // namespace depthpack
