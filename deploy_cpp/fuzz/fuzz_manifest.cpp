// fuzz_manifest: the JSON readers of an export's metadata on arbitrary bytes: manifest.json
// (parse_manifest), a package's depthpack.inputs (parse_specs) and depthpack.constants
// (parse_constant_specs). Seeds: real exports' manifests and package metadata.
#include "harness.h"
#include "weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depthpack;
  const std::string text = fuzz::bytes(data, size);
  fuzz::answer([&] {
    const Manifest m = parse_manifest(text, "export/manifest.json");
    describe(m.buckets.front().inputs), m.takes_frames();  // what the runner reads of it next
    if (m.map_package) describe(m.map_package->inputs), m.map_package->label();
  });
  fuzz::answer([&] { describe(parse_specs(text, "depthpack.inputs")); });
  fuzz::answer([&] {
    for (const auto& [fqn, spec] : parse_constant_specs(text, "depthpack.constants"))
      if (!item_size(spec.dtype)) __builtin_trap();  // the parser let through a dtype it does not know
  });
  return 0;
}
