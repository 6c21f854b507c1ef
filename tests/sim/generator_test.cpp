#include <accelpool/sim/trace.hpp>

#include "test_util.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

using namespace accelpool::sim;
using accelpool::sim::test::make_job;

namespace {

double mean_runtime(const Trace& t) {
  double s = 0;
  for (const auto& j : t.jobs) s += j.runtime_s;
  return s / static_cast<double>(t.jobs.size());
}

}  // namespace

TEST_CASE("generator: Poisson arrivals and exponential run times have the asked means", "[sim][generator]") {
  GeneratorSpec g;
  g.jobs = 40000;
  g.arrival_rate = 2.0;
  g.mean_runtime_s = 300;
  auto t = generate_trace(g, 11);
  REQUIRE(t.is_ok());
  REQUIRE(t->jobs.size() == 40000);
  CHECK(t->jobs.front().arrival_s == 0);
  double prev = 0;
  for (const auto& j : t->jobs) {
    REQUIRE(j.arrival_s >= prev);
    prev = j.arrival_s;
  }
  // Mean gap 1/rate; the sample mean of 40000 exponentials is within ~2% with overwhelming probability.
  CHECK(t->jobs.back().arrival_s / 39999 == Approx(0.5).epsilon(0.03));
  CHECK(mean_runtime(*t) == Approx(300).epsilon(0.03));
  // The exponential's coefficient of variation is 1.
  double sq = 0;
  for (const auto& j : t->jobs) sq += (j.runtime_s - 300) * (j.runtime_s - 300);
  CHECK(std::sqrt(sq / 40000) == Approx(300).epsilon(0.05));
}

TEST_CASE("generator: lognormal keeps the mean, bounded Pareto stays in its bounds", "[sim][generator]") {
  GeneratorSpec g;
  g.jobs = 100000;
  g.runtime = RuntimeDist::lognormal;
  g.mean_runtime_s = 100;
  g.lognormal_sigma = 1.0;
  auto t = generate_trace(g, 5);
  REQUIRE(t.is_ok());
  CHECK(mean_runtime(*t) == Approx(100).epsilon(0.04));
  std::vector<double> rt;
  for (const auto& j : t->jobs) rt.push_back(j.runtime_s);
  std::nth_element(rt.begin(), rt.begin() + rt.size() / 2, rt.end());
  // Median of lognormal(mu, 1) with mean 100 is exp(mu) = 100 / e^0.5.
  CHECK(rt[rt.size() / 2] == Approx(100 / std::exp(0.5)).epsilon(0.04));

  g.runtime = RuntimeDist::pareto;
  g.pareto_alpha = 1.5;
  g.pareto_min_s = 10;
  g.pareto_max_s = 1000;
  t = generate_trace(g, 5);
  REQUIRE(t.is_ok());
  double lo = 1e300, hi = 0;
  for (const auto& j : t->jobs) {
    lo = std::min(lo, j.runtime_s);
    hi = std::max(hi, j.runtime_s);
  }
  CHECK(lo >= 10);
  CHECK(hi <= 1000);
  // Mean of the bounded Pareto: L^a/(1-(L/H)^a) * a/(a-1) * (L^(1-a) - H^(1-a)).
  const double a = 1.5, L = 10, H = 1000;
  const double expected =
      std::pow(L, a) / (1 - std::pow(L / H, a)) * a / (a - 1) * (std::pow(L, 1 - a) - std::pow(H, 1 - a));
  CHECK(mean_runtime(*t) == Approx(expected).epsilon(0.03));
}

TEST_CASE("generator: gang mix, Zipf bitstreams and tenants follow their weights", "[sim][generator]") {
  GeneratorSpec g;
  g.jobs = 50000;
  REQUIRE(parse_gang_mix("1:0.7,2:0.2,8:0.1", g).is_ok());
  g.bitstreams = 4;
  g.zipf_s = 1.0;
  g.tenants = 5;
  auto t = generate_trace(g, 3);
  REQUIRE(t.is_ok());
  std::map<std::uint32_t, double> gangs;
  std::map<std::string, double> bits, tenants;
  for (const auto& j : t->jobs) {
    gangs[j.devices] += 1.0 / 50000;
    bits[j.bitstream] += 1.0 / 50000;
    tenants[j.tenant] += 1.0 / 50000;
  }
  CHECK(gangs.size() == 3);
  CHECK(gangs[1] == Approx(0.7).margin(0.01));
  CHECK(gangs[2] == Approx(0.2).margin(0.01));
  CHECK(gangs[8] == Approx(0.1).margin(0.01));
  // Zipf(1) over 4: weights 1, 1/2, 1/3, 1/4 over H4 = 25/12.
  CHECK(bits["bs0"] == Approx(12.0 / 25).margin(0.01));
  CHECK(bits["bs1"] == Approx(6.0 / 25).margin(0.01));
  CHECK(bits["bs3"] == Approx(3.0 / 25).margin(0.01));
  CHECK(tenants.size() == 5);
  for (const auto& [name, share] : tenants) CHECK(share == Approx(0.2).margin(0.01));
}

