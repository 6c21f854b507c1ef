#include <accelpool/sim/report.hpp>

#include "svg.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>

namespace accelpool::sim {

namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

Status write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (!out) return make_error(Errc::io_error, "cannot write " + path.string() + ": " + std::strerror(errno));
  return Status::ok();
}

}  // namespace

double round_sig(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return std::strtod(buf, nullptr);
}

void write_table(std::ostream& out, const RunMeta& meta, const std::vector<RunResult>& runs) {
  if (!runs.empty()) {
    out << "trace " << meta.trace << ": " << runs.front().jobs << " jobs on " << runs.front().devices
        << " devices, offered load " << fixed(meta.load, 3) << ", estimates " << meta.estimates << ", seed "
        << meta.seed << "\nlower bound on avg JCT: " << fixed(runs.front().lower_bound_avg_jct_s, 1) << " s\n\n";
  }
  std::size_t w = 6;
  for (const auto& r : runs) w = std::max(w, r.policy.size());
  auto pad = [](const std::string& s, std::size_t width) {
    return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
  };
  const std::string policy_head = "policy" + std::string(w - 6, ' ');
  out << policy_head << pad("avg JCT s", 12) << pad("/bound", 8) << pad("p50 JCT s", 12) << pad("p99 JCT s", 12)
      << pad("avg wait s", 12) << pad("p99 slow", 10) << pad("util", 7) << pad("reconfig", 10) << pad("preempt", 9)
      << pad("wall s", 8) << '\n';
  for (const auto& r : runs) {
    const double ratio = r.lower_bound_avg_jct_s > 0 ? r.avg_jct_s / r.lower_bound_avg_jct_s : 0;
    out << r.policy << std::string(w - r.policy.size(), ' ') << pad(fixed(r.avg_jct_s, 1), 12)
        << pad(fixed(ratio, 2), 8) << pad(fixed(r.p50_jct_s, 1), 12) << pad(fixed(r.p99_jct_s, 1), 12)
        << pad(fixed(r.avg_wait_s, 1), 12) << pad(fixed(r.p99_slowdown, 1), 10) << pad(fixed(r.utilization, 3), 7)
        << pad(std::to_string(r.reconfigurations), 10) << pad(std::to_string(r.preemptions), 9)
        << pad(fixed(r.wall_s, 2), 8) << '\n';
  }
}

void write_json(std::ostream& out, const RunMeta& meta, const std::vector<RunResult>& runs, bool wall_time) {
  nlohmann::ordered_json doc;
  doc["meta"] = {{"trace", meta.trace},
                 {"seed", meta.seed},
                 {"estimates", meta.estimates},
                 {"offered_load", round_sig(meta.load)}};
  doc["runs"] = nlohmann::ordered_json::array();
  for (const auto& r : runs) {
    nlohmann::ordered_json j;
    j["policy"] = r.policy;
    j["jobs"] = r.jobs;
    j["devices"] = r.devices;
    j["avg_jct_s"] = round_sig(r.avg_jct_s);
    j["p50_jct_s"] = round_sig(r.p50_jct_s);
    j["p95_jct_s"] = round_sig(r.p95_jct_s);
    j["p99_jct_s"] = round_sig(r.p99_jct_s);
    j["max_jct_s"] = round_sig(r.max_jct_s);
    j["avg_wait_s"] = round_sig(r.avg_wait_s);
    j["p99_wait_s"] = round_sig(r.p99_wait_s);
    j["avg_slowdown"] = round_sig(r.avg_slowdown);
    j["p99_slowdown"] = round_sig(r.p99_slowdown);
    j["utilization"] = round_sig(r.utilization);
    j["useful_utilization"] = round_sig(r.useful_utilization);
    j["reconfigurations"] = r.reconfigurations;
    j["preemptions"] = r.preemptions;
    j["makespan_s"] = round_sig(r.makespan_s);
    j["lower_bound_avg_jct_s"] = round_sig(r.lower_bound_avg_jct_s);
    j["avg_jct_over_bound"] = round_sig(r.lower_bound_avg_jct_s > 0 ? r.avg_jct_s / r.lower_bound_avg_jct_s : 0);
    j["max_waiting"] = r.max_waiting;
    j["wall_s"] = wall_time ? round_sig(r.wall_s) : 0.0;
    j["events"] = r.events;
    doc["runs"].push_back(std::move(j));
  }
  out << doc.dump(2) << '\n';
}

void write_csv(std::ostream& out, const std::vector<RunResult>& runs) {
  out << "policy,id,arrival_s,runtime_s,devices,first_start_s,finish_s,jct_s,wait_s,slowdown,reconfigurations,"
         "preemptions\n";
  for (const auto& r : runs) {
    for (const auto& j : r.per_job) {
      out << r.policy << ',' << j.id << ',' << fixed(j.arrival_s, 3) << ',' << fixed(j.runtime_s, 3) << ',' << j.devices
          << ',' << fixed(j.first_start_s, 3) << ',' << fixed(j.finish_s, 3) << ',' << fixed(j.jct_s, 3) << ','
          << fixed(j.wait_s, 3) << ',' << fixed(j.slowdown, 4) << ',' << j.reconfigurations << ',' << j.preemptions
          << '\n';
    }
  }
}

Status write_plots(const std::string& dir, const std::vector<RunResult>& runs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(Errc::io_error, "cannot create plot directory " + dir + ": " + ec.message());

  detail::Chart cdf;
  cdf.title = "JCT distribution";
  cdf.x_label = "job completion time (s, log scale)";
  cdf.y_label = "fraction of jobs";
  cdf.log_x = true;
  cdf.fixed_y = true;
  detail::Chart queue;
  queue.title = "Waiting requests over time";
  // Long runs read better in hours or days than in millions of seconds.
  double t_max = 0;
  for (const auto& r : runs) {
    if (!r.queue.empty()) t_max = std::max(t_max, r.queue.back().t);
  }
  const double unit = t_max > 4 * 86400.0 ? 86400.0 : t_max > 4 * 3600.0 ? 3600.0 : 1.0;
  queue.x_label = unit == 86400.0  ? "simulated time (days)"
                  : unit == 3600.0 ? "simulated time (hours)"
                                   : "simulated time (s)";
  queue.y_label = "waiting requests";
  for (const auto& r : runs) {
    std::vector<double> jct;
    jct.reserve(r.per_job.size());
    for (const auto& j : r.per_job) jct.push_back(j.jct_s);
    std::sort(jct.begin(), jct.end());
    detail::Series s{r.policy, {}, true, {}};
    // At most ~1000 points: the CDF at evenly spaced ranks, plus the last one.
    const std::size_t n = jct.size();
    const std::size_t stride = std::max<std::size_t>(1, n / 1000);
    for (std::size_t i = 0; i < n; i += stride) {
      s.points.emplace_back(jct[i], static_cast<double>(i + 1) / static_cast<double>(n));
    }
    if (n > 0 && (n - 1) % stride != 0) s.points.emplace_back(jct[n - 1], 1.0);
    cdf.series.push_back(std::move(s));

    detail::Series q{r.policy, {}, true, {}};
    for (const auto& p : r.queue) q.points.emplace_back(p.t / unit, static_cast<double>(p.waiting));
    queue.series.push_back(std::move(q));
  }
  const std::filesystem::path base(dir);
  if (auto st = write_file(base / "jct_cdf.svg", detail::render_svg(cdf)); !st) return st;
  return write_file(base / "queue.svg", detail::render_svg(queue));
}

}  // namespace accelpool::sim
