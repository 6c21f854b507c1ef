// The scheduler's event API: queueing, gangs, rejection, preemption, ageing, fairness, device changes.
#include "fixtures.hpp"

using namespace accelpool::scheduler;
using namespace accelpool::scheduler::testing;
using V = std::vector<RequestId>;

TEST_CASE("fifo grants while devices are free and queues the rest", "[scheduler][fifo]") {
  auto s = make_scheduler("fifo", "fpga:2");
  CHECK(granted(submit(*s, req(1, 0), 0)) == V{1});
  CHECK(granted(submit(*s, req(2, 1), 1)) == V{2});
  CHECK(granted(submit(*s, req(3, 2), 2)).empty());
  CHECK(s->waiting_count() == 1);
  CHECK(s->phase(3) == RequestPhase::waiting);
  CHECK(granted(release(*s, 1, 5)) == V{3});
  CHECK(s->waiting_count() == 0);
  CHECK(s->running_count() == 2);
  CHECK(s->free_count() == 0);
}

TEST_CASE("a gang is granted all or nothing, and smaller requests fill the gap", "[scheduler][gang]") {
  auto s = make_scheduler("fifo", "fpga:4");
  CHECK(granted(submit(*s, req(1, 0, 3), 0)) == V{1});
  CHECK(s->devices_of(1).size() == 3);
  CHECK(granted(submit(*s, req(2, 1, 2), 1)).empty());  // only one device free
  CHECK(granted(submit(*s, req(3, 2, 1), 2)) == V{3});  // fits the hole: work-conserving
  auto d = release(*s, 1, 10);
  CHECK(granted(d) == V{2});
  CHECK(d.grants[0].devices.size() == 2);
}

TEST_CASE("bad requests are rejected with a reason and change nothing", "[scheduler][errors]") {
  auto s = make_scheduler("fifo", "fpga:2;gpu:1");
  Decisions out;
  auto zero = s->submit(req(1, 0, 0), 0, out);
  REQUIRE(zero);
  CHECK_THAT(zero->error, Catch::Contains("0 devices"));
  CHECK(zero->kind == Rejection::Kind::invalid);
  auto huge = s->submit(req(2, 0, 3), 0, out);
  REQUIRE(huge);
  CHECK_THAT(huge->error, Catch::Contains("never"));
  CHECK(huge->kind == Rejection::Kind::infeasible);  // well-formed, but no pool of this shape can serve it
  Request gpu = req(3, 0, 2);
  gpu.kind = kGpu;
  auto too_many_gpus = s->submit(gpu, 0, out);  // only one gpu exists
  REQUIRE(too_many_gpus);
  CHECK(too_many_gpus->kind == Rejection::Kind::infeasible);
  CHECK(granted(submit(*s, req(4, 0), 0)) == V{4});
  auto dup = s->submit(req(4, 0), 0, out);
  REQUIRE(dup);
  CHECK_THAT(dup->error, Catch::Contains("already exists"));
  CHECK(dup->kind == Rejection::Kind::invalid);
  CHECK(s->release(99, 0, out));
  CHECK(s->requeue(99, 0, out));
  CHECK(out.empty());
  CHECK(s->waiting_count() == 0);
  CHECK(s->running_count() == 1);
  Device again;
  again.id = 0;
  CHECK(s->add_device(again, 0, out));
  CHECK(s->device_count() == 3);
}

TEST_CASE("passthrough devices serve only guests on their host, network devices serve all", "[scheduler][attach]") {
  auto s = make_scheduler("fifo", "fpga:2@1;fpga:1");
  Request far = req(1, 0, 2);
  far.guest_host = 7;  // sees only the one network device
  Decisions out;
  CHECK(s->submit(far, 0, out));
  Request near = req(2, 0, 3);
  near.guest_host = 1;  // two passthrough + one network
  auto d = submit(*s, near, 0);
  REQUIRE(granted(d) == V{2});
  CHECK(d.grants[0].devices.size() == 3);
}

TEST_CASE("sjf serves the shortest estimate first, unknown estimates go last", "[scheduler][sjf]") {
  auto s = make_scheduler("sjf", "fpga:1");
  submit(*s, req(1, 0, 1, 100), 0);
  submit(*s, req(2, 1, 1), 1);
  submit(*s, req(3, 2, 1, 50), 2);
  submit(*s, req(4, 3, 1, 10), 3);
  CHECK(s->queue_order(3) == V{4, 3, 2});
  CHECK(granted(release(*s, 1, 100)) == V{4});
}

