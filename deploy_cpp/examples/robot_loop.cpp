// robot_loop: how a robot's code uses depthpack: one Runner, then predict() on every camera frame.
//   robot_loop MANIFEST FRAMES.raw WIDTHxHEIGHT [rgb]
// FRAMES.raw: raw bgr8 frames back to back (rgb8 with "rgb"), as a camera driver hands them over
// ("-": stdin).
// Prints the depth (meters) at the frame's center and at its four quarter points, per frame. A
// stream that ends inside a frame is an error (exit 1): a short read is never dropped silently.
#include <cstdio>
#include <string>
#include <vector>

#include "frames.h"
#include "runner.h"

int main(int argc, char** argv) {
  int w = 0, h = 0;
  if (argc < 4 || argc > 5 || std::sscanf(argv[3], "%dx%d", &w, &h) != 2 || w < 2 || h < 2) {
    std::fprintf(stderr, "usage: robot_loop MANIFEST FRAMES.raw WIDTHxHEIGHT [rgb]\n");
    return 2;
  }
  const auto order = argc == 5 && std::string(argv[4]) == "rgb" ? depthpack::Order::RGB : depthpack::Order::BGR;
  try {
    depthpack::Runner runner(argv[1]);                    // verifies the manifest; packages load on first use
    auto camera = depthpack::open_raw(argv[2], h, w);     // whole frames of w*h*3 bytes, or why not
    const float fw = float(w), fh = float(h);
    const std::vector<float> xy = {fw / 2, fh / 2, fw / 4, fh / 4, 3 * fw / 4, fh / 4, fw / 4, 3 * fh / 4, 3 * fw / 4, 3 * fh / 4};
    const int64_t n = int64_t(xy.size() / 2);
    std::vector<float> depth(xy.size() / 2);
    depthpack::Frame frame;
    std::string why;
    for (int i = 0;; ++i) {
      const auto status = camera->next(frame, why);
      if (status == depthpack::FrameSource::Status::End) break;
      if (status == depthpack::FrameSource::Status::Skip) throw depthpack::Error(camera->name() + ": " + why);
      frame.order = order;
      runner.predict(frame, xy.data(), n, depth.data());
      std::printf("frame %d:", i);
      for (float d : depth) std::printf(" %.6f", d);
      std::printf("\n");
    }
  } catch (const std::exception& e) {  // depthpack::Error: one line that says what is wrong
    std::fprintf(stderr, "robot_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
