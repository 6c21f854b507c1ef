// Running cells: the local runner (parallel child processes, one per cell), the state of a study's cells on
// disk, and Slurm job arrays (each array task runs one slice of the cells with the local runner).
#pragma once

#include "cell.hpp"
#include "study.hpp"

#include <cstddef>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace accelpool::sweep {

enum class CellState { done, failed, remaining };
// done: its result file exists; failed: its last run failed (OUT/failed/ID); remaining: neither.
CellState state_of(const Layout& layout, const Cell& cell);

struct Tally {
  std::vector<const Cell*> done, failed, remaining;
};
Tally tally(const Layout& layout, const std::vector<Cell>& cells);

// Prints done/failed/remaining and, for each failed cell, its id, parameters and log path.
void print_status(std::ostream& out, const Layout& layout, const Tally& t);

struct RunOptions {
  std::filesystem::path self;  // the accelpool-sweep binary (its run-cell command runs each cell)
  std::size_t jobs = 1;        // parallel child processes, >= 1
  bool progress = true;        // a progress line on `log` at most every 2 s and at the end
};

struct RunSummary {
  std::size_t skipped = 0;  // already done
  std::size_t ok = 0;
  std::vector<const Cell*> failed;
};

// Runs every cell of `cells` that is not done, `jobs` at a time, each as `self run-cell --study FILE --out
// OUT --cell ID` with its output in OUT/logs/ID.log. A cell that exits 0 with its result file written is
// done (its failed mark is removed); any other outcome marks it failed. Progress: done, failed, remaining and
// an estimate of the time left. Never stops early for a failed cell.
Result<RunSummary> run_cells(const Study& study, const Layout& layout, const std::vector<const Cell*>& cells,
                             const RunOptions& options, std::ostream& log);

// Slice `task` of `tasks` (cells whose grid index % tasks == task): the cells one Slurm array task runs.
std::vector<const Cell*> slice(const std::vector<Cell>& cells, std::size_t tasks, std::size_t task);

struct SlurmPlan {
  std::size_t tasks = 0;             // slices of the grid
  std::vector<std::size_t> pending;  // slices with a cell not done: the array indices to submit
  std::filesystem::path script;      // OUT/slurm/array.sh
};

// Writes OUT/slurm/array.sh: an `sbatch --array` script whose task I runs `COMMAND run-task --study FILE
// --out OUT --tasks T --task I`. Only slices with unfinished cells are in the array, so submitting again
// after a failure or a cancelled task reruns just those. Each task's output goes to
// OUT/slurm/task-JOB_I.out. `tasks` 0 takes the study's (or min(cells, 64)).
Result<SlurmPlan> write_slurm_script(const Study& study, const Layout& layout, std::size_t tasks,
                                     const std::vector<std::string>& extra_sbatch_args,
                                     const std::filesystem::path& self);

// Runs `sbatch --parsable SCRIPT`; returns the job id it prints. Errors carry sbatch's output.
Result<std::string> submit(const std::filesystem::path& script);

}  // namespace accelpool::sweep
