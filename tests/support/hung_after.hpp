// How long a test waits for something that must happen (a reply, a notification, a process exit, a state a
// poll should see): only a hung component takes this long, so a slow, loaded machine never fails a test by it.
// Tests wait on the event itself and never assert that something happened within less.
#pragma once

#include <chrono>
#include <thread>

namespace accelpool::testing {

inline constexpr std::chrono::milliseconds kHungAfter = std::chrono::seconds(60);

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
