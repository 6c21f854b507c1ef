// Prometheus metrics of the pool (prometheus-cpp registry and text serializer). Internal to the manager.
#pragma once

#include <accelpool/manager/core.hpp>

#include <memory>
#include <string>

namespace accelpool::manager {

class Metrics final : public CoreListener {
 public:
  // Histograms are labelled by tenant and bitstream: the first `max_label_values` distinct tenants (and, apart,
  // bitstreams) seen keep their name as label value, later ones share "other"; a lease of any image has bitstream "".
  explicit Metrics(const PoolCore& core, std::size_t max_label_values = kDefaultMaxLabelValues);
  ~Metrics() override;
  static constexpr std::size_t kDefaultMaxLabelValues = 32;
  // Observes waits (first grant) and JCTs (release). Owner thread.
  void lease_event(const Lease& lease, LeaseEvent event) override;
  // Observes one transaction of the store: from the moment the pending changes were taken until they were durable
  // (what the replies held for it waited for), and whether it was written on the owner thread or on the store
  // writer's (StoreWriter). Owner thread.
  void commit_written(double seconds, bool on_writer);
  // The exposition text (Prometheus text format 0.0.4), with gauges read from the core now. Owner thread.
  std::string scrape();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
