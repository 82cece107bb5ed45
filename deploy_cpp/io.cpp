// io.cpp: the readers of io.h.
#include "io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>
#include <tuple>

#include <openssl/evp.h>

#ifdef DEPTHPACK_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#endif

namespace depthpack::io {
namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// A decimal number as Python's float() reads it (strtod would also take hex such as 0x1p3)
bool parse_number(const std::string& s, double& out) {
  if (s.empty() || s.find_first_of("xX") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// Text of a file quoted in a message: its first 80 bytes (Error escapes control characters)
std::string clip(const std::string& s) { return s.size() > 80 ? s.substr(0, 80) + "..." : s; }

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string hex(const unsigned char* md, unsigned int n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned int k = 0; k < n; ++k) out += digits[md[k] >> 4], out += digits[md[k] & 15];
  return out;
}

// Silences stderr (libpng and libjpeg print their own complaints) for the life of the object.
struct QuietStderr {
  int saved = -1, null = -1;
  QuietStderr() {
    std::fflush(stderr);
    saved = dup(2), null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
  }
  ~QuietStderr() {
    if (saved >= 0) dup2(saved, 2), close(saved);
    if (null >= 0) close(null);
  }
};

}  // namespace

std::string read_file(const fs::path& path, const std::string& what, uint64_t cap) {
  const std::string w = what + " " + path.string() + ": cannot be read";
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(w + " (" + std::strerror(errno) + ")");
  struct stat st {};
  std::string out;
  std::string problem;
  if (fstat(fd, &st) != 0) problem = std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = std::string("it is ") + file_kind(st.st_mode) + ", not a regular file";
  else if (uint64_t(st.st_size) > cap)
    problem = std::to_string(st.st_size) + " bytes is more than the " + std::to_string(cap / kMiB) + " MiB limit";
  else out.reserve(size_t(st.st_size));  // one allocation for large files (the weights)
  while (problem.empty()) {
    char buf[1 << 16];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) problem = std::strerror(errno);
    if (n <= 0) break;
    out.append(buf, size_t(n));
    if (out.size() > cap) problem = "more than the " + std::to_string(cap / kMiB) + " MiB limit";
  }
  close(fd);
  if (!problem.empty()) throw Error(w + ": " + problem);
  return out;
}

Json parse_json(std::string_view text, const std::string& where) {
  // nlohmann takes the last of duplicate keys: refused here, as other readers may take the first
  std::vector<std::set<std::string>> keys;  // of each object being read
  auto strict = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > 64) throw Error(where + ": invalid JSON: nested deeper than 64");
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    else if (event == Json::parse_event_t::object_end) keys.pop_back();
    else if (event == Json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw Error(where + ": invalid JSON: duplicate key " + parsed.dump());
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), strict);
  } catch (const Json::exception& e) {  // "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    const std::string what = e.what();
    const size_t tag = what.find("] ");
    throw Error(where + ": invalid JSON: " + (tag == std::string::npos ? what : what.substr(tag + 2)));
  }
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr)) throw Error("sha256: OpenSSL's EVP_Digest failed");
  return hex(md, n);
}

std::string sha256_file(const fs::path& path, const std::string& what) {
  const std::string w = what + " " + path.string() + ": cannot be read";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(w + " (" + std::strerror(errno) + ")");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  for (ssize_t n; ok && (n = ::read(fd, buf.data(), buf.size())) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0 && EVP_DigestUpdate(ctx, buf.data(), size_t(n));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ok = ok && EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  close(fd);
  if (!ok) throw Error(w + " (a read error, or OpenSSL failed)");
  return hex(md, len);
}

Points read_points(const fs::path& path) { return parse_points(read_file(path, "points", kPointsCap), path); }

Points parse_points(const std::string& text, const fs::path& path) {
  std::istringstream in(text);
  Points p;
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
      throw Error(where + ": expected \"x,y\" (two numbers), got \"" + clip(line) + "\"");
    if (!std::isfinite(x) || !std::isfinite(y)) throw Error(where + ": point is not finite");
    if (std::abs(x) > FLT_MAX || std::abs(y) > FLT_MAX) throw Error(where + ": point is beyond float32's range");
    p.text.emplace_back(sx, sy);
    p.xy.push_back(float(x)), p.xy.push_back(float(y));
    p.line.push_back(n);
  }
  return p;
}

