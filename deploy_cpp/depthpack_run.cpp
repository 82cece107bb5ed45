// depthpack_run: the command line over depthpack::Runner (runner.h): metric depth at queried
// pixels of one image, of every frame of a video, a folder or a raw stream, or a check against
// the export's reference file.
//
// Assumes: a folder written by export/export.py (manifest.json "depthpack-manifest/5", or /4 and /3 from
// before the one-way stream and the map, beside one AOTInductor package per bucket, the map-only package
// of a one-way model, and the weights file they share) built for this machine's CPU
// architecture, GPU compute capability and libtorch major.minor (all checked); trusted packages: a
// .pt2 holds native code, and the sha256 checks only prove a file is the one the manifest names.
// Any error: one line on stderr, "depthpack_run: error: ...", exit code 1. --out and --map never write
// over an input, into the export folder, or over each other.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "frames.h"
#include "io.h"
#include "runner.h"
#include "stats.h"

namespace {

using depthpack::Error;
using Clock = std::chrono::steady_clock;

const char* kUsage = R"(usage: depthpack_run --manifest DIR/manifest.json INPUT [options]
INPUT is one of
  --image PATH --points PTS.csv   one image file (a build with OpenCV), or a .safetensors file whose
                                  "images" tensor [B,3,H,W] float32 RGB in [0,1] is used as is
  --check REF                     REF's inputs (e.g. reference.safetensors) against REF's depth
                                  within the manifest's tolerance; exit 1 on a mismatch
  --video FILE --points PTS.csv   every frame of a video (a build with OpenCV videoio)
  --images DIR --points PTS.csv   every image file of a folder, sorted by name
  --raw FILE --frame-size WxH --points PTS.csv
                                  raw bgr8 frames back to back (FILE "-": stdin; no OpenCV needed)
options
  --points PATH       CSV, one "x,y" per line in the frame's pixels; optional header "x,y"; blank
                      lines ignored; the same points for every frame
  --out PATH          the depths as CSV, "x,y,depth" (frame loops: "frame,x,y,depth"); default
                      stdout; never an input, nor a file of the export folder
  --map PATH          with --image, packages with a map (manifest "map"): the glance's depth map of
                      the same call as CSV, one line per row of the map, meters; without --points
                      (or with no points) the map alone: from the map-only package of a one-way
                      model, else from one point, the image's centre; never --out's file
  --focal F           the camera's focal length sqrt(fx*fy) in the input's pixels, > 0 (default:
                      the manifest's "focal" default); packages without a focal input ignore it
                      (one warning line)
  --bench N           time N runs of each bucket used; median and p90 latency (ms)
  --no-graph          on CUDA, run the packages directly instead of replaying CUDA graphs
  --device-index I    CUDA device (default 0)
  --version           what this build has: libtorch, CUDA, OpenCV (image files), videoio
  --help              this text
Reports (check, bench, frame latency) go to stderr. Frame loops skip a frame that cannot be read
(named on stderr) and go on; the exit code is then 1.
)";

struct Args {
  std::string manifest, image, points, out, map, check, video, images, raw;
  int64_t frame_h = 0, frame_w = 0;
  std::optional<float> focal;
  int bench = 0, device_index = 0;
  bool graph = true;
};

double number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x)) throw Error(flag + " needs a number, got \"" + v + "\"");
  return x;
}

