// replay.cpp: a main for the fuzz targets where libFuzzer is not there (g++): runs the target once
// on each file named, or on each file of each folder named (sorted), and says how many.
//   fuzz_manifest deploy_cpp/fuzz/corpus/manifest deploy_cpp/fuzz/regressions/manifest
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "harness.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int k = 1; k < argc; ++k) {
    if (!fs::is_directory(argv[k])) { files.push_back(argv[k]); continue; }
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(argv[k]))
      if (e.is_regular_file()) found.push_back(e.path());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return std::fprintf(stderr, "replay: cannot read %s\n", f.c_str()), 2;
    const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  }
  std::printf("replayed %zu inputs\n", files.size());
  return 0;
}
