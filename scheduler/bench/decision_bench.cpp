// accelpool-decision-bench: how long one scheduling decision takes on a full pool with a long queue.
//
// Fills a pool of D devices (8 per host, network-attached) with running single-device leases, queues W
// requests (gang sizes 1/2/4/8, estimates, 16 bitstreams, 16 tenants), then times E events, alternating a
// lease ending (which makes the scheduler pick the next requests) and a new request arriving (which may
// preempt). Prints per-event latency percentiles for each policy. A benchmark, not a test.
//
//   accelpool-decision-bench [--devices D] [--waiting W] [--events E] [--policy a,b,...]
#include <accelpool/scheduler/scheduler.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace accelpool::scheduler;

namespace {

struct Options {
  std::uint32_t devices = 10000;
  std::uint32_t waiting = 100000;
  std::uint32_t events = 100000;
  std::vector<std::string> policies{
      "fifo", "sjf", "srpt", "las", "djsf", "fair", "fifo+affinity", "fifo+pack", "las+affinity+guard=3600"};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!value) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      std::exit(2);
    }
    if (flag == "--devices")
      o.devices = static_cast<std::uint32_t>(std::stoul(value));
    else if (flag == "--waiting")
      o.waiting = static_cast<std::uint32_t>(std::stoul(value));
    else if (flag == "--events")
      o.events = static_cast<std::uint32_t>(std::stoul(value));
    else if (flag == "--policy") {
      o.policies.clear();
      std::stringstream list(value);
      for (std::string p; std::getline(list, p, ',');) o.policies.push_back(p);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
    ++i;
  }
  return o;
}

class RequestMaker {
 public:
  explicit RequestMaker(std::uint64_t seed) : rng_(seed) {}
  Request next(Time now) {
    static constexpr std::uint32_t kGangs[] = {1, 1, 1, 1, 1, 1, 2, 2, 4, 8};
    Request r;
    r.id = next_id_++;
    r.arrival = now;
    r.count = kGangs[rng_() % 10];
    r.bitstream = static_cast<BitstreamId>(rng_() % 16);
    r.tenant = static_cast<TenantId>(rng_() % 16);
    r.estimate_s = std::exponential_distribution<double>(1.0 / 3600)(rng_);
    return r;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  RequestId next_id_ = 0;
};

double percentile(std::vector<double>& v, double p) {
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

void run(const Options& o, const std::string& policy) {
  std::string error;
  auto spec = PolicySpec::parse(policy, &error);
  if (!spec) {
    std::fprintf(stderr, "%s\n", error.c_str());
    std::exit(2);
  }
  auto s = Scheduler::create(*spec, &error);
  Decisions out;
  for (DeviceId id = 0; id < o.devices; ++id) {
    (void)s->add_device(Device{.id = id,
                               .host = id / 8,
                               .kind = 0,
                               .attach = AttachMode::network,
                               .loaded = static_cast<BitstreamId>(id % 16)},
                        0, out);
  }
  RequestMaker maker(42);
  Time now = 0;
  std::vector<RequestId> running;
  // Fill every device with a single-device lease, then queue the waiting requests.
  for (std::uint32_t i = 0; i < o.devices; ++i) {
    Request r = maker.next(now);
    r.count = 1;
    out = {};
    (void)s->submit(r, now, out);
    running.push_back(r.id);
  }
  for (std::uint32_t i = 0; i < o.waiting; ++i) {
    out = {};
    (void)s->submit(maker.next(now), now, out);
  }
  std::vector<double> latency_us;
  latency_us.reserve(o.events);
  std::uint64_t grants = 0, preemptions = 0;
  for (std::uint32_t i = 0; i < o.events; ++i) {
    now += 0.01;
    out = {};
    const auto start = std::chrono::steady_clock::now();
    if (i % 2 == 0 && !running.empty()) {
      const std::size_t pick = maker.rng()() % running.size();
      const RequestId id = running[pick];
      running[pick] = running.back();
      running.pop_back();
      (void)s->release(id, now, out);
    } else {
      (void)s->submit(maker.next(now), now, out);
    }
    // Preempted leases give their devices back at once, as in the simulator.
    for (std::size_t p = 0; p < out.preemptions.size(); ++p) (void)s->requeue(out.preemptions[p].request, now, out);
    const auto stop = std::chrono::steady_clock::now();
    latency_us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    for (const auto& g : out.grants) running.push_back(g.request);
    grants += out.grants.size();
    preemptions += out.preemptions.size();
  }
  const double p50 = percentile(latency_us, 0.50);
  const double p99 = percentile(latency_us, 0.99);
  const double max = *std::max_element(latency_us.begin(), latency_us.end());
  std::printf("%-26s %9.2f %9.2f %10.1f %9zu %8llu %8llu\n", policy.c_str(), p50, p99, max, s->waiting_count(),
              static_cast<unsigned long long>(grants), static_cast<unsigned long long>(preemptions));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("devices %u, waiting %u, events %u (half lease ends, half arrivals)\n", o.devices, o.waiting, o.events);
  std::printf("%-26s %9s %9s %10s %9s %8s %8s\n", "policy", "p50_us", "p99_us", "max_us", "waiting", "grants",
              "preempt");
  for (const auto& p : o.policies) run(o, p);
}
