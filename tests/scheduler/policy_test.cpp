// Each policy's rule pinned on small scripted scenarios whose JCTs were computed by hand, replayed through the
// simulator (the same Scheduler the manager runs).
#include <accelpool/sim/simulator.hpp>

#include <catch2/catch.hpp>

#include <numeric>

using namespace accelpool;
using sim::Job;

namespace {

Job job(std::uint64_t id, double arrival, double runtime, std::uint32_t devices = 1) {
  Job j;
  j.id = id;
  j.arrival_s = arrival;
  j.runtime_s = runtime;
  j.devices = devices;
  j.estimate_s = runtime;  // exact estimates
  return j;
}

sim::RunResult run(const std::vector<Job>& jobs, const std::string& policy, const sim::PoolSpec& pool) {
  std::string error;
  auto spec = scheduler::PolicySpec::parse(policy, &error);
  INFO(error);
  REQUIRE(spec);
  sim::SimOptions options;
  options.self_check = true;
  auto result = sim::simulate(sim::Trace{jobs}, pool, *spec, options);
  INFO((result ? std::string() : result.error().message));
  REQUIRE(result);
  return *result;
}

// JCT of each job, by id.
std::vector<double> jcts(const sim::RunResult& r) {
  std::vector<double> out;
  for (const auto& j : r.per_job) out.push_back(j.jct_s);
  return out;
}

// Element-wise approximate equality of JCT vectors.
auto close_to(std::vector<double> expected) { return Catch::Matchers::Approx(expected); }

// One device; X runs from 0, then A (10 s), B (1 s), C (2 s) arrive together at t=1.
const std::vector<Job> kBlocker{job(0, 0, 5), job(1, 1, 10), job(2, 1, 1), job(3, 1, 2)};

}  // namespace

TEST_CASE("fifo serves in arrival order", "[policy][fifo]") {
  auto r = run(kBlocker, "fifo", sim::PoolSpec::homogeneous(1));
  // X 0-5, A 5-15, B 15-16, C 16-18.
  CHECK_THAT(jcts(r), close_to(std::vector<double>{5, 14, 15, 17}));
  CHECK(r.avg_jct_s == Catch::Detail::Approx(12.75));
  CHECK(r.preemptions == 0);
}

TEST_CASE("sjf and djsf serve the shortest waiting job once the device frees", "[policy][sjf][djsf]") {
  for (const char* policy : {"sjf", "djsf"}) {
    INFO(policy);
    auto r = run(kBlocker, policy, sim::PoolSpec::homogeneous(1));
    // X 0-5 (not preempted), B 5-6, C 6-8, A 8-18.
    CHECK_THAT(jcts(r), close_to(std::vector<double>{5, 17, 5, 7}));
    CHECK(r.avg_jct_s == Catch::Detail::Approx(8.5));
  }
}

TEST_CASE("srpt preempts for a shorter remaining time and resumes the victim with its progress", "[policy][srpt]") {
  auto r = run(kBlocker, "srpt", sim::PoolSpec::homogeneous(1));
  // B (1 s) preempts X (4 s left) at t=1: B 1-2, C 2-4, X 4-8, A 8-18.
  CHECK_THAT(jcts(r), close_to(std::vector<double>{8, 17, 1, 3}));
  CHECK(r.avg_jct_s == Catch::Detail::Approx(7.25));
  CHECK(r.preemptions == 1);
  CHECK(r.per_job[0].preemptions == 1);
}

TEST_CASE("las demotes at its thresholds and serves least attained service first", "[policy][las]") {
  auto r = run(kBlocker, "las:2.5", sim::PoolSpec::homogeneous(1));
  // X demoted at 2.5 -> A 2.5-5, demoted -> B 5-6, C 6-8, then queue 1 by arrival: X 8-10.5, A 10.5-18.
  CHECK_THAT(jcts(r), close_to(std::vector<double>{10.5, 17, 5, 7}));
  CHECK(r.preemptions == 2);
  // With one queue only, las is fifo.
  CHECK_THAT(jcts(run(kBlocker, "las:1000", sim::PoolSpec::homogeneous(1))),
             close_to(std::vector<double>{5, 14, 15, 17}));
}