Args parse_args(int argc, char** argv) {
  Args a;
  auto value = [&](int& k) -> std::string {
    if (k + 1 >= argc) throw Error(std::string(argv[k]) + " needs a value (see --help)");
    return argv[++k];
  };
  auto integer = [&](int& k, int lo) {
    std::string flag = argv[k], v = value(k);
    double x = number(flag, v);
    if (x != std::floor(x) || x < lo || x > 1e9) throw Error(flag + " must be an integer >= " + std::to_string(lo) + ", got \"" + v + "\"");
    return int(x);
  };
  for (int k = 1; k < argc; ++k) {
    std::string f = argv[k];
    if (f == "--help" || f == "-h") { std::cout << kUsage; std::exit(0); }
    else if (f == "--version") { std::cout << "depthpack_run " << depthpack::build_info() << "\n"; std::exit(0); }
    else if (f == "--manifest") a.manifest = value(k);
    else if (f == "--image") a.image = value(k);
    else if (f == "--points") a.points = value(k);
    else if (f == "--out") a.out = value(k);
    else if (f == "--map") a.map = value(k);
    else if (f == "--check") a.check = value(k);
    else if (f == "--video") a.video = value(k);
    else if (f == "--images") a.images = value(k);
    else if (f == "--raw") a.raw = value(k);
    else if (f == "--focal") {
      const double x = number(f, value(k));
      if (!(x > 0) || x > 1e7) throw Error("--focal must be a positive number of pixels, got \"" + std::string(argv[k]) + "\"");
      a.focal = float(x);
    }
    else if (f == "--bench") a.bench = integer(k, 1);
    else if (f == "--device-index") a.device_index = integer(k, 0);
    else if (f == "--no-graph") a.graph = false;
    else if (f == "--frame-size") {
      std::string v = value(k);
      long long w = 0, h = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%lldx%lld%c", &w, &h, &tail) != 2 || w < 1 || h < 1 || w > 1 << 16 || h > 1 << 16)
        throw Error("--frame-size must be WIDTHxHEIGHT such as 640x480, got \"" + v + "\"");
      a.frame_w = w, a.frame_h = h;
    } else throw Error("unknown argument \"" + f + "\" (see --help)");
  }
  if (a.manifest.empty()) throw Error("--manifest is required (see --help)");
  const int loops = !a.video.empty() + !a.images.empty() + !a.raw.empty();
  if (loops > 1 || (loops && (!a.image.empty() || !a.check.empty())))
    throw Error("give one input: --image, --check, --video, --images or --raw (see --help)");
  if (!loops && a.check.empty() && a.image.empty()) throw Error("give --image and --points, --check REF, or a frame loop (see --help)");
  if ((loops || (!a.image.empty() && a.map.empty())) && a.points.empty())
    throw Error("--points is required with --image (but for the map alone, --map), --video, --images and --raw");
  if (a.raw.empty() != !a.frame_w) throw Error("--raw and --frame-size WxH go together");
  if (!a.map.empty() && a.image.empty()) throw Error("--map goes with --image (one call, one map)");
  return a;
}

// --out must not write over an input (the same file, by any path or link) nor into the export
// folder (its manifest, packages, weights, references): a typo there would destroy the export.
void check_out(const Args& a) {
  namespace fs = std::filesystem;
  if (a.out.empty() && a.map.empty()) return;
  std::error_code ec;
  auto folder = [&](const std::string& p) { return fs::weakly_canonical(fs::absolute(p, ec), ec); };
  if (!a.out.empty() && !a.map.empty() && (folder(a.out) == folder(a.map) || fs::equivalent(a.out, a.map, ec)))
    throw Error("--out " + a.out + " and --map " + a.map + " are the same file: the map would replace the depths; "
                "give two files");
  for (const auto& [flag, path] : {std::pair{"--out", a.out}, std::pair{"--map", a.map}}) {
    if (path.empty()) continue;
    const fs::path out = folder(path);
    if (out.parent_path() == folder(a.manifest).parent_path())
      throw Error(std::string(flag) + " " + path + ": is in the export folder " + folder(a.manifest).parent_path().string() +
                  " (its manifest, packages and weights); write elsewhere");
    if (!a.images.empty() && out.parent_path() == folder(a.images))
      throw Error(std::string(flag) + " " + path + ": is in the --images folder " + a.images + "; write elsewhere");
    for (const std::string& in : {a.manifest, a.image, a.points, a.check, a.video, a.raw})
      if (!in.empty() && in != "-" && (folder(in) == out || fs::equivalent(in, path, ec)))
        throw Error(std::string(flag) + " " + path + ": is the input " + in + "; write elsewhere");
  }
}

std::ostream& output(const Args& a, std::ofstream& file) {
  if (a.out.empty()) return std::cout;
  file.open(a.out);
  if (!file) throw Error("--out " + a.out + ": cannot be written");
  return file;
}

std::string fmt(float d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", d);
  return buf;
}

