// Slots (partial-reconfiguration regions), the interference bound and the hold rule, with hand-computed
// placements.
#include "fixtures.hpp"

#include <accelpool/scheduler/interference.hpp>

#include <vector>

using namespace accelpool::scheduler;
using namespace accelpool::scheduler::testing;

namespace {

constexpr KindId kSlot = 2;  // "fpga/slot"

Device whole(DeviceId id) {
  Device d;
  d.id = id;
  d.kind = kFpga;
  return d;
}

Device slot_device(DeviceId id, ModelId shape = 0) {
  Device d;
  d.id = id;
  d.kind = kSlot;
  d.model = shape;
  return d;
}

// Device 0 with slots 1 and 2; device 3 with slots 4 and 5.
std::unique_ptr<Scheduler> two_sliced_devices(const std::string& policy = "fifo") {
  auto s = make_scheduler(policy, "");
  Decisions ignored;
  for (DeviceId parent : {0U, 3U}) {
    REQUIRE_FALSE(s->add_device(whole(parent), 0, ignored));
    REQUIRE_FALSE(s->add_slot(slot_device(parent + 1), parent, 0, ignored));
    REQUIRE_FALSE(s->add_slot(slot_device(parent + 2), parent, 0, ignored));
  }
  return s;
}

// Ticks just before `at` (nothing may happen), then at `at`: returns what the second tick decided.
Decisions nothing_before_then_at(Scheduler& s, Time at) {
  Decisions early;
  s.tick(at - 0.1, early);
  CHECK(early.grants.empty());
  Decisions due;
  s.tick(at, due);
  return due;
}

}  // namespace

TEST_CASE("slot leases share a device, and a whole-device lease needs all its slots free", "[slots]") {
  auto s = two_sliced_devices();
  CHECK(s->free_count() == 6);
  CHECK(s->slots_of(0) == std::vector<DeviceId>{1, 2});
  CHECK(s->parent_of(2) == DeviceId{0});
  CHECK_FALSE(s->parent_of(0));

  // Two slot requests: first-fit gives slots 1 and 2 of device 0, side by side.
  CHECK(devices(submit(*s, of_kind(req(1, 0), kSlot), 0)) == std::vector<DeviceId>{1});
  CHECK(devices(submit(*s, of_kind(req(2, 0), kSlot), 0)) == std::vector<DeviceId>{2});
  CHECK(s->device_state(0) == DeviceState::shared);  // its slots are in use: not grantable whole
  CHECK(s->count_in_state(DeviceState::shared) == 1);

  // Two whole-device requests: the first gets device 3 (its slots become shared), the second waits for 0.
  CHECK(devices(submit(*s, of_kind(req(3, 0), kFpga), 0)) == std::vector<DeviceId>{3});
  CHECK(s->device_state(4) == DeviceState::shared);
  CHECK(s->device_state(5) == DeviceState::shared);
  CHECK(submit(*s, of_kind(req(4, 0), kFpga), 0).grants.empty());
  // A third slot request waits too: device 0's slots are taken and device 3 is leased whole.
  CHECK(submit(*s, of_kind(req(5, 0), kSlot), 0).grants.empty());
  CHECK(s->free_count() == 0);

  // One slot back: the slot request takes it (fifo: request 4, first in line, still does not fit).
  auto d = release(*s, 1, 10);
  REQUIRE(granted(d) == std::vector<RequestId>{5});
  CHECK(devices(d) == std::vector<DeviceId>{1});
  // Both slots of device 0 back: the whole-device request gets it.
  CHECK(release(*s, 2, 11).grants.empty());
  d = release(*s, 5, 12);
  REQUIRE(granted(d) == std::vector<RequestId>{4});
  CHECK(devices(d) == std::vector<DeviceId>{0});
  CHECK(s->device_state(1) == DeviceState::shared);
}

