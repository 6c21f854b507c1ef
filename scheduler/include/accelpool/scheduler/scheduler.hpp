// The scheduler: the one place where accelpool decides who gets which device.
//
// Pure and single-threaded: it never reads a clock (every call carries `now`, which must not go backwards),
// does no I/O and uses no randomness. The live manager and the simulator drive the very same object.
//
// Lifecycle of a request: submit -> waiting -> (grant) -> running -> release.
// A preemptive policy may return a Preemption for a running lease: the lease is then "revoking" and keeps
// its devices until the caller reports the outcome with requeue() (the request waits again, keeping its
// attained service) or release() (it is gone).
#pragma once

#include <accelpool/scheduler/estimator.hpp>
#include <accelpool/scheduler/id_map.hpp>
#include <accelpool/scheduler/model.hpp>
#include <accelpool/scheduler/ordering.hpp>
#include <accelpool/scheduler/placement.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace accelpool::scheduler {

// Slowdown at which `+age` (without a value) ages a request. Well above the p99 slowdown a good ordering gives
// (1 to 30 for gittins on the traces of docs/results.md), so it acts only on requests the ordering starves;
// at 10 it also promoted ordinary short jobs and their protected, reserved leases cost fifo 3% of its average
// JCT on Alibaba's trace. With 100, on Philly, Alibaba's trace and the synthetic FPGA workload, fifo+age is never
// worse than fifo and gittins+age never worse than gittins, on average or p99 JCT (docs/results.md).
inline constexpr double kDefaultAgeSlowdown = 100;

// Longest a device may idle on hold for its loaded bitstream under `+hold` without a value (see hold_s).
inline constexpr double kDefaultHoldS = 60;

// Longest a waiting request may be passed over by the reuse rule under `+reuse` without a value (see reuse_s).
// On the synthetic FPGA workload of docs/results.md a bound of an hour keeps nearly all of the rule's effect
// (600 s keeps half of it) and no worse p99 JCT than fifo.
inline constexpr double kDefaultReuseS = 3600;

// A full policy: ordering + placement + tail rules, written "las+affinity" or "sjf+pack+guard=3600+age=10".
struct PolicySpec {
  std::string ordering = "fifo";
  std::string placement = "first-fit";
  std::optional<double> tail_guard_s;  // a request waiting longer than this is served next
  // Slowdown aging: a request that has waited `age_slowdown` times its estimated run time (at least 1 s) is
  // served next, as if it had passed the tail guard. Requests without an estimate (own or learned) age
  // only by the guard.
  std::optional<double> age_slowdown;
  bool preemption = true;  // allow preemption when the ordering is preemptive
  // The hold rule (docs/policies.md, "The hold rule"): a device freed while holding a bitstream whose requests
  // arrive often enough that one is more likely than not within `hold_s` seconds is kept for that bitstream
  // (state `holding`) for at most `hold_s` seconds instead of being reprogrammed for another; a waiting request
  // of its bitstream takes it first. Off when unset.
  std::optional<double> hold_s;
  // The reuse rule (docs/policies.md, "The reuse rule"): free devices are a cache of loaded images. A free
  // device holding bitstream b goes to the best waiting request for b (no programming) before the ordering's own
  // choice, unless a request of its kind has waited `reuse_s` seconds or more (then the ordering alone decides);
  // and a request that must reprogram overwrites the free devices whose images have the least expected demand
  // per free copy (learned from arrivals). Off when unset.
  std::optional<double> reuse_s;

  // Whether the scheduler learns arrival rates per bitstream and indexes waiting requests by bitstream.
  bool learns_images() const { return hold_s || reuse_s; }
  // Whether requests can age (a tail guard or slowdown aging).
  bool ages() const { return tail_guard_s || age_slowdown; }
  // Parses "ORDERING[+PLACEMENT][+guard=SECONDS][+age[=SLOWDOWN]][+hold[=SECONDS]][+reuse[=SECONDS]][+nopreempt]"
  // (`+age` alone: kDefaultAgeSlowdown; `+hold` alone: kDefaultHoldS; `+reuse` alone: kDefaultReuseS).
  // Returns nullopt and sets `error` if malformed.
  static std::optional<PolicySpec> parse(std::string_view text, std::string* error);
  std::string to_string() const;
};