TEST_CASE("generator: same seed, same trace, another seed, another trace", "[sim][generator]") {
  GeneratorSpec g;
  g.jobs = 200;
  g.bitstreams = 3;
  auto a = generate_trace(g, 42), b = generate_trace(g, 42), c = generate_trace(g, 43);
  REQUIRE((a.is_ok() && b.is_ok() && c.is_ok()));
  bool same_ab = true, same_ac = true;
  for (std::size_t i = 0; i < 200; ++i) {
    same_ab = same_ab && a->jobs[i].arrival_s == b->jobs[i].arrival_s && a->jobs[i].runtime_s == b->jobs[i].runtime_s &&
              a->jobs[i].bitstream == b->jobs[i].bitstream;
    same_ac = same_ac && a->jobs[i].runtime_s == c->jobs[i].runtime_s;
  }
  CHECK(same_ab);
  CHECK_FALSE(same_ac);
}

TEST_CASE("generator and gang mix reject bad parameters", "[sim][generator]") {
  GeneratorSpec g;
  g.jobs = 0;
  CHECK_FALSE(generate_trace(g, 1).is_ok());
  g = {};
  g.arrival_rate = 0;
  CHECK_FALSE(generate_trace(g, 1).is_ok());
  g = {};
  g.runtime = RuntimeDist::pareto;
  g.pareto_min_s = 100;
  g.pareto_max_s = 10;
  CHECK_FALSE(generate_trace(g, 1).is_ok());
  g = {};
  g.gang_weights = {1, 2};
  CHECK_FALSE(generate_trace(g, 1).is_ok());
  g = {};
  CHECK_FALSE(parse_gang_mix("1:0.5,x:1", g).is_ok());
  CHECK_FALSE(parse_gang_mix("0:1", g).is_ok());
  CHECK_FALSE(parse_gang_mix("2", g).is_ok());
  CHECK_FALSE(parse_gang_mix("2:-1", g).is_ok());
  CHECK(g.gang_sizes == std::vector<std::uint32_t>{1});  // unchanged by failed parses
}

TEST_CASE("rescale_load: offered load becomes the asked value", "[sim][load]") {
  Trace t;
  // Work: 2x10 + 1x20 = 40 device-seconds over a span of 10 s.
  t.jobs = {make_job(0, 5, 10, 2), make_job(1, 15, 20, 1)};
  CHECK(offered_load(t, 4) == Approx(1.0));
  REQUIRE(rescale_load(t, 4, 0.5).is_ok());
  CHECK(t.jobs[0].arrival_s == 5);
  CHECK(t.jobs[1].arrival_s == Approx(25));
  CHECK(offered_load(t, 4) == Approx(0.5));

  GeneratorSpec g;
  g.jobs = 5000;
  auto s = generate_trace(g, 9);
  REQUIRE(s.is_ok());
  REQUIRE(rescale_load(*s, 100, 0.85).is_ok());
  CHECK(offered_load(*s, 100) == Approx(0.85));

  CHECK_FALSE(rescale_load(*s, 100, 0).is_ok());
  Trace one;
  one.jobs = {make_job(0, 3, 10, 1)};
  CHECK_FALSE(rescale_load(one, 4, 1.0).is_ok());
}

TEST_CASE("estimate modes", "[sim][estimates]") {
  Trace t;
  t.jobs = {make_job(0, 0, 100, 1), make_job(1, 1, 200, 1)};
  t.jobs[0].estimate_s = 50;
  CHECK(default_estimates(t).mode == EstimateSpec::Mode::trace);
  Trace no_est = t;
  no_est.jobs[0].estimate_s.reset();
  CHECK(default_estimates(no_est).mode == EstimateSpec::Mode::oracle);

  auto tr = t;
  apply_estimates(tr, *EstimateSpec::parse("trace"), 1);
  CHECK(tr.jobs[0].estimate_s == 50.0);
  CHECK_FALSE(tr.jobs[1].estimate_s.has_value());
  apply_estimates(tr, *EstimateSpec::parse("oracle"), 1);
  CHECK(tr.jobs[0].estimate_s == 100.0);
  CHECK(tr.jobs[1].estimate_s == 200.0);
  apply_estimates(tr, *EstimateSpec::parse("none"), 1);
  CHECK_FALSE(tr.jobs[0].estimate_s.has_value());
  auto noisy = EstimateSpec::parse("noisy:0.5");
  REQUIRE(noisy.is_ok());
  CHECK(noisy->to_string() == "noisy:0.5");
  auto n1 = t, n2 = t;
  apply_estimates(n1, *noisy, 7);
  apply_estimates(n2, *noisy, 7);
  REQUIRE(n1.jobs[0].estimate_s.has_value());
  CHECK(*n1.jobs[0].estimate_s == *n2.jobs[0].estimate_s);
  CHECK(*n1.jobs[0].estimate_s != 100.0);
  CHECK(*n1.jobs[0].estimate_s > 0);
  CHECK_FALSE(EstimateSpec::parse("noisy:").is_ok());
  CHECK_FALSE(EstimateSpec::parse("psychic").is_ok());
}
