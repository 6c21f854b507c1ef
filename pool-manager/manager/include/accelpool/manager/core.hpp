// The pool's state machine: leases, the queue (through the scheduler library), devices, tenants.
//
// Threading: one owner. Every method must be called on the owner thread (the daemon's io_context thread, or a
// test's thread); network threads post to it. Nothing here locks.
// Durability: every method that changes state writes the change to the Store before it returns, so a reply
// built from its result never reports something a crash could undo. With group commit on, methods leave their
// changes pending instead, and the caller must commit() before it sends any reply built since the last commit:
// many calls then share one transaction.
#pragma once

#include <accelpool/common/guest_id.hpp>
#include <accelpool/common/result.hpp>
#include <accelpool/manager/clock.hpp>
#include <accelpool/manager/host_driver.hpp>
#include <accelpool/manager/store.hpp>
#include <accelpool/manager/types.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace accelpool::manager {

struct AcquireParams;

struct CoreOptions {
  double lease_ttl_s = 30;     // a lease whose guest has not heartbeaten for this long is reclaimed
  double revoke_grace_s = 10;  // time a guest has to release after a revocation warning
  std::string policy = "fifo+first-fit";
  std::size_t history = 10000;  // ended leases kept in memory for stats and listing
  // Live (queued or granted) leases one guest of a tenant may hold: bounds what `hello` and `list` return.
  std::size_t max_live_per_guest = 1000;
  double keep_ended_s = 30 * 86400;  // ended leases older than this are deleted from the store (0: kept forever)
  // Checks a valid acquire before it is queued (e.g. that its bitstream exists and fits a device of its kind,
  // ImageCatalog::check); an error refuses the acquire with that error and changes nothing. Called on the owner
  // thread; must not call into the core. Empty: no check.
  std::function<Status(const AcquireParams&)> acquire_check;
  // The sha256 of a bitstream in the manager's registry (ImageCatalog::sha256_of), "" when it has none: the core
  // puts it in every PrepareRequest, so a host checks (or fetches) the manager's image by its identity. Called on
  // the owner thread; must not call into the core. Empty: requests carry no sha256.
  std::function<std::string(const std::string& bitstream)> image_sha256;
  // The device models a bitstream in the manager's registry fits: its manifest's `compatible` patterns ('*'
  // wildcards, ImageCatalog::compatible_of); nullopt when the registry holds no such bitstream. A lease is granted
  // only devices whose model matches (a device that reports no model is not restricted), and an acquire that no
  // device model of its kind matches is refused. The models a queued lease fits are computed when it is queued and
  // again when a device of a new model joins its kind. Called on the owner thread; must not call into the core.
  // Empty: every lease fits every model.
  std::function<std::optional<std::vector<std::string>>(const std::string& bitstream)> image_models;
  // Whether a bitstream in the manager's registry is a partial image (its manifest's `image = partial`,
  // ImageCatalog::is_partial); nullopt when the registry holds no such bitstream. A lease of a partial image
  // asked of kind K goes on slots (kind K:slot, docs/hosts.md "Slots"); a lease of a full image asked of a slot
  // kind is refused ("incompatible"). Called on the owner thread; must not call into the core. Empty: the kind
  // asked for decides.
  std::function<std::optional<bool>(const std::string& bitstream)> image_partial;
  // The slot shape a partial image in the manager's registry fits (its manifest's `slot_shape`,
  // ImageCatalog::slot_shape_of); "" for a full image or one the registry does not hold. Its leases are placed
  // only on slots of that shape (HostDevice::slot_shapes) or of none; its compatible list still applies to the
  // slots' device model. Called on the owner thread; must not call into the core. Empty: any slot will do.
  std::function<std::string(const std::string& bitstream)> image_slot_shape;
  // The bandwidth demand of a bitstream in the manager's registry: its manifest's `bandwidth_demand`, the share of
  // a device's bandwidth it uses alone (0 to 1; 0 when not stated, or when the registry holds no such bitstream).
  // It is the scheduler's Request::demand for the bitstream's leases, by which slot leases are spread so that the
  // demands on one device stay within its bandwidth where they can (docs/policies.md, "Slots and interference").
  // Called on the owner thread; must not call into the core. Empty: every demand is 0.
  std::function<double(const std::string& bitstream)> image_demand;
};

// Sets acquire_check, image_sha256, image_models, image_partial, image_slot_shape and image_demand of `options` to
// answer from `catalog` (the manager's registry), as the daemon runs the core.
void answer_from_catalog(CoreOptions& options, std::shared_ptr<ImageCatalog> catalog);