// shared: not leased itself but unusable whole because a part of it is in use: a device with a slot held or on
// hold, or a slot whose device is leased whole, on hold, draining or out of service.
// holding: idle, kept for its loaded bitstream by the hold rule (PolicySpec::hold_s).
enum class DeviceState : std::uint8_t { free, leased, draining, unavailable, shared, holding };
inline constexpr std::size_t kDeviceStates = 6;

enum class RequestPhase : std::uint8_t { waiting, running, revoking };

// Outcome of an event that takes input the scheduler may reject; `error` says what was wrong and `kind` what the
// caller can do about it: `invalid`, the input itself is wrong (an unknown id, a count of 0); `infeasible`, the
// input is well-formed but the pool can never serve it (fewer reachable devices than asked), so queueing it would
// wait forever.
struct Rejection {
  enum class Kind : std::uint8_t { invalid, infeasible };
  std::string error;
  Kind kind = Kind::invalid;
};

class Scheduler {
 public:
  // Builds a scheduler with the given policy; nullptr and `error` set when the spec names unknown policies.
  static std::unique_ptr<Scheduler> create(const PolicySpec& spec, std::string* error);

  // --- devices -------------------------------------------------------------------------------------
  // A new device joins the pool free. Rejected if the id is in use or its model is not below kMaxModelsPerKind.
  std::optional<Rejection> add_device(const Device& device, Time now, Decisions& out);
  // A slot (partial-reconfiguration region) of present device `parent` joins the pool as a device of its own
  // (usually of a kind of its own, e.g. "fpga/slot", and of a model naming its shape): slot leases of several
  // requests run side by side on one device. The device is granted whole only while all its slots are free
  // (otherwise it is `shared`); its slots are granted only while the device is neither leased whole, on hold,
  // draining nor out of service (otherwise they are `shared`). A slot leaves with remove_device; the device's
  // failure preempts the leases of its slots. Rejected as add_device, or if `parent` is no present device or
  // is itself a slot.
  std::optional<Rejection> add_slot(const Device& slot, DeviceId parent, Time now, Decisions& out);
  // The device leaves the pool. A lease holding it is preempted (reason device_failed).
  std::optional<Rejection> remove_device(DeviceId id, Time now, Decisions& out);
  // The device stops serving (fails, or its host stopped heartbeating): like remove, but it stays known and
  // can come back with set_available(id, true).
  std::optional<Rejection> set_available(DeviceId id, bool available, Time now, Decisions& out);
  // A draining device is granted to no one; its current lease runs on.
  std::optional<Rejection> set_draining(DeviceId id, bool draining, Time now, Decisions& out);
  // The device was reprogrammed outside a grant (e.g. reset): record what it holds now.
  std::optional<Rejection> set_loaded(DeviceId id, BitstreamId loaded);
  // The device's model changed (e.g. a slot's host reports a new shape): it is placed by `model` from now on; a
  // lease holding it keeps it. Rejected if the device is not present or the model is not below kMaxModelsPerKind.
  std::optional<Rejection> set_model(DeviceId id, ModelId model, Time now, Decisions& out);

  // --- tenants -------------------------------------------------------------------------------------
  void set_tenant_weight(TenantId tenant, double weight);

  // --- learned run times (estimator.hpp) ------------------------------------------------------------
  // Every lease that ends by release() while running teaches the estimator its service. A request without
  // an estimate of its own goes by the learned one (taken when it enters the queue, and fixed while it waits
  // or runs); the gittins ordering reads the learned distribution.
  const RuntimeEstimator& estimator() const { return estimator_; }
  // Replaces what was learned (e.g. with RuntimeEstimator::from_state after a restart, or new options).
  // Requests already queued or running keep the estimate they have.
  void set_estimator(RuntimeEstimator estimator) { estimator_ = std::move(estimator); }