TEST_CASE("srpt preempts a lease with more remaining time, and the victim keeps its progress", "[scheduler][srpt]") {
  auto s = make_scheduler("srpt", "fpga:1");
  submit(*s, req(1, 0, 1, 100), 0);
  auto d = submit(*s, req(2, 10, 1, 20), 10);  // remaining 20 < 90
  CHECK(preempted(d) == V{1});
  CHECK(d.preemptions[0].reason == PreemptReason::priority);
  CHECK(s->phase(1) == RequestPhase::revoking);
  Decisions out;
  REQUIRE_FALSE(s->requeue(1, 10, out));
  CHECK(granted(out) == V{2});
  // A newcomer with 95 s left does not outrank the victim's 90 s left.
  submit(*s, req(3, 11, 1, 95), 11);
  CHECK(s->queue_order(11) == V{1, 3});
  // Nor does one equal to the running lease's remaining time (strict improvement only).
  auto tie = submit(*s, req(4, 12, 1, 18), 12);
  CHECK(tie.preemptions.empty());
}

TEST_CASE("srpt without preemption behaves like sjf on remaining time", "[scheduler][srpt]") {
  auto s = make_scheduler("srpt+first-fit+nopreempt", "fpga:1");
  submit(*s, req(1, 0, 1, 100), 0);
  CHECK(submit(*s, req(2, 10, 1, 1), 10).preemptions.empty());
}

TEST_CASE("las demotes a running lease at its threshold, then a newcomer preempts it", "[scheduler][las]") {
  auto s = make_scheduler("las:10", "fpga:1");
  submit(*s, req(1, 0), 0);
  REQUIRE(s->next_wakeup());
  CHECK(*s->next_wakeup() == Approx(10));
  CHECK(submit(*s, req(2, 5), 5).preemptions.empty());  // same queue: no preemption
  Decisions out;
  s->tick(10, out);
  CHECK(preempted(out) == V{1});
  out = {};
  REQUIRE_FALSE(s->requeue(1, 10, out));
  CHECK(granted(out) == V{2});
  // The demoted request waits behind newcomers of the first queue.
  submit(*s, req(3, 11), 11);
  CHECK(s->queue_order(11) == V{3, 1});
}

TEST_CASE("las counts attained service in device-seconds: wide gangs age faster", "[scheduler][las]") {
  auto s = make_scheduler("las:10", "fpga:4");
  submit(*s, req(1, 0, 4), 0);
  REQUIRE(s->next_wakeup());
  CHECK(*s->next_wakeup() == Approx(2.5));  // 4 devices x 2.5 s = 10 device-seconds
}

TEST_CASE("djsf fills free devices with the densest requests", "[scheduler][djsf]") {
  auto s = make_scheduler("djsf", "fpga:4");
  submit(*s, req(9, 0, 4, 1), 0);   // holds all devices
  submit(*s, req(1, 1, 4, 10), 1);  // work 40
  submit(*s, req(2, 2, 1, 30), 2);  // work 30
  submit(*s, req(3, 3, 2, 10), 3);  // work 20
  CHECK(s->queue_order(3) == V{3, 2, 1});
  CHECK(s->queue_order(3, 2) == V{3, 2});  // only the head: the first two in the same order
  CHECK(s->queue_order(3, 0).empty());
  auto d = release(*s, 9, 4);
  CHECK(granted(d) == V{3, 2});  // 3 devices used; the 4-wide request waits
}

TEST_CASE("fair serves the tenant with the least weighted device-time", "[scheduler][fair]") {
  auto s = make_scheduler("fair", "fpga:1");
  s->set_tenant_weight(0, 1);
  s->set_tenant_weight(1, 1);
  Request a = req(1, 0);
  a.tenant = 0;
  submit(*s, a, 0);
  Request a2 = req(2, 1);
  a2.tenant = 0;
  submit(*s, a2, 1);
  Request b = req(3, 2);
  b.tenant = 1;
  submit(*s, b, 2);
  // Tenant 0 used 10 device-seconds by then, tenant 1 none: tenant 1 goes first despite arriving later.
  CHECK(s->queue_order(10) == V{3, 2});
  CHECK(granted(release(*s, 1, 10)) == V{3});
}

