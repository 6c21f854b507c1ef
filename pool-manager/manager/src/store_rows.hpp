// What the stores share: how a lease, a histogram and a device list are spelled in a row, whatever the database.
// Internal to the store implementations (sqlite_store.cpp, postgres_store.cpp).
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/manager/types.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accelpool::manager::store_rows {

// A live lease: queued, granted or revoking. Spelled as comparisons, not IN (...): SQLite evaluates an IN list
// through a temporary table on every row it writes to a partial index with that predicate.
#define ACCELPOOL_LIVE_LEASE "(state='queued' OR state='granted' OR state='revoking')"

// The lease columns in the order lease_from_row reads them.
inline constexpr const char* kLeaseColumns =
    "id, tenant, guest, guest_host, kind, bitstream, count, estimate_s, state, created_at, granted_at, "
    "first_granted_at, ended_at, expires_at, revoke_deadline, requeue_on_deadline, ready, devices, reprogrammed, "
    "preemptions, end_reason, relayed, grants, label";

// "tenant=excluded.tenant, ...": every lease column but the id, for an upsert by id (same in SQLite and
// PostgreSQL). An update in place leaves alone the index entries of columns that keep their value.
std::string lease_update_set();

// A histogram's bins as text: numbers separated by spaces, each exact (the shortest text that reads back as the
// same double).
std::string format_numbers(const std::vector<double>& values);
// The inverse of format_numbers; nullopt if a field is not a number.
std::optional<std::vector<double>> parse_numbers(const std::string& text);

// A lease's devices as stored: "h/d0,h/d1".
std::string join_devices(const std::vector<std::string>& devices);
std::vector<std::string> split_devices(const std::string& s);

// A lease's grants as stored: a JSON array of device.prepare results (the agent protocol's form,
// docs/agent-protocol.md), "" when there are none.
std::string grants_text(const std::vector<host::PrepareResult>& grants);
// The grants of lease `id` stored as `text`. Errors: "corrupt" naming the lease and what is wrong.
Result<std::vector<host::PrepareResult>> grants_from_text(LeaseId id, const std::string& text);

// The lease in the current row of a result that selects kLeaseColumns. `Row` reads column i with text(i),
// real(i), integer(i) and is_null(i). Errors: "corrupt".
template <typename Row>
Result<Lease> lease_from_row(Row& s) {
  Lease l;
  l.id = static_cast<LeaseId>(s.integer(0));
  l.tenant = s.text(1);
  l.guest = s.text(2);
  l.guest_host = s.text(3);
  l.kind = s.text(4);
  l.bitstream = s.text(5);
  l.count = static_cast<std::uint32_t>(s.integer(6));
  if (!s.is_null(7)) l.estimate_s = s.real(7);
  auto state = parse_lease_state(s.text(8));
  if (!state)
    return make_error(Errc::corrupt, "lease " + std::to_string(l.id) + " has unknown state '" + s.text(8) + "'");
  l.state = *state;
  l.created_at = s.real(9);
  l.granted_at = s.real(10);
  l.first_granted_at = s.real(11);
  l.ended_at = s.real(12);
  l.expires_at = s.real(13);
  l.revoke_deadline = s.real(14);
  l.requeue_on_deadline = s.integer(15) != 0;
  l.ready = s.integer(16) != 0;
  l.devices = split_devices(s.text(17));
  l.reprogrammed = static_cast<std::uint32_t>(s.integer(18));
  l.preemptions = static_cast<std::uint32_t>(s.integer(19));
  l.end_reason = s.text(20);
  l.relayed = s.integer(21) != 0;
  auto grants = grants_from_text(l.id, s.text(22));
  if (!grants) return grants.error();
  l.grants = std::move(*grants);
  l.label = s.text(23);
  return l;
}

// The columns of a learned group, in the order estimate_from_row reads them.
inline constexpr const char* kEstimateColumns =
    "kind, whole_kind, tenant, bitstream, count, label, observations, weights, sums";

// The learned group in the current row of a result that selects kEstimateColumns (Row as for lease_from_row).
// Errors: "corrupt".
template <typename Row>
Result<EstimateRecord> estimate_from_row(Row& s) {
  EstimateRecord e{s.text(0),
                   s.integer(1) != 0,
                   s.text(2),
                   s.text(3),
                   static_cast<std::uint32_t>(s.integer(4)),
                   s.text(5),
                   static_cast<std::uint64_t>(s.integer(6)),
                   {},
                   {}};
  auto weights = parse_numbers(s.text(7)), sums = parse_numbers(s.text(8));
  if (!weights || !sums) return make_error(Errc::corrupt, "estimates of kind " + e.kind + ": malformed histogram");
  e.weights = std::move(*weights);
  e.sums = std::move(*sums);
  return e;
}

// The device in the current row of a result that selects
// name, host, local_id, kind, model, passthrough, loaded, draining, available, sched_id.
template <typename Row>
DeviceRecord device_from_row(Row& s) {
  DeviceRecord d;
  d.name = s.text(0);
  d.host = s.text(1);
  d.local_id = s.text(2);
  d.kind = s.text(3);
  d.model = s.text(4);
  d.passthrough = s.integer(5) != 0;
  d.loaded = s.text(6);
  d.draining = s.integer(7) != 0;
  d.available = s.integer(8) != 0;
  d.sched_id = static_cast<std::uint32_t>(s.integer(9));
  return d;
}

}  // namespace accelpool::manager::store_rows
