#include <accelpool/manager/clock.hpp>
#include <accelpool/manager/types.hpp>

#include <array>
#include <chrono>

namespace accelpool::manager {

namespace {
constexpr std::array<std::string_view, 7> kStateNames = {"queued",    "granted", "revoking", "released",
                                                         "cancelled", "expired", "revoked"};
}

std::string_view to_string(LeaseState s) { return kStateNames.at(static_cast<std::size_t>(s)); }

std::optional<LeaseState> parse_lease_state(std::string_view s) {
  for (std::size_t i = 0; i < kStateNames.size(); ++i) {
    if (kStateNames[i] == s) return static_cast<LeaseState>(i);
  }
  return std::nullopt;
}

double SystemClock::now() const {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

bool Caller::owns(const Lease& l) const {
  if (tenant.empty()) return true;
  return l.tenant == tenant && l.guest == guest && l.relayed == relayed && (!relayed || l.guest_host == guest_host);
}

}  // namespace accelpool::manager
