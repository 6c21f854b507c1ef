// Learned run times and the Gittins ordering, with hand-computed numbers.
#include "fixtures.hpp"

#include <accelpool/scheduler/estimator.hpp>

using namespace accelpool::scheduler;
using namespace accelpool::scheduler::testing;
using Catch::Detail::Approx;
using V = std::vector<RequestId>;

namespace {

Request of(TenantId tenant, std::uint32_t count = 1, LabelId label = kNoLabel) {
  Request r;
  r.tenant = tenant;
  r.count = count;
  r.label = label;
  return r;
}

}  // namespace

TEST_CASE("histogram bins are an octave wide", "[estimator]") {
  CHECK(RuntimeHistogram::bin_of(0.5) == 0);
  CHECK(RuntimeHistogram::bin_of(1) == 1);
  CHECK(RuntimeHistogram::bin_of(10) == 4);  // [8, 16)
  CHECK(RuntimeHistogram::lower_edge(4) == Approx(8));
  CHECK(RuntimeHistogram::upper_edge(4) == Approx(16));
  CHECK(RuntimeHistogram::bin_of(15.9999999999) == 5);  // an edge computed a hair short still counts as reached
  CHECK(RuntimeHistogram::bin_of(15.99) == 4);
}

TEST_CASE("a group is trusted only after its warm-up observations", "[estimator]") {
  RuntimeEstimator e({.warmup = 3, .half_life = 1e9});
  e.observe(of(1), 100);
  e.observe(of(1), 200);
  CHECK_FALSE(e.estimate_s(of(1)));  // two observations teach it, but are not trusted yet
  e.observe(of(1), 300);
  REQUIRE(e.estimate_s(of(1)));
  CHECK(*e.estimate_s(of(1)) == Approx(200));  // (100 + 200 + 300) / 3
  CHECK(e.distribution(of(1))->quantile(0.5) == Approx(200));
  CHECK(e.distribution(of(1))->quantile(1.0) == Approx(300));
}

TEST_CASE("decay: an observation half_life observations old weighs half", "[estimator]") {
  RuntimeEstimator e({.warmup = 1, .half_life = 1});
  e.observe(of(1), 100);
  e.observe(of(1), 300);
  // Weights 0.5 and 1: (0.5 x 100 + 300) / 1.5.
  CHECK(*e.estimate_s(of(1)) == Approx(350.0 / 1.5));
  e.observe(of(1), 300);
  // Weights 0.25, 0.5, 1: (25 + 150 + 300) / 1.75: the estimate follows the drift towards 300.
  CHECK(*e.estimate_s(of(1)) == Approx(475.0 / 1.75));
}

TEST_CASE("groups: tenant, gang size and label keep run times apart, and a cold group falls back to its kind",
          "[estimator]") {
  RuntimeEstimator e({.warmup = 2, .half_life = 1e9});
  e.observe(of(1), 100);
  e.observe(of(1), 100);
  e.observe(of(2), 1000);
  CHECK(*e.estimate_s(of(1)) == Approx(100));
  // Tenant 2 has one observation (cold): its kind speaks for it, (100 + 100 + 1000) / 3.
  CHECK(*e.estimate_s(of(2)) == Approx(400));
  e.observe(of(2), 1000);
  CHECK(*e.estimate_s(of(2)) == Approx(1000));
  // A 4-device gang of tenant 1 is another group; the kind's device-seconds / 4 speak for it.
  CHECK(*e.estimate_s(of(1, 4)) == Approx(2200.0 / 4 / 4));
  e.observe(of(1, 1, 7), 5);
  e.observe(of(1, 1, 7), 5);
  CHECK(*e.estimate_s(of(1, 1, 7)) == Approx(5));
  CHECK(*e.estimate_s(of(1)) == Approx(100));
}

