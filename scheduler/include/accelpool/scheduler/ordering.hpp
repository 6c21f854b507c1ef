// Ordering policies decide "who goes next"; placement (placement.hpp) decides "which devices".
//
// The scheduler keeps waiting requests in ordered sets keyed by PriorityKey. A key is computed when a
// request enters the queue and stays fixed while it waits, so every queue operation is O(log n). Policies
// whose priority changes while a lease runs (srpt, las) say when through next_key_change, and the
// scheduler re-ranks that lease then.
#pragma once

#include <accelpool/scheduler/estimator.hpp>
#include <accelpool/scheduler/model.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::scheduler {

// Lower sorts first (is served first). `primary` is the policy's measure; `secondary` breaks ties
// (usually arrival time); `id` makes keys unique. Preemption happens only on a strictly better primary.
struct PriorityKey {
  double primary = 0;
  double secondary = 0;
  RequestId id = 0;
  auto operator<=>(const PriorityKey&) const = default;
};

// What a policy may read about a request. `attained_device_s` counts device-seconds of service received in
// earlier leases (not the current one); the current lease started at `granted_at` on `request.count` devices.
// `estimate_s` is the run time to go by: the request's own estimate, else the learned one (see
// estimator.hpp), else none; `learned` is the learned distribution that speaks for the request, if any.
// Policies read the run time only through these two, never `request.estimate_s` directly.
struct RequestView {
  const Request& request;
  double attained_device_s = 0;
  double attained_s = 0;  // wall seconds of service in earlier leases (for remaining-time estimates)
  Time granted_at = 0;    // meaningful only while running
  std::optional<double> estimate_s;
  const RuntimeHistogram* learned = nullptr;
};

// Device-time used per tenant, for fairness. Maintained by the scheduler; read by policies.
class TenantLedger {
 public:
  void set_weight(TenantId tenant, double weight);
  double weight(TenantId tenant) const;
  // Device-seconds the tenant has used up to `now`, counting its running leases.
  double usage(TenantId tenant, Time now) const;
  void lease_started(TenantId tenant, std::uint32_t devices, Time now);
  void lease_stopped(TenantId tenant, std::uint32_t devices, Time now);

 private:
  struct Account {
    double weight = 1;
    double used = 0;            // device-seconds up to `since`
    std::uint32_t running = 0;  // devices held now
    Time since = 0;
  };
  Account& account(TenantId tenant);
  std::vector<Account> accounts_;
};

// Contract for an ordering policy. Implementations are pure functions of their arguments (no I/O, no clock,
// no hidden state that changes between calls); every method is O(1) unless it says otherwise.
class OrderingPolicy {
 public:
  virtual ~OrderingPolicy() = default;

  virtual std::string_view name() const = 0;

  // The key of a request entering the queue at `now` (on arrival, or on requeue after preemption).
  // Must not change while the request waits.
  virtual PriorityKey waiting_key(const RequestView& r, Time now) const = 0;

  // Whether running leases may be preempted for waiting requests that outrank them.
  virtual bool preemptive() const { return false; }

  // For preemptive policies: the key a running lease would have if it were waiting at `now`, comparable
  // with waiting keys. Called when choosing victims.
  virtual PriorityKey running_key(const RequestView& r, Time now) const { return waiting_key(r, now); }

  // For preemptive policies: the order of running leases (larger = preempted first), computed at grant and
  // at each next_key_change. Between those times it must order leases as running_key would at any moment.
  virtual PriorityKey victim_rank(const RequestView& r, Time now) const { return running_key(r, now); }

  // When the running lease's running_key next changes in a way that its victim_rank no longer reflects
  // (a LAS queue demotion). nullopt: never.
  virtual std::optional<Time> next_key_change(const RequestView& /*r*/, Time /*now*/) const { return std::nullopt; }

  // Whether the queue is split per tenant and tenants are served by tenant_rank first.
  virtual bool per_tenant() const { return false; }
  // Lower is served first; compared before keys. Only called when per_tenant(). O(1).
  virtual double tenant_rank(const TenantLedger& /*ledger*/, TenantId /*tenant*/, Time /*now*/) const { return 0; }
};

// Builds an ordering policy by name: fifo, sjf, srpt, las, djsf, fair, gittins. Options after a colon, comma-free:
// "las:3600/36000" sets LAS queue thresholds in device-seconds. Returns nullptr and sets `error` for an
// unknown name or bad options.
std::unique_ptr<OrderingPolicy> make_ordering(std::string_view spec, std::string* error);

// The names make_ordering knows, for help texts.
std::span<const std::string_view> ordering_names();

}  // namespace accelpool::scheduler