enum class LeaseEvent : std::uint8_t {
  granted,   // every device is ready: the guest may use them
  revoking,  // the guest must release before revoke_deadline
  requeued,  // preempted: devices taken back, the lease waits again
  ended,     // released, cancelled, expired or revoked
};

// Receives lease events on the owner thread, after the change is durable. Must not call back into the core.
class CoreListener {
 public:
  virtual ~CoreListener() = default;
  virtual void lease_event(const Lease& lease, LeaseEvent event) = 0;
  // The token of `tenant` changed (rotated): sessions opened with the old one must end.
  virtual void tenant_token_changed(const std::string& tenant) { (void)tenant; }
};

struct AcquireParams {
  std::string tenant;
  std::string guest;
  std::string guest_host;  // "" : the first host
  std::string kind;
  std::string bitstream;
  std::uint32_t count = 1;
  std::optional<double> estimate_s;
  std::string label{};   // "" or 1-64 characters of [A-Za-z0-9._:-]; a tenant uses at most kMaxLabelsPerTenant
  bool relayed = false;  // a relay vouches for guest and guest_host (see Caller)
};

// The most distinct job labels one tenant's leases may carry (AcquireParams::label): each one is a group the
// scheduler learns run times for and the store keeps, so a guest cannot grow them without bound.
inline constexpr std::size_t kMaxLabelsPerTenant = 1000;

// The longest drain deadline accepted (one year), in seconds.
inline constexpr double kMaxDrainDeadlineS = 365.0 * 86400;

// A slot of a device as listings show it: its device name, state, what it holds and the lease holding it.
struct SlotView {
  std::string name;
  std::string state;
  std::string loaded;
  std::string shape;  // the slot's shape as its host reports it (e.g. "cu2"), "" for none
  std::optional<LeaseId> lease;
};

struct DeviceView {
  DeviceRecord record;
  std::string state;  // free, leased, draining, unavailable, shared, holding (scheduler DeviceState)
  std::optional<LeaseId> lease;
  std::optional<double> drain_deadline;  // when the lease still on this drained device is revoked
  std::vector<SlotView> slots;           // its slots, in order (record.parent names a slot's device)
};

// Which devices a listing wants. Every field set must match; `state` is one of DeviceView's. Listings show whole
// devices, each with its slots (DeviceView::slots); device() finds a slot by its name too.
struct DeviceFilter {
  std::optional<std::string> host;
  std::optional<std::string> kind;
  std::optional<std::string> state;
};

// A page of a listing by name: the items after the one named `after`, at most `limit` of them. The name of the
// last item of a page is the `after` of the next.
struct PageSpec {
  static constexpr std::size_t kDefaultLimit = 1000;
  static constexpr std::size_t kMaxLimit = 10000;
  std::optional<std::string> after;
  std::size_t limit = kDefaultLimit;
};

struct DevicePage {
  std::vector<DeviceView> devices;
  std::optional<std::string> next;  // the `after` of the next page; empty on the last page
};

struct HostView {
  std::string name;
  bool connected = false;  // attached and not lost
  bool draining = false;
  std::size_t device_count = 0;
};

// Which hosts a listing wants. Every field set must match.
struct HostFilter {
  std::optional<bool> connected;
  std::optional<bool> draining;
};

struct HostPage {
  std::vector<HostView> hosts;
  std::optional<std::string> next;  // the `after` of the next page; empty on the last page
};

struct Percentiles {
  std::size_t count = 0;
  double avg = 0, p50 = 0, p95 = 0, p99 = 0;
};
struct StatsGroup {
  Percentiles jct;
  Percentiles wait;
};
struct Stats {
  double window_s = 0;
  StatsGroup all;
  std::map<std::string, StatsGroup> by_tenant;
  std::map<std::string, StatsGroup> by_bitstream;
};

// One group of learned run times as the admin API shows it: the stored record and what it says.
struct LearnedGroup {
  EstimateRecord group;
  bool warm = false;         // observed at least the estimator's warm-up: requests of the group go by it
  double mean_device_s = 0;  // decayed mean service, device-seconds
  double estimate_s = 0;     // the learned run time of one request: mean_device_s / gang size (whole kind: the mean)
  double p50_device_s = 0, p90_device_s = 0;  // the bins that hold these quantiles (their means)
};

