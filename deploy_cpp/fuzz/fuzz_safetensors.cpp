// fuzz_safetensors: the safetensors readers on arbitrary bytes: the header and the slices of an
// image or reference file (--image, --check: io::Safetensors) and of the weights file
// (WeightsData::get, each entry asked for as float32 of its own shape, and as a bfloat16 [4]).
// Seeds: real exports' reference files, a real weights file cut to a few tensors, its header alone.
#include "harness.h"
#include "io.h"
#include "weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depthpack;
  const std::string bytes = fuzz::bytes(data, size);
  fuzz::answer([&] {
    const io::Safetensors st(bytes, "reference.safetensors");
    for (const char* name : {"images", "frames", "points", "depth", "focal"})
      fuzz::answer([&] {
        const io::Tensor t = st.get(name);
        if (size_t(t.numel()) != (t.dtype == "F32" ? t.f32.size() : t.u8.size())) __builtin_trap();
        if (t.dtype == "F32") io::check_unit_range(t.f32, "reference.safetensors");
      });
  });
  fuzz::answer([&] {
    const WeightsData weights(bytes, "weights.safetensors");
    const io::Json header = io::safetensors_header(bytes, "weights.safetensors").first;
    for (const auto& item : header.items()) {
      const std::string name = item.key();  // clang 14 cannot capture a structured binding
      const io::Json& entry = item.value();
      ConstantSpec own{"float32", {}};
      if (entry.is_object() && entry.contains("shape") && entry["shape"].is_array())
        for (const io::Json& s : entry["shape"])
          if (s.is_number_unsigned()) own.shape.push_back(int64_t(s.get<uint64_t>() % (uint64_t(1) << 40)));
      for (const ConstantSpec& want : {own, ConstantSpec{"bfloat16", {4}}})
        fuzz::answer([&] {
          const std::string_view got = weights.get(name, want, "package depthpack_k8.pt2");
          uint64_t n = item_size(want.dtype);
          for (int64_t s : want.shape) n *= uint64_t(s);
          if (got.size() != n) __builtin_trap();  // exactly the constant's bytes
        });
    }
  });
  return 0;
}
