// ros2_node: how a ROS 2 node calls depthpack::Runner in its image callback. An EXAMPLE, deliberately
// NOT part of deploy_cpp/CMakeLists.txt: nothing in depthpack's C++ build requires ROS. Build it inside
// a colcon package where ROS 2 is installed (rclcpp, sensor_msgs), linking libdepthpack.a and libtorch
// as deploy_cpp/CMakeLists.txt does for robot_loop; docs/bags.md has the CMake lines.
//
//   ros2 run depthpack_ros ros2_node --ros-args -p manifest:=/opt/depthpack/cam/manifest.json
//       -r image:=/camera/color/image_raw -r camera_info:=/camera/color/camera_info   (one command line)
//
// It subscribes to a colour image (rgb8 or bgr8) and its CameraInfo, and publishes on "points" the
// same answers as `python -m depthpack.bag run`: sensor_msgs/PointCloud2, one point per query, float32
// fields u, v (the queried pixel, depthpack's convention: pixel (i, j) spans [i, i+1) x [j, j+1)),
// depth (meters), and x, y, z in the camera's optical frame from K (ROS puts pixel centres at integers,
// hence the 0.5). The header (stamp, frame_id) is the image's, so the answers line up with the frame.
// The queries are a 16x12 grid at cell centres; a real robot passes the pixels it cares about.
//
// Assumptions: one camera per Runner (a static-graph package runs one frame size); the callback runs
// on one thread (a Runner is not thread-safe: use a SingleThreadedExecutor or one Runner per
// callback group); the first frame of each size loads and captures its bucket (hundreds of ms on a
// GPU), so call predict once at start-up on a frame of the camera's size if that matters.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <rclcpp/rclcpp.hpp>
#include <sensor_msgs/msg/camera_info.hpp>
#include <sensor_msgs/msg/image.hpp>
#include <sensor_msgs/msg/point_cloud2.hpp>
#include <sensor_msgs/msg/point_field.hpp>

#include "runner.h"

namespace {

struct Intrinsics {
  double fx = 0, fy = 0, cx = 0, cy = 0;
  uint32_t width = 0, height = 0;
};

// A 16x12 grid of query points at cell centres of a w x h frame, as (x, y) pairs.
std::vector<float> grid(int64_t w, int64_t h, int cols = 16, int rows = 12) {
  std::vector<float> xy;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      xy.push_back((c + 0.5f) * float(w) / cols);
      xy.push_back((r + 0.5f) * float(h) / rows);
    }
  return xy;
}

sensor_msgs::msg::PointCloud2 cloud(const std_msgs::msg::Header& header, const std::vector<float>& xy,
                                    const std::vector<float>& depth, const std::optional<Intrinsics>& k) {
  static const char* names[] = {"u", "v", "depth", "x", "y", "z"};
  sensor_msgs::msg::PointCloud2 msg;
  msg.header = header;
  msg.height = 1;
  msg.width = uint32_t(depth.size());
  for (uint32_t i = 0; i < 6; ++i) {
    sensor_msgs::msg::PointField f;
    f.name = names[i];
    f.offset = 4 * i;
    f.datatype = sensor_msgs::msg::PointField::FLOAT32;
    f.count = 1;
    msg.fields.push_back(f);
  }
  msg.is_bigendian = false;
  msg.point_step = 24;
  msg.row_step = msg.point_step * msg.width;
  msg.data.resize(msg.row_step);
  const float nan = std::nanf("");
  bool dense = bool(k);
  for (size_t i = 0; i < depth.size(); ++i) {
    const float u = xy[2 * i], v = xy[2 * i + 1], z = depth[i];
    const float x = k ? float((u - 0.5 - k->cx) / k->fx * z) : nan;
    const float y = k ? float((v - 0.5 - k->cy) / k->fy * z) : nan;
    const float p[6] = {u, v, z, x, y, k ? z : nan};
    std::memcpy(msg.data.data() + i * 24, p, sizeof p);
    dense = dense && std::isfinite(z);
  }
  msg.is_dense = dense;
  return msg;
}

}  // namespace

