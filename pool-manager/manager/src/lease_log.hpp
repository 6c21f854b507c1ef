// Lease transitions in the log (docs/operations.md "Logs"): one line per granted, revoking, preempted (requeued)
// and ended lease, written after the change is durable. Internal to the manager.
#pragma once

#include <accelpool/manager/core.hpp>

#include <unordered_map>

namespace accelpool::manager {

class LeaseLog final : public CoreListener {
 public:
  // Owner thread. Formats the line only when its level is enabled.
  void lease_event(const Lease& lease, LeaseEvent event) override;
  // A tenant's guest token was rotated (never the token itself).
  void tenant_token_changed(const std::string& tenant) override;

 private:
  // Devices reprogrammed for each live lease so far (Lease::reprogrammed counts every grant of a lease), so a
  // grant line says how many this grant reprogrammed.
  std::unordered_map<LeaseId, std::uint32_t> reprogrammed_;
};

}  // namespace accelpool::manager
