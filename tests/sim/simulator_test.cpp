#include <accelpool/sim/pool_file.hpp>
#include <accelpool/sim/simulator.hpp>
#include <accelpool/sim/trace.hpp>

#include "test_util.hpp"

#include <catch2/catch.hpp>

#include <map>

using namespace accelpool::sim;
using accelpool::sim::test::make_job;
namespace sch = accelpool::scheduler;

namespace {

sch::PolicySpec policy(const std::string& text) {
  std::string error;
  auto spec = sch::PolicySpec::parse(text, &error);
  INFO(error);
  REQUIRE(spec.has_value());
  return *spec;
}

RunResult run(const Trace& t, const PoolSpec& pool, const std::string& p, SimOptions options = {}) {
  options.self_check = true;
  auto r = simulate(t, pool, policy(p), options);
  if (!r) FAIL(r.error().message);
  return std::move(*r);
}

std::map<std::uint64_t, JobResult> by_id(const RunResult& r) {
  std::map<std::uint64_t, JobResult> m;
  for (const auto& j : r.per_job) m[j.id] = j;
  return m;
}

}  // namespace

TEST_CASE("sim: JCT counts waiting, reprogramming and attach", "[sim][engine]") {
  // One device, programming 10 s, attach 2 s. Job 0 (bitstream a, 100 s) at 0; job 1 (a, 50 s) at 5 waits
  // for it and needs no programming; job 2 (b, 20 s) at 6 follows and must program.
  Trace t;
  t.jobs = {make_job(0, 0, 100, 1, "a"), make_job(1, 5, 50, 1, "a"), make_job(2, 6, 20, 1, "b")};
  auto r = run(t, PoolSpec::homogeneous(1, 10, 2), "fifo");
  auto j = by_id(r);
  CHECK(j[0].first_start_s == 0);
  CHECK(j[0].finish_s == Approx(112));
  CHECK(j[0].jct_s == Approx(112));
  CHECK(j[0].reconfigurations == 1);
  CHECK(j[1].first_start_s == Approx(112));
  CHECK(j[1].wait_s == Approx(107));
  CHECK(j[1].finish_s == Approx(164));  // attach only
  CHECK(j[1].reconfigurations == 0);
  CHECK(j[2].finish_s == Approx(164 + 12 + 20));
  CHECK(j[2].reconfigurations == 1);
  CHECK(r.reconfigurations == 2);
  CHECK(r.avg_jct_s == Approx((112 + 159 + 190) / 3.0));
  CHECK(r.max_jct_s == Approx(190));
  CHECK(r.makespan_s == Approx(196));
  // Held device-seconds: 112 + 52 + 32 = 196 = the whole makespan; run time alone is 170.
  CHECK(r.utilization == Approx(1.0));
  CHECK(r.useful_utilization == Approx(170.0 / 196));
  CHECK(j[2].slowdown == Approx(190.0 / 20));
  CHECK(r.preemptions == 0);
}

TEST_CASE("sim: sjf runs the shorter waiting job first", "[sim][engine]") {
  Trace t;
  t.jobs = {make_job(0, 0, 10, 1, "default", 10.0), make_job(1, 1, 30, 1, "default", 30.0),
            make_job(2, 2, 5, 1, "default", 5.0)};
  auto fifo = by_id(run(t, PoolSpec::homogeneous(1), "fifo"));
  CHECK(fifo[1].finish_s == Approx(40));
  CHECK(fifo[2].finish_s == Approx(45));
  auto sjf = by_id(run(t, PoolSpec::homogeneous(1), "sjf"));
  CHECK(sjf[2].finish_s == Approx(15));
  CHECK(sjf[1].finish_s == Approx(45));
}

TEST_CASE("sim: preemption keeps progress and charges the restore cost", "[sim][engine]") {
  // LAS with one threshold at 10 device-seconds: job 0 (100 s) is demoted at t=10; job 1 (5 s) arriving at
  // 50 outranks it and preempts it; job 0 resumes at 55 with a 3 s restore and 50 s left: finishes at 108.
  Trace t;
  t.jobs = {make_job(0, 0, 100), make_job(1, 50, 5)};
  SimOptions o;
  o.restore_s = 3;
  auto r = run(t, PoolSpec::homogeneous(1), "las:10", o);
  auto j = by_id(r);
  CHECK(j[1].jct_s == Approx(5));
  CHECK(j[0].preemptions == 1);
  CHECK(j[0].finish_s == Approx(108));
  CHECK(r.preemptions == 1);
  CHECK(r.lower_bound_avg_jct_s == Approx((105.0 + 5.0) / 2));
}

