// Running one cell and where its files live in a study's output folder.
//
//   OUT/cells/ID.json   the result (written atomically: a temporary file renamed into place), so a cell is
//                       done exactly when this file exists
//   OUT/logs/ID.log     stdout and stderr of the cell's last run
//   OUT/failed/ID       present while the cell's last run failed: its exit status and log path
#pragma once

#include "study.hpp"

#include <accelpool/common/result.hpp>

#include <filesystem>
#include <string>

namespace accelpool::sweep {

// Points of the JCT quantile function kept per cell: JCT at ranks 0, 1/200, ..., 1 (nearest rank).
inline constexpr std::size_t kJctQuantiles = 201;

struct Layout {
  std::filesystem::path out;
  std::filesystem::path result(const std::string& id) const { return out / "cells" / (id + ".json"); }
  std::filesystem::path log(const std::string& id) const { return out / "logs" / (id + ".log"); }
  std::filesystem::path failed(const std::string& id) const { return out / "failed" / id; }
  // Creates cells/, logs/ and failed/.
  Status create() const;
};

// Runs the cell through sim::run_experiment (the code path of accelpool-sim) and returns its result document:
// {"cell": ID, "params": {...}, "result": <what accelpool-sim --json writes for the same run>,
//  "jct_quantiles": [kJctQuantiles numbers]}. Errors are the simulator's.
Result<nlohmann::ordered_json> run_cell(const Cell& cell);

// Writes `text` to `path` through a temporary file in the same folder and a rename, so readers see either
// the old file or the whole new one.
Status write_atomically(const std::filesystem::path& path, const std::string& text);

// Reads a whole file; errors name it.
Result<std::string> read_file(const std::filesystem::path& path);

}  // namespace accelpool::sweep