  // --- requests ------------------------------------------------------------------------------------
  // A request arrives. Rejected if its id is live, count is 0, or it can never be served with the devices
  // that exist (not enough of its kind and of its models reachable from its host). It is granted only devices
  // of its kind whose model is in request.models.
  std::optional<Rejection> submit(const Request& request, Time now, Decisions& out);
  // The request is gone: a running or revoking lease frees its devices; a waiting request leaves the queue.
  // A running lease counts as finished: its service teaches the estimator.
  std::optional<Rejection> release(RequestId id, Time now, Decisions& out);
  // Several requests gone at the same instant, then one decision over all the devices they free (so that
  // devices freed together can go together to a waiting gang). Rejected, changing nothing, if an id is not
  // live or is listed twice.
  std::optional<Rejection> release(std::span<const RequestId> ids, Time now, Decisions& out);
  // The device models a request may run on changed (e.g. a device of a new model joined that its bitstream
  // fits): a waiting request leaves the queue and enters it again under the new set, as on requeue(); a running
  // one keeps its devices and goes by the new set if it waits again. Rejected if the id is not live.
  std::optional<Rejection> set_models(RequestId id, ModelSet models, Time now, Decisions& out);
  // A running or revoking lease gives its devices back and waits again, keeping its attained service.
  std::optional<Rejection> requeue(RequestId id, Time now, Decisions& out);

  // Re-creates a lease that ran before a restart: `request` holds `devices` since `granted_at`, after
  // `attained_device_s` of service in earlier leases. For recovering state from a store; emits no grant.
  // Rejected (and nothing changes) if the id is live, the device count differs from the request's, or a
  // device is unknown, not free, not of the request's kind or of a model not in request.models.
  std::optional<Rejection> restore(const Request& request, std::span<const DeviceId> devices, Time granted_at,
                                   double attained_device_s = 0);

  // Time passes: LAS demotions, the tail guard and preemption checks that fall due by `now`.
  void tick(Time now, Decisions& out);
  // When tick() next has something to do. nullopt: nothing until another event.
  std::optional<Time> next_wakeup() const;

  // Switch policy at runtime: waiting requests are re-ranked (O(n log n)); running leases keep running.
  std::optional<Rejection> set_policy(const PolicySpec& spec, Time now, Decisions& out);
  const PolicySpec& policy() const { return spec_; }

  // --- views (O(1) unless noted) --------------------------------------------------------------------
  std::size_t waiting_count() const { return waiting_count_; }
  std::size_t running_count() const { return running_count_; }
  std::size_t device_count() const { return device_count_; }
  std::size_t free_count() const { return free_count_; }
  // How many devices (present, or removed but still held) are in `state`.
  std::size_t count_in_state(DeviceState state) const { return state_counts_[static_cast<std::size_t>(state)]; }
  std::optional<RequestPhase> phase(RequestId id) const;
  std::optional<DeviceState> device_state(DeviceId id) const;
  const Device* device(DeviceId id) const;
  // The slots of a device (added by add_slot, removed ones left out), in the order added; empty if none.
  std::vector<DeviceId> slots_of(DeviceId id) const;
  // The device a slot belongs to; nullopt for a device that is no slot.
  std::optional<DeviceId> parent_of(DeviceId id) const;
  // A device on hold (state `holding`): until when, and for which bitstream.
  struct Hold {
    Time until = 0;
    BitstreamId bitstream = kNoBitstream;
  };
  std::optional<Hold> hold_of(DeviceId id) const;
  // When a waiting request is expected to start, where the scheduler has an estimate: the request that holds its
  // kind's reservation (aged past the tail guard or by slowdown, and not fitting now) starts when the running
  // leases it waits for are estimated to end (the reservation's shadow time). nullopt for any other request, and
  // when those leases have no estimate or outlived it. O(leases examined for the reservation).
  std::optional<Time> expected_start(RequestId id, Time now) const;
  // Devices of a running or revoking lease; empty otherwise.
  std::vector<DeviceId> devices_of(RequestId id) const;
  // Waiting requests in the order the policy would serve them if devices were free: the first `limit` of them.
  // O(limit log buckets) for a policy without aging (a merge of the per-tenant, per-kind buckets), else O(n log limit)
  // for n waiting.
  std::vector<RequestId> queue_order(Time now, std::size_t limit = SIZE_MAX) const;
  const TenantLedger& ledger() const { return ledger_; }

