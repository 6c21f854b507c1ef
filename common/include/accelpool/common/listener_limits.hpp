// What every listening socket of the manager (guests, admin API, host agents) does about file descriptors:
// raise the process's soft limit at start, check that the configured connection limits fit it, and back off when
// accept() runs out of descriptors anyway. Header-only.
//
// Why the back-off: a connection the kernel completed stays in the listen backlog when accept() fails with EMFILE,
// so the listening socket stays readable and an accept loop that retries at once spins on a core without ever
// making progress, starving everything else on its thread.
#pragma once

#include <accelpool/common/result.hpp>

#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace accelpool::common {

// Descriptors the process needs besides its connections: stdio, listening sockets, the store and its WAL, image
// files being read, backend handles, the agent listener's eventfd.
constexpr std::uint64_t kReservedFds = 64;

// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force. Errors: "io_error".
inline Result<std::uint64_t> raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0)
    return make_error(Errc::io_error, std::string("getrlimit: ") + std::strerror(errno));
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<std::uint64_t>(lim.rlim_cur);
}

// Whether `connections` (the sum of every listener's connection limit) plus kReservedFds fit `fd_limit`.
// Errors: "invalid_config", saying what is needed and the two ways out.
inline Status check_fd_budget(std::uint64_t connections, std::uint64_t fd_limit, const std::string& which_limits) {
  if (connections + kReservedFds <= fd_limit) return Status::ok();
  return make_error(Errc::invalid_config,
                    "the connection limits (" + which_limits + ": " + std::to_string(connections) +
                        " connections) need " + std::to_string(connections + kReservedFds) +
                        " file descriptors, but the limit (RLIMIT_NOFILE, hard) is " + std::to_string(fd_limit) +
                        ": lower the limits or raise the limit (ulimit -n, "
                        "LimitNOFILE= in the systemd unit)");
}

// Whether a failed accept() ran out of a resource (descriptors, kernel memory) rather than losing one connection.
inline bool accept_out_of_resources(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

// The back-off of one listener. One thread at a time (the listener's).
class AcceptBackoff {
 public:
  static constexpr std::chrono::milliseconds kPause{100};

  // `listener` names it in the log ("guest listener tcp 127.0.0.1:7070").
  explicit AcceptBackoff(std::string listener) : listener_(std::move(listener)) {}

  // accept() failed with errno `err`. Returns how long to wait before accepting again: kPause when out of
  // resources (logged once per episode, on stderr), zero for an error that concerns one connection only
  // (ECONNABORTED, EINTR, ...).
  std::chrono::milliseconds failed(int err) {
    if (!accept_out_of_resources(err)) return std::chrono::milliseconds(0);
    if (refusals_++ == 0) {
      std::fprintf(stderr,
                   "%s: %s: cannot accept connections: %s; retrying every %lld ms until connections close "
                   "(raise the file descriptor limit or lower the connection limits)\n",
                   program_invocation_short_name, listener_.c_str(), std::strerror(err),
                   static_cast<long long>(kPause.count()));
    }
    return kPause;
  }

  // accept() succeeded: ends an episode (logged with how many retries it took).
  void accepted() {
    if (refusals_ == 0) return;
    std::fprintf(stderr, "%s: %s: accepting connections again (after %llu retries)\n", program_invocation_short_name,
                 listener_.c_str(), static_cast<unsigned long long>(refusals_));
    refusals_ = 0;
  }

 private:
  std::string listener_;
  std::uint64_t refusals_ = 0;  // failed accepts in this episode
};

}  // namespace accelpool::common