class DepthpackNode : public rclcpp::Node {
 public:
  DepthpackNode() : Node("depthpack") {
    const std::string manifest = declare_parameter<std::string>("manifest", "");
    if (manifest.empty()) throw std::runtime_error("parameter 'manifest' (an export's manifest.json) is required");
    runner_ = std::make_unique<depthpack::Runner>(manifest);  // verifies the export; packages load on first use
    pub_ = create_publisher<sensor_msgs::msg::PointCloud2>("points", rclcpp::SensorDataQoS());
    info_sub_ = create_subscription<sensor_msgs::msg::CameraInfo>(
        "camera_info", rclcpp::SensorDataQoS(), [this](sensor_msgs::msg::CameraInfo::ConstSharedPtr m) {
          if (m->k[0] <= 0 || m->k[4] <= 0) return;  // an uncalibrated camera: no focal, no 3D points
          std::lock_guard<std::mutex> lock(mutex_);
          k_ = Intrinsics{m->k[0], m->k[4], m->k[2], m->k[5], m->width, m->height};
        });
    image_sub_ = create_subscription<sensor_msgs::msg::Image>(
        "image", rclcpp::SensorDataQoS(), [this](sensor_msgs::msg::Image::ConstSharedPtr m) { on_image(*m); });
  }

 private:
  void on_image(const sensor_msgs::msg::Image& m) {
    depthpack::Order order;
    if (m.encoding == "bgr8") order = depthpack::Order::BGR;
    else if (m.encoding == "rgb8") order = depthpack::Order::RGB;
    else {
      RCLCPP_ERROR_THROTTLE(get_logger(), *get_clock(), 5000, "encoding %s: depthpack takes rgb8 or bgr8",
                            m.encoding.c_str());
      return;
    }
    std::optional<Intrinsics> k;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      k = k_;
    }
    if (k && (k->width != m.width || k->height != m.height)) k.reset();  // a CameraInfo of another size: ignore it
    if (xy_.empty() || w_ != m.width || h_ != m.height) {
      w_ = m.width;
      h_ = m.height;
      xy_ = grid(w_, h_);
      depth_.assign(xy_.size() / 2, 0.0f);
    }
    // The image message's buffer is the frame: no copy, rows m.step bytes apart.
    const depthpack::Frame frame{m.data.data(), int64_t(m.height), int64_t(m.width), int64_t(m.step), order};
    std::optional<float> focal;
    if (k) focal = float(std::sqrt(k->fx * k->fy));  // in this frame's pixels, as the Runner wants it
    try {
      runner_->predict(frame, xy_.data(), int64_t(depth_.size()), depth_.data(), focal);
    } catch (const std::exception& e) {  // depthpack::Error: one line naming what is wrong
      RCLCPP_ERROR_THROTTLE(get_logger(), *get_clock(), 5000, "depthpack: %s", e.what());
      return;
    }
    pub_->publish(cloud(m.header, xy_, depth_, k));
  }

  std::unique_ptr<depthpack::Runner> runner_;
  rclcpp::Publisher<sensor_msgs::msg::PointCloud2>::SharedPtr pub_;
  rclcpp::Subscription<sensor_msgs::msg::CameraInfo>::SharedPtr info_sub_;
  rclcpp::Subscription<sensor_msgs::msg::Image>::SharedPtr image_sub_;
  std::mutex mutex_;
  std::optional<Intrinsics> k_;
  uint32_t w_ = 0, h_ = 0;
  std::vector<float> xy_, depth_;
};

int main(int argc, char** argv) {
  rclcpp::init(argc, argv);
  try {
    rclcpp::spin(std::make_shared<DepthpackNode>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ros2_node: error: %s\n", e.what());
    rclcpp::shutdown();
    return 1;
  }
  rclcpp::shutdown();
  return 0;
}
