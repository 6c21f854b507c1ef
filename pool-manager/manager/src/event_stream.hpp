// The dashboard's live view (GET /v1/events, docs/dashboard.md): what the core has committed, as Server-Sent
// Events. A `snapshot` event carries everything a viewer sees; each `delta` event what changed since the last
// refresh. Builds the text only (no sockets: admin_http.cpp sends it). Internal to the manager; owner thread.
//
// The cost follows what commits change, not the size of the pool: the daemon hands over what each commit touched
// (PoolCore::take_touched) and only those devices, hosts and leases are read again, each kept as its JSON text.
// Reading is done in slices of bounded size (work()), so a large change or the first load of a large pool never
// holds the owner thread for long; a snapshot is a concatenation of the texts kept.
#pragma once

#include <accelpool/manager/clock.hpp>
#include <accelpool/manager/core.hpp>

#include <boost/json/object.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace accelpool::manager {

// Who watches. An admin sees the whole pool. A tenant sees the devices and hosts (without other tenants' lease
// ids), its own leases and its own queue entries (with their places in the whole queue), the pool's totals and
// its own statistics.
struct Viewer {
  std::string tenant;  // "" : an admin
  bool admin() const { return tenant.empty(); }
};

class EventStream {
 public:
  // The queue entries an event shows at most (the first ones in policy order); the total is always sent.
  static constexpr std::size_t kQueueShown = 200;
  // How far into the queue a tenant's own entries are looked for (the rest: GET /v1/queue, paged).
  static constexpr std::size_t kQueueScanned = 2000;
  // The window of the statistics (JCT, wait) each event carries, in seconds.
  static constexpr double kStatsWindowS = 300;

  EventStream(PoolCore& core, const Clock& clock);

  // The first watcher came: the whole pool is to be read (by work(), in slices). Idempotent while active.
  void start();
  // Nobody watches: forget everything and ignore note() until the next start().
  void stop();
  bool active() const { return active_; }
  // What a commit touched (PoolCore::take_touched), to be read again by work(). Ignored while stopped.
  void note(PoolCore::Touched touched);
  // Reads at most about `budget` devices, hosts or leases of what is still to read; true when nothing is left (then
  // refresh() may follow). O(budget) plus the devices of a touched host.
  bool work(std::size_t budget);
  // Closes what work() read since the last refresh into the next delta, and reads the pool's totals, statistics
  // and the head of the queue (O(waiting) for the queue order, O(samples in the window) for the statistics).
  void refresh();
  // The SSE `snapshot` event for `viewer`: everything it sees. Built once per tenant per refresh (O(bytes of the
  // pool's view)) and shared by the watchers that take it.
  std::shared_ptr<const std::string> snapshot(const Viewer& viewer) const;
  // The SSE `delta` event for `viewer`: what the last refresh changed that it sees, and the pool's totals.
  // Built once per tenant per refresh, however many watch.
  std::string delta(const Viewer& viewer) const;

 private:
  // A device's JSON as an admin sees it and, where it holds a lease, as the lease's tenant's others see it.
  struct DeviceText {
    std::string admin, anonymous;  // anonymous: "" when the device holds no lease
    std::optional<LeaseId> lease;
  };
  struct LiveLease {
    std::string tenant, text;
  };
  struct Changes {
    std::set<std::string> devices, hosts;        // upserted (present) or removed (absent now)
    std::set<LeaseId> leases;                    // live leases upserted or no longer live
    std::map<LeaseId, std::string> gone_tenant;  // the tenants of the leases no longer live
    std::vector<LiveLease> ended;                // leases that ended since the last refresh
    bool queue = false;
  };
  void read_lease(LeaseId id);
  void read_device(const std::string& name);
  void put_device(const DeviceView& view);
  void read_host(const std::string& name);
  boost::json::object summary(const Viewer& viewer) const;
  std::string queue_text(const Viewer& viewer) const;
  const std::string& device_text(const Viewer& viewer, const DeviceText& device) const;
  bool sees_lease(const Viewer& viewer, LeaseId id) const;

  PoolCore& core_;
  const Clock& clock_;
  bool active_ = false;
  // The first load, hosts then devices, a page at a time: the cursor of the next page ("" : from the first).
  std::optional<std::string> load_hosts_after_, load_devices_after_;
  std::set<std::string> pending_devices_, pending_hosts_;
  std::set<LeaseId> pending_leases_;
  std::uint64_t sequence_ = 0;
  std::map<std::string, DeviceText> devices_;
  std::set<std::string> holding_;  // devices (or devices with a slot) on hold, as last read
  std::map<std::string, std::string> hosts_;
  std::map<LeaseId, LiveLease> live_;  // granted and revoking leases
  std::vector<Lease> queue_;           // the first kQueueScanned waiting leases, in policy order
  std::string policy_;
  boost::json::object counters_, stats_;
  std::size_t queue_length_ = 0;
  double now_ = 0;
  Changes changes_;                                         // since the last refresh (being gathered by work())
  Changes sealed_;                                          // of the last refresh: what delta() sends
  mutable std::map<std::string, std::string> delta_cache_;  // by tenant ("" admin), for the last refresh
  mutable std::map<std::string, std::shared_ptr<const std::string>> snapshot_cache_;  // the same for snapshots
};

}  // namespace accelpool::manager
