// The accelpool-manager process: store, core, hosts, guest listeners, admin API, signals.
#pragma once

#include "config.hpp"

#include <iosfwd>

namespace accelpool::manager {

// The exit status of a leader that found another manager leading (fenced) or could not renew its term.
inline constexpr int kSteppedDownExit = 3;

// Runs until SIGTERM or SIGINT; returns the process exit code. Prints the admin URL (and tokens created now)
// to `out`; errors to stderr. On a shared store ([store] url) it first waits as a standby until it leads, and
// exits with kSteppedDownExit as soon as it finds itself no longer leading (docs/ha.md).
int run_daemon(const Config& config, std::ostream& out);

}  // namespace accelpool::manager
