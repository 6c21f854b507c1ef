// accelpool-sim-bench: replays a large synthetic trace (default 1,000,000 requests on 10,000 devices at
// offered load 0.9) under several policies and prints wall seconds and peak resident memory per policy.
// Each run is a child process so that its peak memory is its own. Each policy runs --repeat times (default 3)
// and the row shows the median wall time and the fastest and slowest: on a shared machine single runs of the
// same work vary by a third.
//
// Usage: accelpool-sim-bench [--jobs N] [--devices D] [--load X] [--policy a,b,c] [--seed S] [--repeat R]
#include <accelpool/sim/lower_bound.hpp>
#include <accelpool/sim/simulator.hpp>
#include <accelpool/sim/trace.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace sim = accelpool::sim;
namespace sch = accelpool::scheduler;

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "accelpool-sim-bench: %s\nusage: accelpool-sim-bench [--jobs N] [--devices D] [--load X] "
               "[--policy a,b,c] [--seed S] [--repeat R]\n",
               why);
  return 2;
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t jobs = 1'000'000;
  std::uint32_t devices = 10'000;
  double load = 0.9;
  std::uint64_t seed = 1;
  unsigned repeat = 3;
  std::string policies = "fifo,sjf,las,srpt,fifo+affinity";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    if (a == "--jobs") {
      jobs = std::strtoull(v, &end, 10);
    } else if (a == "--devices") {
      devices = static_cast<std::uint32_t>(std::strtoul(v, &end, 10));
    } else if (a == "--load") {
      load = std::strtod(v, &end);
    } else if (a == "--seed") {
      seed = std::strtoull(v, &end, 10);
    } else if (a == "--repeat") {
      repeat = static_cast<unsigned>(std::strtoul(v, &end, 10));
    } else if (a == "--policy") {
      policies = v;
      end = const_cast<char*>(v) + policies.size();
    } else {
      return usage(("unknown flag " + a).c_str());
    }
    if (end == v || *end != '\0') return usage(("bad value for " + a).c_str());
  }
  if (jobs == 0 || devices == 0 || !(load > 0) || repeat == 0) {
    return usage("--jobs, --devices, --load and --repeat must be positive");
  }

  std::vector<sch::PolicySpec> specs;
  {
    std::stringstream ss(policies);
    std::string item;
    while (std::getline(ss, item, ',')) {
      std::string error;
      auto spec = sch::PolicySpec::parse(item, &error);
      if (!spec) return usage(("--policy " + item + ": " + error).c_str());
      specs.push_back(*spec);
    }
  }

  // Mostly single-device jobs with some gangs, heavy-tailed (lognormal, sigma 2) run times so that queues
  // build up even on a large pool, 8 bitstreams with Zipf popularity.
  sim::GeneratorSpec gen;
  gen.jobs = jobs;
  gen.runtime = sim::RuntimeDist::lognormal;
  gen.lognormal_sigma = 2.0;
  gen.mean_runtime_s = 600;
  gen.gang_sizes = {1, 2, 4, 8};
  gen.gang_weights = {0.7, 0.15, 0.1, 0.05};
  gen.bitstreams = 8;
  gen.zipf_s = 1.0;
  gen.tenants = 16;
  const auto t0 = std::chrono::steady_clock::now();
  auto trace = sim::generate_trace(gen, seed);
  if (!trace) return usage(trace.error().message.c_str());
  if (auto st = sim::rescale_load(*trace, devices, load); !st) return usage(st.error().message.c_str());
  sim::apply_estimates(*trace, {sim::EstimateSpec::Mode::oracle, 0}, seed);
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const sim::PoolSpec pool = sim::PoolSpec::homogeneous(devices, 5.0, 0.0);
  const double lower_bound = sim::lower_bound_avg_jct(*trace, devices);
  std::printf("%zu requests on %u devices, offered load %.2f, trace generated in %.2f s (peak RSS %.0f MiB)\n", jobs,
              devices, sim::offered_load(*trace, devices), gen_s, peak_rss_mib());
  std::printf("%-16s %8s %13s %8s %10s %10s %10s %12s %10s\n", "policy", "wall s", "(min-max)", "cpu s", "peak MiB",
              "events", "max wait", "avg JCT s", "preempt");
  std::fflush(stdout);

  // What a child reports through its pipe.
  struct Sample {
    double wall = 0, cpu = 0, peak_mib = 0, avg_jct_s = 0;
    unsigned long long events = 0, max_waiting = 0, preemptions = 0;
  };
  auto run_child = [&](const sch::PolicySpec& spec) -> std::optional<Sample> {
    int fds[2];
    if (pipe(fds) != 0) return std::nullopt;
    const pid_t pid = fork();
    if (pid < 0) return std::nullopt;
    if (pid == 0) {
      close(fds[0]);
      sim::SimOptions options;
      options.lower_bound_avg_jct_s = lower_bound;
      options.keep_per_job = false;  // what accelpool-sim does without --csv and --plot
      const double cpu0 = cpu_seconds();
      const auto start = std::chrono::steady_clock::now();
      auto r = sim::simulate(*trace, pool, spec, options);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!r) {
        std::fprintf(stderr, "%s: %s\n", spec.to_string().c_str(), r.error().message.c_str());
        std::_Exit(1);
      }
      Sample out{wall, cpu_seconds() - cpu0, peak_rss_mib(), r->avg_jct_s, r->events, r->max_waiting, r->preemptions};
      const bool sent = write(fds[1], &out, sizeof out) == static_cast<ssize_t>(sizeof out);
      std::_Exit(sent ? 0 : 1);
    }
    close(fds[1]);
    Sample in;
    const bool got = read(fds[0], &in, sizeof in) == static_cast<ssize_t>(sizeof in);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
    return in;
  };

  int status_all = 0;
  for (const auto& spec : specs) {
    std::vector<Sample> samples;
    for (unsigned k = 0; k < repeat; ++k) {
      if (auto s = run_child(spec)) samples.push_back(*s);
    }
    if (samples.size() != repeat) {
      std::printf("%-16s failed\n", spec.to_string().c_str());
      status_all = 1;
      continue;
    }
    std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.wall < b.wall; });
    const Sample& med = samples[samples.size() / 2];
    double peak = 0;
    for (const auto& s : samples) peak = std::max(peak, s.peak_mib);
    char range[32];
    std::snprintf(range, sizeof range, "(%.2f-%.2f)", samples.front().wall, samples.back().wall);
    std::printf("%-16s %8.2f %13s %8.2f %10.0f %10llu %10llu %12.1f %10llu\n", spec.to_string().c_str(), med.wall,
                range, med.cpu, peak, med.events, med.max_waiting, med.avg_jct_s, med.preemptions);
    std::fflush(stdout);
  }
  return status_all;
}