struct Counters {
  std::uint64_t grants = 0;
  std::uint64_t reprogrammings = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t expirations = 0;
};

class PoolCore {
 public:
  // Loads the store's snapshot and rebuilds the pool: devices, queue order, leases (live leases get one TTL
  // from now to heartbeat again). Errors: "store", "invalid_config" (bad policy), "corrupt" (inconsistent snapshot).
  static Result<std::unique_ptr<PoolCore>> create(CoreOptions options, const Clock& clock, Store& store);
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  void add_listener(CoreListener* listener);

  // What a joining host says beyond its device list (a host agent's registration). Both keyed by local id.
  struct HostReport {
    std::set<std::string> unusable;              // devices not to grant (failed health, quarantined)
    std::map<std::string, std::string> serving;  // devices the host says serve a guest (VM) now
  };

  // Binds a host: its devices join the pool (known ones keep their state; known ones now missing become
  // unavailable). A host marked lost (host_lost) may attach again under its name: the new driver replaces the
  // old one, and its reported devices become available again unless `report` calls them unusable. The store
  // is the source of truth: a device the host says serves a guest that holds no live lease on it is released
  // through the host. Errors: "conflict" (host name in use by a live host), "invalid_argument" (bad names),
  // the driver's enumeration error.
  Status attach_host(std::unique_ptr<HostDriver> host, const HostReport& report);
  Status attach_host(std::unique_ptr<HostDriver> host) { return attach_host(std::move(host), HostReport{}); }

  // The host's connection is gone (a host agent missed its heartbeats or closed): every device of the host
  // becomes unavailable, leases on them are preempted (device_failed: requeued, the guest is told), and waiting
  // requests stay queued. Nothing is sent to the lost host. The loss is stored once for the host (a restart keeps
  // its devices unavailable until it attaches again), not in each device's record. Errors: "not_found" (no such
  // host attached).
  Status host_lost(const std::string& host);
  // Whether `host` is attached and not lost.
  bool host_live(const std::string& host) const;

  // A host reported a device's health: unusable devices become unavailable (leases on them are preempted),
  // usable ones available again. A device of a lost host stays unavailable. Errors: "not_found".
  Status set_device_usable(const std::string& name, bool usable);

  // The guest (VM) `guest` on `host` stopped: every live lease of that VM ends revoked with `reason`. A lease is
  // that VM's when its guest id is `guest` and it runs on `host`: its guest_host is `host`, or it names no
  // guest_host and holds a device of `host`. A guest of the same name elsewhere (another host; another tenant's
  // VM) keeps its leases. Returns the leases ended.
  std::vector<Lease> end_guest_leases(const std::string& host, const std::string& guest, const std::string& reason);

  // --- tenants and tokens -------------------------------------------------------------------------------
  // Creates a tenant; returns its token (shown once; only the hash is stored).
  // Errors: "invalid_argument" (bad name, weight <= 0), "conflict" (exists).
  Result<std::string> create_tenant(const std::string& name, double weight, std::uint32_t max_devices);
  // Errors: "not_found", "invalid_argument".
  Status update_tenant(const std::string& name, std::optional<double> weight, std::optional<std::uint32_t> max_devices);
  // A new token for the tenant; the old one stops working. Listeners hear tenant_token_changed at the commit.
  // Errors: "not_found".
  Result<std::string> rotate_tenant_token(const std::string& name);
  std::vector<TenantRecord> tenants() const;
  // The tenant a token belongs to. Errors: "unauthorized".
  Result<std::string> authenticate(const std::string& token) const;
  // Deletes a tenant and its token; sessions opened with it end (listeners hear tenant_token_changed at the
  // commit). Its ended leases stay in the history. Errors: "not_found", "conflict" (it has live leases: named).
  Status delete_tenant(const std::string& name);
  // Admin tokens, one per operator, each with a name (AdminTokens in auth.hpp); only hashes are stored.
  // A new token for `name`, returned once; with `replace` the name's old token stops working (rotation).
  // Errors: "invalid_argument" (bad name), "conflict" (exists, !replace), "not_found" (missing, replace).
  Result<std::string> issue_admin_token(const std::string& name, bool replace = false);
  // Sets the admin token `name` to `token` (created or replaced). Errors: "invalid_argument" (under 16 characters).
  Status set_admin_token(const std::string& token, const std::string& name = "admin");
  // The token stops working at once. Errors: "not_found".
  Status revoke_admin_token(const std::string& name);
  std::vector<std::string> admin_token_names() const;  // by name
  bool has_admin_token() const;
  bool check_admin(const std::string& token) const;