TEST_CASE("the estimator's state round-trips through a plain struct, and bad state is refused", "[estimator]") {
  RuntimeEstimator e({.warmup = 1, .half_life = 10});
  e.observe(of(1), 100);
  e.observe(of(2, 2), 50);
  auto copy = RuntimeEstimator::from_state(e.state(), nullptr);
  REQUIRE(copy);
  CHECK(copy->group_count() == e.group_count());
  CHECK(*copy->estimate_s(of(2, 2)) == Approx(25));
  CHECK(copy->options().half_life == Approx(10));
  auto bad = e.state();
  bad.groups[0].weights.pop_back();
  std::string error;
  CHECK_FALSE(RuntimeEstimator::from_state(bad, &error));
  CHECK_THAT(error, Catch::Contains("group 0"));
}

TEST_CASE("Gittins index of a learned distribution, by hand", "[estimator][gittins]") {
  RuntimeHistogram bimodal;  // half the jobs take 10 device-seconds, half 1000
  for (double x : {10.0, 1000.0, 10.0, 1000.0}) bimodal.observe(x, 1);
  // At 0: a quantum up to 16 (the edge above 10) finishes half the jobs for 0.5 x 10 + 0.5 x 16 of service:
  // 1 / 26; a quantum to the end finishes all for 505: 1 / 505. The best is 1 / 26.
  CHECK(bimodal.gittins_index(0) == Approx(1.0 / 26));
  // At 8 (the bin of 10 starts there), up to 16: half finish for 0.5 x 2 + 0.5 x 8 = 5 more: 1 / 10.
  CHECK(bimodal.gittins_index(9) == Approx(1.0 / 10));
  // Past 16 only the long jobs remain: 1 / (1000 - 16).
  CHECK(bimodal.gittins_index(16.5) == Approx(1.0 / 984));
  RuntimeHistogram hundred;
  for (int i = 0; i < 4; ++i) hundred.observe(100, 1);
  CHECK(hundred.gittins_index(0) == Approx(0.01));
  // Past every observation nothing is known: 1 / the upper edge of the bin.
  CHECK(hundred.gittins_index(5000) == Approx(RuntimeHistogram::unknown_index(5000)));
}

TEST_CASE("gittins serves the group likely to finish soon, then demotes it once it outlives its short mode",
          "[scheduler][gittins]") {
  auto s = make_scheduler("gittins", "fpga:1");
  s->set_estimator(RuntimeEstimator({.warmup = 2, .half_life = 1e9}));
  // Teach: tenant 1 runs 10 s or 1000 s, tenant 2 always 100 s.
  Time t = 0;
  RequestId id = 100;
  for (auto [tenant, run] : {std::pair{1u, 10.0}, {1u, 1000.0}, {1u, 10.0}, {1u, 1000.0}, {2u, 100.0}, {2u, 100.0}}) {
    Request r = req(id, t);
    r.tenant = tenant;
    CHECK(granted(submit(*s, r, t)) == V{id});
    release(*s, id++, t += run);
  }
  Request b = req(2, t);
  b.tenant = 2;
  CHECK(granted(submit(*s, b, t)) == V{2});  // the device is free
  Request a = req(1, t);
  a.tenant = 1;
  // Index of a: 1/26 > index of b: 1/100: a preempts b.
  Decisions out = submit(*s, a, t);
  CHECK(preempted(out) == V{2});
  out = {};
  REQUIRE_FALSE(s->requeue(2, t, out));
  CHECK(granted(out) == V{1});
  // a's index changes when its service crosses a bin edge (1, 2, 4, 8 s: it rises to 1/10 at 8); at 16 s it
  // has outlived its short mode and drops to 1/984 < 1/100: b, waiting, preempts it.
  Time wake = t;
  for (int i = 0; i < 20 && s->phase(1) == RequestPhase::running; ++i) {
    REQUIRE(s->next_wakeup());
    wake = *s->next_wakeup();
    out = {};
    s->tick(wake, out);
    if (!out.preemptions.empty()) {
      CHECK(preempted(out) == V{1});
      REQUIRE_FALSE(s->requeue(1, wake, out));
      CHECK(granted(out) == V{2});
    }
  }
  CHECK(wake - t == Approx(16));
}

