// How long a test waits for something that must happen (a reply, a notification, a process exit, a state a
// poll should see): only a hung component takes this long, so a slow, loaded machine never fails a test by it.
// Tests wait on the event itself and never assert that something happened within less.
#pragma once

#include <chrono>
#include <thread>

namespace accelpool::testing {

// Five minutes: a manager with a PoCL host, started at nice 19 on two cores under a load of 14, once took more
// than 60 s to come up (PoCL compiles its kernels at start). ctest's own --timeout (900 s) still ends a test that
// hangs in many waits.
inline constexpr std::chrono::milliseconds kHungAfter = std::chrono::seconds(300);

// Polls `p` every 20 ms until it holds or `timeout` passes; returns its last value.
template <typename Pred>
bool eventually(Pred p, std::chrono::milliseconds timeout = kHungAfter) {
  using Clock = std::chrono::steady_clock;
  auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return p();
}

}  // namespace accelpool::testing
