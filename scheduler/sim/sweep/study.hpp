// A study for accelpool-sweep: a TOML file naming traces, policies, loads, pools, estimate modes and seeds,
// expanded into cells (one accelpool-sim run each). See docs/sweeps.md for the file format.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/sim/experiment.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace accelpool::sweep {

// One run of the grid. `params` is the canonical description of the run (the trace's whole definition,
// policy, load, pool, estimates, seed, options); `id` is a hash of it, so the same parameters give the same
// id in every expansion, whatever the order of the study file.
struct Cell {
  std::string id;         // 16 hex digits
  std::size_t index = 0;  // position in the grid (order of the study file)
  nlohmann::ordered_json params;
  // Grouping and labels (also in params).
  std::string trace;      // the trace's name in the study
  std::string pool;       // "devices=N" or the pool file as written
  std::string estimates;  // as written
  std::string policy;     // PolicySpec::to_string()
  double load = 0;
  std::uint64_t seed = 1;
  sim::Experiment experiment;  // ready to run (paths resolved against the study's folder)
};

struct SlurmSettings {
  std::size_t tasks = 0;                 // 0: min(cells, 64)
  std::vector<std::string> sbatch_args;  // extra #SBATCH lines, e.g. "--partition=batch"
  std::string command;                   // accelpool-sweep as the nodes see it; "": this binary
};

struct Study {
  std::string name;
  std::filesystem::path file;      // the study file, absolute
  std::vector<Cell> cells;         // grid order
  std::optional<double> cdf_load;  // load of the JCT CDF plot; default: the grid's highest load
  SlurmSettings slurm;
};

// Parses a study. Errors name the file and the key ("study.toml: loads[2]: expected a number > 0"), and
// every policy and estimate mode is checked before anything runs. Two cells with equal parameters are an
// error (a repeated value in a list).
Result<Study> parse_study(const std::string& toml_text, const std::filesystem::path& file);
Result<Study> load_study(const std::filesystem::path& file);

// The stable id of a cell's parameters: FNV-1a 64 of their compact JSON, in hex.
std::string cell_id(const nlohmann::ordered_json& params);

}  // namespace accelpool::sweep