  // --- leases ---------------------------------------------------------------------------------------------
  // A new lease, returned queued or granted, on devices of its kind whose model its bitstream fits
  // (CoreOptions::image_models); on slots for a partial image (CoreOptions::image_partial). Errors: "invalid_argument",
  // "not_found" (unknown tenant), "quota_exceeded" (the tenant's max_devices, or the guest already has
  // max_live_per_guest live leases), "incompatible" (its bitstream fits no device model of its kind; the message names
  // the bitstream's models and the kind's), "infeasible" (no such devices in the pool, or too few of the models it
  // fits).
  Result<Lease> acquire(const AcquireParams& params);
  // The calls below see only the leases `caller` owns (Caller::owns); others are "not_found".
  // Gives up a queued lease. Errors: "not_found", "invalid_state".
  Result<Lease> cancel(const Caller& caller, LeaseId id);
  // Ends a granted, revoking or queued lease. Errors: "not_found", "invalid_state".
  Result<Lease> release(const Caller& caller, LeaseId id);
  // Renews the TTL of one lease (id) or of every live lease the caller owns, in memory: nothing is written (a
  // restart gives every live lease a fresh TTL). Errors: "not_found".
  Result<std::vector<Lease>> heartbeat(const Caller& caller, std::optional<LeaseId> id);
  // Admin revocation: the guest gets the grace period, then the lease ends revoked. Errors: "not_found",
  // "invalid_state".
  Result<Lease> revoke(LeaseId id, const std::string& reason);
  // One lease, live or ended, if `caller` owns it: an ended lease the memory window no longer holds is read from
  // the store (everything kept under keep_ended_s). Errors: "not_found" (also for a lease the caller does not
  // own), "store".
  Result<Lease> get(const Caller& caller, LeaseId id) const;
  // The matching leases that memory holds: every live lease, and with include_ended the most recent `history`
  // ended ones. By id.
  std::vector<Lease> list(const LeaseFilter& filter) const;
  struct LeasePage {
    std::vector<Lease> leases;
    std::optional<LeaseId> next;  // the `after` of the next page; empty on the last page
  };
  // A page of every matching lease, ended ones read from the store (everything kept under keep_ended_s), so a
  // long history is listed whole, page by page, and no reply is unbounded. Errors: "store".
  Result<LeasePage> page(const LeaseFilter& filter, const LeasePageSpec& spec) const;
  // Waiting leases in the order the policy would serve them: `limit` of them, after the first `skip`. The order
  // is computed anew at each call (O(waiting) plus a partial sort of the first skip + limit).
  std::vector<Lease> queue(std::size_t limit = SIZE_MAX, std::size_t skip = 0) const;
  // One tenant's waiting leases in that order: `limit` of them after its first `skip`, each with its position in
  // the whole queue (1 = served first), and how many the tenant has waiting. O(waiting log waiting) for the order;
  // only the page's leases are copied.
  struct TenantQueuePage {
    std::vector<std::pair<Lease, std::size_t>> entries;  // lease, position
    std::size_t total = 0;
  };
  TenantQueuePage tenant_queue(const std::string& tenant, std::size_t limit, std::size_t skip) const;
  // When a waiting lease is expected to be granted, where the scheduler has an estimate (Scheduler::expected_start:
  // the request its kind's reservation is for); nullopt otherwise.
  std::optional<double> expected_start(LeaseId id) const;

