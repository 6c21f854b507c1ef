// The accelpool-manager process: store, core, hosts, guest listeners, admin API, signals.
#pragma once

#include "config.hpp"

#include <iosfwd>

namespace accelpool::manager {

// Runs until SIGTERM or SIGINT; returns the process exit code. Prints the admin URL (and tokens created now)
// to `out`; errors to stderr.
int run_daemon(const Config& config, std::ostream& out);

}  // namespace accelpool::manager