TEST_CASE("fair honours weights", "[scheduler][fair]") {
  TenantLedger ledger;
  ledger.set_weight(1, 4);
  ledger.lease_started(0, 1, 0);
  ledger.lease_started(1, 2, 0);
  CHECK(ledger.usage(0, 10) == Approx(10));
  CHECK(ledger.usage(1, 10) == Approx(20));
  ledger.lease_stopped(1, 2, 10);
  CHECK(ledger.usage(1, 50) == Approx(20));
  auto fair = make_ordering("fair", nullptr);
  CHECK(fair->tenant_rank(ledger, 1, 50) < fair->tenant_rank(ledger, 0, 50));  // 20/4 < 50/1
}

TEST_CASE("the tail guard serves a request that waited too long, and reserves devices for it", "[scheduler][guard]") {
  auto s = make_scheduler("sjf+first-fit+guard=50", "fpga:2");
  submit(*s, req(1, 0, 1, 10), 0);
  submit(*s, req(2, 0, 1, 10), 0);
  submit(*s, req(3, 1, 2, 1000), 1);  // long gang: sjf would starve it
  submit(*s, req(4, 2, 1, 100), 2);
  REQUIRE(s->next_wakeup());
  CHECK(*s->next_wakeup() == Approx(51));  // request 3 (arrived at 1) ages first
  // Request 1 finishes before the guard: the shorter request 4 goes first (estimated to end at 110).
  CHECK(granted(release(*s, 1, 10)) == V{4});
  submit(*s, req(5, 20, 1, 80), 20);
  Decisions out;
  s->tick(51, out);    // request 3 has now waited 50 s
  CHECK(out.empty());  // nothing free yet
  CHECK(s->queue_order(51).front() == 3);
  // One device frees: it is kept for the aged gang (reserved for 110), not given to request 5, which would
  // end at 140.
  CHECK(granted(release(*s, 2, 60)).empty());
  CHECK(granted(release(*s, 4, 61)) == V{3});
}

TEST_CASE("a failed device revokes its lease, the device returns when available again", "[scheduler][devices]") {
  auto s = make_scheduler("fifo", "fpga:2");
  submit(*s, req(1, 0, 2), 0);
  Decisions out;
  REQUIRE_FALSE(s->set_available(0, false, 1, out));
  CHECK(preempted(out) == V{1});
  CHECK(out.preemptions[0].reason == PreemptReason::device_failed);
  out = {};
  REQUIRE_FALSE(s->requeue(1, 2, out));
  CHECK(out.grants.empty());  // one device left, the gang needs two
  CHECK(s->device_state(0) == DeviceState::unavailable);
  CHECK(s->device_state(1) == DeviceState::free);
  REQUIRE_FALSE(s->set_available(0, true, 3, out));
  CHECK(granted(out) == V{1});
}

TEST_CASE("removing a held device revokes the lease and forgets the device", "[scheduler][devices]") {
  auto s = make_scheduler("fifo", "fpga:2");
  submit(*s, req(1, 0), 0);
  Decisions out;
  REQUIRE_FALSE(s->remove_device(0, 1, out));
  CHECK(preempted(out) == V{1});
  CHECK(s->device_count() == 1);
  out = {};
  REQUIRE_FALSE(s->requeue(1, 2, out));
  CHECK(granted(out) == V{1});
  CHECK(s->devices_of(1) == std::vector<DeviceId>{1});
  CHECK_FALSE(s->device(0));
  CHECK(s->remove_device(0, 3, out));  // gone already
}

