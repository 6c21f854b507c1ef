// Slots in the simulator: slot leases side by side, partial programming times, the interference slowdown and
// a whole-device lease waiting for all slots, with hand-computed times.
#include "test_util.hpp"

#include <accelpool/sim/trace.hpp>

#include <catch2/catch.hpp>

using namespace accelpool::sim;
using accelpool::sim::test::make_job;

namespace {

// One device with two slots of share `share`; full image 8 s, partial 0.5 s.
PoolSpec sliced(double share) {
  PoolSpec pool = PoolSpec::homogeneous(1, 8, 0);
  pool.default_cost.partial_reconfig_s = 0.5;
  pool.hosts[0].devices[0].slots = 2;
  pool.hosts[0].devices[0].slot_share = share;
  return pool;
}

Job slot_job(std::uint64_t id, double arrival, double runtime, double demand, std::string bitstream) {
  Job j = make_job(id, arrival, runtime, 1, std::move(bitstream));
  j.kind = "fpga/slot";
  j.demand = demand;
  return j;
}

RunResult run(const Trace& trace, const PoolSpec& pool, const std::string& policy = "fifo") {
  std::string error;
  auto spec = accelpool::scheduler::PolicySpec::parse(policy, &error);
  REQUIRE(spec);
  SimOptions options;
  options.self_check = true;
  auto r = simulate(trace, pool, *spec, options);
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r);
  return *r;
}

}  // namespace

TEST_CASE("two slot leases run side by side, their demands slow both, and a whole lease waits", "[sim][slots]") {
  Trace trace;
  // Demands 0.8 + 0.8 = 1.6 of the device's bandwidth: both run at 1/1.6 of their speed.
  trace.jobs.push_back(slot_job(0, 0, 100, 0.8, "a"));
  trace.jobs.push_back(slot_job(1, 0, 100, 0.8, "b"));
  Job whole = make_job(2, 0, 10, 1, "c");
  trace.jobs.push_back(whole);
  const RunResult r = run(trace, sliced(1.0));
  REQUIRE(r.per_job.size() == 3);
  // Partial programming 0.5 s, then 100 s of work at 0.625: 160 s. Both end at 160.5.
  CHECK(r.per_job[0].first_start_s == 0);
  CHECK(r.per_job[1].first_start_s == 0);
  CHECK(r.per_job[0].finish_s == Approx(160.5));
  CHECK(r.per_job[1].finish_s == Approx(160.5));
  // The whole-device job waits for both slots, then programs the full image (8 s) and runs 10 s.
  CHECK(r.per_job[2].first_start_s == Approx(160.5));
  CHECK(r.per_job[2].finish_s == Approx(178.5));
  CHECK(r.reconfigurations == 3);
  CHECK(r.devices == 1);
}

TEST_CASE("the slowdown follows the leases present: a lease alone again runs at full speed", "[sim][slots]") {
  Trace trace;
  trace.jobs.push_back(slot_job(0, 0, 100, 1.0, "a"));
  trace.jobs.push_back(slot_job(1, 0, 20, 1.0, "a"));
  PoolSpec pool = sliced(1.0);
  pool.default_cost.partial_reconfig_s = 0;
  const RunResult r = run(trace, pool);
  // Together (demand 2): half speed. Job 1 does 20 s of work by t=40; job 0 has done 20 by then, and does the
  // other 80 alone by t=120.
  CHECK(r.per_job[1].finish_s == Approx(40));
  CHECK(r.per_job[0].finish_s == Approx(120));
}

TEST_CASE("a demand above every slot's share is refused before the run", "[sim][slots]") {
  Trace trace;
  trace.jobs.push_back(slot_job(0, 0, 10, 0.6, "a"));
  auto spec = accelpool::scheduler::PolicySpec::parse("fifo", nullptr);
  auto r = simulate(trace, sliced(0.5), *spec, SimOptions{});
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "job 0: demand 0.6 exceeds the share of every slot");
}

TEST_CASE("generator: partial images ask for slots and carry their demand, and the rest of the trace is unchanged",
          "[sim][slots]") {
  GeneratorSpec spec;
  spec.jobs = 500;
  spec.bitstreams = 8;
  auto plain = generate_trace(spec, 7);
  spec.partial_fraction = 1;
  spec.demand_min = 0.1;
  spec.demand_max = 0.3;
  auto mixed = generate_trace(spec, 7);
  REQUIRE(plain);
  REQUIRE(mixed);
  for (std::size_t i = 0; i < plain->jobs.size(); ++i) {
    const Job& p = plain->jobs[i];
    const Job& m = mixed->jobs[i];
    CHECK(p.arrival_s == m.arrival_s);
    CHECK(p.runtime_s == m.runtime_s);
    CHECK(p.bitstream == m.bitstream);
    CHECK(p.kind == "fpga");
    CHECK(m.kind == "fpga/slot");
    CHECK(m.demand >= 0.1);
    CHECK(m.demand <= 0.3);
  }
  spec.partial_fraction = 1.5;
  CHECK_FALSE(generate_trace(spec, 7));
}