TEST_CASE("sim: gangs are placed all-or-nothing", "[sim][engine]") {
  // Two devices. Job 0 holds one device for 10 s; job 1 needs both and must wait until 10 even though one
  // device is free; job 2 (1 device) arriving at 1 backfills the free device.
  Trace t;
  t.jobs = {make_job(0, 0, 10, 1), make_job(1, 0.5, 4, 2), make_job(2, 1, 3, 1)};
  auto j = by_id(run(t, PoolSpec::homogeneous(2), "fifo"));
  CHECK(j[2].first_start_s == Approx(1));
  CHECK(j[1].first_start_s == Approx(10));
  CHECK(j[1].finish_s == Approx(14));
}

TEST_CASE("sim: completions at the same instant: one at a time by default, together with batch_completions",
          "[sim][engine][ties]") {
  // Jobs 0 and 1 each hold one of two devices until 10. The gang (job 2) arrived first, a long single job
  // (job 3) after it.
  Trace t;
  t.jobs = {make_job(0, 0, 10, 1), make_job(1, 0, 10, 1), make_job(2, 1, 5, 2), make_job(3, 2, 100, 1)};
  // One at a time: job 0's device is free alone, the gang does not fit, job 3 backfills it until 110; job 1's
  // device then is not enough for the gang, which waits until 110.
  auto one = by_id(run(t, PoolSpec::homogeneous(2), "fifo"));
  CHECK(one[3].first_start_s == Approx(10));
  CHECK(one[2].first_start_s == Approx(110));
  // Together: both devices are free at once and go to the gang first; job 3 follows at 15.
  SimOptions o;
  o.batch_completions = true;
  auto together = by_id(run(t, PoolSpec::homogeneous(2), "fifo", o));
  CHECK(together[2].first_start_s == Approx(10));
  CHECK(together[2].finish_s == Approx(15));
  CHECK(together[3].first_start_s == Approx(15));
}

TEST_CASE("sim: with --estimates none the schedule does not depend on the run time of a job still running",
          "[sim][estimates]") {
  // A guard policy with reservations on one device. Job 0's true run time differs between the two traces;
  // without estimates nothing the scheduler decides before job 0 ends may depend on it.
  for (const char* policy : {"fifo+first-fit+guard=5", "sjf+first-fit+guard=5", "gittins", "srpt"}) {
    Trace a;
    a.jobs = {make_job(0, 0, 50, 1), make_job(1, 1, 5, 2), make_job(2, 2, 3, 1), make_job(3, 3, 3, 1)};
    Trace b = a;
    b.jobs[0].runtime_s = 60;
    auto ra = by_id(run(a, PoolSpec::homogeneous(2), policy));
    auto rb = by_id(run(b, PoolSpec::homogeneous(2), policy));
    INFO(policy);
    for (std::uint64_t j = 1; j < 4; ++j) {
      if (ra[j].first_start_s < 50) CHECK(rb[j].first_start_s == Approx(ra[j].first_start_s));
    }
  }
}

