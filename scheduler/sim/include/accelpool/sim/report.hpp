// Outputs of accelpool-sim: the stdout table, JSON, per-job CSV and SVG plots.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/sim/simulator.hpp>

#include <ostream>
#include <string>
#include <vector>

namespace accelpool::sim {

// Facts about the experiment printed with the runs.
struct RunMeta {
  std::string trace;  // file name or "synthetic:N"
  std::uint64_t seed = 1;
  std::string estimates;  // EstimateSpec::to_string()
  double load = 0;        // offered load after rescaling
};

// `v` rounded to 9 significant digits: how the JSON writes numbers, readable and still equal for equal inputs.
double round_sig(double v);

// One row per run: policy, avg/p50/p99 JCT, avg JCT over the lower bound, wait, slowdown, utilization,
// reconfigurations, preemptions, wall seconds.
void write_table(std::ostream& out, const RunMeta& meta, const std::vector<RunResult>& runs);

// {"meta":{...},"runs":[{...}]}, keys in a fixed order, numbers with fixed precision, so equal runs give
// byte-identical files. With `wall_time` false, wall_s is written as 0 (for byte-for-byte comparisons).
void write_json(std::ostream& out, const RunMeta& meta, const std::vector<RunResult>& runs, bool wall_time);

// One row per job and run: policy,id,arrival_s,runtime_s,devices,first_start_s,finish_s,jct_s,wait_s,
// slowdown,reconfigurations,preemptions.
void write_csv(std::ostream& out, const std::vector<RunResult>& runs);

// Writes DIR/jct_cdf.svg (JCT CDF per policy, log x axis) and DIR/queue.svg (waiting requests over time per
// policy). Creates DIR. Errors name the file that could not be written.
Status write_plots(const std::string& dir, const std::vector<RunResult>& runs);

}  // namespace accelpool::sim