void print_bench(depthpack::Runner& r, int runs) {
  for (int64_t k : r.buckets_used()) {
    auto ms = r.bench(k, runs);
    std::fprintf(stderr, "bench bucket=%s device=%s graph=%d runs=%d median_ms=%.4f p90_ms=%.4f\n",
                 k ? std::to_string(k).c_str() : depthpack::kMapBucket, r.device().c_str(), int(r.graphs()), runs,
                 depthpack::median(ms), depthpack::percentile(ms, 0.9));
  }
}

// --check REF: the reference's depths within the manifest's tolerance, one line on stderr.
bool report_check(depthpack::Runner& r, const std::string& path) {
  const depthpack::Manifest& m = r.manifest();
  const depthpack::Check c = depthpack::check_reference(r, path);
  std::fprintf(stderr, "check %s: %lld points%s, max abs diff %.3g (atol %g, rtol %g): %s\n", path.c_str(), (long long)c.points,
               c.map_only ? " and the map (also map-only)" : c.map ? " and the map" : "", c.max_abs_diff, m.atol, m.rtol,
               c.ok ? "OK" : "MISMATCH");
  return c.ok;
}

// --image: one image file, or a tensor file used as is.
void predict_image(depthpack::Runner& r, const Args& a) {
  const depthpack::Manifest& m = r.manifest();
  depthpack::io::Points pts = a.points.empty() ? depthpack::io::Points{} : depthpack::io::read_points(a.points);  // none: the map alone
  std::vector<float> depth(pts.xy.size() / 2);
  const auto [rows, cols] = r.map_size();
  if (!a.map.empty() && !rows) throw Error("--map " + a.map + ": these packages return no map (manifest \"map\")");
  std::vector<float> map(a.map.empty() ? 0 : size_t(rows * cols));
  float* map_out = a.map.empty() ? nullptr : map.data();
  if (a.image.size() > 12 && a.image.ends_with(".safetensors")) {
    const std::string name = m.takes_frames() ? "frames" : "images";
    auto t = depthpack::io::Safetensors(a.image).get(name);
    const int64_t h = m.takes_frames() ? m.frame_h : m.H, w = m.takes_frames() ? m.frame_w : m.W;
    if (const std::string why = depthpack::input_mismatch(t, m); !why.empty())
      throw Error("image " + a.image + ": tensor \"" + name + "\" has " + why + " (tensor files are not resized)");
    if (t.shape[0] != 1)  // one image, one CSV: a batch would be answered for its first row only
      throw Error("image " + a.image + ": tensor \"" + name + "\" holds " + std::to_string(t.shape[0]) +
                  " images; --image takes one (shape [1,...]); --check REF runs a reference's batch");
    if (!m.takes_frames()) depthpack::io::check_unit_range(t.f32, "image " + a.image);
    depthpack::io::check_points(pts, a.points, h, w);
    r.predict_inputs(m.takes_frames() ? (const void*)t.u8.data() : t.f32.data(), 1, pts.xy.data(), pts.size(), depth.data(), a.focal,
                     map_out);
  } else {
#ifdef DEPTHPACK_WITH_OPENCV
    cv::Mat bgr = depthpack::io::decode_image(a.image);
    depthpack::io::check_points(pts, a.points, bgr.rows, bgr.cols);
    r.predict(bgr, pts.xy.data(), pts.size(), depth.data(), a.focal, map_out);
#else
    throw Error("image " + a.image + ": this build has no OpenCV, so --image must be a .safetensors file; rebuild with OpenCV to read image files");
#endif
  }
  if (!a.points.empty() || !a.out.empty()) {  // the map alone (no --points) writes no depths to stdout
    std::ofstream file;
    std::ostream& os = output(a, file);
    os << "x,y,depth\n";
    for (int64_t i = 0; i < pts.size(); ++i) os << pts.text[i].first << "," << pts.text[i].second << "," << fmt(depth[i]) << "\n";
    if (!os.flush()) throw Error("writing the depths failed");
  }
  if (map_out) {
    std::ofstream mf(a.map);
    for (int64_t y = 0; y < rows; ++y)
      for (int64_t x = 0; x < cols; ++x) mf << fmt(map[size_t(y * cols + x)]) << (x + 1 < cols ? "," : "\n");
    if (!mf.flush()) throw Error("--map " + a.map + ": cannot be written");
  }
}