 private:
  // Laid out so that a grant or release, which comes for any entry at any time, reads the first two cache
  // lines only: the request and flags, then the lease.
  struct alignas(64) Entry {
    Request request;
    RequestPhase phase = RequestPhase::waiting;
    bool protected_ = false;  // granted by the tail guard: never preempted
    bool live = false;        // the slot holds a request (see entries_)
    double attained_device_s = 0;
    double attained_s = 0;
    Time granted_at = 0;
    std::optional<double> estimate_s;   // run time the scheduler goes by: the request's own, else learned
    Time ages_at = 0;                   // waiting, with a guard or aging: when it is served first
    std::vector<DeviceId> devices;      // running or revoking: the lease's devices
    std::optional<Time> key_change_at;  // running leases: next LAS demotion
    PriorityKey key;                    // waiting key
    PriorityKey victim_rank;            // running leases of preemptive policies
  };
  // One device. Packed into 32 bytes: a grant or release touches the slots of its devices in no
  // particular order, so each should cost one cache line.
  struct alignas(32) Slot {
    Device device;
    DeviceState state = DeviceState::free;
    bool present : 1 = false;
    bool draining : 1 = false;
    bool available : 1 = true;
    bool held : 1 = false;
    bool counted : 1 = false;    // its state is in state_counts_ (present or held)
    bool is_slot : 1 = false;    // added by add_slot: parent_of_ names its device
    bool has_slots : 1 = false;  // slots_of_ lists its slots
    bool on_hold : 1 = false;    // kept for its loaded bitstream (holds_)
    RequestId holder = 0;
  };
  static_assert(sizeof(Slot) == 32);
  // Waiting requests that compete for the same devices in the same way form a bucket; inside a bucket
  // they are ordered by key, so the bucket's head is its best request. With a tail guard a bucket also
  // orders its requests that have an estimate by estimated remaining run time, so that backfilling behind a
  // reservation finds the requests that end in time without scanning the bucket.
  struct BucketKey {
    KindId kind;
    HostId host;
    std::uint32_t count;
    TenantId tenant;  // 0 unless the ordering is per tenant
    ModelSet models;
    auto operator<=>(const BucketKey&) const = default;
  };
  struct Bucket {
    std::set<PriorityKey> by_key;
    std::set<std::pair<double, PriorityKey>> by_remaining;  // (estimated remaining s, key); tail guard only
  };

  Scheduler(PolicySpec spec, std::unique_ptr<OrderingPolicy> ordering, std::unique_ptr<PlacementPolicy> placement);