TEST_CASE("a device's failure preempts the leases of its slots, and its return frees them", "[slots]") {
  auto s = two_sliced_devices();
  submit(*s, of_kind(req(1, 0), kSlot), 0);
  submit(*s, of_kind(req(2, 0), kSlot), 0);
  Decisions out;
  REQUIRE_FALSE(s->set_available(0, false, 1, out));
  CHECK(preempted(out) == std::vector<RequestId>{1, 2});
  CHECK(out.preemptions[0].reason == PreemptReason::device_failed);
  // Requeued, both go to device 3's slots; device 0's slots stay out of service with it.
  Decisions requeued;
  REQUIRE_FALSE(s->requeue(1, 2, requeued));
  REQUIRE_FALSE(s->requeue(2, 2, requeued));
  REQUIRE(requeued.grants.size() == 2);
  CHECK(devices(requeued, 0) == std::vector<DeviceId>{4});
  CHECK(devices(requeued, 1) == std::vector<DeviceId>{5});
  CHECK(s->device_state(1) == DeviceState::shared);
  Decisions back;
  REQUIRE_FALSE(s->set_available(0, true, 3, back));
  CHECK(s->device_state(1) == DeviceState::free);
  CHECK(s->device_state(0) == DeviceState::free);
}

TEST_CASE("add_slot rejects a missing device and a slot of a slot", "[slots]") {
  auto s = two_sliced_devices();
  Decisions out;
  auto missing = s->add_slot(slot_device(9), 8, 0, out);
  REQUIRE(missing);
  CHECK(missing->error == "slot 9: no device 8 to be a slot of");
  auto nested = s->add_slot(slot_device(9), 1, 0, out);
  REQUIRE(nested);
  CHECK(nested->error == "slot 9: device 1 is itself a slot");
  CHECK(s->add_slot(slot_device(2), 0, 0, out));  // id in use
  CHECK(s->device_count() == 6);
  CHECK(s->slots_of(0) == std::vector<DeviceId>{1, 2});
}

TEST_CASE("interference: a demand takes only the slot shapes whose share admits it, and slowdown is bounded",
          "[slots]") {
  // Shapes: 0 = a quarter of the device's bandwidth, 1 = half of it. Capacity 16 GB/s.
  const std::vector<double> shares{0.25, 0.5};
  CHECK(shapes_admitting(shares, 16, 3) == 0b11);  // 3 <= 4 and 3 <= 8
  CHECK(shapes_admitting(shares, 16, 6) == 0b10);  // 6 > 4, 6 <= 8
  CHECK(shapes_admitting(shares, 16, 9) == 0b00);  // fits no slot
  CHECK(shapes_admitting(shares, 16, 0) == 0b11);
  // Four half-share slots: at most 2 x capacity demanded together, so at most twice as slow.
  const std::vector<double> four_halves{0.5, 0.5, 0.5, 0.5};
  CHECK(slowdown_bound(four_halves) == 2.0);
  CHECK(slowdown(24, 16) == 1.5);
  CHECK(slowdown(8, 16) == 1.0);
  CHECK(slowdown_bound(std::vector<double>{0.25, 0.25, 0.25, 0.25}) == 1.0);

  // In the scheduler the shapes are the slot kind's models: a request admitted by shape 1 only gets the
  // half-share slot even though the quarter-share slot has a lower id.
  auto s = make_scheduler("fifo", "");
  Decisions ignored;
  REQUIRE_FALSE(s->add_device(whole(0), 0, ignored));
  REQUIRE_FALSE(s->add_slot(slot_device(1, 0), 0, 0, ignored));
  REQUIRE_FALSE(s->add_slot(slot_device(2, 1), 0, 0, ignored));
  Request r = of_kind(req(1, 0), kSlot);
  r.models = shapes_admitting(shares, 16, 6);
  CHECK(devices(submit(*s, r, 0)) == std::vector<DeviceId>{2});
  Request too_big = of_kind(req(2, 0), kSlot);
  too_big.models = shapes_admitting(shares, 16, 9);
  Decisions out;
  CHECK(s->submit(too_big, 0, out));  // no slot admits it: rejected, never queued
}