TEST_CASE("the counts of devices by state follow every change, and a removed device leaves them",
          "[scheduler][devices]") {
  auto s = make_scheduler("fifo", "fpga:4");
  auto counts = [&] {
    return std::array<std::size_t, 4>{s->count_in_state(DeviceState::free), s->count_in_state(DeviceState::leased),
                                      s->count_in_state(DeviceState::draining),
                                      s->count_in_state(DeviceState::unavailable)};
  };
  using C = std::array<std::size_t, 4>;  // free, leased, draining, unavailable
  CHECK(counts() == C{4, 0, 0, 0});
  submit(*s, req(1, 0, 2), 0);
  CHECK(counts() == C{2, 2, 0, 0});
  Decisions out;
  REQUIRE_FALSE(s->set_draining(3, true, 1, out));
  REQUIRE_FALSE(s->set_available(2, false, 1, out));
  CHECK(counts() == C{0, 2, 1, 1});
  // A held device that fails stays leased until its lease gives it back; removed, it is counted no more.
  const DeviceId held = s->devices_of(1).front();
  REQUIRE_FALSE(s->remove_device(held, 2, out));
  CHECK(counts() == C{0, 2, 1, 1});
  out = {};
  REQUIRE_FALSE(s->release(1, 3, out));
  CHECK(counts() == C{1, 0, 1, 1});
  REQUIRE_FALSE(s->set_available(2, true, 4, out));
  REQUIRE_FALSE(s->set_draining(3, false, 4, out));
  CHECK(counts() == C{3, 0, 0, 0});
  // Added again under its id, it is counted once.
  Device back;
  back.id = held;
  back.kind = kFpga;
  back.attach = AttachMode::network;
  REQUIRE_FALSE(s->add_device(back, 5, out));
  CHECK(counts() == C{4, 0, 0, 0});
}

TEST_CASE("a draining device is granted to no one until undrained", "[scheduler][devices]") {
  auto s = make_scheduler("fifo", "fpga:1");
  Decisions out;
  REQUIRE_FALSE(s->set_draining(0, true, 0, out));
  CHECK(s->device_state(0) == DeviceState::draining);
  CHECK(granted(submit(*s, req(1, 0), 0)).empty());
  REQUIRE_FALSE(s->set_draining(0, false, 1, out));
  CHECK(granted(out) == V{1});
  CHECK(s->device_state(0) == DeviceState::leased);
}

TEST_CASE("switching policy re-ranks the queue and keeps leases", "[scheduler][policy]") {
  auto s = make_scheduler("fifo", "fpga:1");
  submit(*s, req(1, 0, 1, 100), 0);
  submit(*s, req(2, 1, 1, 50), 1);
  submit(*s, req(3, 2, 1, 10), 2);
  CHECK(s->queue_order(2) == V{2, 3});
  std::string error;
  auto spec = PolicySpec::parse("sjf+affinity", &error);
  REQUIRE(spec);
  Decisions out;
  REQUIRE_FALSE(s->set_policy(*spec, 3, out));
  CHECK(s->queue_order(3) == V{3, 2});
  CHECK(s->phase(1) == RequestPhase::running);
  CHECK(s->policy().to_string() == "sjf+affinity");
}

TEST_CASE("policy specs parse and reject clearly", "[scheduler][policy]") {
  std::string error;
  auto spec = PolicySpec::parse("las:100/1000+pack+guard=3600", &error);
  REQUIRE(spec);
  CHECK(spec->ordering == "las:100/1000");
  CHECK(spec->placement == "pack");
  CHECK(spec->tail_guard_s == Approx(3600));
  CHECK(PolicySpec::parse(spec->to_string(), &error)->to_string() == spec->to_string());
  CHECK_FALSE(PolicySpec::parse("lifo", &error));
  CHECK_THAT(error, Catch::Contains("unknown ordering 'lifo'"));
  CHECK_FALSE(PolicySpec::parse("fifo+closest", &error));
  CHECK_THAT(error, Catch::Contains("unknown placement"));
  CHECK_FALSE(PolicySpec::parse("fifo+guard=-1", &error));
  CHECK_THAT(error, Catch::Contains("guard"));
  CHECK_FALSE(PolicySpec::parse("las:100/50", &error));
  CHECK_THAT(error, Catch::Contains("ascending"));
  CHECK_FALSE(PolicySpec::parse("fifo++pack", &error));
  CHECK_FALSE(PolicySpec::parse("sjf:3", &error));
}

