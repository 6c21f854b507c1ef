// `accelpool-manager token ...`: the tokens of a stopped manager's store, offline (docs/operations.md, Tokens).
#pragma once

#include "config.hpp"

#include <iosfwd>
#include <string>

namespace accelpool::manager {

struct TokenCommand {
  enum class Action { list, create, rotate, revoke } action = Action::list;
  std::string name;    // the admin token's name (create, rotate, revoke)
  std::string tenant;  // rotate: the tenant whose guest token to replace instead
};

// Runs `command` on the store of `config` (its data folder and store file) while no manager runs there (the data
// folder's lock, DataLock, says so). Prints what it did and the new tokens (shown once) to `out`, errors to
// stderr. Never creates a store. Returns the process exit code: 0, 1 (refused or failed), 2 (bad arguments).
int run_token_command(const Config& config, const TokenCommand& command, std::ostream& out);

}  // namespace accelpool::manager
