#include <accelpool/sim/lower_bound.hpp>

#include "test_util.hpp"

#include <catch2/catch.hpp>

using namespace accelpool::sim;
using accelpool::sim::test::make_job;

TEST_CASE("lower bound: hand-computed tiny cases", "[sim][lower_bound]") {
  Trace t;
  CHECK(lower_bound_avg_jct(t, 4) == 0);

  // One job: its run time.
  t.jobs = {make_job(0, 0, 10)};
  CHECK(lower_bound_avg_jct(t, 1) == Approx(10));
  CHECK(lower_bound_avg_jct(t, 8) == Approx(10));  // more devices cannot make one job faster

  // Two jobs at 0 on one device, run times 1 and 3: SRPT finishes them at 1 and 4 -> 2.5 (> mean 2).
  t.jobs = {make_job(0, 0, 3), make_job(1, 0, 1)};
  CHECK(lower_bound_avg_jct(t, 1) == Approx(2.5));
  // On two devices the fast machine finishes them at 0.5 and 2 -> 1.25 < mean run time 2.
  CHECK(lower_bound_avg_jct(t, 2) == Approx(2.0));

  // Preemption: A (10 s) at 0, B (2 s) at 1 on one device. SRPT runs B at 1..3 and A finishes at 12:
  // JCTs 12 and 2 -> 7 (> mean 6).
  t.jobs = {make_job(0, 0, 10), make_job(1, 1, 2)};
  CHECK(lower_bound_avg_jct(t, 1) == Approx(7));

  // Gangs: work = devices x runtime. A: 2 devices x 5 s = 10, B: 1 x 4 = 4 at 0 on 2 devices: sizes 5 and 2
  // on the fast machine: B at 2, A at 7 -> 4.5; mean run time 4.5.
  t.jobs = {make_job(0, 0, 5, 2), make_job(1, 0, 4, 1)};
  CHECK(lower_bound_avg_jct(t, 2) == Approx(4.5));
  // Same jobs on one device-equivalent... with 4 devices: sizes 2.5 and 1 -> 1 and 3.5 -> 2.25 < 4.5.
  CHECK(lower_bound_avg_jct(t, 4) == Approx(4.5));

  // Idle gap: jobs far apart do not interact.
  t.jobs = {make_job(0, 0, 2, 2), make_job(1, 100, 6, 2)};
  CHECK(lower_bound_avg_jct(t, 1) == Approx(8));  // sizes 4 and 12
}

TEST_CASE("lower bound: SRPT beats every order a brute force can find", "[sim][lower_bound]") {
  // Three jobs at time 0 on one device: SRPT's mean equals the best permutation's mean.
  Trace t;
  t.jobs = {make_job(0, 0, 7), make_job(1, 0, 2), make_job(2, 0, 4)};
  // Shortest first: 2, 6, 13 -> 7.
  CHECK(lower_bound_avg_jct(t, 1) == Approx(7));
}
