#include <accelpool/sim/experiment.hpp>

#include <accelpool/sim/lower_bound.hpp>
#include <accelpool/sim/pool_file.hpp>

#include <algorithm>
#include <limits>

namespace accelpool::sim {

namespace {

Result<PoolSpec> make_pool(const PoolSource& source) {
  if (!source.path.empty()) return load_pool_file(source.path);
  PoolSpec pool = PoolSpec::homogeneous(source.devices, source.reconfig_s, source.attach_s);
  pool.default_cost.partial_reconfig_s = source.partial_reconfig_s;
  pool.hosts[0].devices[0].slots = source.slots;
  pool.hosts[0].devices[0].slot_share = source.slot_share;
  return pool;
}

// Keeps the jobs arriving in the window (seconds after the first arrival).
Status apply_window(Trace& trace, const TraceSource& source) {
  if (!source.window_from_s && !source.window_to_s) return Status::ok();
  const double from = source.window_from_s.value_or(0);
  const double to = source.window_to_s.value_or(std::numeric_limits<double>::infinity());
  if (!(from >= 0) || !(to > from)) {
    return make_error(Errc::invalid_argument, "window: expected 0 <= from < to, got [" + std::to_string(from) + ", " +
                                                  std::to_string(to) + ")");
  }
  double first = std::numeric_limits<double>::infinity();
  for (const auto& j : trace.jobs) first = std::min(first, j.arrival_s);
  std::erase_if(trace.jobs, [&](const Job& j) { return j.arrival_s - first < from || j.arrival_s - first >= to; });
  if (trace.jobs.empty()) {
    return make_error(Errc::invalid_argument, "window [" + std::to_string(from) + ", " + std::to_string(to) +
                                                  ") keeps no job of " + source.path);
  }
  return Status::ok();
}

Result<Trace> make_trace(const TraceSource& source, std::uint64_t seed) {
  if (source.synthetic > 0) {
    GeneratorSpec gen = source.generator;
    gen.jobs = source.synthetic;
    return generate_trace(gen, seed);
  }
  auto trace = load_trace(source.path, source.format);
  if (trace) {
    if (auto st = apply_window(*trace, source); !st) return st.error();
  }
  return trace;
}

}  // namespace

Result<ExperimentResult> run_experiment(const Experiment& experiment) {
  auto pool = make_pool(experiment.pool);
  if (!pool) return pool.error();
  auto trace = make_trace(experiment.trace, experiment.options.seed);
  if (!trace) return trace.error();

  ExperimentResult out;
  out.meta.seed = experiment.options.seed;
  out.meta.trace = experiment.trace.synthetic > 0 ? "synthetic:" + std::to_string(experiment.trace.synthetic)
                                                  : experiment.trace.path;
  if (experiment.load > 0) {
    if (auto st = rescale_load(*trace, pool->total_devices(), experiment.load); !st) return st.error();
  }
  out.meta.load = offered_load(*trace, pool->total_devices());
  EstimateSpec est = default_estimates(*trace);
  if (!experiment.estimates.empty()) {
    auto e = EstimateSpec::parse(experiment.estimates);
    if (!e) return e.error();
    est = *e;
  }
  apply_estimates(*trace, est, experiment.options.seed);
  out.meta.estimates = est.to_string();

  SimOptions options = experiment.options;
  options.lower_bound_avg_jct_s = lower_bound_avg_jct(*trace, pool->total_devices());
  for (const auto& spec : experiment.policies) {
    options.progress_label = spec.to_string();
    auto r = simulate(*trace, *pool, spec, options);
    if (!r) return make_error(r.error().code, spec.to_string() + ": " + r.error().message);
    out.runs.push_back(std::move(*r));
  }
  return out;
}

}  // namespace accelpool::sim
