// The reuse rule (`+reuse`): freed devices go to waiting requests for their image, within the pass-over bound,
// and a grant that must reprogram overwrites the image with the least expected demand per free copy. Placements
// and grants computed by hand.
#include "fixtures.hpp"

#include <vector>

using namespace accelpool::scheduler;
using namespace accelpool::scheduler::testing;

namespace {

constexpr BitstreamId kA = 5, kB = 7, kC = 9, kX = 11;

Request fpga(RequestId id, Time arrival, BitstreamId bitstream, std::uint32_t count = 1) {
  return of_kind(req(id, arrival, count), kFpga, bitstream);
}

// Devices 0 and 1 run A (request 1) and B (request 2) from t=0; at t=1 a request for B (3) and at t=2 one for A (4)
// wait behind them.
std::unique_ptr<Scheduler> two_busy_devices_and_a_queue(const std::string& policy) {
  auto s = make_scheduler(policy, "fpga:2");
  REQUIRE(devices(submit(*s, fpga(1, 0, kA), 0)) == std::vector<DeviceId>{0});
  REQUIRE(devices(submit(*s, fpga(2, 0, kB), 0)) == std::vector<DeviceId>{1});
  REQUIRE(submit(*s, fpga(3, 1, kB), 1).grants.empty());
  REQUIRE(submit(*s, fpga(4, 2, kA), 2).grants.empty());
  return s;
}

// Teaches the scheduler arrival rates: one request of `bitstream` at each of `times`, each released 0.5 s later.
void arrivals(Scheduler& s, RequestId& next_id, BitstreamId bitstream, std::initializer_list<Time> times) {
  for (Time t : times) {
    const RequestId id = next_id++;
    REQUIRE(granted(submit(s, fpga(id, t, bitstream), t)) == std::vector<RequestId>{id});
    release(s, id, t + 0.5);
  }
}

void load(Scheduler& s, std::initializer_list<std::pair<DeviceId, BitstreamId>> images) {
  for (const auto& [device, bitstream] : images) REQUIRE_FALSE(s.set_loaded(device, bitstream));
}

}  // namespace

TEST_CASE("reuse rule: a freed device goes to the waiting request for its image, not to the older one", "[reuse]") {
  SECTION("with the rule: no programming at all") {
    auto s = two_busy_devices_and_a_queue("fifo+affinity+reuse=100");
    // t=5: device 0 frees holding A. Request 3 (B) is first in line but has waited 4 s < 100 s: request 4 (A)
    // takes device 0 as it is.
    auto d = release(*s, 1, 5);
    REQUIRE(granted(d) == std::vector<RequestId>{4});
    CHECK(devices(d) == std::vector<DeviceId>{0});
    CHECK_FALSE(d.grants[0].devices[0].reprogram);
    // t=6: device 1 frees holding B, for request 3.
    d = release(*s, 2, 6);
    REQUIRE(granted(d) == std::vector<RequestId>{3});
    CHECK(devices(d) == std::vector<DeviceId>{1});
    CHECK_FALSE(d.grants[0].devices[0].reprogram);
  }
  SECTION("without it: fifo gives each freed device to the other image, two programmings") {
    auto s = two_busy_devices_and_a_queue("fifo+affinity");
    auto d = release(*s, 1, 5);
    REQUIRE(granted(d) == std::vector<RequestId>{3});
    CHECK(d.grants[0].devices[0].reprogram);
    d = release(*s, 2, 6);
    REQUIRE(granted(d) == std::vector<RequestId>{4});
    CHECK(d.grants[0].devices[0].reprogram);
  }
}

TEST_CASE("reuse rule: no request is passed over once it has waited reuse_s", "[reuse]") {
  auto s = two_busy_devices_and_a_queue("fifo+affinity+reuse=100");
  // t=101: request 3 has waited 100 s: fifo decides alone and gives it device 0 (programming B).
  auto d = release(*s, 1, 101);
  REQUIRE(granted(d) == std::vector<RequestId>{3});
  CHECK(devices(d) == std::vector<DeviceId>{0});
  CHECK(d.grants[0].devices[0].reprogram);
}

