// stats.h: the latency summaries of depthpack.runtime.graphs.summarize: the median, and the
// nearest-rank percentile (the smallest value with at least q of the values at or below it).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace depthpack {

inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q * double(v.size())) - 1;
  return v[size_t(std::clamp(rank, 0.0, double(v.size() - 1)))];
}

inline double median(std::vector<double> v) {  // as Python's statistics.median
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace depthpack