TEST_CASE("sim: a job's label groups what the scheduler learns about run times", "[sim][estimates]") {
  // One device, sjf, no estimates, a group is trusted after one finished job. Job 0 (label quick, 10 s) runs
  // 0-10, job 1 (slow, 100 s) 10-110, job 2 (quick, 10 s) 111-121. Jobs 3 (slow, 100 s, at 112) and 4 (quick,
  // 10 s, at 113) wait for job 2. With labels the scheduler learned 100 s for slow and 10 s for quick, so at
  // 121 job 4 goes first: 121-131, then job 3: 131-231. Without labels every job is in one group whose mean is
  // 55 s for both, the tie goes by arrival: job 3 121-221, job 4 221-231.
  Trace t;
  t.jobs = {make_job(0, 0, 10), make_job(1, 0.5, 100), make_job(2, 111, 10), make_job(3, 112, 100),
            make_job(4, 113, 10)};
  for (std::uint64_t i : {0, 2, 4}) t.jobs[i].label = "quick";
  for (std::uint64_t i : {1, 3}) t.jobs[i].label = "slow";
  SimOptions o;
  o.learning.warmup = 1;
  auto labelled = by_id(run(t, PoolSpec::homogeneous(1), "sjf", o));
  CHECK(labelled[2].finish_s == Approx(121));
  CHECK(labelled[4].first_start_s == Approx(121));
  CHECK(labelled[4].finish_s == Approx(131));
  CHECK(labelled[3].finish_s == Approx(231));

  for (auto& j : t.jobs) j.label.clear();
  auto unlabelled = by_id(run(t, PoolSpec::homogeneous(1), "sjf", o));
  CHECK(unlabelled[3].finish_s == Approx(221));
  CHECK(unlabelled[4].finish_s == Approx(231));
}

TEST_CASE("sim: invariants hold for every ordering x placement on random traces", "[sim][invariants]") {
  // A mixed pool: two hosts with passthrough devices and a network-attached group, two models with
  // different programming costs.
  auto pool = parse_pool_json(R"({
    "models": {"slow": {"reconfig_s": 30, "attach_s": 1}, "fast": {"reconfig_s": 5}},
    "hosts": [
      {"name": "h", "repeat": 2, "devices": [{"model": "slow", "attach": "passthrough", "count": 3}]},
      {"name": "net", "devices": [{"model": "fast", "count": 6}]}
    ]})",
                              "pool");
  REQUIRE(pool.is_ok());
  GeneratorSpec g;
  g.jobs = 400;
  g.runtime = RuntimeDist::lognormal;
  g.mean_runtime_s = 200;
  g.gang_sizes = {1, 2, 4};
  g.gang_weights = {0.7, 0.2, 0.1};
  g.bitstreams = 5;
  g.tenants = 3;
  std::map<std::string, std::uint64_t> preemptions;  // per ordering, over all runs
  for (std::uint64_t seed : {1, 2, 3}) {
    auto trace = generate_trace(g, seed);
    REQUIRE(trace.is_ok());
    for (std::size_t i = 0; i < trace->jobs.size(); ++i) {
      trace->jobs[i].host = i % 3 == 0 ? "h0" : i % 3 == 1 ? "h1" : "net";
    }
    REQUIRE(rescale_load(*trace, pool->total_devices(), 0.9).is_ok());
    apply_estimates(*trace, {EstimateSpec::Mode::noisy, 0.5}, seed);
    for (auto ordering : sch::ordering_names()) {
      for (auto placement : sch::placement_names()) {
        for (const char* guard : {"", "+guard=600"}) {
          const std::string p = std::string(ordering) + "+" + std::string(placement) + guard;
          SimOptions o;
          o.self_check = true;
          // Without a tail guard every ordering backfills, so no device idles while a fitting job waits.
          o.check_work_conserving = std::string(guard).empty();
          o.restore_s = 2;
          INFO(p << " seed " << seed);
          auto r = simulate(*trace, *pool, policy(p), o);
          if (!r) FAIL(r.error().message);
          REQUIRE(r->per_job.size() == trace->jobs.size());
          for (const auto& j : r->per_job) {
            REQUIRE(j.jct_s >= j.runtime_s - 1e-9);
            REQUIRE(j.wait_s >= 0);
            REQUIRE(j.finish_s >= j.first_start_s + j.runtime_s - 1e-9);
          }
          CHECK(r->avg_jct_s >= r->lower_bound_avg_jct_s * (1 - 1e-9));
          CHECK(r->utilization <= 1 + 1e-9);
          CHECK(r->useful_utilization <= r->utilization + 1e-9);
          preemptions[std::string(ordering)] += r->preemptions;
        }
      }
    }
  }
  // The sweep exercises the preemption path of the preemptive orderings, and only theirs.
  CHECK(preemptions["srpt"] > 0);
  CHECK(preemptions["las"] > 0);
  CHECK(preemptions["fifo"] == 0);
  CHECK(preemptions["sjf"] == 0);
}

