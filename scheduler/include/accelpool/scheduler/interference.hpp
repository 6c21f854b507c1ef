// The interference model of devices shared by slot leases (docs/policies.md, "Slots and interference").
//
// Leases on the slots of one device compete for its memory bandwidth and host link. A device declares its
// bandwidth capacity C and each of its slots a share s of C: the most a lease on that slot is admitted to use.
// A partial image declares its demand d (the bandwidth it uses when alone, in the same unit as C). A lease may
// take a slot only if d <= s * C, so the leases on a device demand at most C * (sum of its slots' shares)
// together, and each runs at C / (sum of demands) of its own speed when the sum exceeds C. The slowdown of a
// device is therefore bounded by max(1, sum of shares), whatever the mix of leases: the operator chooses the
// bound by choosing the shares (1 in all: no slowdown; 2: at most twice as slow).
#pragma once

#include <accelpool/scheduler/model.hpp>

#include <span>

namespace accelpool::scheduler {

// The slot shapes (models of a slot kind, by ModelId) whose share of capacity `capacity` admits `demand`:
// bit m is set when demand <= shares[m] * capacity. Demand 0 (unknown) fits every shape.
ModelSet shapes_admitting(std::span<const double> shares, double capacity, double demand);

// How much slower each lease on a device runs while its leases demand `total_demand` of `capacity`:
// max(1, total_demand / capacity). 1 for capacity <= 0.
double slowdown(double total_demand, double capacity);

// The worst slowdown admission allows on a device whose slots have `shares`: max(1, sum of shares).
double slowdown_bound(std::span<const double> shares);

}  // namespace accelpool::scheduler
