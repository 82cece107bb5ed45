// io.h: what the runner reads from disk: regular files under a size cap (never a device, a FIFO
// or a directory, so nothing hangs), strict JSON (nlohmann/json), SHA-256 (OpenSSL's libcrypto),
// the points CSV, safetensors tensors, image files (OpenCV decode after a truncation check).
// Errors are depthpack::Error, one line naming the file. No libtorch here: the fuzz targets
// (fuzz/) link this part alone.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "manifest.h"

#ifdef DEPTHPACK_WITH_OPENCV
#include <opencv2/core.hpp>
#endif

namespace depthpack::io {

namespace fs = std::filesystem;
using Json = nlohmann::json;

inline constexpr uint64_t kMiB = uint64_t(1) << 20;
inline constexpr uint64_t kManifestCap = 16 * kMiB, kPointsCap = 64 * kMiB, kImageCap = 256 * kMiB;
inline constexpr uint64_t kWeightsCap = 4096 * kMiB;  // the export's weights.safetensors
inline constexpr uint64_t kHeaderCap = 100 * kMiB;    // a safetensors header (the format's own limit)

// The bytes of a regular file of at most cap bytes: anything else (missing, a directory, a device
// such as /dev/zero, a FIFO, larger than cap) is one Error "WHAT PATH: cannot be read ...".
std::string read_file(const fs::path& path, const std::string& what, uint64_t cap);

// Strict JSON (RFC 8259, UTF-8): duplicate keys and nesting deeper than 64 are refused too. An
// Error "WHERE: invalid JSON: ..." with the position.
Json parse_json(std::string_view text, const std::string& where);

// Lowercase hex SHA-256 of bytes, or of a file's bytes (streamed; an Error if it cannot be read).
std::string sha256_hex(std::string_view bytes);
std::string sha256_file(const fs::path& path, const std::string& what);

// The points CSV: one "x,y" per line, optional header "x,y", blank lines ignored, finite numbers.
struct Points {
  std::vector<float> xy;                                  // x0, y0, x1, y1, ... (float32)
  std::vector<std::pair<std::string, std::string>> text;  // as written, for the output CSV
  std::vector<int64_t> line;                              // the line each point came from
  int64_t size() const { return int64_t(line.size()); }
};
Points read_points(const fs::path& path);
Points parse_points(const std::string& text, const fs::path& path);  // text: the file's bytes
// An Error naming the line of the first point outside a w x h image.
void check_points(const Points& p, const fs::path& path, int64_t h, int64_t w);

// One tensor of a safetensors file (F32 or U8, little-endian host).
struct Tensor {
  std::string dtype;  // "F32" | "U8"
  std::vector<int64_t> shape;
  std::vector<float> f32;
  std::vector<uint8_t> u8;
  int64_t numel() const;
};
// safetensors bytes: 8-byte little-endian header length, a JSON object header, the data area. The
// header and where the data area starts, or an Error "WHERE: ..." (where: "safetensors PATH", say).
std::pair<Json, uint64_t> safetensors_header(const std::string& bytes, const std::string& where);
// One header entry, checked against a data area of avail bytes: its dtype one that item_size takes
// (bytes per element, 0: not taken; the error says "dtype must be " + allowed), shape and
// data_offsets non-negative integers, the data inside the area and numel * item size long.
struct TensorSlice {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0, size = 0;  // in the data area
};
TensorSlice safetensors_slice(const Json& entry, const std::string& where, uint64_t avail,
                              uint64_t (*item_size)(const std::string& dtype), const std::string& allowed);

class Safetensors {
 public:
  explicit Safetensors(const fs::path& path);
  Safetensors(std::string bytes, const std::string& where);  // bytes already read (the fuzz targets)
  bool has(const std::string& name) const;
  Tensor get(const std::string& name) const;

 private:
  std::string where_;
  std::string bytes_;
  Json header_;
  uint64_t data_start_ = 0;
};
// RGB images must be finite and in [0, 1]: an Error naming how many values are not.
void check_unit_range(const std::vector<float>& v, const std::string& where);

// "" when the bytes look complete, else why not: a JPEG must end with EOI (FF D9, trailing zero
// bytes allowed), a PNG must hold its IEND chunk. Other formats: "".
std::string truncation(const std::string& bytes);

#ifdef DEPTHPACK_WITH_OPENCV
// uint8 BGR [h,w,3]; an Error on a file that cannot be read, is truncated or does not decode.
cv::Mat decode_image(const fs::path& path);
#endif

// What this build can read: "opencv=0|1 videoio=0|1".
std::string readers();

}  // namespace depthpack::io
