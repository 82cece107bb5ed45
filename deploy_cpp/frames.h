// frames.h: where a frame loop gets its frames: a raw bgr8 stream (no OpenCV needed), a folder of
// image files, a video file. A frame that cannot be read is reported (Skip, with why) and the
// source goes on with the next one. No libtorch here.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "runner.h"

namespace depthpack {

class FrameSource {
 public:
  enum class Status { Frame, Skip, End };
  virtual ~FrameSource() = default;
  // The next frame (its pixels stay valid until the next call), or why it was skipped, or the end.
  virtual Status next(Frame& frame, std::string& why) = 0;
  virtual std::string name() const = 0;  // of the frame just returned, for messages
};

// Frames of h*w*3 bytes back to back, B, G, R; path "-" is stdin; a file, a FIFO or a device.
std::unique_ptr<FrameSource> open_raw(const std::filesystem::path& path, int64_t h, int64_t w);
// Every image file of a folder (jpg jpeg png bmp tif tiff webp ppm pgm), sorted by name (OpenCV).
std::unique_ptr<FrameSource> open_folder(const std::filesystem::path& dir);
// A video file through OpenCV's VideoCapture (a build with videoio).
std::unique_ptr<FrameSource> open_video(const std::filesystem::path& path);

}  // namespace depthpack
