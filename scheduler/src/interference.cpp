#include <accelpool/scheduler/interference.hpp>

#include <algorithm>

namespace accelpool::scheduler {

ModelSet shapes_admitting(std::span<const double> shares, double capacity, double demand) {
  ModelSet set = 0;
  for (std::size_t m = 0; m < shares.size() && m < kMaxModelsPerKind; ++m) {
    if (demand <= shares[m] * capacity) set |= ModelSet{1} << m;
  }
  return set;
}

double slowdown(double total_demand, double capacity) {
  return capacity > 0 ? std::max(1.0, total_demand / capacity) : 1.0;
}

double slowdown_bound(std::span<const double> shares) {
  double sum = 0;
  for (double s : shares) sum += s;
  return std::max(1.0, sum);
}

}  // namespace accelpool::scheduler
