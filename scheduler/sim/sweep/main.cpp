// accelpool-sweep: runs a study (a grid of accelpool-sim runs described in TOML) locally or as a Slurm job
// array, resumes it, and merges the results with confidence intervals and plots. See docs/sweeps.md.
#include "cell.hpp"
#include "merge.hpp"
#include "runner.hpp"
#include "study.hpp"

#include <CLI/CLI.hpp>

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <iostream>
#include <thread>

namespace {

namespace fs = std::filesystem;
namespace sweep = accelpool::sweep;

int fail(const std::string& message) {
  std::cerr << "accelpool-sweep: " << message << '\n';
  return 1;
}

fs::path self_path() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("accelpool-sweep") : p;
}

// The output folder: --out, or STUDY_DIR/NAME.sweep next to the study file.
sweep::Layout layout_for(const sweep::Study& study, const std::string& out) {
  return sweep::Layout{out.empty() ? study.file.parent_path() / (study.name + ".sweep") : fs::absolute(out)};
}

// Prints a run's end: counts, and each failed cell with its log and how to retry it.
int finish(const sweep::Study& study, const sweep::Layout& layout, const sweep::RunSummary& s) {
  std::cout << "sweep " << study.name << ": " << s.ok << " ran, " << s.skipped << " already done, " << s.failed.size()
            << " failed\n";
  for (const auto* c : s.failed) {
    std::cout << "failed " << c->id << ": log " << layout.log(c->id).string() << "; retry: accelpool-sweep run --study "
              << study.file.string() << " --out " << layout.out.string() << " --cell " << c->id << '\n';
  }
  return s.failed.empty() ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "accelpool-sweep: runs a study (a grid of accelpool-sim runs: traces x pools x estimates x policies x "
      "loads x seeds, described in TOML) on this machine or as a Slurm job array, resumes it, and merges the "
      "results with 95% confidence intervals and SVG plots. See docs/sweeps.md.\n"
      "Example: accelpool-sweep run --study study.toml && accelpool-sweep merge --study study.toml"};
  app.set_help_all_flag("--help-all", "Show all options");
  app.require_subcommand(1);
  std::string study_path, out;
  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("--study", study_path, "Study file (TOML)")->required()->type_name("FILE");
    cmd->add_option("--out", out, "Output folder (default: NAME.sweep next to the study file)")->type_name("DIR");
  };

  std::size_t jobs = std::max(1U, std::thread::hardware_concurrency());
  std::vector<std::string> only_cells;
  bool quiet = false;
  auto* run = app.add_subcommand("run", "Run the cells not done yet on this machine, in parallel processes");
  add_common(run);
  run->add_option("-j,--jobs", jobs, "Parallel processes (default: the core count)")->check(CLI::Range(1, 4096));
  run->add_option("--cell", only_cells, "Run only this cell (repeatable), e.g. to retry a failed one")->type_name("ID");
  run->add_flag("--quiet", quiet, "No progress lines");

  std::size_t tasks = 0, task = 0;
  auto* run_task = app.add_subcommand("run-task", "Run one slice of the cells (what each Slurm array task runs)");
  add_common(run_task);
  run_task->add_option("--tasks", tasks, "Number of slices")->required()->check(CLI::Range(1, 1'000'000));
  run_task->add_option("--task", task, "This slice, 0 to tasks-1 ($SLURM_ARRAY_TASK_ID)")->required();
  run_task->add_option("-j,--jobs", jobs, "Parallel processes")->check(CLI::Range(1, 4096));

  std::string cell_id;
  auto* run_cell = app.add_subcommand("run-cell", "Run one cell in this process and write its result file");
  add_common(run_cell);
  run_cell->add_option("--cell", cell_id, "Cell id")->required()->type_name("ID");
  pid_t parent = 0;
  run_cell
      ->add_option("--parent", parent,
                   "The process that started this cell (the runner passes its own): the cell ends with it, and "
                   "does not start when it is already gone")
      ->type_name("PID")
      ->check(CLI::PositiveNumber);

  std::vector<std::string> sbatch_args;
  bool no_submit = false;
  auto* slurm =
      app.add_subcommand("slurm", "Write a Slurm job array for the slices with unfinished cells and submit it");
  add_common(slurm);
  slurm->add_option("--tasks", tasks, "Slices of the grid (default: [slurm] tasks, else min(cells, 64))")
      ->check(CLI::Range(1, 1'000'000));
  slurm->add_option("--sbatch-arg", sbatch_args, "Extra #SBATCH line (repeatable), e.g. --sbatch-arg=--partition=batch")
      ->type_name("ARG")
      ->allow_extra_args(false);
  slurm->add_flag("--no-submit", no_submit, "Write the script only");

  auto* status = app.add_subcommand("status", "Cells done, failed (with their logs) and remaining");
  add_common(status);

  bool partial = false;
  auto* merge =
      app.add_subcommand("merge", "Merge the cell results: OUT/merged/{study.json,cells.csv,groups.csv,plots/}");
  add_common(merge);
  merge->add_flag("--partial", partial, "Merge the cells done so far even if some are not");

  auto* cells = app.add_subcommand("cells", "List the cells: id, state and parameters");
  add_common(cells);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  auto study = sweep::load_study(study_path);
  if (!study) return fail(study.error().message);
  const sweep::Layout layout = layout_for(*study, out);
  sweep::RunOptions options{.self = self_path(), .jobs = jobs, .progress = !quiet};

  if (*run_cell) {
    // A cell ends with the task that started it: a cancelled Slurm task (scancel) or a killed local run leaves no
    // cell behind. Slurm's process tracking by parentage (proctrack/linuxproc) loses a process whose parent died
    // first, and such a cell would run on, or wait forever on its input. The parent's pid comes from the parent
    // itself: one read here with getppid() is init's when the parent died before this process got that far, and
    // the check would pass. Run by hand (no --parent), a cell ends with whatever started it.
    const pid_t expected = parent > 0 ? parent : getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != expected) {
      return fail("the process that started this cell (" + std::to_string(expected) + ") is gone");
    }
    for (const auto& c : study->cells) {
      if (c.id != cell_id) continue;
      std::cout << "cell " << c.id << ": " << c.params.dump() << std::endl;
      auto doc = sweep::run_cell(c);
      if (!doc) return fail("cell " + c.id + ": " + doc.error().message);
      if (auto st = layout.create(); !st) return fail(st.error().message);
      if (auto st = sweep::write_atomically(layout.result(c.id), doc->dump(2) + "\n"); !st)
        return fail(st.error().message);
      std::cout << "wrote " << layout.result(c.id).string() << '\n';
      return 0;
    }
    return fail("no cell " + cell_id + " in " + study_path);
  }
  if (*run) {
    std::vector<const sweep::Cell*> todo;
    for (const auto& id : only_cells) {
      auto it = std::find_if(study->cells.begin(), study->cells.end(), [&](const auto& c) { return c.id == id; });
      if (it == study->cells.end()) return fail("no cell " + id + " in " + study_path);
      std::error_code ec;
      fs::remove(layout.result(id), ec);  // an explicit retry runs the cell again
      todo.push_back(&*it);
    }
    if (only_cells.empty()) {
      for (const auto& c : study->cells) todo.push_back(&c);
    }
    auto s = sweep::run_cells(*study, layout, todo, options, std::cerr);
    if (!s) return fail(s.error().message);
    return finish(*study, layout, *s);
  }
  if (*run_task) {
    if (task >= tasks) return fail("--task " + std::to_string(task) + " is not below --tasks " + std::to_string(tasks));
    std::cout << "task " << task << " of " << tasks << " on " << [] {
      char host[256] = "?";
      gethostname(host, sizeof host - 1);
      return std::string(host);
    }() << std::endl;
    auto s = sweep::run_cells(*study, layout, sweep::slice(study->cells, tasks, task), options, std::cout);
    if (!s) return fail(s.error().message);
    return finish(*study, layout, *s);
  }
  if (*slurm) {
    auto plan = sweep::write_slurm_script(*study, layout, tasks, sbatch_args, options.self);
    if (!plan) return fail(plan.error().message);
    if (plan->pending.empty()) {
      std::cout << "sweep " << study->name << ": every cell is done; nothing to submit\n";
      return 0;
    }
    std::cout << "wrote " << plan->script.string() << ": " << plan->pending.size() << " of " << plan->tasks
              << " slices\n";
    if (no_submit) return 0;
    auto job = sweep::submit(plan->script);
    if (!job) return fail(job.error().message);
    std::cout << "submitted job " << *job << "\n" << *job << '\n';
    return 0;
  }
  if (*status) {
    sweep::print_status(std::cout, layout, sweep::tally(layout, study->cells));
    return 0;
  }
  if (*merge) {
    auto m = sweep::merge(*study, layout, partial);
    if (!m) return fail(m.error().message);
    std::cout << "merged " << m->cells << " cells into " << m->groups << " groups; simulation time " << m->run_wall_s
              << " s in all\n";
    for (const auto& f : m->files) std::cout << f << '\n';
    return 0;
  }
  if (*cells) {
    for (const auto& c : study->cells) {
      const auto st = sweep::state_of(layout, c);
      std::cout << c.id << ' '
                << (st == sweep::CellState::done     ? "done"
                    : st == sweep::CellState::failed ? "failed"
                                                     : "remaining")
                << ' ' << c.params.dump() << '\n';
    }
    return 0;
  }
  return 0;
}
