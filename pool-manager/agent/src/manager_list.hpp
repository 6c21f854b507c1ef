// Which manager of a pool the agent's connections (its manager link, each relayed guest port) go to next. The
// managers are given in order: one of them, or the leader and standbys of a shared store (docs/ha.md). A standby
// refuses with `not_leader`, naming the leader's address; that address is tried next, at once. Any other failure
// or end of a connection moves on to the next manager of the list, after the caller's backoff.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace accelpool::agent {

// The leader's address that a standby's refusal `line` names (its error's `data.leader`); "" when it names none
// (nobody leads yet) or the line is no such refusal.
std::string standby_names_leader(std::string_view line);

class ManagerList {
 public:
  // `managers`: one or more addresses, in the order to try them; current() is the first.
  explicit ManagerList(std::vector<std::string> managers);

  // The address to connect to now.
  const std::string& current() const { return current_; }

  // The connection to current() failed or ended; `leader` is the address a standby named when it refused ("" when
  // none). Moves current() on: to `leader` when that is another address (returns true: try it at once; false when
  // current() was itself a named leader, so two managers naming each other are not tried in a tight loop), else to
  // the next manager of the list (returns false: try it after the backoff). When a named leader fails in turn,
  // the list goes on at the manager after the one that named it (a stale name is not followed for good).
  bool advance(const std::string& leader);

 private:
  std::vector<std::string> managers_;
  std::size_t next_ = 0;  // the manager of the list tried when no leader is named
  std::string current_;
  bool redirected_ = false;  // current_ is a leader a standby named, not managers_[next_]
};

}  // namespace accelpool::agent