TEST_CASE("policy spec: +NAME takes the option's default, +NAME=VALUE a positive value",
          "[scheduler][policy][hold][reuse][age]") {
  struct Option {
    std::string name;
    std::optional<double> PolicySpec::*field;
    double bare;            // the value of +NAME alone
    std::string bare_text;  // how to_string() writes it
    std::string must_be;    // in the refusal of a bad value
  };
  const Option options[] = {
      {"hold", &PolicySpec::hold_s, kDefaultHoldS, "hold=60", "a positive number of seconds"},
      {"reuse", &PolicySpec::reuse_s, kDefaultReuseS, "reuse=3600", "a positive number of seconds"},
      {"age", &PolicySpec::age_slowdown, kDefaultAgeSlowdown, "age=100", "a positive slowdown"},
  };
  for (const Option& o : options) {
    INFO(o.name);
    std::string error;
    auto bare = PolicySpec::parse("fifo+affinity+" + o.name, &error);
    REQUIRE(bare);
    CHECK((*bare).*o.field == o.bare);
    CHECK(bare->to_string() == "fifo+affinity+" + o.bare_text);
    auto given = PolicySpec::parse("gittins+affinity+" + o.name + "=12.5", &error);
    REQUIRE(given);
    CHECK((*given).*o.field == 12.5);
    CHECK(given->to_string() == "gittins+affinity+" + o.name + "=12.5");
    for (const std::string bad : {"0", "-1", "x", ""}) {
      CHECK_FALSE(PolicySpec::parse("fifo+" + o.name + "=" + bad, &error));
      CHECK_THAT(error, Catch::Contains(o.name + " needs " + o.must_be + ", got '" + bad + "'"));
    }
    auto without = PolicySpec::parse("fifo+affinity", &error);
    REQUIRE(without);
    CHECK_FALSE(((*without).*o.field).has_value());
    // A spec built in code is checked as a parsed one, by create and by a policy switch.
    PolicySpec zero = *bare;
    zero.*o.field = 0.0;
    CHECK_FALSE(Scheduler::create(zero, &error));
    CHECK(error == o.name + " must be " + o.must_be);
    auto running = make_scheduler("fifo", "fpga:1");
    Decisions out;
    auto refused = running->set_policy(zero, 0, out);
    REQUIRE(refused);
    CHECK(refused->error == o.name + " must be " + o.must_be);
  }
  std::string error;
  auto both = PolicySpec::parse("fifo+affinity+hold=30+reuse=120", &error);
  REQUIRE(both);
  CHECK(both->to_string() == "fifo+affinity+hold=30+reuse=120");
  CHECK_FALSE(PolicySpec::parse("fifo+affinity+guard", &error));  // guard has no default
  CHECK_THAT(error, Catch::Contains("unexpected 'guard'"));
}

TEST_CASE("cancelling a waiting request removes it from the queue", "[scheduler]") {
  auto s = make_scheduler("fifo", "fpga:1");
  submit(*s, req(1, 0), 0);
  submit(*s, req(2, 1), 1);
  submit(*s, req(3, 2), 2);
  release(*s, 2, 3);
  CHECK(s->queue_order(3) == V{3});
  CHECK(granted(release(*s, 1, 4)) == V{3});
}

TEST_CASE("a lease restored after a restart holds its devices and keeps its service", "[scheduler][restore]") {
  auto s = make_scheduler("las:10", "fpga:3");
  const std::vector<DeviceId> held{2, 0};
  REQUIRE_FALSE(s->restore(req(7, 0, 2), held, /*granted_at=*/100, /*attained_device_s=*/4));
  CHECK(s->phase(7) == RequestPhase::running);
  CHECK(s->devices_of(7) == held);
  CHECK(s->device_state(1) == DeviceState::free);
  // 4 device-seconds attained + 2 devices x 3 s = 10 at t=103: the LAS demotion is due then.
  REQUIRE(s->next_wakeup());
  CHECK(*s->next_wakeup() == Approx(103));
  // Bad restores are refused and change nothing.
  const std::vector<DeviceId> busy{0}, unknown{9}, twice{1, 1};
  CHECK(s->restore(req(8, 0, 1), busy, 100));
  CHECK(s->restore(req(8, 0, 1), unknown, 100));
  CHECK(s->restore(req(8, 0, 2), twice, 100));
  CHECK(s->restore(req(7, 0, 1), std::vector<DeviceId>{1}, 100));
  CHECK(s->restore(req(8, 0, 2), std::vector<DeviceId>{1}, 100));
  CHECK_FALSE(s->phase(8));
  CHECK(s->running_count() == 1);
  CHECK(s->free_count() == 1);
  CHECK(granted(release(*s, 7, 104)).empty());
  CHECK(s->free_count() == 3);
}

