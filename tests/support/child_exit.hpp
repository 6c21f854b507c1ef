// Waiting for a child process of a test (a daemon binary it started) to exit. Header-only.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <optional>
#include <thread>

namespace accelpool::testing {

// The exit code in a waitpid() status, or -SIGNAL when a signal ended the process.
inline int exit_status(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -WTERMSIG(wait_status);
}

// Waits up to `timeout` for child `pid` to exit by itself and reaps it; its exit_status(), or nullopt when it
// is still running (then it is left alone).
inline std::optional<int> wait_child_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return exit_status(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

}  // namespace accelpool::testing
