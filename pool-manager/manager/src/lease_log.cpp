#include "lease_log.hpp"

#include "store_rows.hpp"

#include <accelpool/common/log.hpp>

namespace accelpool::manager {

void LeaseLog::lease_event(const Lease& lease, LeaseEvent event) {
  if (event == LeaseEvent::ended) reprogrammed_.erase(lease.id);
  if (!log::enabled(log::Level::info)) return;
  switch (event) {
    case LeaseEvent::granted: {
      std::uint32_t& seen = reprogrammed_[lease.id];
      const std::uint32_t now_reprogrammed = lease.reprogrammed - std::min(seen, lease.reprogrammed);
      seen = lease.reprogrammed;
      log::info("lease granted", {{"lease", lease.id},
                                  {"tenant", lease.tenant},
                                  {"guest", lease.guest},
                                  {"kind", lease.kind},
                                  {"bitstream", lease.bitstream},
                                  {"devices", store_rows::join_devices(lease.devices)},
                                  {"reprogrammed", now_reprogrammed},
                                  {"wait_s", lease.granted_at - lease.created_at},
                                  {"preemptions", lease.preemptions}});
      return;
    }
    case LeaseEvent::revoking:
      log::info("lease revoking", {{"lease", lease.id},
                                   {"tenant", lease.tenant},
                                   {"guest", lease.guest},
                                   {"devices", store_rows::join_devices(lease.devices)},
                                   {"deadline", lease.revoke_deadline},
                                   {"preempted", lease.requeue_on_deadline},
                                   {"reason", lease.end_reason}});
      return;
    case LeaseEvent::requeued:
      log::info("lease preempted", {{"lease", lease.id},
                                    {"tenant", lease.tenant},
                                    {"guest", lease.guest},
                                    {"kind", lease.kind},
                                    {"preemptions", lease.preemptions}});
      return;
    case LeaseEvent::ended:
      log::info("lease ended", {{"lease", lease.id},
                                {"tenant", lease.tenant},
                                {"guest", lease.guest},
                                {"state", to_string(lease.state)},
                                {"reason", lease.end_reason},
                                {"devices", store_rows::join_devices(lease.devices)},
                                {"jct_s", lease.ended_at - lease.created_at}});
      return;
  }
}

void LeaseLog::tenant_token_changed(const std::string& tenant) {
  log::info("tenant token rotated", {{"tenant", tenant}});
}

}  // namespace accelpool::manager
