// Builders for scheduler tests: pools from a short text, requests with defaults, decision capture.
#pragma once

#include <accelpool/scheduler/scheduler.hpp>

#include <catch2/catch.hpp>

#include <sstream>
#include <string>

namespace accelpool::scheduler::testing {

inline constexpr KindId kFpga = 0;
inline constexpr KindId kGpu = 1;

// A scheduler under `policy` (e.g. "las+affinity") whose pool is described by `pool`:
// "fpga:4" = 4 network fpga devices on host 0; "fpga:2@1" = 2 passthrough fpga devices on host 1;
// parts separated by ';'. Device ids are assigned in order from 0.
inline std::unique_ptr<Scheduler> make_scheduler(const std::string& policy, const std::string& pool) {
  std::string error;
  auto spec = PolicySpec::parse(policy, &error);
  INFO(error);
  REQUIRE(spec);
  auto s = Scheduler::create(*spec, &error);
  REQUIRE(s);
  std::stringstream parts(pool);
  std::string part;
  DeviceId next = 0;
  while (std::getline(parts, part, ';')) {
    const auto colon = part.find(':');
    const auto at = part.find('@');
    const std::string kind = part.substr(0, colon);
    const int count = std::stoi(part.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1));
    Device d;
    d.kind = kind == "gpu" ? kGpu : kFpga;
    d.attach = at == std::string::npos ? AttachMode::network : AttachMode::passthrough;
    d.host = at == std::string::npos ? 0 : static_cast<HostId>(std::stoi(part.substr(at + 1)));
    for (int i = 0; i < count; ++i) {
      d.id = next++;
      Decisions ignored;
      REQUIRE_FALSE(s->add_device(d, 0, ignored));
    }
  }
  return s;
}

inline Request req(RequestId id, Time arrival, std::uint32_t count = 1, std::optional<double> estimate = {}) {
  return {.id = id, .count = count, .estimate_s = estimate, .arrival = arrival};
}

// The request for `bitstream` on devices of `kind`.
inline Request of_kind(Request r, KindId kind, BitstreamId bitstream = kNoBitstream) {
  r.kind = kind;
  r.bitstream = bitstream;
  return r;
}

// Submits and returns the decisions it caused; the submit must be accepted.
inline Decisions submit(Scheduler& s, const Request& r, Time now) {
  Decisions out;
  auto rejected = s.submit(r, now, out);
  INFO((rejected ? rejected->error : std::string()));
  REQUIRE_FALSE(rejected);
  return out;
}

inline Decisions release(Scheduler& s, RequestId id, Time now) {
  Decisions out;
  REQUIRE_FALSE(s.release(id, now, out));
  return out;
}

inline std::vector<RequestId> granted(const Decisions& d) {
  std::vector<RequestId> ids;
  for (const auto& g : d.grants) ids.push_back(g.request);
  return ids;
}

// The devices of a decision's `grant`-th grant.
inline std::vector<DeviceId> devices(const Decisions& d, std::size_t grant = 0) {
  std::vector<DeviceId> ids;
  for (const auto& g : d.grants.at(grant).devices) ids.push_back(g.device);
  return ids;
}

inline std::vector<RequestId> preempted(const Decisions& d) {
  std::vector<RequestId> ids;
  for (const auto& p : d.preemptions) ids.push_back(p.request);
  return ids;
}

}  // namespace accelpool::scheduler::testing