TEST_CASE("sjf goes by the learned run time when a request brings none", "[scheduler][estimator]") {
  auto s = make_scheduler("sjf", "fpga:1");
  s->set_estimator(RuntimeEstimator({.warmup = 1, .half_life = 1e9}));
  Request slow = req(10, 0);
  slow.tenant = 1;
  submit(*s, slow, 0);
  release(*s, 10, 500);  // tenant 1: 500 s
  Request quick = req(11, 500);
  quick.tenant = 2;
  submit(*s, quick, 500);
  release(*s, 11, 510);          // tenant 2: 10 s
  submit(*s, req(1, 510), 510);  // occupies the device
  Request a = req(2, 511);
  a.tenant = 1;
  Request b = req(3, 512);
  b.tenant = 2;
  submit(*s, a, 511);
  submit(*s, b, 512);
  // Without learning sjf would serve them in arrival order (a first); learned: b (10 s) before a (500 s).
  CHECK(granted(release(*s, 1, 520)) == V{3});
}

TEST_CASE("gittins preempts a running lease only for twice its index", "[scheduler][gittins]") {
  auto gittins = make_ordering("gittins", nullptr);
  REQUIRE(gittins);
  auto learned = [](double run) {
    RuntimeHistogram h;
    for (int i = 0; i < 3; ++i) h.observe(run, 1);
    return h;
  };
  const RuntimeHistogram hundred = learned(100), sixty = learned(60), thirty = learned(30);
  const Request r = req(1, 0);
  const RequestView running{r, 0, 0, 0, std::nullopt, &hundred};  // index 1/100, counts 2/100
  const auto victim = gittins->running_key(running, 0).primary;
  // Index 1/60 is higher than 1/100 but not twice as high: no preemption; 1/30 is: preemption.
  CHECK_FALSE(gittins->waiting_key({r, 0, 0, 0, std::nullopt, &sixty}, 0).primary < victim);
  CHECK(gittins->waiting_key({r, 0, 0, 0, std::nullopt, &thirty}, 0).primary < victim);
  // Waiting requests compare by their plain index.
  CHECK(gittins->waiting_key({r, 0, 0, 0, std::nullopt, &sixty}, 0).primary <
        gittins->waiting_key({r, 0, 0, 0, std::nullopt, &hundred}, 0).primary);
}

TEST_CASE("gittins with a minimum quantum does not preempt a lease before it has run that long",
          "[scheduler][gittins]") {
  // Nothing learned: index 1 / (upper edge of the attained bin). Request 1 runs from 0 on the only device; at 3
  // it has 3 device-seconds, bin [2, 4), index 1/4, counted twice: 1/2, below request 2's 1 (no service yet).
  // Without a quantum request 2 preempts it at 3. With gittins:10 request 1 keeps its index at grant (1, counted
  // 2) for 10 s: request 2 waits; at 10 the key changes (bin [8, 16): 1/16, counted 1/8) and it is preempted.
  auto plain = make_scheduler("gittins", "fpga:1");
  CHECK(granted(submit(*plain, req(1, 0), 0)) == V{1});
  CHECK(preempted(submit(*plain, req(2, 3), 3)) == V{1});

  auto quantum = make_scheduler("gittins:10", "fpga:1");
  CHECK(granted(submit(*quantum, req(1, 0), 0)) == V{1});
  CHECK(preempted(submit(*quantum, req(2, 3), 3)).empty());
  REQUIRE(quantum->next_wakeup());
  CHECK(*quantum->next_wakeup() == Approx(10));
  Decisions out;
  quantum->tick(10, out);
  CHECK(preempted(out) == V{1});

  std::string error;
  CHECK_FALSE(make_ordering("gittins:-1", &error));
  CHECK_THAT(error, Catch::Contains("gittins:QUANTUM needs a number of seconds >= 0"));
  CHECK_FALSE(make_ordering("gittins:soon", &error));
}