  // --- devices and hosts ----------------------------------------------------------------------------------
  // Every device, by name. Proportional to the pool: a reply to a client takes a page (device_page).
  std::vector<DeviceView> devices() const;
  Result<DeviceView> device(const std::string& name) const;
  // A page of the devices that match `filter`, by name, after the device named `spec.after`. Filtered by host, it
  // visits that host's devices only; otherwise it walks the pool from the cursor until the page is full.
  DevicePage device_page(const DeviceFilter& filter, const PageSpec& spec) const;
  // Every host the pool knows (attached, or holding devices known from the store), by name. Proportional to the
  // hosts, not to the devices.
  std::vector<std::string> hosts() const;
  bool host_known(const std::string& host) const;
  // One host: whether it is connected and draining, and how many devices it has. Errors: "not_found".
  Result<HostView> host(const std::string& host) const;
  // A page of the matching hosts, by name, after the host named `spec.after`.
  HostPage host_page(const HostFilter& filter, const PageSpec& spec) const;
  // The devices of one host, by name (none for an unknown host).
  std::vector<DeviceView> host_devices(const std::string& host) const;
  // How many device records the host operations (attach_host, host_lost, set_host_draining, host listings) have
  // visited since the core was created. Grows with the devices of the hosts concerned, never with the pool: tests
  // assert a host's reach with it.
  std::uint64_t host_device_visits() const;
  // Drains a device (no new grants; its lease runs on) or undrains it. With `deadline_s` (drain only), a lease
  // still on the device that many seconds from now is revoked with the usual grace. Errors: "not_found",
  // "invalid_argument" (bad deadline).
  Status set_draining(const std::string& name, bool draining, std::optional<double> deadline_s = std::nullopt);
  // The same for every device of a host, and for the devices it registers later, until undrained. Survives
  // restarts. Errors: "not_found", "invalid_argument".
  Status set_host_draining(const std::string& host, bool draining, std::optional<double> deadline_s = std::nullopt);
  bool host_draining(const std::string& host) const;
  // Resets a free device through its host. Errors: "not_found", "invalid_state" (leased).
  Status reset_device(const std::string& name);
  // The registry's image of `bitstream` changed (a version was registered): the live leases that name it take
  // the device models its compatible list fits now (CoreOptions::image_models), as when a new model joins. A
  // queued lease may be placed on devices it fits only now, and waits only for those it still fits; one that no
  // device model of its kind fits any more is revoked, naming both; a granted lease keeps its devices.
  void bitstream_changed(const std::string& bitstream);
  std::vector<std::string> bitstreams() const;  // names held by devices or asked for by leases

  // --- policy, time, stats --------------------------------------------------------------------------------
  std::string policy() const;
  // Errors: "invalid_argument" naming what is wrong.
  Status set_policy(const std::string& spec);
  // Carries out what falls due by now: expiries, revocation deadlines, scheduler ticks.
  void tick();
  // When tick() next has work, if ever.
  std::optional<double> next_wakeup() const;
  Stats stats(double window_s) const;
  // What the scheduler learned about run times, every group (the store keeps it across restarts), ordered by
  // kind, then the whole kind first, then tenant, bitstream, gang size and label. O(groups).
  std::vector<LearnedGroup> learned_estimates() const;
  std::uint64_t learning_warmup() const;
  Counters counters() const;
  std::size_t queue_length() const;
  std::map<std::string, std::size_t> leases_by_state() const;
  std::map<std::string, std::size_t> devices_by_state() const;

  Store& store();

  // Group commit (see the header comment). Off by default.
  void set_group_commit(bool on);
  // Whether changes are waiting for commit().
  bool has_uncommitted() const;
  // Writes every pending change in one transaction, runs `after_write` (send the held replies there), then
  // tells the listeners about the events. A store that cannot write ends the process (see flush in core.cpp).
  void commit(const std::function<void()>& after_write = {});

  // Group commit in two steps, for a caller that makes the batch durable on another thread while the core goes
  // on serving (the daemon's StoreWriter): take_commit() hands over every pending change as one Commit and leaves
  // none pending; once its batch is durable (Store::apply succeeded), finish_commit() lets memory forget what the
  // store now holds and tells the listeners about its events. A reply built before take_commit may be sent once
  // the batch is durable; one built after it waits for the next commit. At most one commit may be taken and not
  // finished, and commit() must not be called meanwhile.
  struct Commit {
    Batch batch;
    std::vector<std::pair<Lease, LeaseEvent>> events;
    std::vector<std::string> rotated_tenants;
  };
  Commit take_commit();
  void finish_commit(Commit commit);
  // What the core does when a batch cannot be made durable: it cannot keep its promise of durability, so it logs
  // the store's error and ends the process (a restart resumes from the store).
  [[noreturn]] static void fail_store(const Error& error);

  // What commits changed, for the dashboards' live view (event_stream.cpp), which re-reads only these: the
  // devices and leases each commit wrote, and the hosts whose loss, return or draining it wrote. A device's
  // derived view (its lease, a lost host's availability) changes with the lease or host named here, not always
  // with the device itself. Recorded only while tracking is on (off by default); take_touched() hands over what
  // was recorded since the last call and clears it.
  struct Touched {
    std::set<std::string> devices, hosts;
    std::set<LeaseId> leases;
  };
  void track_touched(bool on);
  Touched take_touched();

 private:
  struct Impl;
  explicit PoolCore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