  Slot* slot(DeviceId id);
  const Slot* slot(DeviceId id) const;
  Entry* find(RequestId id);
  const Entry* find(RequestId id) const;
  // The entry of a live request; the request must exist (a broken invariant otherwise: aborts).
  Entry& entry(RequestId id);
  const Entry& entry(RequestId id) const;
  // A fresh entry for a request whose id is not live. Invalidates references to other entries.
  Entry& add_entry(const Request& request);
  // What the ordering may read of a request.
  RequestView view(const Entry& e) const;
  // Sets e.estimate_s: the request's own estimate, else what the estimator has learned by now.
  void take_estimate(Entry& e) const;
  void remove_entry(Entry& e);
  BucketKey bucket_key(const Request& r) const;
  void enqueue(Entry& e, Time now);
  void dequeue(Entry& e);
  void grant(Entry& e, const FreeIndex::Eligible& eligible, Time now, bool protect, Decisions& out);
  void place(Entry& e, const FreeIndex::Eligible& eligible, Time now);
  // Interference-aware placement of a request on slots (docs/policies.md, "Slots and interference"); false,
  // choosing nothing, if the eligible devices are no slots.
  bool place_on_slots(Entry& e, const FreeIndex::Eligible& eligible);
  Grant start(Entry& e, Time granted_at, bool protect);
  // Frees the lease's devices; `may_hold`: they may go on hold (a lease that ended, not one preempted).
  void stop_running(Entry& e, Time now, bool may_hold = false);
  // release() without the decision that follows: the request must be live.
  void forget(Entry& e, Time now);
  void make_free(Slot& s);
  void make_unfree(Slot& s);
  void refresh_slot(Slot& s);
  // Sets whether a device is held by a lease and whether it is on hold, and re-indexes it with the devices
  // that depend on it (a slot's device, a device's slots).
  void set_use(Slot& s, bool held, bool on_hold);
  // Whether the slots of `parent` may be granted now (present, available, not draining, not leased or on hold).
  bool open_for_slots(const Slot& parent) const;
  // --- the hold rule (PolicySpec::hold_s) ---
  // Learns the arrival rate of the request's bitstream.
  void observe_arrival(const Request& r, Time now);
  // Puts a device just freed on hold for its loaded bitstream if the rule says so.
  void maybe_hold(Slot& s, Time now);
  bool likely_soon(BitstreamId b, Time now) const;
  // The gap between arrivals of b the rules go by: the decayed mean, or the time since the last arrival if
  // longer; infinity until kHoldMinArrivals have been seen.
  Time arrival_gap(BitstreamId b, Time now) const;
  // Whether a waiting request for b passes its turn for now: it has waited less than hold_s, too few free
  // devices it may use hold b, a device holding b is leased and b's rate makes one likely to free in time.
  bool deferred(const Entry& e, Time now) const;
  // The best request of a bucket that is not deferred, among its first kMaxBackfillExamined; nullptr if none.
  const PriorityKey* first_not_deferred(const Bucket& bucket, Time now) const;
  IndexNeeds index_needs() const;
  void end_hold(DeviceId id);
  void end_holds_due(Time now);
  void end_all_holds();
  // Grants devices on hold to waiting requests of their bitstream, best first.
  void serve_held(Time now, Decisions& out);
  // The body of remove_device, set_available and set_draining: applies `change` to present device `id`'s slot,
  // re-indexes it, revokes the lease holding it when `revoke_holder`, and dispatches. A rejection when `id` is
  // no present device.
  template <class Change>
  std::optional<Rejection> change_device(DeviceId id, Time now, Decisions& out, bool revoke_holder, Change change);
  std::size_t reachable_devices(const Request& r) const;
  std::size_t usable_by(const Entry& lease, const Request& r) const;  // present devices of the lease `r` could use
  // Whether `r` may be granted device `d` (its kind, reachable from its host, of its models).
  static bool suits(const Device& d, const Request& r);
  // The free devices `r` may be granted: its kind, reachable from its host, of its models.
  FreeIndex::Eligible eligible(const Request& r) const;
  // Present devices of `d`'s kind, model and reach (its host if passthrough), counted in *_total_.
  using ModelCounts = std::vector<std::size_t>;  // by model
  std::size_t& model_count(const Device& d);
  void dispatch(Time now, Decisions& out);
  // While an aged request waits for devices: others of its kind may start only if estimated to end by
  // `shadow`, when it is expected to fit, or if they take no more than `extra` devices it will not need.
  struct Window {
    Time shadow;
    std::size_t extra;
    bool ends_in_time(const Entry& e, Time now) const { return e.estimate_s && now + remaining_estimate(e) <= shadow; }
    void take(const Entry& e, Time now) {
      if (!ends_in_time(e, now)) extra -= std::min(extra, std::size_t{e.request.count});
    }
  };
  // Estimated run time still to go of a request with an estimate, from the service it has received.
  static double remaining_estimate(const Entry& e) { return std::max(0.0, *e.estimate_s - e.attained_s); }
  // The best request of `bucket` that `window` admits now, or nullptr (EASY backfilling, see dispatch()).
  const PriorityKey* backfill_candidate(const BucketKey& bk, const Bucket& bucket, const Window& window,
                                        Time now) const;
  void serve_aged(Time now, Decisions& out, std::map<KindId, Window>& windows);
  // --- the reuse rule (PolicySpec::reuse_s) ---
  // Grants free devices holding a bitstream to the best waiting requests for it that they cover, unless a request
  // of their kind has waited reuse_s or more, or the kind's devices are kept for a preempting request (`blocked`)
  // or a reservation (`windows`).
  void serve_loaded(Time now, Decisions& out, const std::set<KindId>& blocked, const std::map<KindId, Window>& windows);
  // Whether serving e ahead of the ordering would pass over another request of its kind that has waited
  // reuse_s or more.
  bool reuse_passes_over_aged(const Entry& e, Time now) const;
  // The images loaded on free devices of `eligible`, in the order a grant for `r` should overwrite them: images
  // never requested first, then by expected demand per free copy (arrival rate / free devices holding it),
  // least first. Leaves out r's own image.
  std::vector<BitstreamId> overwrite_order(const Request& r, const FreeIndex::Eligible& eligible, Time now) const;
  // Whether a waiting request has passed the guard or aged by slowdown at `now`; when it will (ages_at).
  bool aged(const Entry& e, Time now) const;
  Time ages_at(const Entry& e) const;
  // nullopt: no reservation (the leases it waits for all outlived their estimates).
  std::optional<Window> reservation_window(const Request& r, std::size_t free_now, Time now) const;
  std::optional<Time> estimated_finish(const Entry& e) const;
  void track_running(Entry& e, Time now);
  void untrack_running(Entry& e);
  void serve_reserved(Time now, Decisions& out, std::set<KindId>& blocked);
  void preempt_for_waiting(Time now, Decisions& out, const std::set<KindId>& blocked);
  void apply_key_changes(Time now);
  void mark_revoking(Entry& e, PreemptReason reason, Decisions& out);