TEST_CASE("reuse rule: a gang is served ahead only if free devices of its image cover it", "[reuse]") {
  auto s = make_scheduler("fifo+affinity+reuse=100", "fpga:3");
  REQUIRE(devices(submit(*s, fpga(1, 0, kA), 0)) == std::vector<DeviceId>{0});
  REQUIRE(devices(submit(*s, fpga(2, 0, kA), 0)) == std::vector<DeviceId>{1});
  REQUIRE(devices(submit(*s, fpga(3, 0, kB), 0)) == std::vector<DeviceId>{2});
  REQUIRE(submit(*s, fpga(4, 1, kB), 1).grants.empty());
  REQUIRE(submit(*s, fpga(5, 2, kA, 2), 2).grants.empty());
  // t=3: device 0 frees holding A. The gang (5) needs two devices of A and one is free: it is not served ahead;
  // fifo gives device 0 to request 4 (programming B).
  auto d = release(*s, 1, 3);
  REQUIRE(granted(d) == std::vector<RequestId>{4});
  CHECK(d.grants[0].devices[0].reprogram);
  // t=4: request 3 ends (device 2, B) and device 1 is still leased: the gang still waits.
  CHECK(release(*s, 3, 4).grants.empty());
  // t=5: device 1 frees holding A; devices 1 (A) and 2 (B) are free: the gang takes them, programming device 2.
  d = release(*s, 2, 5);
  REQUIRE(granted(d) == std::vector<RequestId>{5});
  CHECK(d.grants[0].devices.size() == 2);
}

TEST_CASE("reuse rule: a grant that must reprogram overwrites the image least in demand per free copy", "[reuse]") {
  RequestId next_id = 1;
  SECTION("a rarely requested image gives way to a popular one") {
    auto s = make_scheduler("fifo+affinity+reuse", "fpga:3");
    // B every 10 s (t = 0, 10, 20), A every second (t = 21, 22, 23).
    arrivals(*s, next_id, kB, {0, 10, 20});
    arrivals(*s, next_id, kA, {21, 22, 23});
    load(*s, {{0, kA}, {1, kA}, {2, kB}});
    // t=24: per free copy A is expected 1/s / 2 = 0.5/s, B 0.1/s / 1 (its gap: max(10, 24 - 20)): C takes the
    // device of B, although device 0 comes first.
    auto d = submit(*s, fpga(next_id, 24, kC), 24);
    CHECK(devices(d) == std::vector<DeviceId>{2});
    CHECK(d.grants[0].devices[0].reprogram);
  }
  SECTION("of two images asked for equally, the one with more free copies gives way") {
    auto s = make_scheduler("fifo+affinity+reuse", "fpga:3");
    for (Time t : {20.0, 21.0, 22.0}) {
      arrivals(*s, next_id, kB, {t});
      arrivals(*s, next_id, kA, {t + 0.5});
    }
    load(*s, {{0, kB}, {1, kA}, {2, kA}});
    // t=23: B 1/s / 1 copy, A 1/s / 2 copies: C overwrites an A, the lower id of its two devices.
    CHECK(devices(submit(*s, fpga(next_id, 23, kC), 23)) == std::vector<DeviceId>{1});
  }
  SECTION("an image never requested gives way first, and a device holding nothing before any") {
    auto s = make_scheduler("fifo+affinity+reuse", "fpga:3");
    arrivals(*s, next_id, kA, {20, 21, 22});
    load(*s, {{0, kA}, {1, kX}});  // device 2 holds nothing
    CHECK(devices(submit(*s, fpga(next_id, 23, kC), 23)) == std::vector<DeviceId>{2});
    CHECK(devices(submit(*s, fpga(next_id + 1, 23, kC), 23)) == std::vector<DeviceId>{1});
  }
  SECTION("without the rule affinity takes the lowest id") {
    auto s = make_scheduler("fifo+affinity", "fpga:3");
    arrivals(*s, next_id, kB, {0, 10, 20});
    arrivals(*s, next_id, kA, {21, 22, 23});
    load(*s, {{0, kA}, {1, kA}, {2, kB}});
    CHECK(devices(submit(*s, fpga(next_id, 24, kC), 24)) == std::vector<DeviceId>{0});
  }
}