TEST_CASE("devices freed by preemption go to the request they were freed for", "[scheduler][srpt]") {
  // A 2-wide request preempts two single leases; as the first victim gives its device back, neither it nor
  // anyone else may take that device: the preempting request gets both once the second one is back.
  auto s = make_scheduler("srpt", "fpga:2");
  submit(*s, req(1, 0, 1, 100), 0);
  submit(*s, req(2, 0, 1, 90), 0);
  auto d = submit(*s, req(3, 1, 2, 5), 1);
  CHECK(preempted(d) == V{1, 2});   // the most remaining time first
  submit(*s, req(4, 1, 1, 50), 1);  // narrow and shorter than the victims: would fit a single freed device
  Decisions out;
  REQUIRE_FALSE(s->requeue(2, 1, out));
  CHECK(out.grants.empty());
  CHECK(out.preemptions.empty());
  REQUIRE_FALSE(s->requeue(1, 1, out));
  CHECK(granted(out) == V{3});
  CHECK(out.preemptions.empty());
}

TEST_CASE("behind an aged gang, only jobs that end before its reservation start (EASY backfilling)",
          "[scheduler][guard]") {
  auto s = make_scheduler("sjf+first-fit+guard=50", "fpga:2");
  submit(*s, req(1, 0, 1, 100), 0);  // device until 100
  submit(*s, req(2, 0, 1, 30), 0);   // device until 30
  submit(*s, req(3, 1, 2, 50), 1);   // the gang
  release(*s, 2, 30);                // the gang has waited 29 s: not aged, and one device is not enough
  CHECK(granted(submit(*s, req(4, 40, 1, 20), 40)) == V{4});  // not aged yet: ordinary sjf
  submit(*s, req(5, 45, 1, 5), 45);
  CHECK_FALSE(s->expected_start(3, 50));  // not aged yet: no reservation, no estimate
  Decisions out;
  s->tick(51, out);  // the gang ages; its reservation starts at 100, when request 1 is estimated to end
  CHECK(out.empty());
  REQUIRE(s->expected_start(3, 51));
  CHECK(*s->expected_start(3, 51) == Approx(100));
  CHECK_FALSE(s->expected_start(5, 51));  // no reservation of its own
  // At 60 a device frees: request 5 (5 s) ends by 100 and may use it; request 6 (50 s) may not.
  submit(*s, req(6, 59, 1, 50), 59);
  CHECK(granted(release(*s, 4, 60)) == V{5});
  CHECK(granted(release(*s, 5, 65)).empty());
  CHECK(granted(release(*s, 1, 100)) == V{3});
  CHECK(s->phase(6) == RequestPhase::waiting);
}

TEST_CASE("behind a reservation, any waiting request that ends in time starts, not only a bucket's head (full EASY)",
          "[scheduler][guard][easy]") {
  auto s = make_scheduler("fifo+first-fit+guard=50", "fpga:3");
  CHECK(granted(submit(*s, req(1, 0, 2, 1000), 0)) == V{1});  // devices 0 and 1 until 1000
  CHECK(granted(submit(*s, req(2, 0, 1, 100), 0)) == V{2});   // device 2 until 100
  submit(*s, req(3, 0, 3, 50), 0);                            // a gang of the whole pool
  submit(*s, req(4, 60, 1, 5000), 60);                        // one device for 5,000 s
  submit(*s, req(5, 70, 1, 10), 70);  // one device for 10 s, same bucket as request 4, behind it
  // At 100 device 2 frees. The gang (waited 100 s) is aged and does not fit: its reservation starts at 1000,
  // when request 1 ends, and leaves no spare device. Request 4 would end at 5100: it may not start. Request
  // 5 ends at 110 <= 1000: it starts although request 4, first in its bucket, may not.
  CHECK(granted(release(*s, 2, 100)) == V{5});
  CHECK(s->phase(4) == RequestPhase::waiting);
  CHECK(granted(release(*s, 5, 110)).empty());   // device 2 is kept for the gang: request 4 would overrun
  CHECK(granted(release(*s, 1, 1000)) == V{3});  // the reservation is kept
  CHECK(granted(release(*s, 3, 1050)) == V{4});
}