TEST_CASE("the tail guard bounds how long sjf makes a long job wait", "[policy][guard]") {
  // X 0-10; a long job L (100 s) arrives at 1; six 6-second jobs arrive every 5 s from 5.
  std::vector<Job> jobs{job(0, 0, 10), job(1, 1, 100)};
  for (int i = 0; i < 6; ++i) jobs.push_back(job(2 + i, 5.0 * (i + 1), 6));
  auto plain = run(jobs, "sjf", sim::PoolSpec::homogeneous(1));
  // Short jobs keep winning: L starts at 46.
  CHECK(plain.per_job[1].jct_s == Catch::Detail::Approx(145));
  auto guarded = run(jobs, "sjf+first-fit+guard=20", sim::PoolSpec::homogeneous(1));
  // L ages at 21 and takes the device at 22, when the running short job ends.
  CHECK(guarded.per_job[1].jct_s == Catch::Detail::Approx(121));
  CHECK(guarded.max_jct_s < plain.max_jct_s);
}

TEST_CASE("a gang waits for all its devices while single jobs backfill", "[policy][gang]") {
  std::vector<Job> jobs{job(0, 0, 4), job(1, 0.5, 10, 2), job(2, 1, 3)};
  auto r = run(jobs, "fifo", sim::PoolSpec::homogeneous(2));
  // Job 0 on one device 0-4; the gang cannot start; job 2 backfills the other device 1-4; the gang runs 4-14.
  CHECK_THAT(jcts(r), close_to(std::vector<double>{4, 13.5, 3}));
}

TEST_CASE("affinity avoids reprogramming where first-fit reprograms", "[policy][affinity]") {
  std::vector<Job> jobs{job(0, 0, 5), job(1, 0, 5), job(2, 20, 5)};
  jobs[0].bitstream = "a";
  jobs[1].bitstream = "b";
  jobs[2].bitstream = "b";
  const auto pool = sim::PoolSpec::homogeneous(2, /*reconfig_s=*/10);
  auto ff = run(jobs, "fifo+first-fit", pool);
  auto af = run(jobs, "fifo+affinity", pool);
  // Both first program the blank devices (10 s). Then job 2 (image b) gets device 0 (holds a) under
  // first-fit and pays 10 s again; affinity gives it device 1, which holds b.
  CHECK_THAT(jcts(ff), close_to(std::vector<double>{15, 15, 15}));
  CHECK_THAT(jcts(af), close_to(std::vector<double>{15, 15, 5}));
  CHECK(ff.reconfigurations == 3);
  CHECK(af.reconfigurations == 2);
}

TEST_CASE("the reuse rule gives a freed device to the waiting job of its image, within its bound", "[policy][reuse]") {
  std::vector<Job> jobs{job(0, 0, 5), job(1, 0, 30), job(2, 1, 5), job(3, 2, 5)};
  jobs[0].bitstream = "a";
  jobs[1].bitstream = "b";
  jobs[2].bitstream = "b";
  jobs[3].bitstream = "a";
  const auto pool = sim::PoolSpec::homogeneous(2, /*reconfig_s=*/10);
  // Both start on blank devices: job 0 on device 0 (holds a) 0-15, job 1 on device 1 (holds b) 0-40.
  // fifo: device 0 frees at 15 and goes to job 2 (b, first in line), programmed: 15-30; then to job 3 (a),
  // programmed again: 30-45.
  auto af = run(jobs, "fifo+affinity", pool);
  CHECK_THAT(jcts(af), close_to(std::vector<double>{15, 40, 29, 43}));
  CHECK(af.reconfigurations == 4);
  // reuse: at 15 job 2 has waited 14 s < 3600 s, so device 0 (holds a) goes to job 3 as it is: 15-20; then job 2
  // takes it, programmed: 20-35. One programming less and 5 s less average JCT.
  auto reuse = run(jobs, "fifo+affinity+reuse", pool);
  CHECK_THAT(jcts(reuse), close_to(std::vector<double>{15, 40, 34, 18}));
  CHECK(reuse.reconfigurations == 3);
  // A bound of 10 s: job 2 has waited 14 s at 15, so no one passes it: as fifo.
  auto bounded = run(jobs, "fifo+affinity+reuse=10", pool);
  CHECK_THAT(jcts(bounded), close_to(std::vector<double>{15, 40, 29, 43}));
}

TEST_CASE("fair serves the tenant with less device-time first", "[policy][fair]") {
  std::vector<Job> jobs{job(0, 0, 10), job(1, 0, 10), job(2, 0, 10), job(3, 1, 10)};
  for (int i = 0; i < 3; ++i) jobs[i].tenant = "a";
  jobs[3].tenant = "b";
  auto fifo = run(jobs, "fifo", sim::PoolSpec::homogeneous(1));
  CHECK(fifo.per_job[3].jct_s == Catch::Detail::Approx(39));
  auto fair = run(jobs, "fair", sim::PoolSpec::homogeneous(1));
  // After a's first job, a has used 10 device-seconds and b none: b runs 10-20.
  CHECK_THAT(jcts(fair), close_to(std::vector<double>{10, 30, 40, 19}));
}