void check_points(const Points& p, const fs::path& path, int64_t h, int64_t w) {
  for (int64_t i = 0; i < p.size(); ++i) {
    const float x = p.xy[2 * i], y = p.xy[2 * i + 1];
    if (x < 0 || x >= float(w) || y < 0 || y >= float(h))
      throw Error("points " + path.string() + " line " + std::to_string(p.line[i]) + ": point (" + p.text[i].first + ", " +
                  p.text[i].second + ") is outside the " + std::to_string(w) + "x" + std::to_string(h) +
                  " image (need 0 <= x < " + std::to_string(w) + ", 0 <= y < " + std::to_string(h) + ")");
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::pair<Json, uint64_t> safetensors_header(const std::string& bytes, const std::string& where) {
  if (bytes.size() < 8) throw Error(where + ": too short for a safetensors file");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | uint8_t(bytes[k]);
  if (n > bytes.size() - 8) throw Error(where + ": header length " + std::to_string(n) + " exceeds the file");
  if (n > kHeaderCap) throw Error(where + ": header length " + std::to_string(n) + " is more than the format's 100 MiB");
  Json header = parse_json(std::string_view(bytes).substr(8, n), where + ": header");
  if (!header.is_object()) throw Error(where + ": header: not a JSON object");
  return {std::move(header), 8 + n};
}

TensorSlice safetensors_slice(const Json& entry, const std::string& where, uint64_t avail,
                              uint64_t (*item_size)(const std::string& dtype), const std::string& allowed) {
  const Json* dtype = entry.is_object() && entry.contains("dtype") ? &entry["dtype"] : nullptr;
  const uint64_t item = dtype && dtype->is_string() ? item_size(dtype->get<std::string>()) : 0;
  if (!item) throw Error(where + ": dtype must be " + allowed);
  auto ints = [&](const char* key) {
    std::vector<int64_t> r;
    if (!entry.contains(key) || !entry[key].is_array()) throw Error(where + ": malformed shape or data_offsets");
    for (const Json& x : entry[key]) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > uint64_t(1e12)) throw Error(where + ": malformed shape or data_offsets");
      r.push_back(int64_t(x.get<uint64_t>()));
    }
    return r;
  };
  TensorSlice out{dtype->get<std::string>(), ints("shape"), 0, 0};
  const std::vector<int64_t> o = ints("data_offsets");
  uint64_t numel = 1;  // saturates above the data area: no overflow, and then no match below
  for (int64_t s : out.shape) numel = s && numel > (avail + 1) / uint64_t(s) ? avail + 1 : numel * uint64_t(s);
  out.size = numel * item;
  if (o.size() != 2 || o[0] > o[1] || uint64_t(o[1]) > avail || uint64_t(o[1] - o[0]) != out.size)
    throw Error(where + " has inconsistent data_offsets");
  out.offset = uint64_t(o[0]);
  return out;
}

Safetensors::Safetensors(const fs::path& path)
    : Safetensors(read_file(path, "safetensors", kImageCap), "safetensors " + path.string()) {}

Safetensors::Safetensors(std::string bytes, const std::string& where) : where_(where), bytes_(std::move(bytes)) {
  std::tie(header_, data_start_) = safetensors_header(bytes_, where_);
}

bool Safetensors::has(const std::string& name) const { return header_.contains(name); }

Tensor Safetensors::get(const std::string& name) const {
  const std::string w = where_ + ": tensor \"" + name + "\"";
  if (!header_.contains(name) || !header_[name].is_object()) throw Error(w + " is missing");
  auto f32_or_u8 = [](const std::string& d) -> uint64_t { return d == "F32" ? 4 : d == "U8" ? 1 : 0; };
  const TensorSlice s = safetensors_slice(header_[name], w, bytes_.size() - data_start_, f32_or_u8, "F32 or U8");
  Tensor out{s.dtype, s.shape, {}, {}};
  const char* data = bytes_.data() + data_start_ + s.offset;
  if (s.dtype == "F32") out.f32.resize(s.size / 4), std::memcpy(out.f32.data(), data, s.size);
  else out.u8.assign(data, data + s.size);
  return out;
}

void check_unit_range(const std::vector<float>& v, const std::string& where) {
  int64_t bad = 0, out = 0;
  float lo = 0, hi = 1;
  for (float x : v)
    if (!std::isfinite(x)) ++bad;
    else if (x < 0 || x > 1) ++out, lo = std::min(lo, x), hi = std::max(hi, x);
  if (bad) throw Error(where + ": images hold " + std::to_string(bad) + " non-finite values (NaN or inf)");
  if (out)
    throw Error(where + ": images must be RGB in [0,1]: " + std::to_string(out) + " values outside (min " +
                std::to_string(lo) + ", max " + std::to_string(hi) + ")");
}

std::string truncation(const std::string& b) {
  auto u = [&](size_t i) { return (unsigned char)b[i]; };
  if (b.size() >= 3 && u(0) == 0xFF && u(1) == 0xD8 && u(2) == 0xFF) {
    size_t end = b.size();
    while (end > 2 && b[end - 1] == 0) --end;  // zero padding after EOI is allowed
    if (u(end - 2) != 0xFF || u(end - 1) != 0xD9) return "a JPEG that does not end with the EOI marker FF D9 (truncated)";
  }
  if (b.size() >= 8 && b.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0) {
    for (uint64_t i = 8;; ) {  // chunks: length (4, big-endian), type (4), data, CRC (4)
      if (i + 12 > b.size()) return "a PNG without its IEND chunk (truncated)";
      const uint64_t len = uint64_t(u(i)) << 24 | u(i + 1) << 16 | u(i + 2) << 8 | u(i + 3);
      if (b.compare(i + 4, 4, "IEND") == 0) return "";
      i += 12 + len;
    }
  }
  return "";
}

#ifdef DEPTHPACK_WITH_OPENCV
cv::Mat decode_image(const fs::path& path) {
  const std::string bytes = read_file(path, "image", kImageCap);
  if (std::string why = truncation(bytes); !why.empty()) throw Error("image " + path.string() + ": " + why);
  cv::Mat bgr;
  if (!bytes.empty()) {
    QuietStderr quiet;
    try {
      bgr = cv::imdecode(cv::Mat(1, int(bytes.size()), CV_8U, const_cast<char*>(bytes.data())), cv::IMREAD_COLOR);
    } catch (const cv::Exception&) {
    }
  }
  if (bgr.empty() || bgr.type() != CV_8UC3) throw Error("image " + path.string() + ": cannot be decoded as an image");
  return bgr;
}
#endif

std::string readers() {
#ifdef DEPTHPACK_WITH_OPENCV
  std::string out = "opencv=1";
#else
  std::string out = "opencv=0";
#endif
#ifdef DEPTHPACK_WITH_VIDEOIO
  return out + " videoio=1";
#else
  return out + " videoio=0";
#endif
}

}  // namespace depthpack::io
