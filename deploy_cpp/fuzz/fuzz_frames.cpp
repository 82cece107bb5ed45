// fuzz_frames: the raw frame reader (open_raw, what --raw and robot_loop read) on an arbitrary
// stream, and the image truncation check (io::truncation) on the same bytes. The first two bytes
// choose the frame size (height 1 + b0 % 128, width 1 + b1 % 128); the rest is the stream. Seeds: a
// real export's reference frame, its reference.png.
#include <sys/mman.h>
#include <unistd.h>

#include "frames.h"
#include "harness.h"
#include "io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depthpack;
  if (size < 2) return 0;
  const int64_t h = 1 + data[0] % 128, w = 1 + data[1] % 128;
  const std::string stream = fuzz::bytes(data + 2, size - 2);
  io::truncation(stream);
  const int fd = memfd_create("frames", 0);  // a file of the stream's bytes, read through its path
  if (fd < 0 || ::write(fd, stream.data(), stream.size()) != ssize_t(stream.size())) __builtin_trap();
  fuzz::answer([&] {
    auto source = open_raw("/proc/self/fd/" + std::to_string(fd), h, w);
    Frame f;
    std::string why;
    size_t frames = 0, skipped = 0;
    for (FrameSource::Status s; (s = source->next(f, why)) != FrameSource::Status::End;) {
      if (s == FrameSource::Status::Skip) { ++skipped; continue; }
      if (f.height != h || f.width != w || f.row_bytes != 3 * w || !f.data) __builtin_trap();
      volatile uint8_t last = f.data[h * w * 3 - 1];  // the whole frame is there
      (void)last;
      ++frames;
    }
    const size_t frame_bytes = size_t(h * w * 3);  // whole frames answered, a cut-short last one reported
    if (frames != stream.size() / frame_bytes || skipped != (stream.size() % frame_bytes ? 1 : 0)) __builtin_trap();
  });
  close(fd);
  return 0;
}
