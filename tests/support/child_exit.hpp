// Waiting for a child process of a test (a daemon binary it started) to exit. Header-only.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include "hung_after.hpp"

#include <chrono>
#include <optional>

namespace accelpool::testing {

// The exit code in a waitpid() status, or -SIGNAL when a signal ended the process.
inline int exit_status(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -WTERMSIG(wait_status);
}

// Waits up to `timeout` for child `pid` to exit by itself and reaps it; its exit_status(), or nullopt when it
// is still running (then it is left alone).
inline std::optional<int> wait_child_exit(pid_t pid, std::chrono::milliseconds timeout) {
  int st = 0;
  if (!eventually([&] { return ::waitpid(pid, &st, WNOHANG) == pid; }, timeout)) return std::nullopt;
  return exit_status(st);
}

}  // namespace accelpool::testing
