// Running a command line through the shell from a test and collecting its output. Header-only.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace accelpool::testing {

struct CommandOutput {
  int code = -1;     // exit status, -1 if the command did not exit normally
  std::string text;  // stdout, and stderr when the command line redirects it (2>&1)
};

// Runs `command` with /bin/sh and waits for it to end.
inline CommandOutput run_command(const std::string& command) {
  CommandOutput out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + command);
  char buf[4096];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.text.append(buf, n);
  const int status = pclose(p);
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

}  // namespace accelpool::testing