// --video / --images / --raw: the same points on every frame; latency without and with the read.
int frame_loop(depthpack::Runner& r, const Args& a) {
  auto source = !a.raw.empty() ? depthpack::open_raw(a.raw, a.frame_h, a.frame_w)
                : !a.video.empty() ? depthpack::open_video(a.video) : depthpack::open_folder(a.images);
  depthpack::io::Points pts = depthpack::io::read_points(a.points);
  std::vector<float> depth(pts.xy.size() / 2);
  std::ofstream file;
  std::ostream* os = nullptr;  // opened at the first frame: an error before it leaves no output
  std::vector<double> predict_ms, total_ms;
  int64_t frames = 0, skipped = 0, checked_h = -1, checked_w = -1, buffers_first = 0;
  depthpack::Frame f;
  std::string why;
  for (int64_t i = 0;; ++i) {
    const auto t0 = Clock::now();
    const auto status = source->next(f, why);
    if (status == depthpack::FrameSource::Status::End) break;
    if (status == depthpack::FrameSource::Status::Skip) {
      std::fprintf(stderr, "depthpack_run: skipped frame %lld (%s): %s\n", (long long)i, source->name().c_str(), why.c_str());
      ++skipped;
      continue;
    }
    if (f.height != checked_h || f.width != checked_w) depthpack::io::check_points(pts, a.points, f.height, f.width);
    checked_h = f.height, checked_w = f.width;
    const auto t1 = Clock::now();
    r.predict(f, pts.xy.data(), pts.size(), depth.data(), a.focal);
    const auto t2 = Clock::now();
    predict_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    total_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    if (!os) os = &output(a, file), *os << "frame,x,y,depth\n";
    for (int64_t k = 0; k < pts.size(); ++k)
      *os << i << "," << pts.text[k].first << "," << pts.text[k].second << "," << fmt(depth[k]) << "\n";
    if (++frames == 1) buffers_first = r.allocations();
  }
  if (frames == 0 && skipped == 0) throw Error("no frames in " + (a.raw + a.video + a.images));
  if (!os) os = &output(a, file), *os << "frame,x,y,depth\n";
  if (!os->flush()) throw Error("writing the depths failed");
  // the first frame loads the packages (and captures the CUDA graphs): reported apart
  const double first = predict_ms.empty() ? NAN : predict_ms.front();
  if (predict_ms.size() > 1) predict_ms.erase(predict_ms.begin()), total_ms.erase(total_ms.begin());
  std::fprintf(stderr, "frames frames=%lld skipped=%lld device=%s graph=%d first_ms=%.3f predict_median_ms=%.4f predict_p90_ms=%.4f "
               "read_predict_median_ms=%.4f read_predict_p90_ms=%.4f buffers_first=%lld buffers_end=%lld\n", (long long)frames,
               (long long)skipped, r.device().c_str(), int(r.graphs()), first, depthpack::median(predict_ms),
               depthpack::percentile(predict_ms, 0.9), depthpack::median(total_ms), depthpack::percentile(total_ms, 0.9),
               (long long)buffers_first, (long long)r.allocations());
  if (skipped) throw Error(std::to_string(skipped) + " of " + std::to_string(frames + skipped) + " frames skipped (named above)");
  return 0;
}

int run_main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  check_out(a);
  depthpack::Runner runner(a.manifest, {a.device_index, a.graph});
  if (a.focal && !runner.manifest().has_input("focal"))
    std::fprintf(stderr, "depthpack_run: warning: --focal ignored: these packages take no focal input (a model without canonical_focal)\n");
  if (!a.check.empty() && !report_check(runner, a.check)) return 1;
  if (!a.image.empty()) predict_image(runner, a);
  if (!a.raw.empty() || !a.video.empty() || !a.images.empty()) frame_loop(runner, a);
  if (a.bench) print_bench(runner, a.bench);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::fprintf(stderr, "depthpack_run: error: %s\n", what.substr(0, what.find('\n')).c_str());
  }
  return 1;
}