// Mostly single-device jobs, a fifth of them pairs, at `load` on 8 devices.
Trace small_gang_trace(std::size_t jobs, std::uint64_t seed, double load) {
  GeneratorSpec g;
  g.jobs = jobs;
  g.gang_sizes = {1, 2};
  g.gang_weights = {0.8, 0.2};
  auto trace = generate_trace(g, seed);
  REQUIRE(trace.is_ok());
  REQUIRE(rescale_load(*trace, 8, load).is_ok());
  return std::move(*trace);
}

TEST_CASE("sim: same input, same result", "[sim][engine]") {
  auto trace = small_gang_trace(500, 4, 0.9);
  auto a = run(trace, PoolSpec::homogeneous(8, 3), "las+affinity");
  auto b = run(trace, PoolSpec::homogeneous(8, 3), "las+affinity");
  CHECK(a.avg_jct_s == b.avg_jct_s);
  CHECK(a.events == b.events);
  for (std::size_t i = 0; i < a.per_job.size(); ++i) CHECK(a.per_job[i].finish_s == b.per_job[i].finish_s);
}

TEST_CASE("sim: without per-job rows the summary is the same", "[sim][engine]") {
  auto trace = small_gang_trace(800, 6, 0.95);
  SimOptions lean;
  lean.keep_per_job = false;
  auto full = run(trace, PoolSpec::homogeneous(8, 3), "las+affinity");
  auto summary = run(trace, PoolSpec::homogeneous(8, 3), "las+affinity", lean);
  CHECK(summary.per_job.empty());
  REQUIRE(full.per_job.size() == 800);
  CHECK(summary.avg_jct_s == full.avg_jct_s);
  CHECK(summary.p99_jct_s == full.p99_jct_s);
  CHECK(summary.p99_wait_s == full.p99_wait_s);
  CHECK(summary.avg_slowdown == full.avg_slowdown);
  CHECK(summary.makespan_s == full.makespan_s);
  CHECK(summary.preemptions == full.preemptions);
  CHECK(full.preemptions > 0);
}

TEST_CASE("sim: queue samples are evenly spaced and bounded", "[sim][engine]") {
  GeneratorSpec g;
  g.jobs = 3000;
  auto trace = generate_trace(g, 8);
  REQUIRE(trace.is_ok());
  REQUIRE(rescale_load(*trace, 4, 1.2).is_ok());
  SimOptions o;
  o.max_queue_samples = 64;
  auto r = run(*trace, PoolSpec::homogeneous(4), "fifo", o);
  REQUIRE(r.queue.size() >= 16);
  CHECK(r.queue.size() <= 64);
  const double dt = r.queue[1].t - r.queue[0].t;
  for (std::size_t i = 1; i < r.queue.size(); ++i) CHECK(r.queue[i].t - r.queue[i - 1].t == Approx(dt));
  CHECK(r.max_waiting > 0);
  std::uint64_t peak = 0;
  for (const auto& q : r.queue) {
    peak = std::max(peak, q.waiting);
    CHECK(q.busy_devices <= 4);
  }
  CHECK(peak <= r.max_waiting);
}

TEST_CASE("sim: impossible jobs and bad input are errors, not runs", "[sim][engine]") {
  Trace t;
  CHECK_FALSE(simulate(t, PoolSpec::homogeneous(2), policy("fifo"), {}).is_ok());

  t.jobs = {make_job(0, 0, 1, 1), make_job(7, 1, 1, 3)};
  auto r = simulate(t, PoolSpec::homogeneous(2), policy("fifo"), {});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().message == "job 7 asks for 3 fpga devices but only 2 are reachable from host \"host0\"");

  t.jobs = {make_job(0, 0, 1)};
  t.jobs[0].kind = "gpu";
  r = simulate(t, PoolSpec::homogeneous(2), policy("fifo"), {});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().message == "job 0: the pool has no devices of kind \"gpu\"");

  t.jobs = {make_job(0, 0, 1)};
  t.jobs[0].host = "elsewhere";
  r = simulate(t, PoolSpec::homogeneous(2), policy("fifo"), {});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().message == "job 0: the pool has no host \"elsewhere\"");

  t.jobs = {make_job(3, 0, 1), make_job(3, 1, 1)};
  r = simulate(t, PoolSpec::homogeneous(2), policy("fifo"), {});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().message == "job 3: id used twice");

  // Passthrough devices serve only guests on their host.
  auto pool = parse_pool_json(R"({"hosts":[{"name":"a","devices":[{"attach":"passthrough","count":2}]},
                                          {"name":"b","devices":[{"attach":"passthrough","count":1}]}]})",
                              "p");
  REQUIRE(pool.is_ok());
  t.jobs = {make_job(0, 0, 1, 2)};
  t.jobs[0].host = "b";
  r = simulate(t, *pool, policy("fifo"), {});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().message == "job 0 asks for 2 fpga devices but only 1 are reachable from host \"b\"");
  t.jobs[0].host = "a";
  CHECK(simulate(t, *pool, policy("fifo"), {}).is_ok());
}

