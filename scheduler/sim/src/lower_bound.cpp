#include <accelpool/sim/lower_bound.hpp>

#include <algorithm>
#include <functional>
#include <queue>
#include <vector>

namespace accelpool::sim {

double lower_bound_avg_jct(const Trace& trace, std::uint64_t devices) {
  const std::size_t n = trace.jobs.size();
  if (n == 0 || devices == 0) return 0;
  const double speed = static_cast<double>(devices);

  struct Arrival {
    double at;
    double size;  // seconds on the fast machine: devices x runtime / N
  };
  std::vector<Arrival> arrivals;
  arrivals.reserve(n);
  double sum_runtime = 0;
  for (const Job& j : trace.jobs) {
    arrivals.push_back({j.arrival_s, static_cast<double>(j.devices) * j.runtime_s / speed});
    sum_runtime += j.runtime_s;
  }
  std::sort(arrivals.begin(), arrivals.end(),
            [](const Arrival& a, const Arrival& b) { return a.at != b.at ? a.at < b.at : a.size < b.size; });

  // Preemptive SRPT on one machine: always run the job with the least remaining work. A job is preempted
  // only by an arrival, so each job is pushed and popped at most twice per arrival that interrupts it:
  // O(n log n) in all. The heap holds (remaining, arrival time).
  using Item = std::pair<double, double>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  double now = 0;
  double sum_jct = 0;
  std::size_t next = 0;
  while (next < n || !ready.empty()) {
    if (ready.empty()) now = std::max(now, arrivals[next].at);
    while (next < n && arrivals[next].at <= now) {
      ready.push({arrivals[next].size, arrivals[next].at});
      ++next;
    }
    auto [remaining, at] = ready.top();
    ready.pop();
    const double finish = now + remaining;
    if (next < n && arrivals[next].at < finish) {
      // Run until the next arrival, then choose again.
      const double ran = arrivals[next].at - now;
      now = arrivals[next].at;
      ready.push({remaining - ran, at});
    } else {
      now = finish;
      sum_jct += finish - at;
    }
  }
  const double mean_srpt = sum_jct / static_cast<double>(n);
  const double mean_runtime = sum_runtime / static_cast<double>(n);
  return std::max(mean_srpt, mean_runtime);
}

}  // namespace accelpool::sim
