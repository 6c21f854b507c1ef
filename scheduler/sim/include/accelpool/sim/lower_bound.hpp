// A clairvoyant lower bound on the average JCT any scheduler can reach for a trace on a pool.
#pragma once

#include <accelpool/sim/simulator.hpp>

#include <cstdint>

namespace accelpool::sim {

// max(a, b) where (a) is the mean run time (no job finishes faster than it runs) and (b) is the mean JCT of
// preemptive SRPT on one machine `devices` times as fast as a device, each job bringing work
// devices x runtime_s. Any schedule on `devices` devices can be emulated by that machine, and SRPT minimizes
// mean completion time on one machine, so (b) is a bound too. Setup costs are ignored (they only add).
// O(n log n) time, O(n) memory. 0 for an empty trace; `devices` must be >= 1.
double lower_bound_avg_jct(const Trace& trace, std::uint64_t devices);

}  // namespace accelpool::sim
