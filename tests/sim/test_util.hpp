// Builders shared by the simulator tests.
#pragma once

#include <accelpool/sim/simulator.hpp>

#include <optional>
#include <string>

namespace accelpool::sim::test {

inline Job make_job(std::uint64_t id, double arrival, double runtime, std::uint32_t devices = 1,
                    std::string bitstream = "default", std::optional<double> estimate = std::nullopt) {
  Job j;
  j.id = id;
  j.arrival_s = arrival;
  j.runtime_s = runtime;
  j.devices = devices;
  j.bitstream = std::move(bitstream);
  j.estimate_s = estimate;
  return j;
}

}  // namespace accelpool::sim::test
