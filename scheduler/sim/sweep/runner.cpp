#include "runner.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

extern char** environ;

namespace accelpool::sweep {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string duration_text(double s) {
  char buf[64];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  }
  return buf;
}

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

// Starts `argv` with stdin from /dev/null and stdout and stderr written to `log` (truncated).
Result<pid_t> spawn_logged(const std::vector<std::string>& argv, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return make_error(Errc::io_error, "cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

}  // namespace

CellState state_of(const Layout& layout, const Cell& cell) {
  std::error_code ec;
  if (fs::exists(layout.result(cell.id), ec)) return CellState::done;
  if (fs::exists(layout.failed(cell.id), ec)) return CellState::failed;
  return CellState::remaining;
}

Tally tally(const Layout& layout, const std::vector<Cell>& cells) {
  Tally t;
  for (const auto& c : cells) {
    switch (state_of(layout, c)) {
      case CellState::done:
        t.done.push_back(&c);
        break;
      case CellState::failed:
        t.failed.push_back(&c);
        break;
      case CellState::remaining:
        t.remaining.push_back(&c);
        break;
    }
  }
  return t;
}

void print_status(std::ostream& out, const Layout& layout, const Tally& t) {
  out << t.done.size() << " done, " << t.failed.size() << " failed, " << t.remaining.size() << " remaining\n";
  for (const auto* c : t.failed) {
    auto why = read_file(layout.failed(c->id));
    std::string first_line = why ? why->substr(0, why->find('\n')) : "";
    out << "failed " << c->id << " (" << c->policy << ", load " << c->load << ", seed " << c->seed << ", trace "
        << c->trace << ", " << c->pool << ", estimates " << c->estimates << "): " << first_line << "; log "
        << layout.log(c->id).string() << '\n';
  }
}

Result<RunSummary> run_cells(const Study& study, const Layout& layout, const std::vector<const Cell*>& cells,
                             const RunOptions& options, std::ostream& log) {
  if (auto st = layout.create(); !st) return st.error();
  RunSummary summary;
  std::vector<const Cell*> todo;
  for (const auto* c : cells) {
    if (state_of(layout, *c) == CellState::done) {
      ++summary.skipped;
    } else {
      todo.push_back(c);
    }
  }
  const auto start = Clock::now();
  auto last_print = start;
  auto report = [&](bool final) {
    if (!options.progress) return;
    const auto now = Clock::now();
    if (!final && now - last_print < std::chrono::seconds(2)) return;
    last_print = now;
    const std::size_t finished = summary.ok + summary.failed.size();
    const std::size_t remaining = todo.size() - finished;
    const double elapsed = std::chrono::duration<double>(now - start).count();
    log << "sweep: " << summary.skipped + summary.ok << " done, " << summary.failed.size() << " failed, " << remaining
        << " remaining, " << duration_text(elapsed) << " elapsed";
    if (finished > 0 && remaining > 0) {
      log << ", ~" << duration_text(elapsed / static_cast<double>(finished) * static_cast<double>(remaining))
          << " left";
    }
    log << std::endl;
  };

  std::map<pid_t, const Cell*> running;
  std::size_t next = 0;
  while (next < todo.size() || !running.empty()) {
    while (next < todo.size() && running.size() < std::max<std::size_t>(1, options.jobs)) {
      const Cell* c = todo[next++];
      auto pid = spawn_logged({options.self.string(), "run-cell", "--study", study.file.string(), "--out",
                               layout.out.string(), "--cell", c->id, "--parent", std::to_string(::getpid())},
                              layout.log(c->id));
      if (!pid) {
        for (const auto& [p, rc] : running) waitpid(p, nullptr, 0);
        return pid.error();
      }
      running[*pid] = c;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return make_error(Errc::internal, std::string("waitpid: ") + std::strerror(errno));
    }
    auto it = running.find(pid);
    if (it == running.end()) continue;  // not one of ours
    const Cell* c = it->second;
    running.erase(it);
    std::error_code ec;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && fs::exists(layout.result(c->id), ec)) {
      fs::remove(layout.failed(c->id), ec);
      ++summary.ok;
    } else {
      (void)write_atomically(layout.failed(c->id), exit_text(status) + "\nlog: " + layout.log(c->id).string() + "\n");
      summary.failed.push_back(c);
    }
    report(false);
  }
  report(true);
  return summary;
}

std::vector<const Cell*> slice(const std::vector<Cell>& cells, std::size_t tasks, std::size_t task) {
  std::vector<const Cell*> out;
  for (const auto& c : cells) {
    if (c.index % tasks == task) out.push_back(&c);
  }
  return out;
}

namespace {

// Single-quotes a word for sh.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

Result<SlurmPlan> write_slurm_script(const Study& study, const Layout& layout, std::size_t tasks,
                                     const std::vector<std::string>& extra_sbatch_args, const fs::path& self) {
  SlurmPlan plan;
  plan.tasks = tasks > 0               ? tasks
               : study.slurm.tasks > 0 ? study.slurm.tasks
                                       : std::min<std::size_t>(study.cells.size(), 64);
  plan.tasks = std::min(plan.tasks, study.cells.size());
  for (std::size_t t = 0; t < plan.tasks; ++t) {
    for (const auto* c : slice(study.cells, plan.tasks, t)) {
      if (state_of(layout, *c) != CellState::done) {
        plan.pending.push_back(t);
        break;
      }
    }
  }
  if (auto st = layout.create(); !st) return st.error();
  std::error_code ec;
  fs::create_directories(layout.out / "slurm", ec);
  if (ec) return make_error(Errc::io_error, "cannot create " + (layout.out / "slurm").string() + ": " + ec.message());
  plan.script = layout.out / "slurm" / "array.sh";
  if (plan.pending.empty()) return plan;

  std::string array;
  for (auto t : plan.pending) array += (array.empty() ? "" : ",") + std::to_string(t);
  const std::string command = study.slurm.command.empty() ? self.string() : study.slurm.command;
  std::ostringstream s;
  s << "#!/bin/sh\n"
    << "# accelpool-sweep: study " << study.name << ", " << study.cells.size() << " cells in " << plan.tasks
    << " slices; submitted slices: " << plan.pending.size() << "\n"
    << "#SBATCH --job-name=sweep-" << study.name << "\n"
    << "#SBATCH --array=" << array << "\n"
    << "#SBATCH --output=" << (layout.out / "slurm" / "task-%A_%a.out").string() << "\n";
  for (const auto& a : study.slurm.sbatch_args) s << "#SBATCH " << a << "\n";
  for (const auto& a : extra_sbatch_args) s << "#SBATCH " << a << "\n";
  s << "exec " << sh_quote(command) << " run-task --study " << sh_quote(study.file.string()) << " --out "
    << sh_quote(fs::absolute(layout.out).string()) << " --tasks " << plan.tasks
    << " --task \"$SLURM_ARRAY_TASK_ID\" --jobs \"${SLURM_CPUS_PER_TASK:-1}\"\n";
  if (auto st = write_atomically(plan.script, s.str()); !st) return st.error();
  fs::permissions(plan.script, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, ec);
  return plan;
}

Result<std::string> submit(const fs::path& script) {
  const std::string cmd = "sbatch --parsable " + sh_quote(script.string()) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return make_error(Errc::io_error, "cannot run sbatch: " + std::string(std::strerror(errno)));
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (status != 0) return make_error(Errc::slurm, "sbatch failed (" + exit_text(status) + "): " + out);
  return out.substr(0, out.find(';'));  // "JOBID" or "JOBID;CLUSTER"
}

}  // namespace accelpool::sweep
