#include "metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <unordered_set>

namespace accelpool::manager {

namespace {
const prometheus::Histogram::BucketBoundaries kSeconds = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5,  1,     5,
                                                          10,    30,    60,   300,  900, 3600, 14400, 86400};
}

// Label values of one label (tenant, bitstream): the first `max` distinct ones keep their name, later ones are
// "other", so a scrape stays bounded however many tenants or bitstreams come and go.
class BoundedLabel {
 public:
  explicit BoundedLabel(std::size_t max) : max_(max) {}
  const std::string& value(const std::string& name) {
    static const std::string kOther = "other";
    if (auto it = kept_.find(name); it != kept_.end()) return *it;
    if (kept_.size() >= max_) return kOther;
    return *kept_.insert(name).first;
  }

 private:
  std::size_t max_;
  std::unordered_set<std::string> kept_;
};

struct Metrics::Impl {
  const PoolCore& core;
  BoundedLabel tenants, bitstreams;
  prometheus::Registry registry;
  prometheus::Gauge& queue_length;
  prometheus::Family<prometheus::Gauge>& devices;
  prometheus::Family<prometheus::Gauge>& leases;
  prometheus::Counter& grants;
  prometheus::Counter& reprogrammings;
  prometheus::Counter& preemptions;
  prometheus::Counter& expirations;
  prometheus::Family<prometheus::Histogram>& wait;
  prometheus::Family<prometheus::Histogram>& jct;
  prometheus::Family<prometheus::Histogram>& commits;
  Counters seen;

  Impl(const PoolCore& c, std::size_t max_label_values)
      : core(c),
        tenants(max_label_values),
        bitstreams(max_label_values),
        queue_length(prometheus::BuildGauge()
                         .Name("accelpool_queue_length")
                         .Help("Requests waiting for devices")
                         .Register(registry)
                         .Add({})),
        devices(prometheus::BuildGauge().Name("accelpool_devices").Help("Devices by state").Register(registry)),
        leases(prometheus::BuildGauge()
                   .Name("accelpool_leases")
                   .Help("Leases by state (ended ones: those still in memory)")
                   .Register(registry)),
        grants(prometheus::BuildCounter()
                   .Name("accelpool_grants_total")
                   .Help("Leases granted (a requeued lease counts again)")
                   .Register(registry)
                   .Add({})),
        reprogrammings(prometheus::BuildCounter()
                           .Name("accelpool_reprogrammings_total")
                           .Help("Devices programmed with another bitstream for a grant")
                           .Register(registry)
                           .Add({})),
        preemptions(prometheus::BuildCounter()
                        .Name("accelpool_preemptions_total")
                        .Help("Leases preempted by the scheduler")
                        .Register(registry)
                        .Add({})),
        expirations(prometheus::BuildCounter()
                        .Name("accelpool_expirations_total")
                        .Help("Leases reclaimed after their guest stopped heartbeating")
                        .Register(registry)
                        .Add({})),
        wait(prometheus::BuildHistogram()
                 .Name("accelpool_wait_seconds")
                 .Help("Time from acquire to first grant, by tenant and bitstream")
                 .Register(registry)),
        jct(prometheus::BuildHistogram()
                .Name("accelpool_jct_seconds")
                .Help("Job completion time: acquire to release, by tenant and bitstream")
                .Register(registry)),
        commits(prometheus::BuildHistogram()
                    .Name("accelpool_store_commit_seconds")
                    .Help("Store transactions: from taking the pending changes to durable, by the thread that wrote "
                          "them (owner: quick ones; writer: slow ones, written while the owner serves on)")
                    .Register(registry)) {}

  // The histogram of `family` for the lease's tenant and bitstream (bounded label values).
  prometheus::Histogram& of(prometheus::Family<prometheus::Histogram>& family, const Lease& lease) {
    return family.Add({{"tenant", tenants.value(lease.tenant)}, {"bitstream", bitstreams.value(lease.bitstream)}},
                      kSeconds);
  }
};

Metrics::Metrics(const PoolCore& core, std::size_t max_label_values)
    : impl_(std::make_unique<Impl>(core, max_label_values)) {}
Metrics::~Metrics() = default;

void Metrics::lease_event(const Lease& lease, LeaseEvent event) {
  if (event == LeaseEvent::granted && lease.preemptions == 0 && lease.granted_at == lease.first_granted_at) {
    impl_->of(impl_->wait, lease).Observe(lease.first_granted_at - lease.created_at);
  } else if (event == LeaseEvent::ended && lease.state == LeaseState::released) {
    impl_->of(impl_->jct, lease).Observe(lease.ended_at - lease.created_at);
  }
}

void Metrics::commit_written(double seconds, bool on_writer) {
  static const prometheus::Histogram::BucketBoundaries kCommitSeconds{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                                      0.01,   0.025,   0.05,   0.1,   0.25,   1};
  impl_->commits.Add({{"written_on", on_writer ? "writer" : "owner"}}, kCommitSeconds).Observe(seconds);
}

std::string Metrics::scrape() {
  auto& m = *impl_;
  m.queue_length.Set(static_cast<double>(m.core.queue_length()));
  for (const auto& [state, n] : m.core.devices_by_state())
    m.devices.Add({{"state", state}}).Set(static_cast<double>(n));
  for (const auto& [state, n] : m.core.leases_by_state()) m.leases.Add({{"state", state}}).Set(static_cast<double>(n));
  Counters c = m.core.counters();
  m.grants.Increment(static_cast<double>(c.grants - m.seen.grants));
  m.reprogrammings.Increment(static_cast<double>(c.reprogrammings - m.seen.reprogrammings));
  m.preemptions.Increment(static_cast<double>(c.preemptions - m.seen.preemptions));
  m.expirations.Increment(static_cast<double>(c.expirations - m.seen.expirations));
  m.seen = c;
  prometheus::TextSerializer serializer;
  return serializer.Serialize(m.registry.Collect());
}

}  // namespace accelpool::manager
