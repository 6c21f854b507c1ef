// The pool manager's records: leases, devices, tenants. Plain data, shared by the core, the store and the APIs.
#pragma once

#include <accelpool/host/contract.hpp>

#include <cstddef>
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
  std::string bitstream;  // "" when any image will do
  std::uint32_t count = 1;
  std::optional<double> estimate_s;
  std::string label;  // the guest's name for its job ("" none); learned run times are grouped by it
  LeaseState state = LeaseState::queued;
  double created_at = 0;
  double granted_at = 0;        // last grant
  double first_granted_at = 0;  // first grant (wait time = first_granted_at - created_at)
  double ended_at = 0;
  double expires_at = 0;             // TTL deadline, renewed by heartbeats
  double revoke_deadline = 0;        // while revoking
  bool requeue_on_deadline = false;  // revoking for priority: back to the queue at the deadline
  bool ready = false;                // every device is programmed and attached
  std::vector<std::string> devices;
  // What each device's host did to prepare it (what it holds, how the guest reaches it, what it is), aligned with
  // `devices`: filled as the hosts answer (an entry stays empty until its device is prepared); empty while queued.
  std::vector<host::PrepareResult> grants;
  std::uint32_t reprogrammed = 0;
  std::uint32_t preemptions = 0;
  std::string end_reason;
};

// Who calls about a lease. An admin (empty tenant) may touch every lease. A guest owns the leases it acquired:
// same tenant, same guest id and the same voucher. A lease acquired through a host agent's relay belongs to that
// relayed VM (its guest id and guest_host as the relay announced them), one acquired on a direct connection to
// the guest id said at hello: a direct connection naming a relayed VM owns none of that VM's leases. Leases a
// caller does not own are reported as not found, like ids that do not exist.
struct Caller {
  std::string tenant;  // "" : an admin
  std::string guest;
  std::string guest_host;  // compared for relayed callers only (a direct caller's host is its own claim)
  bool relayed = false;
  static Caller admin() { return {}; }
  // A guest on a direct TCP or Unix connection: its id is the one it said at hello.
  static Caller direct(std::string tenant, std::string guest) {
    return {std::move(tenant), std::move(guest), "", false};
  }
  bool owns(const Lease& lease) const;
};

// Which leases a listing wants. Every field set must match.
struct LeaseFilter {
  std::optional<std::string> tenant;
  std::optional<std::string> guest;
  std::optional<Caller> owner;  // leases this caller owns
  std::optional<LeaseState> state;
  std::optional<std::string> device;  // leases whose devices include this one ("HOST/LOCAL_ID")
  bool include_ended = false;
};

// One page of a listing in lease id order: the leases after `after` (before it when newest_first), at most
// `limit` of them. The id of the last lease of a page is the `after` of the next.
struct LeasePageSpec {
  static constexpr std::size_t kDefaultLimit = 1000;
  static constexpr std::size_t kMaxLimit = 10000;
  std::optional<LeaseId> after;
  std::size_t limit = kDefaultLimit;
  bool newest_first = false;
  // Whether `id` lies beyond the cursor in this page's order.
  bool beyond(LeaseId id) const { return !after || (newest_first ? id < *after : id > *after); }
};

struct DeviceRecord {
  std::string name;  // "<host>/<local_id>", unique in the pool
  std::string host;
  std::string local_id;
  std::string kind;
  std::string model;
  bool passthrough = true;
  std::string loaded;  // bitstream name held now, "" for none
  bool draining = false;
  bool available = true;       // the device itself: its host's health reports, its failed operations (a lost host's
                               // devices keep theirs; the loss is the host's, stored once as meta host_lost:<host>)
  std::uint32_t sched_id = 0;  // stable dense id used by the scheduler
  // A slot (partial-reconfiguration region, docs/hosts.md "Slots"): the name of its device; "" for a whole
  // device. Slot records are derived from their host's report at each attach and never stored.
  std::string parent{};
  // A slot's shape as its host reports it (HostDevice::slot_shapes): it takes only partial images of that
  // `slot_shape`; "" for a slot without one, and for a whole device.
  std::string slot_shape{};
};

struct TenantRecord {
  std::string name;
  double weight = 1;
  std::uint32_t max_devices = 0;  // 0: no quota
  std::string token_hash;         // hex SHA-256 of the token
};

// One group of the scheduler's learned run times (scheduler/estimator.hpp) by name, as the store keeps it:
// the requests of `kind` with this tenant, bitstream, gang size and label, or, when `whole_kind`, every request
// of the kind (then tenant, bitstream and label are empty and count 0). Empty bitstream or label: none.
// `weights` and `sums` are the decayed histogram's bins (RuntimeHistogram::kBins each, device-seconds).
struct EstimateRecord {
  std::string kind;
  bool whole_kind = false;
  std::string tenant;
  std::string bitstream;
  std::uint32_t count = 0;
  std::string label;
  std::uint64_t observations = 0;
  std::vector<double> weights;
  std::vector<double> sums;
};

}  // namespace accelpool::manager
