// The pool manager's records: leases, devices, tenants. Plain data, shared by the core, the store and the APIs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::manager {

using LeaseId = std::uint64_t;

// queued -> granted -> released, plus cancelled (given up while queued), expired (heartbeats stopped) and
// revoked (by an admin or a device failure). `revoking` is a granted lease inside its grace period; a
// lease revoked for priority goes back to `queued` at the end of its grace period unless the guest released.
enum class LeaseState : std::uint8_t { queued, granted, revoking, released, cancelled, expired, revoked };

std::string_view to_string(LeaseState s);
std::optional<LeaseState> parse_lease_state(std::string_view s);
inline bool is_terminal(LeaseState s) {
  return s == LeaseState::released || s == LeaseState::cancelled || s == LeaseState::expired ||
         s == LeaseState::revoked;
}

struct Lease {
  LeaseId id = 0;
  std::string tenant;
  std::string guest;       // the guest (VM) id given at hello
  std::string guest_host;  // host the guest runs on (passthrough devices serve only their own host's guests)
  bool relayed = false;    // acquired through a host agent's relay, which vouches for `guest` and `guest_host`
  std::string kind;
  std::string bitstream;   // "" when any image will do
  std::uint32_t count = 1;
  std::optional<double> estimate_s;
  LeaseState state = LeaseState::queued;
  double created_at = 0;
  double granted_at = 0;       // last grant
  double first_granted_at = 0; // first grant (wait time = first_granted_at - created_at)
  double ended_at = 0;
  double expires_at = 0;       // TTL deadline, renewed by heartbeats
  double revoke_deadline = 0;  // while revoking
  bool requeue_on_deadline = false;  // revoking for priority: back to the queue at the deadline
  bool ready = false;          // every device is programmed and attached
  std::vector<std::string> devices;
  std::uint32_t reprogrammed = 0;
  std::uint32_t preemptions = 0;
  std::string end_reason;
};

struct DeviceRecord {
  std::string name;      // "<host>/<local_id>", unique in the pool
  std::string host;
  std::string local_id;
  std::string kind;
  std::string model;
  bool passthrough = true;
  std::string loaded;    // bitstream name held now, "" for none
  bool draining = false;
  bool available = true;
  std::uint32_t sched_id = 0;  // stable dense id used by the scheduler
};

struct TenantRecord {
  std::string name;
  double weight = 1;
  std::uint32_t max_devices = 0;  // 0: no quota
  std::string token_hash;         // hex SHA-256 of the token
};

}  // namespace accelpool::manager
