// One experiment of accelpool-sim as a library call: read or generate a trace, build the pool, rescale the
// load, choose the estimates, then run each policy on the same trace. accelpool-sim's command line and
// accelpool-sweep's cells both go through run_experiment, so a sweep cell is exactly an accelpool-sim run.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/sim/report.hpp>
#include <accelpool/sim/simulator.hpp>
#include <accelpool/sim/trace.hpp>

#include <optional>
#include <string>
#include <vector>

namespace accelpool::sim {

// Where the jobs come from: a trace file, or (synthetic > 0) the generator seeded by SimOptions::seed.
struct TraceSource {
  std::string path;
  TraceFormat format = TraceFormat::native;
  std::size_t synthetic = 0;
  GeneratorSpec generator;  // `jobs` is taken from `synthetic`
  // When set, only jobs arriving in [window_from_s, window_to_s) seconds after the trace's first arrival are
  // kept (before any load rescaling); a window that keeps no job is an error.
  std::optional<double> window_from_s, window_to_s;
};

// The pool: `devices` homogeneous devices with the given costs, or (path non-empty) a pool file.
struct PoolSource {
  std::uint32_t devices = 0;
  double reconfig_s = 0;
  double attach_s = 0;
  std::uint32_t slots = 0;  // per device (DeviceGroupSpec::slots)
  double slot_share = 1;
  double partial_reconfig_s = 0;
  std::string path;
};

struct Experiment {
  TraceSource trace;
  PoolSource pool;
  double load = 0;                              // > 0: rescale arrivals to this offered load; 0: the trace's own times
  std::string estimates;                        // EstimateSpec text; empty: default_estimates(trace)
  std::vector<scheduler::PolicySpec> policies;  // each run on the same trace, in this order
  // seed, learning, restore, checks, keep_per_job and progress as for simulate(); progress_label and
  // lower_bound_avg_jct_s are filled in per run.
  SimOptions options;
};

struct ExperimentResult {
  RunMeta meta;
  std::vector<RunResult> runs;  // one per policy, in order
};

// Runs the experiment. Errors (nothing partial): an unreadable or malformed trace or pool file, a bad
// generator, window, load or estimate mode (the trace/pool reader's message), or a failed run
// ("POLICY: message").
Result<ExperimentResult> run_experiment(const Experiment& experiment);

}  // namespace accelpool::sim