TEST_CASE("behind a reservation, a request that takes only devices the reservation does not need starts",
          "[scheduler][guard][easy]") {
  auto s = make_scheduler("fifo+first-fit+guard=50", "fpga:4");
  CHECK(granted(submit(*s, req(1, 0, 3, 1000), 0)) == V{1});  // devices 0-2 until 1000
  CHECK(granted(submit(*s, req(2, 0, 1, 100), 0)) == V{2});   // device 3 until 100
  submit(*s, req(3, 0, 2, 50), 0);                            // the gang: needs 2 of the 4 at 1000, leaving 2 spare
  submit(*s, req(4, 60, 2, 5000), 60);  // would overrun the reservation and takes 2 devices: not spare now
  submit(*s, req(5, 70, 1, 5000), 70);  // overruns too, but one device fits in the spare ones
  // At 100 one device is free and the gang needs two: reservation at 1000 with 4 - 2 = 2 spare devices.
  CHECK(granted(release(*s, 2, 100)) == V{5});
  CHECK(s->phase(4) == RequestPhase::waiting);
  CHECK(granted(release(*s, 1, 1000)) == V{3});
}

TEST_CASE("releasing several requests at once decides once over all the devices they free", "[scheduler][ties]") {
  auto s = make_scheduler("fifo", "fpga:2");
  submit(*s, req(1, 0), 0);
  submit(*s, req(2, 0), 0);
  submit(*s, req(3, 1, 2), 1);  // the gang, first in line
  submit(*s, req(4, 2), 2);
  Decisions out;
  const std::vector<RequestId> done{1, 2};
  REQUIRE_FALSE(s->release(done, 10, out));
  CHECK(granted(out) == V{3});
  out = {};
  const std::vector<RequestId> twice{3, 3};
  auto rejected = s->release(twice, 11, out);
  REQUIRE(rejected);
  CHECK_THAT(rejected->error, Catch::Contains("listed twice"));
  CHECK(s->phase(3) == RequestPhase::running);
  const std::vector<RequestId> unknown{3, 99};
  CHECK(s->release(unknown, 11, out));
  CHECK(s->phase(3) == RequestPhase::running);
}

TEST_CASE("slowdown aging serves a short job that waited many times its length before a long one", "[scheduler][age]") {
  for (const bool aging : {false, true}) {
    auto s = make_scheduler(aging ? "fifo+first-fit+age=2" : "fifo", "fpga:1");
    CHECK(granted(submit(*s, req(1, 0, 1, 100), 0)) == V{1});  // the device until 100
    submit(*s, req(2, 1, 1, 1000), 1);                         // ages at 1 + 2 x 1000 = 2001
    submit(*s, req(3, 2, 1, 10), 2);                           // ages at 2 + 2 x 10 = 22
    submit(*s, req(4, 3), 3);                                  // no estimate: never ages by slowdown
    if (aging) {
      REQUIRE(s->next_wakeup());
      CHECK(*s->next_wakeup() == Approx(22));
      CHECK(s->queue_order(50) == V{3, 2, 4});
    }
    // At 100 fifo would serve request 2; with aging, request 3 (waited 98 s, 9.8 times its 10 s) goes first.
    CHECK(granted(release(*s, 1, 100)) == (aging ? V{3} : V{2}));
  }
  std::string error;
  CHECK_FALSE(PolicySpec::parse("fifo+age=0", &error));
  CHECK_THAT(error, Catch::Contains("age needs a positive slowdown"));
  CHECK(PolicySpec::parse("gittins+age=50", &error)->to_string() == "gittins+first-fit+age=50");
  CHECK(PolicySpec::parse("fifo+age", &error)->age_slowdown == Approx(kDefaultAgeSlowdown));
}

TEST_CASE("slowdown aging counts the service a request already received", "[scheduler][age]") {
  // Request 1 (estimate 10 s) runs from 0 and is requeued at 100, having run 100 s: its run time is at least
  // 100 s, so with age=2 it ages at 0 + 2 x 100 = 200, not at 0 + 2 x 10 = 20 (when it would already be aged
  // and served first). At 105 sjf therefore serves request 3 (7 s) before it.
  auto s = make_scheduler("sjf+first-fit+age=2", "fpga:1");
  CHECK(granted(submit(*s, req(1, 0, 1, 10), 0)) == V{1});
  submit(*s, req(2, 1, 1, 5), 1);
  Decisions out;
  REQUIRE_FALSE(s->requeue(1, 100, out));
  CHECK(granted(out) == V{2});  // sjf: 5 s before 10 s
  submit(*s, req(3, 101, 1, 7), 101);
  REQUIRE(s->next_wakeup());
  CHECK(*s->next_wakeup() == Approx(115));  // request 3 ages first, at 101 + 2 x 7
  CHECK(s->queue_order(105) == V{3, 1});    // neither aged at 105: sjf order
  CHECK(s->queue_order(150) == V{3, 1});    // request 3 aged
  CHECK(s->queue_order(200) == V{3, 1});    // both aged, in the order they aged
  CHECK(s->queue_order(150, 1) == V{3});    // the head only: the aged request
  CHECK(s->queue_order(105, 1) == V{3});
  CHECK(granted(release(*s, 2, 105)) == V{3});
  CHECK(granted(release(*s, 3, 112)) == V{1});
}