  PolicySpec spec_;
  std::unique_ptr<OrderingPolicy> ordering_;
  std::unique_ptr<PlacementPolicy> placement_;
  TenantLedger ledger_;
  RuntimeEstimator estimator_;

  std::vector<Slot> slots_;
  FreeIndex free_;
  // Live requests. Entries sit in a slab and are reused after release, so the working set stays compact and
  // a reused entry keeps its device vector's capacity (no allocation per grant); `entry_of_` finds them by id.
  // The slab grows to the largest number of requests live at once and does not shrink.
  std::vector<Entry> entries_;
  std::vector<std::uint32_t> unused_entries_;
  IdMap entry_of_;
  std::map<BucketKey, Bucket> buckets_;
  // Waiting requests per kind by (ages_at, arrival, id); kept only with a tail guard or aging.
  std::unordered_map<KindId, std::set<std::tuple<Time, Time, RequestId>>> aging_;
  std::unordered_map<KindId, std::set<PriorityKey>> victims_;  // running, preemptible
  std::set<std::pair<Time, RequestId>> key_changes_;           // running, by next demotion
  std::unordered_map<KindId, std::size_t> revoking_devices_;
  std::map<KindId, RequestId> reservations_;
  // Running leases with estimates by estimated finish, per kind; kept only with a tail guard.
  std::unordered_map<KindId, std::set<std::pair<Time, RequestId>>>
      finishes_;  // per kind: the request that preempted leases are making room for
  // Present devices by model per (kind, host) and per kind for network devices, to reject impossible requests.
  std::map<std::pair<KindId, HostId>, ModelCounts> passthrough_total_;
  std::unordered_map<KindId, ModelCounts> network_total_;

  std::size_t waiting_count_ = 0;
  std::size_t running_count_ = 0;
  std::size_t device_count_ = 0;
  std::size_t free_count_ = 0;
  std::array<std::size_t, kDeviceStates> state_counts_{};  // by DeviceState, kept by refresh_slot
  // Slots: each slot's device, each device's slots, and how many of a device's slots are held or on hold.
  std::unordered_map<DeviceId, DeviceId> parent_of_;
  std::unordered_map<DeviceId, std::vector<DeviceId>> slots_of_;
  std::unordered_map<DeviceId, std::uint32_t> busy_slots_;
  std::unordered_map<DeviceId, double> slot_demand_;  // by device: demand of the leases on its slots
  // The hold and reuse rules: arrivals per bitstream (mean gap, decayed), devices on hold.
  struct ArrivalRate {
    Time last = 0;
    double mean_gap = 0;
    std::uint64_t seen = 0;
  };
  std::vector<ArrivalRate> arrivals_;  // by bitstream id
  std::map<DeviceId, Hold> holds_;
  std::set<std::pair<Time, DeviceId>> hold_ends_;
  std::map<BitstreamId, std::set<DeviceId>> held_for_;
  std::unordered_map<BitstreamId, std::size_t> leased_with_;  // hold_s only: leased devices holding each image
  // With hold_s or reuse_s: the waiting requests of each bitstream by key, and of each kind by arrival.
  std::map<BitstreamId, std::set<PriorityKey>> waiting_for_;
  std::unordered_map<KindId, std::set<std::pair<Time, RequestId>>> waiting_since_;  // by arrival, per kind
  Time last_now_ = 0;
};

}  // namespace accelpool::scheduler
