// The dashboard's live view (GET /v1/events, docs/dashboard.md): what the core has committed, as Server-Sent
// Events. A `snapshot` event carries everything a viewer sees; each `delta` event what changed since the last
// refresh. Builds the text only (no sockets: admin_http.cpp sends it). Internal to the manager; owner thread.
#pragma once

#include <accelpool/manager/clock.hpp>
#include <accelpool/manager/core.hpp>

#include <boost/json/object.hpp>

#include <cstdint>
#include <map>
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
  // The window of the statistics (JCT, wait) each event carries, in seconds.
  static constexpr double kStatsWindowS = 300;

  EventStream(PoolCore& core, const Clock& clock);

  // Reads what the core holds now (call it after a commit, so it is what was committed) and works out what
  // changed since the last refresh: the next delta() says that. O(devices + hosts + queue).
  void refresh();
  // The SSE `snapshot` event for `viewer`: everything it sees as of the last refresh.
  std::string snapshot(const Viewer& viewer) const;
  // The SSE `delta` event for `viewer`: what the last refresh changed that it sees, and the pool's totals.
  // Built once per tenant per refresh, however many watch.
  std::string delta(const Viewer& viewer) const;

 private:
  struct Changes {
    std::vector<std::string> devices, hosts;  // upserted (present) or removed (absent now)
    std::vector<std::uint64_t> leases;        // live leases upserted or no longer live
    std::map<std::uint64_t, std::string> gone_tenant;  // the tenants of the leases no longer live
    std::vector<boost::json::object> ended;   // leases that ended since the last refresh
    bool queue = false;
  };
  boost::json::object summary(const Viewer& viewer) const;
  boost::json::array queue_json(const Viewer& viewer) const;
  boost::json::object device_for(const Viewer& viewer, const boost::json::object& device) const;
  bool sees_lease(const Viewer& viewer, std::uint64_t id) const;

  PoolCore& core_;
  const Clock& clock_;
  std::uint64_t sequence_ = 0;
  std::map<std::string, boost::json::object> devices_, hosts_;
  std::map<std::uint64_t, boost::json::object> live_;  // granted and revoking leases
  std::map<std::uint64_t, std::string> live_tenant_;
  std::vector<Lease> queue_;  // every waiting lease, in policy order
  std::string policy_;
  boost::json::object counters_, stats_;
  std::size_t queue_length_ = 0;
  double now_ = 0;
  Changes changes_;
  mutable std::map<std::string, std::string> delta_cache_;  // by tenant ("" admin), for the last refresh
};

}  // namespace accelpool::manager
