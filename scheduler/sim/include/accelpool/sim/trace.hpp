// Traces for accelpool-sim: reading native and Philly CSV files, generating synthetic traces, rescaling
// load and choosing what runtime estimates the scheduler sees.
//
// Every reader either returns a whole trace or an error naming file, line and column
// ("trace.csv:17:2: runtime_s: expected a number, got \"abc\""); it never returns part of a file.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/sim/simulator.hpp>

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace accelpool::sim {

// Native CSV: a header naming columns, then one job per line. `arrival_s` and `runtime_s` are required;
// `devices`, `bitstream`, `tenant`, `estimate_s`, `kind`, `host`, `label`, `demand` are optional, in any order. An
// empty optional cell takes the default. Blank lines and lines starting with '#' are skipped. Job ids are the 0-based
// data row numbers. `source` names the input in error messages.
Result<Trace> parse_native_csv(std::istream& in, const std::string& source);

// Philly CSV (columns timestamp,duration,num_gpus,gpu_time,cluster in any order): timestamp
// "YYYY-MM-DD HH:MM:SS" UTC becomes seconds after the earliest job, duration is the run time, num_gpus the
// gang size, cluster the tenant; gpu_time is checked to be a number and otherwise ignored.
Result<Trace> parse_philly_csv(std::istream& in, const std::string& source);

enum class TraceFormat { native, philly };
// Opens `path` and parses it; a missing file is an error naming it.
Result<Trace> load_trace(const std::string& path, TraceFormat format);

enum class RuntimeDist { exponential, lognormal, pareto };

// Synthetic workload. Arrivals are Poisson with rate `arrival_rate` (jobs per second); run times follow
// `runtime` with mean `mean_runtime_s` (lognormal: sigma `lognormal_sigma`; pareto: bounded Pareto with
// shape `pareto_alpha` on [pareto_min_s, pareto_max_s], mean_runtime_s ignored); gang sizes are drawn from
// `gang_sizes` with weights `gang_weights`; bitstreams "bs0".."bsK-1" by Zipf(`zipf_s`) popularity; tenants
// "t0".."tM-1" uniformly. Deterministic for a given seed.
struct GeneratorSpec {
  std::size_t jobs = 1000;
  double arrival_rate = 1.0;
  RuntimeDist runtime = RuntimeDist::exponential;
  double mean_runtime_s = 600;
  double lognormal_sigma = 1.5;
  double pareto_alpha = 1.1;
  double pareto_min_s = 10;
  double pareto_max_s = 1e6;
  std::vector<std::uint32_t> gang_sizes{1};
  std::vector<double> gang_weights{1};
  std::uint32_t bitstreams = 1;
  double zipf_s = 1.0;
  std::uint32_t tenants = 1;
  std::string kind = "fpga";
  // FPGA mix: each bitstream is a partial image with probability `partial_fraction` (0: all full images); jobs
  // of a partial image ask for slots (kind "<kind>/slot") and carry its bandwidth demand, drawn once per
  // bitstream uniformly from [demand_min, demand_max]. Drawn from a stream of their own, so the rest of the
  // trace is the same whatever these are.
  double partial_fraction = 0;
  double demand_min = 0;
  double demand_max = 0;
};
// Errors: jobs == 0, non-positive rates or means, gang_sizes/gang_weights empty or of different lengths,
// bitstreams == 0, tenants == 0, bad Pareto bounds, partial_fraction outside [0, 1], demands not
// 0 <= demand_min <= demand_max <= 1.
Result<Trace> generate_trace(const GeneratorSpec& spec, std::uint64_t seed);

// Parses "1:0.7,2:0.2,8:0.1" (size:weight pairs) into gang_sizes/gang_weights.
Status parse_gang_mix(const std::string& text, GeneratorSpec& spec);

// Offered load: sum(devices x runtime) / (pool_devices x span), span = last arrival - first arrival.
// 0 when the span is 0.
double offered_load(const Trace& trace, std::uint64_t pool_devices);

// Scales arrival times (relative to the first) so that offered_load(trace, pool_devices) == load.
// Errors: load <= 0, fewer than two distinct arrival times.
Status rescale_load(Trace& trace, std::uint64_t pool_devices, double load);

// What the scheduler is told about run times. Whatever the mode, the scheduler also learns run times from
// the leases that finish (scheduler/estimator.hpp) and goes by them for a request that brings no estimate.
//   trace   : the trace's estimate_s column as is (jobs without one give no estimate)
//   oracle  : the exact runtime
//   none    : no estimate: the scheduler knows only what it learned itself, never the true run time
//   noisy   : runtime x lognormal(0, sigma), seeded
struct EstimateSpec {
  enum class Mode { trace, oracle, none, noisy } mode = Mode::trace;
  double sigma = 0;
  static Result<EstimateSpec> parse(
      const std::string& text);  // "trace", "oracle", "none", "noisy:0.5"; "learned" is refused (see parse)
  std::string to_string() const;
};
// Default when no --estimates is given: `trace` if any job carries an estimate, else `oracle`.
EstimateSpec default_estimates(const Trace& trace);
void apply_estimates(Trace& trace, const EstimateSpec& spec, std::uint64_t seed);

}  // namespace accelpool::sim