TEST_CASE("pool file: valid description", "[sim][pool]") {
  auto p = parse_pool_json(R"({
    "default": {"reconfig_s": 1, "attach_s": 0.5},
    "models": {"u250": {"reconfig_s": 12}},
    "hosts": [
      {"name": "fpga", "repeat": 3, "devices": [{"kind": "fpga", "model": "u250", "attach": "passthrough", "count": 4}]},
      {"devices": [{"kind": "gpu", "model": "a100"}]}
    ]})",
                           "pool.json");
  REQUIRE(p.is_ok());
  REQUIRE(p->hosts.size() == 4);
  CHECK(p->hosts[0].name == "fpga0");
  CHECK(p->hosts[2].name == "fpga2");
  CHECK(p->hosts[3].name == "host1");
  CHECK(p->total_devices() == 13);
  CHECK(p->hosts[1].devices[0].attach == sch::AttachMode::passthrough);
  CHECK(p->cost("u250").reconfig_s == 12);
  CHECK(p->cost("u250").attach_s == 0);
  CHECK(p->cost("a100").reconfig_s == 1);
  CHECK(p->cost("a100").attach_s == 0.5);
}

TEST_CASE("pool file: errors name the file and the place", "[sim][pool]") {
  auto err = [](const std::string& text) {
    auto p = parse_pool_json(text, "pool.json");
    REQUIRE_FALSE(p.is_ok());
    return p.error().message;
  };
  CHECK_THAT(err("{\"hosts\": [}"), Catch::StartsWith("pool.json: invalid JSON at byte"));
  CHECK(err("[]") == "pool.json: expected a JSON object");
  CHECK(err("{}") == "pool.json: missing \"hosts\"");
  CHECK(err(R"({"hosts": [], "x": 1})") == "pool.json: unknown key \"x\" (known: hosts, models, default)");
  CHECK(err(R"({"hosts": []})") == "pool.json: hosts: expected a non-empty array");
  CHECK(err(R"({"hosts": [{"devices": [{"count": 0}]}]})") ==
        "pool.json: hosts[0].devices[0].count: expected an integer from 1 to 10000000");
  CHECK(err(R"({"hosts": [{"devices": [{"attach": "usb"}]}]})") ==
        "pool.json: hosts[0].devices[0].attach: expected \"network\" or \"passthrough\"");
  CHECK(
      err(R"({"hosts": [{"devices": [{"colour": "red"}]}]})") ==
      "pool.json: hosts[0].devices[0]: unknown key \"colour\" (known: kind, model, attach, count, slots, slot_share)");
  CHECK(err(R"({"hosts": [{"name": "a", "devices": [{}]}, {"name": "a", "devices": [{}]}]})") ==
        "pool.json: hosts[1].name: host \"a\" declared twice");
  CHECK(err(R"({"models": {"m": {"reconfig_s": -1}}, "hosts": [{"devices": [{}]}]})") ==
        "pool.json: models.m.reconfig_s: expected a number of seconds >= 0");
  auto missing = load_pool_file("/nonexistent/pool.json");
  REQUIRE_FALSE(missing.is_ok());
  CHECK_THAT(missing.error().message, Catch::StartsWith("cannot open pool file /nonexistent/pool.json"));
}
