// Small, strict JSON (RFC 8259) parser for manifest.json and safetensors headers, and a SHA-256.
// No dependencies: the deployment machines may have nothing beyond libtorch. Errors throw
// std::runtime_error with the byte offset, so the runner can print one clear line.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace minijson {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;  // insertion order; duplicate keys rejected

  bool is_null() const { return kind == Kind::Null; }
  const Value* find(const std::string& key) const {
    for (const auto& [k, v] : object)
      if (k == key) return &v;
    return nullptr;
  }
};

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Value parse() {
    Value v = value(0);
    ws();
    if (i_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(i_) + ": " + what);
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) { ++i_; return true; }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  void literal(const char* word) {
    for (const char* p = word; *p; ++p, ++i_)
      if (i_ >= s_.size() || s_[i_] != *p) fail(std::string("expected '") + word + "'");
  }

  Value value(int depth) {
    if (depth > 64) fail("nested too deeply");
    ws();
    if (i_ >= s_.size()) fail("unexpected end of input");
    Value v;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Value::Kind::Object;
      if (eat('}')) return v;
      do {
        ws();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string key");
        std::string key = string();
        if (v.find(key)) fail("duplicate key \"" + key + "\"");
        expect(':');
        v.object.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Value::Kind::Array;
      if (eat(']')) return v;
      do v.array.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.string = string();
    } else if (c == 't') {
      literal("true"); v.kind = Value::Kind::Bool; v.boolean = true;
    } else if (c == 'f') {
      literal("false"); v.kind = Value::Kind::Bool;
    } else if (c == 'n') {
      literal("null");
    } else {
      v.kind = Value::Kind::Number;
      v.number = number();
    }
    return v;
  }

  double number() {
    // -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?  checked by hand, then converted by strtod
    size_t start = i_;
    auto digits = [&] { size_t d = i_; while (i_ < s_.size() && std::isdigit((unsigned char)s_[i_])) ++i_; return i_ - d; };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') ++i_;
    else if (digits() == 0) fail("invalid number");
    if (i_ < s_.size() && s_[i_] == '.') { ++i_; if (digits() == 0) fail("invalid number"); }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail("invalid number");
    }
    std::string text = s_.substr(start, i_ - start);
    double x = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(x)) fail("number out of range");
    return x;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= h - '0';
      else if (h >= 'a' && h <= 'f') u |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') u |= h - 'A' + 10;
      else fail("bad \\u escape");
    }
    return u;
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      unsigned char c = s_[i_++];
      if (c == '"') return out;
      if (c < 0x20) fail("control character in string");
      if (c != '\\') { out += char(c); continue; }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // surrogate pair
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') fail("lone surrogate");
            i_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("lone surrogate");
          }
          if (cp < 0x80) out += char(cp);
          else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
          else if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
          else { out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
          break;
        }
        default: fail(std::string("bad escape \\") + e);
      }
    }
  }
};

inline Value parse(const std::string& text) { return Parser(text).parse(); }

// ---- SHA-256 (FIPS 180-4), streamed over a file ------------------------------------------------
class Sha256 {
 public:
  void update(const unsigned char* data, size_t n) {
    for (size_t k = 0; k < n; ++k) {
      buf_[len_++ % 64] = data[k];
      if (len_ % 64 == 0) block(buf_.data());
    }
  }
  std::string hex() {
    uint64_t bits = len_ * 8;
    unsigned char pad = 0x80;
    update(&pad, 1);
    unsigned char zero = 0;
    while (len_ % 64 != 56) update(&zero, 1);
    for (int k = 7; k >= 0; --k) { unsigned char b = (bits >> (8 * k)) & 0xFF; update(&b, 1); }
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (uint32_t w : h_)
      for (int k = 28; k >= 0; k -= 4) out += digits[(w >> k) & 0xF];
    return out;
  }

 private:
  std::array<uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> buf_{};
  uint64_t len_ = 0;

  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const unsigned char* p) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(p[4 * t]) << 24 | uint32_t(p[4 * t + 1]) << 16 | uint32_t(p[4 * t + 2]) << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }
};

// Hex SHA-256 of a file's bytes; throws if it cannot be read.
inline std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  Sha256 sha;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    sha.update(reinterpret_cast<const unsigned char*>(buf.data()), size_t(in.gcount()));
  }
  return sha.hex();
}

}  // namespace minijson
