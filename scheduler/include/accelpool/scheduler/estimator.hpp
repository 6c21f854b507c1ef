// Learned run times: what the pool knows about how long requests run when they say nothing themselves.
//
// RuntimeEstimator learns online from finished leases, grouped by what a request carries (tenant,
// bitstream, gang size, kind and an optional label the guest supplies, e.g. its command name). Per group it
// keeps a decayed histogram of the service each lease received, in device-seconds (devices x seconds, so
// gangs count), from which it answers the centre (mean), the spread (quantiles) and a Gittins index.
// - Warm-up: a group is trusted only after `warmup` observations; until then a request falls back to the
//   histogram of its whole kind (which learns from every group of the kind), and until that one is warm it
//   gets no learned estimate at all.
// - Decay: each observation of a group multiplies the weight of its earlier ones by 2^(-1/half_life), so an
//   observation `half_life` observations old counts half: the estimate follows drift.
// Pure like the rest of the library: no clock (times are passed in by the scheduler), no randomness, no I/O.
// Its whole state converts to and from a plain struct (EstimatorState) so that the manager can keep it in its
// store across restarts.
#pragma once

#include <accelpool/scheduler/model.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace accelpool::scheduler {

// A decayed histogram of device-seconds over log-spaced bins: bin 0 holds [0, 1), bin i >= 1 holds
// [2^(i-1), 2^i) (an octave wide), the last bin is open-ended (2^31, about 2e9 device-seconds, and up).
// Octaves rather than finer bins: on the Philly trace gittins does as well or better with them (half and
// quarter octaves gave a 1-3% higher average JCT) and a running lease changes index less often.
// Each bin keeps its weight and the weighted sum of its values, so a bin's mean is exact.
class RuntimeHistogram {
 public:
  static constexpr std::size_t kBinsPerOctave = 1;
  static constexpr std::size_t kBins = 33;
  static double lower_edge(std::size_t bin);
  static double upper_edge(std::size_t bin);  // +inf for the last bin
  // The bin of `device_s`; a relative slack of 1e-9 puts a value computed to land on an edge in the upper bin.
  static std::size_t bin_of(double device_s);

  // Adds one observation after multiplying the earlier ones by `decay` (0 < decay <= 1). O(kBins).
  void observe(double device_s, double decay);
  std::uint64_t observations() const { return observations_; }  // undecayed count
  double total_weight() const;
  // Weighted mean of the observations, device-seconds; 0 when empty. O(kBins).
  double mean() const;
  // The mean of the bin that holds the q-quantile (0 < q <= 1) of the weight; 0 when empty. O(kBins).
  double quantile(double q) const;

  // Gittins index of a job that has received `attained` device-seconds, discretized: the index at the lower
  // edge e of attained's bin, max over quanta ending at an upper bin edge u of
  //     P(S <= u | S >= e) / E[min(S, u) - e | S >= e],
  // the rate at which service spent on it completes jobs; higher is served first. Constant inside a bin, so
  // it changes only when the attained service crosses a bin edge. With no weight at or above e (the job
  // outlived every observation) it is unknown_index(attained). O(kBins).
  double gittins_index(double attained) const;
  // The index when nothing is known: 1 / upper edge of attained's bin, falling as service grows (least
  // attained service first, in octave steps).
  static double unknown_index(double attained);

  const std::array<double, kBins>& weights() const { return weight_; }
  const std::array<double, kBins>& sums() const { return sum_; }
  // Rebuilds a histogram from its parts (see EstimatorState); false if a weight or sum is negative or not finite.
  bool assign(const std::vector<double>& weights, const std::vector<double>& sums, std::uint64_t observations);

 private:
  std::array<double, kBins> weight_{};
  std::array<double, kBins> sum_{};
  std::uint64_t observations_ = 0;
};

inline constexpr std::uint32_t kAnyGroupField = 0xFFFFFFFFu;  // in a kind-wide GroupKey: every value

// What groups requests: everything a request carries that tells its run time apart.
struct GroupKey {
  TenantId tenant = 0;
  BitstreamId bitstream = kNoBitstream;
  std::uint32_t count = 1;
  KindId kind = 0;
  LabelId label = kNoLabel;
  bool operator==(const GroupKey&) const = default;
  static GroupKey of(const Request& r) { return {r.tenant, r.bitstream, r.count, r.kind, r.label}; }
  // The group of every request of `kind`.
  static GroupKey whole_kind(KindId kind) {
    return {kAnyGroupField, kAnyGroupField, kAnyGroupField, kind, kAnyGroupField};
  }
};

struct EstimatorOptions {
  std::uint64_t warmup = 3;  // observations before a group is trusted (>= 1)
  double half_life = 100;    // observations after which an observation weighs half (> 0)
};

// The estimator's whole state as plain data, for storing it (the manager keeps it across restarts).
struct EstimatorState {
  struct Group {
    GroupKey key;
    std::uint64_t observations = 0;
    std::vector<double> weights;  // RuntimeHistogram::kBins each
    std::vector<double> sums;
  };
  EstimatorOptions options;
  std::vector<Group> groups;
};

class RuntimeEstimator {
 public:
  explicit RuntimeEstimator(EstimatorOptions options = {});
  // Rebuilds an estimator from a stored state; nullopt and `error` set (naming the bad group) if the options
  // or a group's histogram are invalid.
  static std::optional<RuntimeEstimator> from_state(const EstimatorState& state, std::string* error);
  EstimatorState state() const;  // groups in a deterministic order (by key)

  // A finished lease: `r` received `device_s` device-seconds of service in all (setup included). Teaches its
  // group and its kind. O(kBins).
  void observe(const Request& r, double device_s);
  // The histogram that speaks for `r`: its group once warm, else its kind once warm, else nullptr. O(1).
  const RuntimeHistogram* distribution(const Request& r) const;
  // Learned run time of `r` in seconds (the mean device-seconds of distribution(r) / r.count); nullopt while
  // nothing warm speaks for it. O(kBins).
  std::optional<double> estimate_s(const Request& r) const;
  // What group `key` has learned (warm or not); nullptr if it never observed anything. O(1).
  const RuntimeHistogram* group(const GroupKey& key) const;
  const EstimatorOptions& options() const { return options_; }
  std::size_t group_count() const { return groups_.size(); }

 private:
  struct KeyHash {
    std::size_t operator()(const GroupKey& k) const;
  };
  const RuntimeHistogram* warm(const GroupKey& key) const;
  EstimatorOptions options_;
  double decay_ = 1;
  std::unordered_map<GroupKey, RuntimeHistogram, KeyHash> groups_;
};

}  // namespace accelpool::scheduler
