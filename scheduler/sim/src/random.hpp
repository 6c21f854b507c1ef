// Seeded randomness for the simulator. std::mt19937_64 is fully specified but std::*_distribution is not,
// so the transforms are written out here: a seed gives the same numbers with any standard library (up to
// the last bit of libm's log/exp/cos).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace accelpool::sim::detail {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1): 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: safe for log().
  double uniform_open0() { return 1.0 - uniform(); }
  double exponential(double rate) { return -std::log(uniform_open0()) / rate; }
  // Standard normal by Box-Muller (one value per call; simple over fast).
  double normal() {
    const double u1 = uniform_open0();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  double lognormal(double mu, double sigma) { return std::exp(mu + sigma * normal()); }

 private:
  std::mt19937_64 engine_;
};

}  // namespace accelpool::sim::detail
