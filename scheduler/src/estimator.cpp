// Learned run times. See estimator.hpp for the contract and docs/policies.md for how policies use them.
#include <accelpool/scheduler/estimator.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace accelpool::scheduler {

// --- RuntimeHistogram ----------------------------------------------------------------------------------------

double RuntimeHistogram::lower_edge(std::size_t bin) {
  return bin == 0 ? 0.0 : std::exp2(static_cast<double>(bin - 1) / kBinsPerOctave);
}

double RuntimeHistogram::upper_edge(std::size_t bin) {
  return bin + 1 >= kBins ? std::numeric_limits<double>::infinity() : lower_edge(bin + 1);
}

std::size_t RuntimeHistogram::bin_of(double device_s) {
  const double x = device_s + 1e-9 * std::max(1.0, device_s);
  if (!(x >= 1)) return 0;
  const auto bin = static_cast<std::size_t>(1 + std::floor(kBinsPerOctave * std::log2(x)));
  return std::min(bin, kBins - 1);
}

void RuntimeHistogram::observe(double device_s, double decay) {
  device_s = std::max(0.0, device_s);
  for (std::size_t i = 0; i < kBins; ++i) {
    weight_[i] *= decay;
    sum_[i] *= decay;
  }
  const std::size_t bin = bin_of(device_s);
  weight_[bin] += 1;
  sum_[bin] += device_s;
  ++observations_;
}

double RuntimeHistogram::total_weight() const {
  double total = 0;
  for (double w : weight_) total += w;
  return total;
}

double RuntimeHistogram::mean() const {
  double weight = 0, sum = 0;
  for (std::size_t i = 0; i < kBins; ++i) {
    weight += weight_[i];
    sum += sum_[i];
  }
  return weight > 0 ? sum / weight : 0;
}

double RuntimeHistogram::quantile(double q) const {
  const double total = total_weight();
  if (!(total > 0)) return 0;
  double seen = 0;
  for (std::size_t i = 0; i < kBins; ++i) {
    seen += weight_[i];
    if (weight_[i] > 0 && seen >= q * total * (1 - 1e-12)) return sum_[i] / weight_[i];
  }
  return 0;
}

double RuntimeHistogram::unknown_index(double attained) { return 1 / upper_edge(bin_of(attained)); }

double RuntimeHistogram::gittins_index(double attained) const {
  const std::size_t first = bin_of(attained);
  const double edge = lower_edge(first);
  double rest = 0;  // weight at or above `edge`
  for (std::size_t i = first; i < kBins; ++i) rest += weight_[i];
  if (!(rest > 1e-12 * std::max(1.0, total_weight()))) return unknown_index(attained);
  double done = 0;     // weight of jobs that finish within the quantum
  double service = 0;  // their service beyond `edge`, weighted
  double best = 0;
  for (std::size_t j = first; j < kBins; ++j) {
    if (weight_[j] <= 0) continue;
    done += weight_[j];
    service += std::max(0.0, sum_[j] - weight_[j] * edge);
    const double quantum = upper_edge(j) - edge;
    const double unfinished = rest - done;
    const double spent = service + (unfinished > 0 ? unfinished * quantum : 0);
    if (spent > 0) best = std::max(best, done / spent);
  }
  return best > 0 ? best : unknown_index(attained);
}

bool RuntimeHistogram::assign(const std::vector<double>& weights, const std::vector<double>& sums,
                              std::uint64_t observations) {
  if (weights.size() != kBins || sums.size() != kBins) return false;
  for (std::size_t i = 0; i < kBins; ++i) {
    if (!std::isfinite(weights[i]) || !std::isfinite(sums[i]) || weights[i] < 0 || sums[i] < 0) return false;
  }
  std::copy(weights.begin(), weights.end(), weight_.begin());
  std::copy(sums.begin(), sums.end(), sum_.begin());
  observations_ = observations;
  return true;
}

// --- RuntimeEstimator ----------------------------------------------------------------------------------------

std::size_t RuntimeEstimator::KeyHash::operator()(const GroupKey& k) const {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::uint64_t v : {std::uint64_t{k.tenant}, std::uint64_t{k.bitstream}, std::uint64_t{k.count},
                          std::uint64_t{k.kind}, std::uint64_t{k.label}}) {
    h = (h ^ v) * 1099511628211ULL;
  }
  return static_cast<std::size_t>(h ^ (h >> 32));
}

RuntimeEstimator::RuntimeEstimator(EstimatorOptions options)
    : options_(options), decay_(std::exp2(-1 / options.half_life)) {}

std::optional<RuntimeEstimator> RuntimeEstimator::from_state(const EstimatorState& state, std::string* error) {
  auto fail = [&](std::string message) -> std::optional<RuntimeEstimator> {
    if (error) *error = "estimator state: " + std::move(message);
    return std::nullopt;
  };
  if (state.options.warmup < 1) return fail("warmup must be at least 1");
  if (!(state.options.half_life > 0) || !std::isfinite(state.options.half_life)) {
    return fail("half_life must be a positive number of observations");
  }
  RuntimeEstimator estimator(state.options);
  for (std::size_t i = 0; i < state.groups.size(); ++i) {
    const auto& g = state.groups[i];
    RuntimeHistogram h;
    if (!h.assign(g.weights, g.sums, g.observations)) {
      return fail("group " + std::to_string(i) + ": needs " + std::to_string(RuntimeHistogram::kBins) +
                  " finite non-negative weights and sums");
    }
    if (!estimator.groups_.emplace(g.key, h).second) return fail("group " + std::to_string(i) + " is listed twice");
  }
  return estimator;
}

EstimatorState RuntimeEstimator::state() const {
  EstimatorState s;
  s.options = options_;
  for (const auto& [key, h] : groups_) {
    s.groups.push_back(
        {key, h.observations(), {h.weights().begin(), h.weights().end()}, {h.sums().begin(), h.sums().end()}});
  }
  auto tie = [](const GroupKey& k) { return std::tie(k.kind, k.tenant, k.bitstream, k.count, k.label); };
  std::sort(s.groups.begin(), s.groups.end(),
            [&](const EstimatorState::Group& a, const EstimatorState::Group& b) { return tie(a.key) < tie(b.key); });
  return s;
}

void RuntimeEstimator::observe(const Request& r, double device_s) {
  groups_[GroupKey::of(r)].observe(device_s, decay_);
  groups_[GroupKey::whole_kind(r.kind)].observe(device_s, decay_);
}

const RuntimeHistogram* RuntimeEstimator::group(const GroupKey& key) const {
  auto it = groups_.find(key);
  return it != groups_.end() ? &it->second : nullptr;
}

const RuntimeHistogram* RuntimeEstimator::warm(const GroupKey& key) const {
  const RuntimeHistogram* h = group(key);
  return h && h->observations() >= options_.warmup ? h : nullptr;
}

const RuntimeHistogram* RuntimeEstimator::distribution(const Request& r) const {
  if (groups_.empty()) return nullptr;
  if (const auto* h = warm(GroupKey::of(r))) return h;
  return warm(GroupKey::whole_kind(r.kind));
}

std::optional<double> RuntimeEstimator::estimate_s(const Request& r) const {
  const RuntimeHistogram* h = distribution(r);
  if (!h) return std::nullopt;
  return h->mean() / r.count;
}

}  // namespace accelpool::scheduler
