// harness.h: what every fuzz target asks of a reader. A depthpack::Error is the reader's answer to
// bad bytes (one line by construction); any other exception escapes LLVMFuzzerTestOneInput and
// aborts, and so counts as a finding, like a crash or a sanitizer report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "manifest.h"

namespace depthpack::fuzz {

// Runs f; true when it returned, false when it refused the input with a depthpack::Error.
template <class F>
bool answer(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

inline std::string bytes(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

}  // namespace depthpack::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
