// frames.cpp: the frame sources of frames.h.
#include "frames.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "io.h"

#ifdef DEPTHPACK_WITH_VIDEOIO
#include <opencv2/videoio.hpp>
#endif

namespace depthpack {
namespace {

namespace fs = std::filesystem;

class RawSource : public FrameSource {
 public:
  RawSource(const fs::path& path, int64_t h, int64_t w) : path_(path), h_(h), w_(w), buf_(size_t(h) * size_t(w) * 3) {
    std::error_code ec;
    if (path == "-") f_ = stdin;
    else if (fs::is_directory(path, ec)) throw Error("raw frames " + path.string() + ": is a directory");
    else if (!(f_ = std::fopen(path.c_str(), "rb")))
      throw Error("raw frames " + path.string() + ": cannot be read (" + std::strerror(errno) + ")");
  }
  ~RawSource() override {
    if (f_ && f_ != stdin) std::fclose(f_);
  }
  Status next(Frame& frame, std::string& why) override {
    if (ended_) return Status::End;
    ++index_;
    const size_t n = std::fread(buf_.data(), 1, buf_.size(), f_);
    if (n == buf_.size()) {
      frame = {buf_.data(), h_, w_, w_ * 3, Order::BGR};
      return Status::Frame;
    }
    ended_ = true;
    if (n == 0 && !std::ferror(f_)) return Status::End;
    why = std::ferror(f_) ? std::string("read error: ") + std::strerror(errno)
                          : "only " + std::to_string(n) + " of " + std::to_string(buf_.size()) + " bytes: the stream ends inside this frame";
    return Status::Skip;
  }
  std::string name() const override { return path_.string() + " frame " + std::to_string(index_); }

 private:
  fs::path path_;
  int64_t h_, w_, index_ = -1;
  std::vector<uint8_t> buf_;
  std::FILE* f_ = nullptr;
  bool ended_ = false;
};

#ifdef DEPTHPACK_WITH_OPENCV
class FolderSource : public FrameSource {
 public:
  explicit FolderSource(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw Error("--images " + dir.string() + ": not a directory");
    static const std::vector<std::string> exts = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"};
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
      if (e.path().filename().string()[0] != '.' && std::count(exts.begin(), exts.end(), ext)) files_.push_back(e.path());
    }
    if (ec) throw Error("--images " + dir.string() + ": cannot be listed (" + ec.message() + ")");
    if (files_.empty()) throw Error("--images " + dir.string() + ": no image files (jpg, jpeg, png, bmp, tif, tiff, webp, ppm, pgm)");
    std::sort(files_.begin(), files_.end());
  }
  Status next(Frame& frame, std::string& why) override {
    if (++index_ >= int64_t(files_.size())) return Status::End;
    try {
      mat_ = io::decode_image(files_[index_]);
    } catch (const Error& e) {
      why = e.what();
      return Status::Skip;
    }
    frame = {mat_.data, mat_.rows, mat_.cols, int64_t(mat_.step[0]), Order::BGR};
    return Status::Frame;
  }
  std::string name() const override { return files_[index_].string(); }

 private:
  std::vector<fs::path> files_;
  int64_t index_ = -1;
  cv::Mat mat_;
};
#endif

#ifdef DEPTHPACK_WITH_VIDEOIO
class VideoSource : public FrameSource {
 public:
  explicit VideoSource(const fs::path& path) : path_(path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw Error("--video " + path.string() + ": no such file");
    if (!cap_.open(path.string(), cv::CAP_ANY) || !cap_.isOpened())
      throw Error("--video " + path.string() + ": cannot be opened as a video (OpenCV videoio)");
    count_ = int64_t(cap_.get(cv::CAP_PROP_FRAME_COUNT));
  }
  Status next(Frame& frame, std::string& why) override {
    if (ended_) return Status::End;
    ++index_;
    if (cap_.read(mat_) && mat_.type() == CV_8UC3) {
      frame = {mat_.data, mat_.rows, mat_.cols, int64_t(mat_.step[0]), Order::BGR};
      return Status::Frame;
    }
    ended_ = true;
    if (count_ <= 0 || index_ >= count_) return Status::End;
    why = "the video stops here, but its header says " + std::to_string(count_) + " frames (truncated or corrupt)";
    return Status::Skip;
  }
  std::string name() const override { return path_.string() + " frame " + std::to_string(index_); }

 private:
  fs::path path_;
  cv::VideoCapture cap_;
  cv::Mat mat_;
  int64_t index_ = -1, count_ = 0;
  bool ended_ = false;
};
#endif

}  // namespace

std::unique_ptr<FrameSource> open_raw(const fs::path& path, int64_t h, int64_t w) {
  return std::make_unique<RawSource>(path, h, w);
}

std::unique_ptr<FrameSource> open_folder(const fs::path& dir) {
#ifdef DEPTHPACK_WITH_OPENCV
  return std::make_unique<FolderSource>(dir);
#else
  throw Error("--images " + dir.string() + ": this build has no OpenCV to decode image files; use --raw, or rebuild with OpenCV");
#endif
}

std::unique_ptr<FrameSource> open_video(const fs::path& path) {
#ifdef DEPTHPACK_WITH_VIDEOIO
  return std::make_unique<VideoSource>(path);
#else
  throw Error("--video " + path.string() + ": this build has no OpenCV videoio (libopencv-videoio-dev); use --images or --raw");
#endif
}

}  // namespace depthpack
