// Time for the pool manager. The core never reads a clock directly: it asks the Clock it was given, so tests
// drive time by hand and the daemon uses wall time (seconds since the Unix epoch, so times survive restarts).
#pragma once

namespace accelpool::manager {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since the Unix epoch. Called on the owner thread only; must be cheap and must not block.
  virtual double now() const = 0;
};

// Wall time from std::chrono::system_clock.
class SystemClock final : public Clock {
 public:
  double now() const override;
};

// Time that moves only when told: for tests.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(double start = 1'000'000.0) : now_(start) {}
  double now() const override { return now_; }
  void advance(double seconds) { now_ += seconds; }
  void set(double t) { now_ = t; }

 private:
  double now_;
};

}  // namespace accelpool::manager
