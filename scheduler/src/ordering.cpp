// The ordering policies. Each rule is described in its class comment and in docs/policies.md.
#include <accelpool/scheduler/ordering.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>

namespace accelpool::scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Run time still expected of a request that has received `done_s` seconds of service; +inf without an
// estimate. An overrun estimate counts as "almost done" (0) rather than negative.
double remaining_s(const RequestView& r, double done_s) {
  if (!r.estimate_s) return kInf;
  return std::max(0.0, *r.estimate_s - done_s);
}

// fifo: first come, first served, by arrival time. Non-preemptive. Needs no estimate.
class Fifo final : public OrderingPolicy {
 public:
  std::string_view name() const override { return "fifo"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override { return {r.request.arrival, 0, r.request.id}; }
};

// sjf: shortest job first by the guest's run-time estimate; requests without one go last, in arrival
// order. Non-preemptive. Optimal for average JCT among non-preemptive orders on one machine when estimates
// are exact (Smith's rule with unit weights).
class Sjf final : public OrderingPolicy {
 public:
  std::string_view name() const override { return "sjf"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override {
    return {r.estimate_s.value_or(kInf), r.request.arrival, r.request.id};
  }
};

// srpt: shortest remaining processing time, preemptive. Remaining = estimate - service already received.
// A running lease's remaining time falls as it runs, so its victim order is its estimated finish time,
// which does not change while it runs. Optimal for average JCT on one machine (Schrage 1968).
class Srpt final : public OrderingPolicy {
 public:
  std::string_view name() const override { return "srpt"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override {
    return {remaining_s(r, r.attained_s), r.request.arrival, r.request.id};
  }
  bool preemptive() const override { return true; }
  PriorityKey running_key(const RequestView& r, Time now) const override {
    return {remaining_s(r, r.attained_s + (now - r.granted_at)), r.request.arrival, r.request.id};
  }
  PriorityKey victim_rank(const RequestView& r, Time) const override {
    // Estimated finish time: later finish = more remaining = preempted first.
    return {r.granted_at + remaining_s(r, r.attained_s), r.request.arrival, r.request.id};
  }
};

// las: least attained service, discretized (Tiresias' 2D-LAS). Service is measured in device-seconds
// (devices x time), so wide gangs age faster. Queue i holds requests whose attained service lies in
// [T(i-1), T(i)); lower queues go first, FIFO by arrival inside a queue. Preemptive across queues only, so
// jobs in one queue never preempt each other. Needs no estimate.
class Las final : public OrderingPolicy {
 public:
  explicit Las(std::vector<double> thresholds) : thresholds_(std::move(thresholds)) {}
  std::string_view name() const override { return "las"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override {
    return {static_cast<double>(queue_of(r.attained_device_s)), r.request.arrival, r.request.id};
  }
  bool preemptive() const override { return true; }
  PriorityKey running_key(const RequestView& r, Time now) const override {
    return {static_cast<double>(queue_of(attained_at(r, now))), r.request.arrival, r.request.id};
  }
  std::optional<Time> next_key_change(const RequestView& r, Time now) const override {
    const std::size_t queue = queue_of(attained_at(r, now));
    if (queue == thresholds_.size()) return std::nullopt;
    return r.granted_at + (thresholds_[queue] - r.attained_device_s) / r.request.count;
  }

 private:
  static double attained_at(const RequestView& r, Time now) {
    return r.attained_device_s + r.request.count * (now - r.granted_at);
  }
  // A lease reaches a threshold at a computed instant; the relative slack keeps rounding at that instant
  // from leaving it one ulp short of the next queue.
  std::size_t queue_of(double attained) const {
    const double slack = 1e-9 * std::max(1.0, attained);
    return static_cast<std::size_t>(std::upper_bound(thresholds_.begin(), thresholds_.end(), attained + slack) -
                                    thresholds_.begin());
  }
  std::vector<double> thresholds_;  // ascending device-seconds
};

// djsf: densest job set first. On the free devices, serve the set of waiting requests that completes the
// most jobs per unit time: maximize sum(1/estimate) subject to sum(devices) <= free devices. The greedy
// answer to that knapsack takes requests by density 1/(estimate x devices), i.e. smallest work first, and
// skips those that do not fit (the scheduler's backfilling). Non-preemptive; requests without an estimate
// go last.
class Djsf final : public OrderingPolicy {
 public:
  std::string_view name() const override { return "djsf"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override {
    const double work = r.estimate_s ? *r.estimate_s * r.request.count : kInf;
    return {work, r.request.arrival, r.request.id};
  }
};

// gittins: the Gittins index over the learned distribution of attained service (device-seconds, so gangs
// count), the order that minimizes the mean response time in a single-server queue among policies that do
// not know run times (Gittins 1989; Scully et al., "The Gittins Policy in the M/G/1 Queue", 2021). A request
// with more index goes first: it is the one whose next quantum of service is most likely to complete a job
// per device-second spent. Discretized to the estimator's octave bins (RuntimeHistogram::gittins_index),
// so the index of a running lease changes only when its attained service crosses a bin edge, a timed event
// like a LAS demotion. Without a warm distribution for a request, 1 / (upper edge of its attained bin): least
// attained service first. Preemptive (on a strictly higher index); ties by arrival.
// `gittins:Q` adds a minimum quantum: a lease keeps the index it was granted with for its first Q seconds, so it
// is not preempted before it has run Q seconds (0, the default: no quantum).
class Gittins final : public OrderingPolicy {
 public:
  static constexpr double kPreemptRatio = 2;
  explicit Gittins(double quantum_s = 0) : quantum_s_(quantum_s) {}
  std::string_view name() const override { return "gittins"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override {
    return {-index(r, r.attained_device_s), r.request.arrival, r.request.id};
  }
  bool preemptive() const override { return true; }
  // A running lease counts kPreemptRatio times its index: a waiting request preempts it only with a clearly
  // higher index, which keeps leases that cross bin edges together from being swapped back and forth.
  PriorityKey running_key(const RequestView& r, Time now) const override {
    return {-kPreemptRatio * index(r, counted_at(r, now)), r.request.arrival, r.request.id};
  }
  std::optional<Time> next_key_change(const RequestView& r, Time now) const override {
    const double edge = RuntimeHistogram::upper_edge(RuntimeHistogram::bin_of(counted_at(r, now)));
    if (!std::isfinite(edge)) return std::nullopt;
    return std::max(r.granted_at + quantum_s_, r.granted_at + (edge - r.attained_device_s) / r.request.count);
  }

 private:
  static double attained_at(const RequestView& r, Time now) {
    return r.attained_device_s + r.request.count * (now - r.granted_at);
  }
  // The service the index is taken at: what it had when granted during the quantum, its attained service after.
  double counted_at(const RequestView& r, Time now) const {
    return now < r.granted_at + quantum_s_ ? r.attained_device_s : attained_at(r, now);
  }
  double quantum_s_;
  static double index(const RequestView& r, double attained) {
    return r.learned ? r.learned->gittins_index(attained) : RuntimeHistogram::unknown_index(attained);
  }
};

// fair: long-term fairness across tenants (in the spirit of Astraea): the tenant with the least device-time
// used so far, divided by its weight, is served next; FIFO inside a tenant. Non-preemptive.
class Fair final : public OrderingPolicy {
 public:
  std::string_view name() const override { return "fair"; }
  PriorityKey waiting_key(const RequestView& r, Time) const override { return {r.request.arrival, 0, r.request.id}; }
  bool per_tenant() const override { return true; }
  double tenant_rank(const TenantLedger& ledger, TenantId tenant, Time now) const override {
    return ledger.usage(tenant, now) / ledger.weight(tenant);
  }
};

// Parses "A/B/C" into ascending positive numbers.
std::optional<std::vector<double>> parse_thresholds(std::string_view text, std::string* error) {
  std::vector<double> out;
  while (!text.empty()) {
    const auto slash = text.find('/');
    const auto part = text.substr(0, slash);
    double v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc{} || ptr != part.data() + part.size() || !(v > 0) || !std::isfinite(v) ||
        (!out.empty() && v <= out.back())) {
      if (error)
        *error =
            "las thresholds must be ascending positive device-seconds like 3600/36000, got '" + std::string(part) + "'";
      return std::nullopt;
    }
    out.push_back(v);
    text = slash == std::string_view::npos ? std::string_view{} : text.substr(slash + 1);
  }
  if (out.empty()) {
    if (error) *error = "las thresholds are empty";
    return std::nullopt;
  }
  return out;
}

constexpr std::array<std::string_view, 7> kNames{"fifo", "sjf", "srpt", "las", "djsf", "fair", "gittins"};

}  // namespace

void TenantLedger::set_weight(TenantId tenant, double weight) { account(tenant).weight = weight; }

double TenantLedger::weight(TenantId tenant) const {
  return tenant < accounts_.size() ? accounts_[tenant].weight : 1.0;
}

double TenantLedger::usage(TenantId tenant, Time now) const {
  if (tenant >= accounts_.size()) return 0;
  const Account& a = accounts_[tenant];
  return a.used + a.running * (now - a.since);
}

void TenantLedger::lease_started(TenantId tenant, std::uint32_t devices, Time now) {
  Account& a = account(tenant);
  a.used = usage(tenant, now);
  a.since = now;
  a.running += devices;
}

void TenantLedger::lease_stopped(TenantId tenant, std::uint32_t devices, Time now) {
  Account& a = account(tenant);
  a.used = usage(tenant, now);
  a.since = now;
  a.running -= std::min(a.running, devices);
}

TenantLedger::Account& TenantLedger::account(TenantId tenant) {
  if (tenant >= accounts_.size()) accounts_.resize(tenant + 1);
  return accounts_[tenant];
}

std::unique_ptr<OrderingPolicy> make_ordering(std::string_view spec, std::string* error) {
  const auto colon = spec.find(':');
  const auto name = spec.substr(0, colon);
  const auto options = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  auto no_options = [&](std::unique_ptr<OrderingPolicy> p) -> std::unique_ptr<OrderingPolicy> {
    if (colon != std::string_view::npos) {
      if (error) *error = "ordering '" + std::string(name) + "' takes no options, got '" + std::string(spec) + "'";
      return nullptr;
    }
    return p;
  };
  if (name == "fifo") return no_options(std::make_unique<Fifo>());
  if (name == "sjf") return no_options(std::make_unique<Sjf>());
  if (name == "srpt") return no_options(std::make_unique<Srpt>());
  if (name == "djsf") return no_options(std::make_unique<Djsf>());
  if (name == "fair") return no_options(std::make_unique<Fair>());
  if (name == "gittins") {
    if (colon == std::string_view::npos) return std::make_unique<Gittins>();
    double quantum = 0;
    auto [ptr, ec] = std::from_chars(options.data(), options.data() + options.size(), quantum);
    if (options.empty() || ec != std::errc() || ptr != options.data() + options.size() || !std::isfinite(quantum) ||
        quantum < 0) {
      if (error) *error = "gittins:QUANTUM needs a number of seconds >= 0, got '" + std::string(options) + "'";
      return nullptr;
    }
    return std::make_unique<Gittins>(quantum);
  }
  if (name == "las") {
    if (colon == std::string_view::npos) return std::make_unique<Las>(std::vector<double>{3600, 36000, 360000});
    auto thresholds = parse_thresholds(options, error);
    if (!thresholds) return nullptr;
    return std::make_unique<Las>(std::move(*thresholds));
  }
  if (error) {
    *error = "unknown ordering '" + std::string(name) + "' (known:";
    for (auto n : kNames) *error += " " + std::string(n);
    *error += ")";
  }
  return nullptr;
}

std::span<const std::string_view> ordering_names() { return kNames; }

}  // namespace accelpool::scheduler