TEST_CASE("an aged request behind leases that outlived their estimates reserves nothing", "[scheduler][guard]") {
  // Request 1 was estimated to end at 10 and still runs at 70: when it ends is unknown, and a reservation for
  // "now" would keep device 1 idle until it does. So the aged gang keeps its place but reserves nothing, and
  // request 4 (5,000 s) starts on the freed device.
  auto s = make_scheduler("fifo+first-fit+guard=50", "fpga:2");
  CHECK(granted(submit(*s, req(1, 0, 1, 10), 0)) == V{1});
  CHECK(granted(submit(*s, req(2, 0, 1, 1000), 0)) == V{2});
  submit(*s, req(3, 0, 2, 50), 0);  // the gang, aged at 50
  submit(*s, req(4, 60, 1, 5000), 60);
  CHECK(granted(release(*s, 2, 70)) == V{4});
  // Now the gang waits for request 1 (past its estimate) and request 4, estimated to end at 5,070: the later.
  REQUIRE(s->expected_start(3, 70));
  CHECK(*s->expected_start(3, 70) == Approx(5070));
  CHECK(granted(release(*s, 1, 100)).empty());  // the gang still needs both
  CHECK(granted(release(*s, 4, 5070)) == V{3});
}

TEST_CASE("next_wakeup never names a past time", "[scheduler][guard]") {
  auto s = make_scheduler("fifo+first-fit+guard=10", "fpga:1");
  submit(*s, req(1, 0), 0);
  submit(*s, req(2, 0.1, 1), 0.1);
  Decisions out;
  s->tick(20, out);  // request 2 is aged and cannot fit: time alone changes nothing now
  CHECK_FALSE(s->next_wakeup());
  submit(*s, req(3, 15, 1), 20);
  REQUIRE(s->next_wakeup());
  CHECK(*s->next_wakeup() == Approx(25));
}

TEST_CASE("names intern to dense ids", "[scheduler][names]") {
  NameTable names;
  CHECK(names.intern("fpga") == 0);
  CHECK(names.intern("gpu") == 1);
  CHECK(names.intern(std::string_view("fpga-u250").substr(0, 4)) == 0);
  CHECK(names.find("gpu") == 1u);
  CHECK_FALSE(names.find("tpu"));
  CHECK(names.name(1) == "gpu");
  CHECK(names.size() == 2);
}

TEST_CASE("the queue's order is the order the policy grants in, whole or by its head", "[scheduler][queue]") {
  for (const char* policy : {"fifo", "sjf", "fair", "gittins"}) {
    INFO("policy " << policy);
    auto s = make_scheduler(policy, "fpga:1");
    submit(*s, req(1, 0, 1, 10), 0);  // holds the one device
    // 60 waiting requests of three tenants with assorted estimates (some none).
    for (RequestId id = 2; id <= 61; ++id) {
      Request r =
          req(id, static_cast<Time>(id), 1,
              id % 5 == 0 ? std::optional<double>{} : std::optional<double>{static_cast<double>((id * 37) % 23 + 1)});
      r.tenant = static_cast<TenantId>(id % 3);
      submit(*s, r, static_cast<Time>(id));
    }
    RequestId running = 1;
    Time t = 100;
    for (int step = 0; step < 60; ++step, t += 7) {
      const auto order = s->queue_order(t);
      REQUIRE(order.size() == static_cast<std::size_t>(60 - step));
      for (std::size_t k : {std::size_t{1}, std::size_t{7}, order.size()}) {
        const auto head = s->queue_order(t, k);
        CHECK(head == std::vector<RequestId>(order.begin(),
                                             order.begin() + static_cast<std::ptrdiff_t>(std::min(k, order.size()))));
      }
      auto next = granted(release(*s, running, t));
      REQUIRE(next.size() == 1);
      CHECK(next.front() == order.front());
      running = next.front();
    }
  }
}