TEST_CASE("hold rule: a freed device goes to a waiting request of its bitstream, within the bound", "[hold]") {
  auto s = make_scheduler("fifo+affinity+hold=10", "fpga:1");
  constexpr BitstreamId kA = 5, kB = 7;
  auto d = submit(*s, of_kind(req(1, 0), kFpga, kA), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(d.grants[0].devices[0].reprogram);
  submit(*s, of_kind(req(4, 0.5), kFpga, kB), 0.5);  // first in line, another image
  submit(*s, of_kind(req(2, 1), kFpga, kA), 1);
  submit(*s, of_kind(req(3, 2), kFpga, kA), 2);
  // t=3: request 4 waited 2.5 s < 10 s: the device, holding A, goes to request 2 (A) without programming.
  d = release(*s, 1, 3);
  REQUIRE(granted(d) == std::vector<RequestId>{2});
  CHECK_FALSE(d.grants[0].devices[0].reprogram);
  // t=20: request 4 has waited 19.5 s > 10 s: nothing is held or passed over any more; fifo gives it the
  // device although request 3 (A) waits too.
  d = release(*s, 2, 20);
  REQUIRE(granted(d) == std::vector<RequestId>{4});
  CHECK(d.grants[0].devices[0].reprogram);
}

TEST_CASE("hold rule: a device idles for a likely request of its image, at most hold_s", "[hold]") {
  auto s = make_scheduler("fifo+affinity+hold=10", "fpga:1");
  constexpr BitstreamId kA = 5, kB = 7;
  // A arrives every second: three arrivals teach a mean gap of 1 s.
  for (RequestId id = 1; id <= 3; ++id) {
    const Time t = static_cast<Time>(id - 1);
    REQUIRE(granted(submit(*s, of_kind(req(id, t), kFpga, kA), t)) == std::vector<RequestId>{id});
    release(*s, id, t + 0.5);
  }
  // Request 3 ended at 2.5: 10 s / 1 s = 10 expected arrivals >= ln 2, so the device is on hold for A.
  CHECK(s->device_state(0) == DeviceState::holding);
  REQUIRE(s->hold_of(0));
  CHECK(s->hold_of(0)->until == 12.5);
  CHECK(s->hold_of(0)->bitstream == kA);
  CHECK(s->next_wakeup() == 12.5);
  // B waits for the held device; the next A takes it without programming.
  CHECK(submit(*s, of_kind(req(4, 3), kFpga, kB), 3).grants.empty());
  auto d = submit(*s, of_kind(req(5, 4), kFpga, kA), 4);
  REQUIRE(granted(d) == std::vector<RequestId>{5});
  CHECK_FALSE(d.grants[0].devices[0].reprogram);
  // Released at 5 (request 4 has waited 2 s): held again, until 15. B gets it when the hold ends, no later.
  CHECK(release(*s, 5, 5).grants.empty());
  CHECK(s->hold_of(0)->until == 15);
  const Decisions due = nothing_before_then_at(*s, 15);
  REQUIRE(granted(due) == std::vector<RequestId>{4});
  CHECK(due.grants[0].devices[0].reprogram);
  CHECK_FALSE(s->hold_of(0));
}

TEST_CASE("hold rule: a rarely requested image is not held", "[hold]") {
  auto s = make_scheduler("fifo+affinity+hold=10", "fpga:1");
  constexpr BitstreamId kA = 5;
  // A arrives every 100 s: 10 s / 100 s = 0.1 expected arrivals < ln 2.
  for (RequestId id = 1; id <= 4; ++id) {
    const Time t = 100.0 * static_cast<Time>(id - 1);
    submit(*s, of_kind(req(id, t), kFpga, kA), t);
    release(*s, id, t + 1);
    CHECK(s->device_state(0) == DeviceState::free);
  }
  CHECK_FALSE(s->next_wakeup());
}

TEST_CASE("hold rule: a slot is held like a device, and keeps its device shared while held", "[hold][slots]") {
  auto s = two_sliced_devices("fifo+affinity+hold=10");
  constexpr BitstreamId kA = 5;
  for (RequestId id = 1; id <= 3; ++id) {
    const Time t = static_cast<Time>(id - 1);
    submit(*s, of_kind(req(id, t), kSlot, kA), t);
    release(*s, id, t + 0.5);
  }
  // Affinity put every A lease on slot 1 (it holds A after the first); it is now on hold.
  CHECK(s->device_state(1) == DeviceState::holding);
  CHECK(s->device_state(0) == DeviceState::shared);
  // A whole-device request takes device 3, not 0.
  CHECK(devices(submit(*s, of_kind(req(10, 3), kFpga), 3)) == std::vector<DeviceId>{3});
}

TEST_CASE("hold rule: a request defers, at most hold_s, to a device of its image that will free", "[hold]") {
  auto s = make_scheduler("fifo+affinity+hold=10", "fpga:2");
  constexpr BitstreamId kA = 5, kB = 7;
  REQUIRE(devices(submit(*s, of_kind(req(1, 0), kFpga, kA), 0)) == std::vector<DeviceId>{0});
  REQUIRE(devices(submit(*s, of_kind(req(2, 1), kFpga, kA), 1)) == std::vector<DeviceId>{1});
  release(*s, 2, 1.5);  // A seen twice: not trusted yet, device 1 stays free
  CHECK(s->device_state(1) == DeviceState::free);
  REQUIRE(devices(submit(*s, of_kind(req(3, 2), kFpga, kB), 2)) == std::vector<DeviceId>{1});
  release(*s, 3, 2.5);  // device 1 now holds B
  // Request 4 (A, third arrival: mean gap 1.5 s, 10 / 1.5 >= ln 2): device 1 is free but holds B, and device 0,
  // holding A, is leased: it defers rather than reprogram device 1.
  CHECK(submit(*s, of_kind(req(4, 3), kFpga, kA), 3).grants.empty());
  CHECK(s->device_state(1) == DeviceState::free);
  SECTION("the device of its image frees: it takes it without programming") {
    auto d = release(*s, 1, 4);
    REQUIRE(granted(d) == std::vector<RequestId>{4});
    CHECK(devices(d) == std::vector<DeviceId>{0});
    CHECK_FALSE(d.grants[0].devices[0].reprogram);
  }
  SECTION("none frees within hold_s: it takes the free device when its deferral ends") {
    CHECK(s->next_wakeup() == 13);
    const Decisions due = nothing_before_then_at(*s, 13);
    REQUIRE(granted(due) == std::vector<RequestId>{4});
    CHECK(devices(due) == std::vector<DeviceId>{1});
    CHECK(due.grants[0].devices[0].reprogram);
  }
}

TEST_CASE("slot placement keeps each device's demand within its bandwidth, then prefers the loaded image", "[slots]") {
  auto s = two_sliced_devices();  // device 0: slots 1, 2; device 3: slots 4, 5
  auto with_demand = [](RequestId id, double demand, BitstreamId b = kNoBitstream) {
    Request r = of_kind(req(id, 0), kSlot, b);
    r.demand = demand;
    return r;
  };
  // 0.6 on device 0; a second 0.6 there would make 1.2 > 1: it goes to device 3.
  CHECK(devices(submit(*s, with_demand(1, 0.6), 0)) == std::vector<DeviceId>{1});
  CHECK(devices(submit(*s, with_demand(2, 0.6), 0)) == std::vector<DeviceId>{4});
  // 0.3 fits either (0.9 each): the lowest id.
  CHECK(devices(submit(*s, with_demand(3, 0.3), 0)) == std::vector<DeviceId>{2});
  // 0.5 fits neither (1.4 on device 0, 1.1 on device 3): oversubscribed, the least loaded device takes it.
  CHECK(devices(submit(*s, with_demand(4, 0.5), 0)) == std::vector<DeviceId>{5});
  release(*s, 3, 1);
  release(*s, 4, 1);
  // Slot 2 (device 0, demand 0.6) and slot 5 (device 3, demand 0.6) are free; slot 5 holds nothing, slot 2 holds
  // nothing: a request for an image already on neither takes the lowest id.
  CHECK(devices(submit(*s, with_demand(5, 0.2, 9), 2)) == std::vector<DeviceId>{2});
  release(*s, 5, 3);
  // Slot 2 now holds image 9: a request for 9 with demand 0.3 takes it (0.9, no programming) over slot 5.
  CHECK(devices(submit(*s, with_demand(6, 0.3, 9), 4)) == std::vector<DeviceId>{2});
}
