// The synthetic workload generator.
#include <accelpool/sim/trace.hpp>

#include "random.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

namespace accelpool::sim {

namespace {

// Index drawn with probability proportional to the (cumulative) weights: binary search, O(log k).
std::size_t draw(detail::Rng& rng, const std::vector<double>& cumulative) {
  const double x = rng.uniform() * cumulative.back();
  auto it = std::upper_bound(cumulative.begin(), cumulative.end(), x);
  return std::min<std::size_t>(static_cast<std::size_t>(it - cumulative.begin()), cumulative.size() - 1);
}

bool positive(double v) { return v > 0 && std::isfinite(v); }

}  // namespace

Result<Trace> generate_trace(const GeneratorSpec& spec, std::uint64_t seed) {
  auto bad = [](const std::string& what) { return make_error(Errc::invalid_argument, "generator: " + what); };
  if (spec.jobs == 0) return bad("jobs must be >= 1");
  if (!positive(spec.arrival_rate)) return bad("arrival rate must be > 0");
  if (spec.runtime != RuntimeDist::pareto && !positive(spec.mean_runtime_s)) return bad("mean runtime must be > 0");
  if (spec.runtime == RuntimeDist::lognormal && !(spec.lognormal_sigma >= 0 && std::isfinite(spec.lognormal_sigma))) {
    return bad("lognormal sigma must be >= 0");
  }
  if (spec.runtime == RuntimeDist::pareto && (!positive(spec.pareto_alpha) || !positive(spec.pareto_min_s) ||
                                              !positive(spec.pareto_max_s) || spec.pareto_max_s <= spec.pareto_min_s)) {
    return bad("bounded Pareto needs alpha > 0 and 0 < min < max");
  }
  if (spec.gang_sizes.empty() || spec.gang_sizes.size() != spec.gang_weights.size()) {
    return bad("gang sizes and weights must be non-empty and of the same length");
  }
  std::vector<double> gang_cum;
  double total = 0;
  for (std::size_t i = 0; i < spec.gang_sizes.size(); ++i) {
    if (spec.gang_sizes[i] == 0) return bad("gang sizes must be >= 1");
    if (!(spec.gang_weights[i] >= 0) || !std::isfinite(spec.gang_weights[i])) return bad("gang weights must be >= 0");
    total += spec.gang_weights[i];
    gang_cum.push_back(total);
  }
  if (total <= 0) return bad("gang weights must not all be 0");
  if (spec.bitstreams == 0) return bad("bitstreams must be >= 1");
  if (spec.tenants == 0) return bad("tenants must be >= 1");
  if (!(spec.zipf_s >= 0) || !std::isfinite(spec.zipf_s)) return bad("zipf exponent must be >= 0");
  if (!(spec.partial_fraction >= 0 && spec.partial_fraction <= 1)) return bad("partial fraction must be in [0, 1]");
  if (!(spec.demand_min >= 0 && spec.demand_min <= spec.demand_max && spec.demand_max <= 1)) {
    return bad("demands must satisfy 0 <= min <= max <= 1");
  }

  std::vector<double> zipf_cum(spec.bitstreams);
  double z = 0;
  for (std::uint32_t k = 0; k < spec.bitstreams; ++k) {
    z += 1.0 / std::pow(static_cast<double>(k + 1), spec.zipf_s);
    zipf_cum[k] = z;
  }
  const double mu = std::log(spec.mean_runtime_s) - spec.lognormal_sigma * spec.lognormal_sigma / 2;
  const double pareto_ratio = std::pow(spec.pareto_min_s / spec.pareto_max_s, spec.pareto_alpha);

  // Names are built once; jobs copy them.
  std::vector<std::string> bitstream_names(spec.bitstreams), tenant_names(spec.tenants);
  // Appended rather than "bs" + to_string(k): g++ 12 at -O3 warns falsely (-Wrestrict) on the latter.
  for (std::uint32_t k = 0; k < spec.bitstreams; ++k) bitstream_names[k].append("bs").append(std::to_string(k));
  for (std::uint32_t k = 0; k < spec.tenants; ++k) tenant_names[k].append("t").append(std::to_string(k));

  // Which bitstreams are partial images, and their demands: a stream of their own (see GeneratorSpec).
  std::vector<bool> partial(spec.bitstreams, false);
  std::vector<double> demand(spec.bitstreams, 0.0);
  if (spec.partial_fraction > 0) {
    detail::Rng images(seed ^ 0x9e3779b97f4a7c15ULL);
    for (std::uint32_t k = 0; k < spec.bitstreams; ++k) {
      partial[k] = images.uniform() < spec.partial_fraction;
      demand[k] = spec.demand_min + images.uniform() * (spec.demand_max - spec.demand_min);
    }
  }
  const std::string slot_kind = spec.kind + kSlotKindSuffix;

  detail::Rng rng(seed);
  Trace trace;
  trace.jobs.reserve(spec.jobs);
  double t = 0;
  for (std::size_t i = 0; i < spec.jobs; ++i) {
    if (i > 0) t += rng.exponential(spec.arrival_rate);
    Job job;
    job.id = i;
    job.arrival_s = t;
    switch (spec.runtime) {
      case RuntimeDist::exponential:
        job.runtime_s = rng.exponential(1.0 / spec.mean_runtime_s);
        break;
      case RuntimeDist::lognormal:
        job.runtime_s = rng.lognormal(mu, spec.lognormal_sigma);
        break;
      case RuntimeDist::pareto:
        // Inverse CDF of the Pareto distribution truncated to [min, max].
        job.runtime_s =
            spec.pareto_min_s / std::pow(1.0 - rng.uniform() * (1.0 - pareto_ratio), 1.0 / spec.pareto_alpha);
        job.runtime_s = std::min(job.runtime_s, spec.pareto_max_s);
        break;
    }
    job.devices = spec.gang_sizes[draw(rng, gang_cum)];
    const std::size_t image = draw(rng, zipf_cum);
    job.bitstream = bitstream_names[image];
    job.tenant =
        tenant_names[std::min<std::size_t>(static_cast<std::size_t>(rng.uniform() * spec.tenants), spec.tenants - 1)];
    job.kind = partial[image] ? slot_kind : spec.kind;
    if (partial[image]) job.demand = demand[image];
    trace.jobs.push_back(std::move(job));
  }
  return trace;
}

Status parse_gang_mix(const std::string& text, GeneratorSpec& spec) {
  std::vector<std::uint32_t> sizes;
  std::vector<double> weights;
  std::stringstream ss(text);
  std::string item;
  auto bad = [&](const std::string& why) {
    return make_error(Errc::invalid_argument,
                      "gang mix \"" + text + "\": " + why + " (expected SIZE:WEIGHT,... e.g. 1:0.8,4:0.2)");
  };
  while (std::getline(ss, item, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) return bad("\"" + item + "\" has no ':'");
    std::uint32_t size = 0;
    double weight = 0;
    const char* s0 = item.data();
    auto r1 = std::from_chars(s0, s0 + colon, size);
    auto r2 = std::from_chars(s0 + colon + 1, s0 + item.size(), weight);
    if (r1.ec != std::errc() || r1.ptr != s0 + colon || size == 0) return bad("bad size in \"" + item + "\"");
    if (r2.ec != std::errc() || r2.ptr != s0 + item.size() || !(weight >= 0) || !std::isfinite(weight)) {
      return bad("bad weight in \"" + item + "\"");
    }
    sizes.push_back(size);
    weights.push_back(weight);
  }
  if (sizes.empty()) return bad("empty");
  spec.gang_sizes = std::move(sizes);
  spec.gang_weights = std::move(weights);
  return Status::ok();
}

}  // namespace accelpool::sim
