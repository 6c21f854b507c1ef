// The pool's state machine. See core.hpp for the threading and durability rules.
#include <accelpool/bitstreams/manifest.hpp>
#include <accelpool/common/log.hpp>
#include <accelpool/common/slots.hpp>
#include <accelpool/manager/auth.hpp>
#include <accelpool/manager/core.hpp>
#include <accelpool/scheduler/scheduler.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace accelpool::manager {

namespace sched = accelpool::scheduler;

namespace {

constexpr const char* kNoHeartbeat = "no heartbeat for the lease TTL";

bool valid_name(const std::string& s, std::size_t max_len) {
  return !s.empty() && s.size() <= max_len && std::all_of(s.begin(), s.end(), common::is_name_char);
}

// The error code of a scheduler's rejection: its kind survives up to the APIs.
Errc errc_of(const sched::Rejection& rejection) {
  switch (rejection.kind) {
    case sched::Rejection::Kind::infeasible:
      return Errc::infeasible;
    case sched::Rejection::Kind::invalid:
      return Errc::invalid_argument;
  }
  return Errc::internal;
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  p.count = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.avg = sum / static_cast<double>(v.size());
  auto at = [&](double q) {
    auto idx = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, idx == 0 ? 0 : idx - 1)];
  };
  p.p50 = at(0.50);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  return p;
}

std::string device_state_name(std::optional<sched::DeviceState> s) {
  if (!s) return "unknown";
  switch (*s) {
    case sched::DeviceState::free:
      return "free";
    case sched::DeviceState::leased:
      return "leased";
    case sched::DeviceState::draining:
      return "draining";
    case sched::DeviceState::unavailable:
      return "unavailable";
    case sched::DeviceState::shared:
      return "shared";
    case sched::DeviceState::holding:
      return "holding";
  }
  return "unknown";
}

// A drain deadline is a number of seconds from now, and only a drain has one.
std::optional<Error> check_drain_deadline(bool draining, std::optional<double> deadline_s) {
  if (!deadline_s) return std::nullopt;
  if (!draining) return make_error(Errc::invalid_argument, "'deadline_s' applies to drain only");
  if (!std::isfinite(*deadline_s) || *deadline_s < 0 || *deadline_s > kMaxDrainDeadlineS) {
    return make_error(Errc::invalid_argument, "'deadline_s' must be a number of seconds in [0, " +
                                                  std::to_string(static_cast<long>(kMaxDrainDeadlineS)) + "]");
  }
  return std::nullopt;
}

// A page of the entries of `map` (keyed by name) after spec.after: at most spec.limit of those match(name, value)
// accepts, each given to add(name, value). Returns the cursor of the next page: the last name added, when another
// match follows.
template <class Map, class Match, class Add>
std::optional<std::string> page_of(const Map& map, const PageSpec& spec, Match match, Add add) {
  std::size_t taken = 0;
  std::optional<std::string> last;
  for (auto it = spec.after ? map.upper_bound(*spec.after) : map.begin(); it != map.end(); ++it) {
    if (!match(it->first, it->second)) continue;
    if (taken == spec.limit) return last;
    add(it->first, it->second);
    last = it->first;
    ++taken;
  }
  return std::nullopt;
}

}  // namespace

struct PoolCore::Impl {
  struct Sample {
    std::string tenant;
    std::string bitstream;
    double ended_at;
    double jct;
    double wait;
  };

  CoreOptions options;
  const Clock& clock;
  Store& store;
  std::unique_ptr<sched::Scheduler> scheduler;
  sched::NameTable kinds, bitstreams, tenant_ids, host_ids, labels;
  // The distinct job labels each tenant's leases and learned groups carry (at most kMaxLabelsPerTenant new ones).
  std::unordered_map<std::string, std::unordered_set<std::string>> labels_of_tenant;
  std::vector<sched::NameTable> models;  // by kind id: the device models of that kind, numbered as the scheduler's

  std::map<std::string, TenantRecord> tenants;
  std::unordered_map<std::string, std::string> tenant_by_hash;
  AdminTokens admin_tokens;
  std::string policy_text;

  std::map<std::string, DeviceRecord> devices;                     // by name
  std::unordered_map<sched::DeviceId, DeviceRecord*> by_sched_id;  // into `devices`
  std::unordered_map<std::string, LeaseId> holder;                 // device name -> lease holding it
  sched::DeviceId next_sched_id = 0;

  std::map<std::string, std::unique_ptr<HostDriver>> hosts;
  // Hosts whose connection is gone (lost since they attached, or lost before a restart and not back yet): their
  // devices are unavailable and nothing is sent to them. A device record's `available` is the device's own state
  // (its host's reports, failed operations); the host's loss is stored once, as meta host_lost:<host>, so a storm
  // of hosts leaving or returning writes a row per host, not one per device.
  std::set<std::string> lost_hosts;
  std::vector<std::string> host_order;
  // The host table: every host the pool knows (attached, or holding devices restored from the store), with its
  // devices by name. A host's join, loss, return and drain go through its entry only, never over the whole pool.
  // The records live in `devices` (a std::map, so the pointers stay valid; devices are never erased).
  struct HostEntry {
    std::map<std::string, DeviceRecord*> devices;  // by device name
  };
  std::map<std::string, HostEntry> host_table;
  std::map<std::string, std::uint32_t> stored_slots;  // device -> slots the store knows it has (meta slots:<device>)
  std::uint64_t device_visits = 0;  // device records host operations visited (PoolCore::host_device_visits)
  std::map<std::string, std::vector<std::function<void(HostDriver&)>>> deferred;  // ops for hosts not bound yet

  std::map<LeaseId, Lease> live;
  // Live leases by (tenant, guest), and each tenant's devices held or wanted by live leases: a guest's heartbeat,
  // listing and lease limit, and a tenant's quota, touch that guest's or tenant's leases only, never the pool's.
  std::map<std::pair<std::string, std::string>, std::set<LeaseId>> live_by_guest;
  std::map<std::string, std::uint64_t> live_devices_of_tenant;

  // Keeps live_by_guest and live_devices_of_tenant in step with `live`: called when a lease enters it and when it
  // leaves.
  void index_live(const Lease& l, bool entering) {
    const std::pair<std::string, std::string> guest{l.tenant, l.guest};
    auto& devices = live_devices_of_tenant[l.tenant];
    if (entering) {
      live_by_guest[guest].insert(l.id);
      devices += l.count;
      return;
    }
    if (auto it = live_by_guest.find(guest);
        it != live_by_guest.end() && it->second.erase(l.id) && it->second.empty()) {
      live_by_guest.erase(it);
    }
    devices -= std::min<std::uint64_t>(devices, l.count);
    if (devices == 0) live_devices_of_tenant.erase(l.tenant);
  }

  // The live leases of (tenant, guest), by id; empty when it has none.
  const std::set<LeaseId>& live_of_guest(const std::string& tenant, const std::string& guest) const {
    static const std::set<LeaseId> none;
    auto it = live_by_guest.find({tenant, guest});
    return it == live_by_guest.end() ? none : it->second;
  }
  // The ids of the only live leases `f` can match when it names one guest (as owner, or tenant and guest); null
  // when it may match any.
  const std::set<LeaseId>* own_leases(const LeaseFilter& f) const;
  std::map<LeaseId, Lease> ended;   // a window of the most recently ended leases; the store holds them all
  std::deque<LeaseId> ended_order;  // the ids in `ended`, oldest end first
  std::set<std::pair<double, LeaseId>> expiries;
  std::set<std::pair<double, LeaseId>> deadlines;
  std::map<std::string, double> drain_deadlines;     // device -> when the lease still on it is revoked
  std::set<std::string> draining_hosts;              // devices these hosts register later join draining
  double next_prune = 0;                             // when tick() next deletes old ended leases from the store
  std::unordered_map<LeaseId, std::uint64_t> epoch;  // bumps on every grant: stale completions are ignored
  std::unordered_map<LeaseId, std::size_t> pending_prepare;
  std::deque<Sample> samples;
  Counters counters;
  LeaseId last_id = 0;
  double last_now = 0;

  std::set<LeaseId> dirty_leases;
  // Records of `devices` changed since the last commit, in scheduler id order (the store's key: new devices are
  // written at the end of its table).
  std::map<sched::DeviceId, const DeviceRecord*> dirty_devices;
  Batch batch;  // tenants and meta; leases and devices are copied from the dirty sets at flush
  std::vector<std::pair<Lease, LeaseEvent>> events;
  std::vector<std::string> rotated_tenants;  // tenants whose token changed, told to the listeners at the commit
  std::vector<CoreListener*> listeners;

  Impl(CoreOptions o, const Clock& c, Store& s) : options(std::move(o)), clock(c), store(s) {}

  double now() {
    last_now = std::max(last_now, clock.now());
    return last_now;
  }

  Lease* find_lease(LeaseId id) {
    auto it = live.find(id);
    return it == live.end() ? nullptr : &it->second;
  }
  const Lease* find_any(LeaseId id) const {
    if (auto it = live.find(id); it != live.end()) return &it->second;
    if (auto it = ended.find(id); it != ended.end()) return &it->second;
    return nullptr;
  }
  DeviceRecord* device_by_sched(sched::DeviceId id) {
    auto it = by_sched_id.find(id);
    return it == by_sched_id.end() ? nullptr : it->second;
  }

  // Adds a record of `devices` to its host's entry.
  void index_device(DeviceRecord& d) { host_table[d.host].devices[d.name] = &d; }

  // Whether the scheduler may grant the device: it is usable itself and its host is not lost.
  bool grantable(const DeviceRecord& d) const { return d.available && !lost_hosts.count(d.host); }

  // Calls f(DeviceRecord&) for every device of `host` (none for an unknown host), counting the visits.
  template <class F>
  void each_device_of(const std::string& host, F&& f) {
    auto it = host_table.find(host);
    if (it == host_table.end()) return;
    for (auto& [_, d] : it->second.devices) {
      ++device_visits;
      f(*d);
    }
  }

  // --- durability -----------------------------------------------------------------------------------------
  void touch(const Lease& l) { dirty_leases.insert(l.id); }
  void touch(const DeviceRecord& d) { dirty_devices.emplace(d.sched_id, &d); }  // d: a record of `devices`
  void emit(const Lease& l, LeaseEvent e) { events.emplace_back(l, e); }
  // A tenant created or changed since the last commit: an upsert (it undoes a delete pending in the batch).
  void write_tenant(const TenantRecord& t) {
    std::erase(batch.deleted_tenants, t.name);
    batch.tenants.push_back(t);
  }

  bool group_commit = false;

  void flush() {
    if (!group_commit) commit({});
  }

  bool uncommitted() const {
    return !dirty_leases.empty() || !dirty_devices.empty() || !batch.empty() || !events.empty() ||
           !rotated_tenants.empty();
  }

  // Every pending change as one commit; none is pending afterwards.
  PoolCore::Commit take_commit() {
    if (tracking_touched) record_touched();
    for (LeaseId id : dirty_leases) {
      if (const Lease* l = find_any(id)) batch.leases.push_back(*l);
    }
    batch.devices.reserve(batch.devices.size() + dirty_devices.size());
    for (const auto& [_, d] : dirty_devices) {
      // Slots are derived from their host's report at each attach: only whole devices are stored.
      if (d->parent.empty()) batch.devices.push_back(*d);
    }
    dirty_leases.clear();
    dirty_devices.clear();
    return {std::exchange(batch, Batch{}), std::exchange(events, {}), std::exchange(rotated_tenants, {})};
  }

  // After `c` is durable: memory may forget what the store now holds, and the listeners hear the events.
  void finish_commit(PoolCore::Commit c) {
    trim_ended();
    for (const auto& [lease, event] : c.events) {
      for (auto* l : listeners) l->lease_event(lease, event);
    }
    for (const auto& tenant : c.rotated_tenants) {
      for (auto* l : listeners) l->tenant_token_changed(tenant);
    }
  }

  // Writes every pending change, then tells the listeners. A store that cannot write leaves the manager unable
  // to keep its promise of durability: it stops, and a restart resumes from the store.
  void commit(const std::function<void()>& after_write) {
    PoolCore::Commit c = take_commit();
    if (!c.batch.empty()) {
      Status s = store.apply(c.batch);
      if (!s) PoolCore::fail_store(s.error());
    }
    if (after_write) after_write();
    finish_commit(std::move(c));
  }

  bool tracking_touched = false;
  PoolCore::Touched touched;
  void record_touched() {
    touched.leases.insert(dirty_leases.begin(), dirty_leases.end());
    for (const auto& [_, d] : dirty_devices) touched.devices.insert(d->name);
    for (const auto& [key, _] : batch.meta) {
      for (std::string_view prefix : {"host_lost:", "host_draining:"}) {
        if (key.starts_with(prefix)) touched.hosts.insert(key.substr(prefix.size()));
      }
    }
  }

  // Keeps the `history` most recently ended leases in memory. Only after a commit: an ended lease's last change
  // must reach the store before memory may forget it, so one changed since the last take_commit stays.
  void trim_ended() {
    while (ended_order.size() > options.history && !dirty_leases.contains(ended_order.front())) {
      ended.erase(ended_order.front());
      ended_order.pop_front();
    }
  }

  // --- host calls ---------------------------------------------------------------------------------------------
  void host_call(const std::string& host, std::function<void(HostDriver&)> fn) {
    auto it = hosts.find(host);
    if (it == hosts.end()) {
      deferred[host].push_back(std::move(fn));
    } else {
      fn(*it->second);
    }
  }

  void release_devices(const Lease& l) {
    for (const auto& name : l.devices) {
      holder.erase(name);
      auto& d = devices.at(name);
      if (lost_hosts.count(d.host)) continue;  // the host is gone; it reconciles when it comes back
      host_call(d.host, [this, name, local = d.local_id](HostDriver& h) {
        h.release(local, [this, name](Status s, std::string loaded) { on_device_reset(name, s, std::move(loaded)); });
      });
    }
  }

  void on_device_reset(const std::string& name, const Status& s, std::string loaded) {
    auto it = devices.find(name);
    if (it == devices.end()) return;
    auto& d = it->second;
    double t = now();
    sched::Decisions out;
    if (!s) {
      log::warn("device failed to reset", {{"device", name}, {"error", s.error().message}});
      d.available = false;
      (void)scheduler->set_available(d.sched_id, false, t, out);
      touch(d);
    } else if (loaded != d.loaded) {
      d.loaded = loaded;
      (void)scheduler->set_loaded(d.sched_id, loaded.empty() ? sched::kNoBitstream : bitstreams.intern(loaded));
      touch(d);
    }  // else the record is as stored: nothing to write
    apply(out, t);
    flush();
  }

  void prepare_devices(Lease& l) {
    std::uint64_t ep = epoch[l.id];
    pending_prepare[l.id] = l.devices.size();
    l.grants.assign(l.devices.size(), host::PrepareResult{});
    for (const auto& name : l.devices) {
      auto& d = devices.at(name);
      bool reprogram = !l.bitstream.empty() && d.loaded != l.bitstream;
      if (reprogram)
        log::info("device reprogrammed", {{"device", name}, {"from", d.loaded}, {"to", l.bitstream}, {"lease", l.id}});
      host::PrepareRequest request;
      request.device = d.local_id;
      request.lease = std::to_string(l.id);
      request.vm = l.guest;
      request.bitstream = l.bitstream;
      if (!l.bitstream.empty() && options.image_sha256) request.sha256 = options.image_sha256(l.bitstream);
      request.reprogram = reprogram;
      host_call(d.host, [this, id = l.id, ep, name, request = std::move(request)](HostDriver& h) {
        h.prepare(request, [this, id, ep, name](Status s, host::PrepareResult result) {
          on_prepared(id, ep, name, s, std::move(result));
        });
      });
    }
  }

  void on_prepared(LeaseId id, std::uint64_t ep, const std::string& name, const Status& s, host::PrepareResult result) {
    const std::string& loaded = result.loaded;
    double t = now();
    sched::Decisions out;
    auto dit = devices.find(name);
    if (dit != devices.end() && s && !loaded.empty() && loaded != dit->second.loaded) {
      dit->second.loaded = loaded;
      (void)scheduler->set_loaded(dit->second.sched_id, bitstreams.intern(loaded));
      touch(dit->second);
    }
    Lease* l = find_lease(id);
    bool current = l && epoch[id] == ep && (l->state == LeaseState::granted || l->state == LeaseState::revoking);
    const Errc code = s ? Errc::internal : s.error().code;
    if (!s && (code == Errc::checksum_mismatch || code == Errc::corrupt_image || code == Errc::missing_file ||
               code == Errc::incompatible)) {
      // The image is at fault, not the device: it was not touched and stays usable; the lease ends, saying why.
      log::warn("device not programmed", {{"device", name}, {"lease", id}, {"error", s.error().message}});
      if (current) end_lease(*l, LeaseState::revoked, "bitstream " + l->bitstream + ": " + s.error().message, t);
    } else if (!s) {
      log::warn("device failed to prepare", {{"device", name}, {"lease", id}, {"error", s.error().message}});
      if (dit != devices.end()) {
        dit->second.available = false;
        touch(dit->second);
        // The scheduler preempts the lease holding it (device_failed); apply() requeues that lease.
        (void)scheduler->set_available(dit->second.sched_id, false, t, out);
      }
    } else if (current) {
      auto i = static_cast<std::size_t>(std::find(l->devices.begin(), l->devices.end(), name) - l->devices.begin());
      if (i < l->grants.size()) l->grants[i] = std::move(result);
      if (--pending_prepare[id] == 0) {
        pending_prepare.erase(id);
        l->ready = true;
        touch(*l);
        emit(*l, LeaseEvent::granted);
      }
    }
    apply(out, t);
    flush();
  }

  // --- lease transitions --------------------------------------------------------------------------------------
  void set_expiry(Lease& l, double at) {
    expiries.erase({l.expires_at, l.id});
    l.expires_at = at;
    expiries.insert({at, l.id});
  }
  void clear_deadline(Lease& l) {
    deadlines.erase({l.revoke_deadline, l.id});
    l.revoke_deadline = 0;
    l.requeue_on_deadline = false;
  }

  // Puts a granted lease into its grace period; at the deadline it ends revoked with `reason`.
  void begin_revoke(Lease& l, const std::string& reason, double t) {
    clear_deadline(l);
    l.state = LeaseState::revoking;
    l.revoke_deadline = t + options.revoke_grace_s;
    l.end_reason = reason;
    deadlines.insert({l.revoke_deadline, l.id});
    touch(l);
    emit(l, LeaseEvent::revoking);
  }

  // --- draining -----------------------------------------------------------------------------------------------
  static std::string drain_deadline_key(const std::string& device) { return "drain_deadline:" + device; }
  static std::string host_draining_key(const std::string& host) { return "host_draining:" + host; }
  static std::string host_lost_key(const std::string& host) { return "host_lost:" + host; }
  static std::string slots_key(const std::string& device) { return "slots:" + device; }

  // Drains or undrains one device. `deadline_at`: when a lease still on it is revoked (draining only).
  Status drain(DeviceRecord& d, bool draining, std::optional<double> deadline_at, double t, sched::Decisions& out) {
    if (auto r = scheduler->set_draining(d.sched_id, draining, t, out))
      return make_error(Errc::invalid_state, r->error);
    d.draining = draining;
    touch(d);
    bool had_deadline = drain_deadlines.erase(d.name) > 0;
    if (draining && deadline_at) {
      drain_deadlines[d.name] = *deadline_at;
      batch.meta.emplace_back(drain_deadline_key(d.name), std::to_string(*deadline_at));
    } else if (had_deadline) {
      batch.meta.emplace_back(drain_deadline_key(d.name), "");
    }
    return Status::ok();
  }

  // Revokes the leases on drained devices whose deadline has come.
  void enforce_drain_deadlines(double t) {
    for (auto it = drain_deadlines.begin(); it != drain_deadlines.end();) {
      if (it->second > t) {
        ++it;
        continue;
      }
      const std::string device = it->first;
      batch.meta.emplace_back(drain_deadline_key(device), "");
      it = drain_deadlines.erase(it);
      auto h = holder.find(device);
      if (h == holder.end()) continue;
      Lease* l = find_lease(h->second);
      if (l && l->state == LeaseState::granted) begin_revoke(*l, "device " + device + " was drained", t);
    }
  }

  void apply(sched::Decisions& d, double t) {
    // Decisions can cascade (a requeue frees devices that serve others): loop until quiet.
    while (!d.empty()) {
      sched::Decisions next;
      std::vector<LeaseId> unclaimed;
      for (const auto& g : d.grants) {
        if (!on_grant(g, t)) unclaimed.push_back(g.request);
      }
      for (const auto& p : d.preemptions) on_preempt(p, t, next);
      // A request whose guest stopped heartbeating is not served: it ends, and its devices go to the next one.
      for (LeaseId id : unclaimed) {
        if (Lease* l = find_lease(id)) end_lease(*l, LeaseState::expired, kNoHeartbeat, t);
      }
      d = std::move(next);
    }
  }

  // Records a grant. A grant does not renew the TTL (only heartbeats do): a request whose guest is gone keeps
  // the expiry of its last heartbeat. Returns false, without preparing the devices, when that expiry has passed.
  bool on_grant(const sched::Grant& g, double t) {
    Lease* l = find_lease(g.request);
    if (!l) {
      log::error("fatal: the scheduler granted an unknown request", {{"request", g.request}});
      log::flush();
      std::abort();
    }
    l->state = LeaseState::granted;
    l->granted_at = t;
    if (l->first_granted_at == 0) l->first_granted_at = t;
    l->ready = false;
    l->devices.clear();
    for (const auto& dg : g.devices) {
      DeviceRecord* d = device_by_sched(dg.device);
      if (!d) {
        log::error("fatal: the scheduler granted an unknown device", {{"device", dg.device}});
        log::flush();
        std::abort();
      }
      l->devices.push_back(d->name);
      holder[d->name] = l->id;
      if (dg.reprogram) {
        ++l->reprogrammed;
        ++counters.reprogrammings;
      }
    }
    ++counters.grants;
    ++epoch[l->id];
    touch(*l);
    if (l->expires_at <= t) return false;
    prepare_devices(*l);
    // Record what the devices will hold once programmed, as the scheduler does.
    for (const auto& name : l->devices) {
      auto& d = devices.at(name);
      if (!l->bitstream.empty() && d.loaded != l->bitstream) {
        d.loaded = l->bitstream;
        touch(d);
      }
    }
    return true;
  }

  void on_preempt(const sched::Preemption& p, double t, sched::Decisions& out) {
    Lease* l = find_lease(p.request);
    if (!l) return;
    ++counters.preemptions;
    ++l->preemptions;
    if (p.reason == sched::PreemptReason::device_failed) {
      requeue(*l, t, out);
      return;
    }
    l->state = LeaseState::revoking;
    clear_deadline(*l);
    l->revoke_deadline = t + options.revoke_grace_s;
    l->requeue_on_deadline = true;
    deadlines.insert({l->revoke_deadline, l->id});
    touch(*l);
    emit(*l, LeaseEvent::revoking);
  }

  void requeue(Lease& l, double t, sched::Decisions& out) {
    if (auto r = scheduler->requeue(l.id, t, out)) {
      log::warn("requeue refused by the scheduler", {{"lease", l.id}, {"error", r->error}});
    }
    release_devices(l);
    clear_deadline(l);
    pending_prepare.erase(l.id);
    ++epoch[l.id];
    l.state = LeaseState::queued;
    l.devices.clear();
    l.grants.clear();
    l.ready = false;
    touch(l);
    emit(l, LeaseEvent::requeued);
  }

  void end_lease(Lease& l, LeaseState state, const std::string& reason, double t) {
    sched::Decisions out;
    if (auto r = scheduler->release(l.id, t, out)) {
      log::warn("release refused by the scheduler", {{"lease", l.id}, {"error", r->error}});
    }
    if (l.state == LeaseState::granted || l.state == LeaseState::revoking) keep_learned(l);
    if (l.state == LeaseState::granted || l.state == LeaseState::revoking) release_devices(l);
    expiries.erase({l.expires_at, l.id});
    clear_deadline(l);
    pending_prepare.erase(l.id);
    epoch.erase(l.id);
    l.state = state;
    l.ended_at = t;
    l.end_reason = reason;
    l.ready = false;
    if (state == LeaseState::released && l.first_granted_at > 0) {
      samples.push_back({l.tenant, l.bitstream, t, t - l.created_at, l.first_granted_at - l.created_at});
      while (samples.size() > options.history) samples.pop_front();
    }
    if (state == LeaseState::expired) ++counters.expirations;
    LeaseId id = l.id;
    index_live(l, false);
    Lease& e = ended[id] = std::move(l);
    ended_order.push_back(id);
    live.erase(id);
    touch(e);
    emit(e, LeaseEvent::ended);
    apply(out, t);
  }

  // The live lease `id` if `caller` owns it. Leases of others look like no lease at all: ids leak nothing.
  Result<Lease*> owned(const Caller& caller, LeaseId id) {
    Lease* l = find_lease(id);
    if (!l) {
      if (const Lease* e = find_any(id); e && caller.owns(*e)) {
        return make_error(Errc::invalid_state, "lease " + std::to_string(id) + " has already ended (" +
                                                   std::string(to_string(e->state)) + ")");
      }
      return make_error(Errc::not_found, "no lease " + std::to_string(id));
    }
    if (!caller.owns(*l)) return make_error(Errc::not_found, "no lease " + std::to_string(id));
    return l;
  }

  // --- learned run times -------------------------------------------------------------------------------------
  // A running lease ended: the scheduler learned from it. Its group and its kind's go to the store.
  void keep_learned(const Lease& l) {
    const sched::Request r = request_of(l);
    for (const auto& key : {sched::GroupKey::of(r), sched::GroupKey::whole_kind(r.kind)}) {
      if (const auto* h = scheduler->estimator().group(key)) batch.estimates.push_back(estimate_record(key, *h));
    }
  }

  EstimateRecord estimate_record(const sched::GroupKey& key, const sched::RuntimeHistogram& h) const {
    EstimateRecord e;
    e.kind = kinds.name(key.kind);
    e.whole_kind = key == sched::GroupKey::whole_kind(key.kind);
    if (!e.whole_kind) {
      e.tenant = tenant_ids.name(key.tenant);
      e.bitstream = key.bitstream == sched::kNoBitstream ? "" : bitstreams.name(key.bitstream);
      e.count = key.count;
      e.label = key.label == sched::kNoLabel ? "" : labels.name(key.label);
    }
    e.observations = h.observations();
    e.weights.assign(h.weights().begin(), h.weights().end());
    e.sums.assign(h.sums().begin(), h.sums().end());
    return e;
  }

  // The stored groups become the scheduler's estimator. Errors: "corrupt" naming the bad group.
  Status restore_learned(const std::vector<EstimateRecord>& records) {
    sched::EstimatorState state;
    state.options = scheduler->estimator().options();
    for (const auto& e : records) {
      sched::GroupKey key = sched::GroupKey::whole_kind(kinds.intern(e.kind));
      if (!e.whole_kind) {
        key.tenant = tenant_ids.intern(e.tenant);
        key.bitstream = e.bitstream.empty() ? sched::kNoBitstream : bitstreams.intern(e.bitstream);
        key.count = e.count;
        key.label = e.label.empty() ? sched::kNoLabel : labels.intern(e.label);
        if (!e.label.empty()) labels_of_tenant[e.tenant].insert(e.label);
      }
      state.groups.push_back({key, e.observations, e.weights, e.sums});
    }
    std::string error;
    auto estimator = sched::RuntimeEstimator::from_state(state, &error);
    if (!estimator) return make_error(Errc::corrupt, "learned run times: " + error);
    scheduler->set_estimator(std::move(*estimator));
    return Status::ok();
  }

  // --- restore ----------------------------------------------------------------------------------------------
  // The device models of `kind` (interned; grows with the kinds).
  sched::NameTable& models_of_kind(sched::KindId kind) {
    if (kind >= models.size()) models.resize(std::size_t{kind} + 1);
    return models[kind];
  }

  // What a lease's bitstream fits, as the registry says: its compatible list (nullopt: any model will do) and,
  // for a partial image, its slot shape ("": any slot).
  struct ImageFit {
    std::optional<std::vector<std::string>> compatible;
    std::string slot_shape;
    // The compatible list as messages show it ("u250, u280*"); "any" when there is none.
    std::string models_text() const {
      if (!compatible) return "any";
      std::string text;
      for (const auto& c : *compatible) text += (text.empty() ? "" : ", ") + c;
      return text;
    }
  };
  ImageFit fit_of(const std::string& bitstream) const {
    if (bitstream.empty()) return {};
    return {options.image_models ? options.image_models(bitstream) : std::nullopt,
            options.image_slot_shape ? options.image_slot_shape(bitstream) : std::string()};
  }

  // The scheduler's model of a device: its model, and a slot's shape after a '\0' (a shape never holds one), so
  // that a partial image is placed only on slots of its shape while its compatible list still applies to the model.
  static std::string sched_model_name(const DeviceRecord& d) {
    return d.slot_shape.empty() ? d.model : d.model + '\0' + d.slot_shape;
  }
  // The device model and slot shape ("" for none) that a sched_model_name names.
  static std::pair<std::string_view, std::string_view> model_and_shape(std::string_view name) {
    const auto at = name.rfind('\0');
    if (at == std::string_view::npos) return {name, {}};
    return {name.substr(0, at), name.substr(at + 1)};
  }
  // A sched_model_name as messages show it: "model" or "model (slot shape 'cu2')".
  static std::string describe_model(std::string_view name) {
    const auto [model, shape] = model_and_shape(name);
    return "'" + std::string(model) + "'" + (shape.empty() ? "" : " (slot shape '" + std::string(shape) + "')");
  }

  // The models of `kind` that `fit` fits: those its compatible list matches (a device that reports no model is
  // restricted by nothing here; its host checks the image when it programs it) and, for an image with a slot
  // shape, only slots of that shape or of none.
  sched::ModelSet fitting_models(sched::KindId kind, const ImageFit& fit) {
    if (!fit.compatible && fit.slot_shape.empty()) return sched::kAnyModel;
    const sched::NameTable& table = models_of_kind(kind);
    sched::ModelSet set = 0;
    for (std::uint32_t m = 0; m < table.size() && m < sched::kMaxModelsPerKind; ++m) {
      const auto [model, shape] = model_and_shape(table.name(m));
      const bool model_fits = !fit.compatible || model.empty() || bitstreams::model_matches(*fit.compatible, model);
      const bool shape_fits = fit.slot_shape.empty() || shape.empty() || shape == fit.slot_shape;
      if (model_fits && shape_fits) set |= sched::ModelSet{1} << m;
    }
    return set;
  }

  // A device of a model its kind did not have joined: the waiting and running leases of that kind whose
  // bitstream fits it may now use it too.
  void widen_models(sched::KindId kind, double t, sched::Decisions& out) {
    for (const auto& [id, l] : live) {
      if (l.bitstream.empty() || kinds.find(l.kind) != kind) continue;
      (void)scheduler->set_models(id, fitting_models(kind, fit_of(l.bitstream)), t, out);
    }
  }

  // The scheduler's request for a lease; `models`: the device models it fits (fitting_models), computed here
  // when not given.
  sched::Request request_of(const Lease& l, std::optional<sched::ModelSet> models = std::nullopt) {
    sched::Request r;
    r.id = l.id;
    r.tenant = tenant_ids.intern(l.tenant);
    r.kind = kinds.intern(l.kind);
    r.models = models ? *models : fitting_models(r.kind, fit_of(l.bitstream));
    r.bitstream = l.bitstream.empty() ? sched::kNoBitstream : bitstreams.intern(l.bitstream);
    r.count = l.count;
    r.guest_host = host_ids.intern(l.guest_host);
    r.estimate_s = l.estimate_s;
    if (!l.label.empty()) {
      r.label = labels.intern(l.label);
      labels_of_tenant[l.tenant].insert(l.label);
    }
    r.arrival = l.created_at;
    r.demand = l.bitstream.empty() || !options.image_demand ? 0.0 : options.image_demand(l.bitstream);
    return r;
  }

  sched::Device sched_device(const DeviceRecord& d) {
    sched::Device sd;
    sd.id = d.sched_id;
    sd.host = host_ids.intern(d.host);
    sd.kind = kinds.intern(d.kind);
    sd.model = static_cast<sched::ModelId>(
        std::min<std::uint32_t>(models_of_kind(sd.kind).intern(sched_model_name(d)), sched::kMaxModelsPerKind));
    sd.attach = d.passthrough ? sched::AttachMode::passthrough : sched::AttachMode::network;
    sd.loaded = d.loaded.empty() ? sched::kNoBitstream : bitstreams.intern(d.loaded);
    return sd;
  }

  // Registers the first `count` slots of `parent` that the pool does not know yet, each a device of its own named
  // "<parent>:slot<N>" (slot_local_id) of kind slot_kind(parent's kind), the parent's model and shape `shapes[N]`
  // (none when `shapes` is empty; the caller checked its length). A known slot whose shape changed gets its new
  // shape (a lease holding it keeps it). Slot records are kept out of the host table: host operations reach them
  // through their device (the scheduler stops granting the slots of a device out of service, and preempts their
  // leases). The store keeps no slot record, only each device's slot count and shapes (meta slots:<device>,
  // slots_meta), so that a restart knows them before their host is back.
  Status add_slots(const DeviceRecord& parent, std::uint32_t count, const std::vector<std::string>& shapes, double t,
                   sched::Decisions& out) {
    bool changed = false;
    for (std::uint32_t n = 0; n < count; ++n) {
      const std::string local = slot_local_id(parent.local_id, n);
      const std::string name = parent.host + "/" + local;
      const std::string shape = shapes.empty() ? std::string() : shapes[n];
      if (auto known = devices.find(name); known != devices.end()) {
        if (known->second.slot_shape != shape) {
          known->second.slot_shape = shape;
          if (auto s = refit_slot(known->second, t, out); !s) return s;
          changed = true;
        }
        continue;
      }
      DeviceRecord slot;
      slot.name = name;
      slot.host = parent.host;
      slot.local_id = local;
      slot.kind = slot_kind(parent.kind);
      slot.model = parent.model;
      slot.slot_shape = shape;
      slot.passthrough = parent.passthrough;
      slot.parent = parent.name;
      slot.sched_id = next_sched_id++;
      auto& rec = devices[name] = std::move(slot);
      by_sched_id[rec.sched_id] = &rec;
      const sched::KindId kind = kinds.intern(rec.kind);
      const bool new_model = !models_of_kind(kind).find(sched_model_name(rec));
      if (auto r = scheduler->add_slot(sched_device(rec), parent.sched_id, t, out)) {
        return make_error(Errc::invalid_argument, "slot " + name + ": " + r->error);
      }
      if (new_model) widen_models(kind, t, out);
    }
    if (auto& stored = stored_slots[parent.name]; count > stored || changed) {
      stored = std::max(count, stored);
      batch.meta.emplace_back(slots_key(parent.name), slots_meta(parent));
    }
    return Status::ok();
  }

  // A known slot's shape changed: the scheduler places by its new model from now on.
  Status refit_slot(const DeviceRecord& slot, double t, sched::Decisions& out) {
    const bool new_model = !models_of_kind(kinds.intern(slot.kind)).find(sched_model_name(slot));
    const sched::Device sd = sched_device(slot);
    if (auto r = scheduler->set_model(slot.sched_id, sd.model, t, out)) {
      return make_error(Errc::invalid_argument, "slot " + slot.name + ": " + r->error);
    }
    if (new_model) widen_models(sd.kind, t, out);
    return Status::ok();
  }

  // The meta slots:<device> value: the device's slot count, then, when some slot has a shape, a space and every
  // slot's shape in slot order, comma-separated ("3" or "3 cu2,cu1,cu1"; restore_slots reads both).
  std::string slots_meta(const DeviceRecord& parent) const {
    const std::uint32_t count = stored_slots.at(parent.name);
    std::string shapes;
    bool any_shape = false;
    for (std::uint32_t n = 0; n < count; ++n) {
      const auto slot = devices.find(parent.host + "/" + slot_local_id(parent.local_id, n));
      const std::string& shape = slot == devices.end() ? std::string() : slot->second.slot_shape;
      any_shape = any_shape || !shape.empty();
      shapes += (n == 0 ? "" : ",") + shape;
    }
    return std::to_string(count) + (any_shape ? " " + shapes : "");
  }

  // The slots the store knows each device had (meta slots:<device>, slots_meta), made again with their shapes
  // before any lease is restored, so that a lease holding a slot, or waiting for one, outlives a restart.
  Status restore_slots(const std::map<std::string, std::string>& meta, double t, sched::Decisions& out) {
    for (auto it = meta.lower_bound("slots:"); it != meta.end() && it->first.starts_with("slots:"); ++it) {
      if (it->second.empty()) continue;
      const std::string device = it->first.substr(6);
      char* end = nullptr;
      const unsigned long count = std::strtoul(it->second.c_str(), &end, 10);
      std::vector<std::string> shapes;
      if (*end == ' ') {
        shapes = split_slot_shapes(end + 1);
        end += std::strlen(end);
      }
      auto parent = devices.find(device);
      if (*end != '\0' || count > kMaxSlotsPerDevice || parent == devices.end() || !parent->second.parent.empty() ||
          (!shapes.empty() && shapes.size() != count)) {
        return make_error(Errc::corrupt, "meta " + it->first + " = '" + it->second +
                                             "': not a slot count (and shapes) of a stored device");
      }
      stored_slots[device] = static_cast<std::uint32_t>(count);
      if (auto s = add_slots(parent->second, static_cast<std::uint32_t>(count), shapes, t, out); !s) return s;
    }
    return Status::ok();
  }

  Status restore(Snapshot snap) {
    double t = now();
    if (auto s = restore_learned(snap.estimates); !s) return s;
    for (auto& tr : snap.tenants) {
      tenant_by_hash[tr.token_hash] = tr.name;
      scheduler->set_tenant_weight(tenant_ids.intern(tr.name), tr.weight);
      tenants[tr.name] = tr;
    }
    admin_tokens = AdminTokens(snap.meta);
    for (auto& d : snap.devices) {
      next_sched_id = std::max(next_sched_id, d.sched_id + 1);
      auto [at, added] = devices.try_emplace(d.name);
      if (!added) return make_error(Errc::corrupt, "device " + d.name + " is stored twice");
      DeviceRecord& rec = at->second;
      rec = std::move(d);  // its name was copied into the key first
      by_sched_id[rec.sched_id] = &rec;
      index_device(rec);
    }
    last_id = snap.max_lease_id;

    std::vector<Lease*> running, waiting;
    std::vector<std::pair<double, LeaseId>> ends;
    for (auto& l : snap.leases) {
      LeaseId id = l.id;
      if (is_terminal(l.state)) {
        if (l.state == LeaseState::released && l.first_granted_at > 0) {
          samples.push_back(
              {l.tenant, l.bitstream, l.ended_at, l.ended_at - l.created_at, l.first_granted_at - l.created_at});
        }
        ends.emplace_back(l.ended_at, id);
        ended[id] = std::move(l);
      } else {
        live[id] = std::move(l);
        Lease& ll = live[id];
        index_live(ll, true);
        (ll.state == LeaseState::queued ? waiting : running).push_back(&ll);
      }
    }
    std::sort(ends.begin(), ends.end());
    for (const auto& [_, id] : ends) ended_order.push_back(id);
    std::sort(running.begin(), running.end(), [](const Lease* a, const Lease* b) {
      return std::tie(a->granted_at, a->id) < std::tie(b->granted_at, b->id);
    });
    std::sort(waiting.begin(), waiting.end(), [](const Lease* a, const Lease* b) {
      return std::tie(a->created_at, a->id) < std::tie(b->created_at, b->id);
    });

    // Every device, then each running lease on exactly its devices, then the queue. A lease whose devices are
    // gone or claimed twice cannot be restored: it ends below.
    sched::Decisions out;
    for (auto& [name, d] : devices) {
      if (auto r = scheduler->add_device(sched_device(d), t, out)) {
        return make_error(Errc::corrupt, "device " + name + ": " + r->error);
      }
    }
    if (auto st = restore_slots(snap.meta, t, out); !st) return st;
    std::vector<Lease*> orphans;
    for (Lease* l : running) {
      std::vector<sched::DeviceId> ids;
      for (const auto& name : l->devices) {
        if (auto it = devices.find(name); it != devices.end()) ids.push_back(it->second.sched_id);
      }
      // A lease that ran keeps its devices even if its bitstream's compatible list changed since: restored on
      // any model, then it goes by the list if it waits again.
      sched::Request r = request_of(*l);
      const sched::ModelSet fits = r.models;
      r.models = sched::kAnyModel;
      if (ids.size() != l->devices.size() || scheduler->restore(r, ids, l->granted_at)) {
        orphans.push_back(l);
        continue;
      }
      (void)scheduler->set_models(l->id, fits, t, out);
      for (const auto& name : l->devices) holder[name] = l->id;
      epoch[l->id] = 1;
      l->expires_at = t + options.lease_ttl_s;
      expiries.insert({l->expires_at, l->id});
      if (l->state == LeaseState::revoking) {
        l->revoke_deadline = std::max(l->revoke_deadline, t + options.revoke_grace_s);
        deadlines.insert({l->revoke_deadline, l->id});
      }
      touch(*l);
      if (!l->ready) prepare_devices(*l);
    }
    for (const auto& [key, value] : snap.meta) {
      if (value.empty()) continue;
      if (key.starts_with("host_draining:")) draining_hosts.insert(key.substr(14));
      if (key.starts_with("host_lost:")) lost_hosts.insert(key.substr(10));
      if (key.starts_with("drain_deadline:") && devices.count(key.substr(15))) {
        drain_deadlines[key.substr(15)] = std::strtod(value.c_str(), nullptr);
      }
    }
    for (auto& [name, d] : devices) {
      if (!d.parent.empty()) continue;  // a slot goes with its device
      if (d.draining) (void)scheduler->set_draining(d.sched_id, true, t, out);
      if (!grantable(d)) (void)scheduler->set_available(d.sched_id, false, t, out);
    }
    for (Lease* l : waiting) {
      l->expires_at = t + options.lease_ttl_s;
      expiries.insert({l->expires_at, l->id});
      touch(*l);
      if (auto r = scheduler->submit(request_of(*l), t, out)) {
        // The pool no longer has devices for it.
        end_lease(*l, LeaseState::revoked, "restore: " + r->error, t);
      }
    }
    for (Lease* l : orphans) {
      l->state = LeaseState::queued;  // it holds nothing the scheduler knows of
      end_lease(*l, LeaseState::revoked, "restore: its devices are gone", t);
    }
    apply(out, t);
    flush();
    return Status::ok();
  }
};

// --- PoolCore ----------------------------------------------------------------------------------------------------

PoolCore::PoolCore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PoolCore::~PoolCore() = default;

Result<std::unique_ptr<PoolCore>> PoolCore::create(CoreOptions options, const Clock& clock, Store& store) {
  if (!(options.lease_ttl_s > 0) || !(options.revoke_grace_s >= 0)) {
    return make_error(Errc::invalid_config, "lease TTL must be > 0 and revocation grace >= 0");
  }
  auto snap = store.load(options.history);
  if (!snap) return snap.error();
  std::string spec_text = options.policy;
  // A policy set at runtime survives restarts unless the configured one changed since.
  auto& meta = snap->meta;
  if (auto it = meta.find("policy"); it != meta.end() && meta["policy_config"] == options.policy)
    spec_text = it->second;
  std::string error;
  auto spec = sched::PolicySpec::parse(spec_text, &error);
  if (!spec) return make_error(Errc::invalid_config, "policy '" + spec_text + "': " + error);
  auto scheduler = sched::Scheduler::create(*spec, &error);
  if (!scheduler) return make_error(Errc::invalid_config, "policy '" + spec_text + "': " + error);
  auto impl = std::make_unique<Impl>(options, clock, store);
  impl->scheduler = std::move(scheduler);
  impl->policy_text = spec->to_string();
  impl->batch.meta.emplace_back("policy_config", options.policy);
  impl->batch.meta.emplace_back("policy", impl->policy_text);
  if (auto s = impl->restore(std::move(*snap)); !s) return s.error();
  return std::unique_ptr<PoolCore>(new PoolCore(std::move(impl)));
}

void PoolCore::add_listener(CoreListener* listener) { impl_->listeners.push_back(listener); }

Status PoolCore::attach_host(std::unique_ptr<HostDriver> host, const HostReport& report) {
  auto& m = *impl_;
  std::string name = host->name();
  if (!valid_name(name, 64)) return make_error(Errc::invalid_argument, "host name '" + name + "' is not valid");
  const bool attached_before = m.hosts.count(name) > 0;
  const bool was_lost = m.lost_hosts.count(name) > 0;  // lost here, or before a restart
  if (attached_before && !was_lost) return make_error(Errc::conflict, "host " + name + " is already attached");
  auto found = host->devices();
  if (!found) return found.error();
  // Every name is checked before anything changes.
  std::unordered_set<std::string_view> reported;  // local ids
  reported.reserve(found->size());
  for (const auto& hd : *found) {
    if (!valid_name(hd.local_id, 128) || !valid_name(hd.kind, 64)) {
      return make_error(Errc::invalid_argument, "host " + name + " reports device '" + hd.local_id + "' of kind '" +
                                                    hd.kind + "' with characters outside [A-Za-z0-9._:-]");
    }
    if (!reported.insert(hd.local_id).second)
      return make_error(Errc::invalid_argument, "host " + name + " reports device '" + hd.local_id + "' twice");
    if (hd.model.find('\0') != std::string::npos) {  // the scheduler's model names end at one (sched_model_name)
      return make_error(Errc::invalid_argument, "host " + name + " reports device '" + hd.local_id +
                                                    "' with a model that holds a NUL character");
    }
    if (hd.slots > kMaxSlotsPerDevice) {
      return make_error(Errc::invalid_argument, "host " + name + " declares " + std::to_string(hd.slots) +
                                                    " slots on device '" + hd.local_id + "' (at most " +
                                                    std::to_string(kMaxSlotsPerDevice) + ")");
    }
    if (!hd.slot_shapes.empty() && hd.slot_shapes.size() != hd.slots) {
      return make_error(Errc::invalid_argument, "host " + name + " reports " + std::to_string(hd.slot_shapes.size()) +
                                                    " slot shapes for device '" + hd.local_id + "', which has " +
                                                    std::to_string(hd.slots) + " slots: give one shape per slot");
    }
    for (const auto& shape : hd.slot_shapes) {
      if (!shape.empty() && !valid_slot_shape(shape)) {
        return make_error(Errc::invalid_argument, "host " + name + " reports slot shape '" + shape + "' for device '" +
                                                      hd.local_id + "': a shape is 1-64 characters of [A-Za-z0-9._:-]");
      }
    }
  }
  for (const auto& hd : *found) {
    for (std::uint32_t n = 0; n < hd.slots; ++n) {
      if (reported.count(slot_local_id(hd.local_id, n))) {
        return make_error(Errc::invalid_argument, "host " + name + " reports device '" + slot_local_id(hd.local_id, n) +
                                                      "', the name of a slot of device '" + hd.local_id + "'");
      }
    }
  }
  double t = m.now();
  sched::Decisions out;
  auto& entry = m.host_table[name];  // an attached host is listed even when it has no device
  const std::size_t known_before = entry.devices.size();
  std::size_t known_reported = 0;
  for (const auto& hd : *found) {
    std::string dev_name = name + "/" + hd.local_id;
    bool usable = !report.unusable.count(hd.local_id);
    ++m.device_visits;
    auto known = entry.devices.lower_bound(dev_name);  // the device, or where a new one goes
    if (known == entry.devices.end() || known->first != dev_name) {
      DeviceRecord d;
      d.name = dev_name;
      d.host = name;
      d.local_id = hd.local_id;
      d.kind = hd.kind;
      d.model = hd.model;
      d.passthrough = hd.passthrough;
      d.loaded = hd.loaded;
      d.sched_id = m.next_sched_id++;
      auto& rec = m.devices[dev_name] = std::move(d);
      m.by_sched_id[rec.sched_id] = &rec;
      entry.devices.emplace_hint(known, dev_name, &rec);
      const sched::KindId kind = m.kinds.intern(rec.kind);
      const bool new_model = !m.models_of_kind(kind).find(Impl::sched_model_name(rec));
      if (auto r = m.scheduler->add_device(m.sched_device(rec), t, out)) {
        return make_error(Errc::invalid_argument, "device " + dev_name + ": " + r->error);
      }
      if (new_model) m.widen_models(kind, t, out);
      if (!usable) {
        rec.available = false;
        (void)m.scheduler->set_available(rec.sched_id, false, t, out);
      }
      if (m.draining_hosts.count(name)) (void)m.drain(rec, true, std::nullopt, t, out);
      m.touch(rec);
      if (auto s = m.add_slots(rec, hd.slots, hd.slot_shapes, t, out); !s) return s;
    } else {
      // Only the device's own change is written; the host's return is one meta row below.
      ++known_reported;
      DeviceRecord& d = *known->second;
      // The slots' shapes first: the device may become grantable below.
      if (auto s = m.add_slots(d, hd.slots, hd.slot_shapes, t, out); !s) return s;
      if (m.grantable(d) != usable) (void)m.scheduler->set_available(d.sched_id, usable, t, out);
      if (d.available != usable) {
        d.available = usable;
        m.touch(d);
      }
    }
  }
  // Known devices the host no longer reports become unavailable; looked for only when some are missing.
  if (known_reported < known_before)
    m.each_device_of(name, [&](DeviceRecord& d) {
      if (!reported.count(d.local_id) && d.available) {
        if (!was_lost) (void)m.scheduler->set_available(d.sched_id, false, t, out);
        d.available = false;
        m.touch(d);
      }
    });
  if (!attached_before) m.host_order.push_back(name);
  if (was_lost) {
    m.lost_hosts.erase(name);
    m.batch.meta.emplace_back(Impl::host_lost_key(name), "");
  }
  HostDriver& h = *(m.hosts[name] = std::move(host));
  auto ops = std::move(m.deferred[name]);
  m.deferred.erase(name);
  for (auto& op : ops) op(h);
  // Reconcile: a device serving a guest that holds no live lease on it goes back to the pool through a release.
  for (const auto& [local, guest] : report.serving) {
    std::string dev_name = name + "/" + local;
    if (!reported.count(local) || report.unusable.count(local)) continue;
    if (auto hl = m.holder.find(dev_name); hl != m.holder.end()) {
      if (const Lease* l = m.find_lease(hl->second); l && l->guest == guest) continue;
    }
    log::warn("device serves a guest without a lease: releasing it",
              {{"host", name}, {"device", local}, {"guest", guest}});
    h.release(local,
              [&m, dev_name](Status s, std::string loaded) { m.on_device_reset(dev_name, s, std::move(loaded)); });
  }
  m.apply(out, t);
  m.flush();
  return Status::ok();
}

Status PoolCore::host_lost(const std::string& host) {
  auto& m = *impl_;
  if (!m.hosts.count(host)) return make_error(Errc::not_found, "no host " + host + " is attached");
  double t = m.now();
  sched::Decisions out;
  // The device records keep their own state; the scheduler stops granting them, preempting the leases holding
  // them (device_failed; apply() requeues those), and the loss is written once for the host.
  m.each_device_of(host, [&](DeviceRecord& d) {
    if (m.grantable(d)) (void)m.scheduler->set_available(d.sched_id, false, t, out);
  });
  if (m.lost_hosts.insert(host).second) m.batch.meta.emplace_back(Impl::host_lost_key(host), "1");
  m.apply(out, t);
  m.flush();
  return Status::ok();
}

bool PoolCore::host_live(const std::string& host) const {
  return impl_->hosts.count(host) && !impl_->lost_hosts.count(host);
}

Status PoolCore::set_device_usable(const std::string& name, bool usable) {
  auto& m = *impl_;
  auto it = m.devices.find(name);
  if (it == m.devices.end()) return make_error(Errc::not_found, "no device " + name);
  auto& d = it->second;
  if (usable && m.lost_hosts.count(d.host)) return Status::ok();
  if (d.available == usable) return Status::ok();
  double t = m.now();
  sched::Decisions out;
  const bool was_grantable = m.grantable(d);
  d.available = usable;
  m.touch(d);
  if (m.grantable(d) != was_grantable) (void)m.scheduler->set_available(d.sched_id, usable, t, out);
  m.apply(out, t);
  m.flush();
  return Status::ok();
}

std::vector<Lease> PoolCore::end_guest_leases(const std::string& host, const std::string& guest,
                                              const std::string& reason) {
  auto& m = *impl_;
  const std::string prefix = host + "/";
  auto on_host = [&](const Lease& l) {
    if (!l.guest_host.empty()) return l.guest_host == host;
    return std::any_of(l.devices.begin(), l.devices.end(),
                       [&](const std::string& d) { return d.compare(0, prefix.size(), prefix) == 0; });
  };
  std::vector<LeaseId> ids;
  for (const auto& [id, l] : m.live) {
    if (l.guest == guest && on_host(l)) ids.push_back(id);
  }
  double t = m.now();
  std::vector<Lease> out;
  for (LeaseId id : ids) {
    if (Lease* l = m.find_lease(id)) {
      m.end_lease(*l, LeaseState::revoked, reason, t);
      out.push_back(*m.find_any(id));
    }
  }
  m.flush();
  return out;
}

// --- tenants ---------------------------------------------------------------------------------------------------

Result<std::string> PoolCore::create_tenant(const std::string& name, double weight, std::uint32_t max_devices) {
  auto& m = *impl_;
  if (!valid_name(name, 64))
    return make_error(Errc::invalid_argument, "tenant name must be 1-64 characters of [A-Za-z0-9._:-]");
  if (!(weight > 0) || !std::isfinite(weight) || weight > 1e6) {
    return make_error(Errc::invalid_argument, "tenant weight must be a number in (0, 1e6]");
  }
  if (m.tenants.count(name)) return make_error(Errc::conflict, "tenant " + name + " exists");
  TenantRecord t{name, weight, max_devices, ""};
  std::string token = new_tenant_token(t);
  m.tenants[name] = t;
  m.tenant_by_hash[t.token_hash] = name;
  m.scheduler->set_tenant_weight(m.tenant_ids.intern(name), weight);
  m.write_tenant(t);
  m.flush();
  return token;
}

Status PoolCore::update_tenant(const std::string& name, std::optional<double> weight,
                               std::optional<std::uint32_t> max_devices) {
  auto& m = *impl_;
  auto it = m.tenants.find(name);
  if (it == m.tenants.end()) return make_error(Errc::not_found, "no tenant " + name);
  if (weight && (!(*weight > 0) || !std::isfinite(*weight) || *weight > 1e6)) {
    return make_error(Errc::invalid_argument, "tenant weight must be a number in (0, 1e6]");
  }
  if (weight) {
    it->second.weight = *weight;
    m.scheduler->set_tenant_weight(m.tenant_ids.intern(name), *weight);
  }
  if (max_devices) it->second.max_devices = *max_devices;
  m.write_tenant(it->second);
  m.flush();
  return Status::ok();
}

Result<std::string> PoolCore::rotate_tenant_token(const std::string& name) {
  auto& m = *impl_;
  auto it = m.tenants.find(name);
  if (it == m.tenants.end()) return make_error(Errc::not_found, "no tenant " + name);
  m.tenant_by_hash.erase(it->second.token_hash);
  std::string token = new_tenant_token(it->second);
  m.tenant_by_hash[it->second.token_hash] = name;
  m.write_tenant(it->second);
  m.rotated_tenants.push_back(name);
  m.flush();
  return token;
}

std::vector<TenantRecord> PoolCore::tenants() const {
  std::vector<TenantRecord> out;
  for (const auto& [_, t] : impl_->tenants) out.push_back(t);
  return out;
}

Result<std::string> PoolCore::authenticate(const std::string& token) const {
  if (token.empty() || token.size() > 256) return make_error(Errc::unauthorized, "missing or malformed token");
  auto it = impl_->tenant_by_hash.find(sha256_hex(token));
  if (it == impl_->tenant_by_hash.end()) return make_error(Errc::unauthorized, "unknown token");
  return it->second;
}

Status PoolCore::delete_tenant(const std::string& name) {
  auto& m = *impl_;
  auto it = m.tenants.find(name);
  if (it == m.tenants.end()) return make_error(Errc::not_found, "no tenant " + name);
  std::string holding;
  for (const auto& [id, l] : m.live) {
    if (l.tenant == name)
      holding += (holding.empty() ? "" : ", ") + std::to_string(id) + " (" + std::string(to_string(l.state)) + ")";
  }
  if (!holding.empty()) {
    return make_error(Errc::conflict, "tenant " + name + " has live leases " + holding +
                                          ": release or revoke them, then delete the tenant");
  }
  m.tenant_by_hash.erase(it->second.token_hash);
  m.tenants.erase(it);
  std::erase_if(m.batch.tenants, [&](const TenantRecord& t) { return t.name == name; });
  m.batch.deleted_tenants.push_back(name);
  m.rotated_tenants.push_back(name);  // its guests' sessions end: their token no longer works
  m.flush();
  return Status::ok();
}

Result<std::string> PoolCore::issue_admin_token(const std::string& name, bool replace) {
  auto token = impl_->admin_tokens.issue(name, replace, impl_->batch.meta);
  if (token) impl_->flush();
  return token;
}

Status PoolCore::set_admin_token(const std::string& token, const std::string& name) {
  auto s = impl_->admin_tokens.set(name, token, impl_->batch.meta);
  if (s) impl_->flush();
  return s;
}

Status PoolCore::revoke_admin_token(const std::string& name) {
  auto s = impl_->admin_tokens.revoke(name, impl_->batch.meta);
  if (s) impl_->flush();
  return s;
}

std::vector<std::string> PoolCore::admin_token_names() const { return impl_->admin_tokens.names(); }

bool PoolCore::has_admin_token() const { return !impl_->admin_tokens.empty(); }

bool PoolCore::check_admin(const std::string& token) const { return !impl_->admin_tokens.check(token).empty(); }

// --- leases ----------------------------------------------------------------------------------------------------

Result<Lease> PoolCore::acquire(const AcquireParams& asked) {
  auto& m = *impl_;
  AcquireParams p = asked;  // its kind becomes a slot kind for a partial image
  auto tit = m.tenants.find(p.tenant);
  if (tit == m.tenants.end()) return make_error(Errc::not_found, "no tenant " + p.tenant);
  if (!common::valid_guest_id(p.guest)) {
    return make_error(Errc::invalid_argument, std::string("guest id must be ") + common::kGuestIdSyntax);
  }
  if (!valid_name(p.kind, 64))
    return make_error(Errc::invalid_argument, "kind must be 1-64 characters of [A-Za-z0-9._:-]");
  if (!p.bitstream.empty() && !valid_name(p.bitstream, 128)) {
    return make_error(Errc::invalid_argument, "bitstream must be 1-128 characters of [A-Za-z0-9._:-]");
  }
  if (!p.guest_host.empty() && !valid_name(p.guest_host, 64)) {
    return make_error(Errc::invalid_argument, "guest_host must be 1-64 characters of [A-Za-z0-9._:-]");
  }
  if (p.count < 1 || p.count > 4096) return make_error(Errc::invalid_argument, "count must be in 1..4096");
  if (p.estimate_s && (!std::isfinite(*p.estimate_s) || *p.estimate_s < 0 || *p.estimate_s > 1e9)) {
    return make_error(Errc::invalid_argument, "estimate_s must be a number in [0, 1e9]");
  }
  if (!p.label.empty()) {
    if (!valid_name(p.label, 64))
      return make_error(Errc::invalid_argument, "label must be 1-64 characters of [A-Za-z0-9._:-]");
    const auto it = m.labels_of_tenant.find(p.tenant);
    if (it != m.labels_of_tenant.end() && it->second.size() >= kMaxLabelsPerTenant && !it->second.contains(p.label)) {
      return make_error(Errc::quota_exceeded, "tenant " + p.tenant + " already gave " +
                                                  std::to_string(kMaxLabelsPerTenant) +
                                                  " distinct labels, the most one tenant may use; reuse one of them or "
                                                  "give none");
    }
  }
  if (auto partial =
          m.options.image_partial && !p.bitstream.empty() ? m.options.image_partial(p.bitstream) : std::nullopt) {
    const bool slot_asked = p.kind.ends_with(":slot");
    if (*partial && !slot_asked) p.kind = slot_kind(p.kind);
    if (!*partial && slot_asked) {
      return make_error(Errc::incompatible, "bitstream " + p.bitstream +
                                                " is a full image: it takes a whole device, not a "
                                                "slot (kind '" +
                                                p.kind + "')");
    }
  }
  const auto kind = m.kinds.find(p.kind);
  if (!kind) return make_error(Errc::infeasible, "the pool has no device of kind '" + p.kind + "'");
  const auto fit = m.fit_of(p.bitstream);
  const sched::ModelSet fits = m.fitting_models(*kind, fit);
  if (fits == 0) {
    std::string patterns = fit.models_text();
    if (!fit.slot_shape.empty()) patterns += " in slots of shape '" + fit.slot_shape + "'";
    std::string listed;
    const sched::NameTable& table = m.models_of_kind(*kind);
    for (std::uint32_t i = 0; i < table.size(); ++i)
      listed += (listed.empty() ? "" : ", ") + Impl::describe_model(table.name(i));
    return make_error(Errc::incompatible, "bitstream " + p.bitstream + " fits device models " + patterns +
                                              ", but the devices of kind '" + p.kind + "' are " + listed);
  }
  if (m.options.acquire_check) {
    if (auto s = m.options.acquire_check(p); !s) return s.error();
  }
  if (const std::size_t own = m.live_of_guest(p.tenant, p.guest).size(); own >= m.options.max_live_per_guest) {
    return make_error(Errc::quota_exceeded, "guest " + p.guest + " of tenant " + p.tenant + " holds or waits for " +
                                                std::to_string(own) + " leases, the most one guest may have " +
                                                "([leases] max_per_guest); release or cancel some first");
  }
  if (tit->second.max_devices > 0) {
    const auto held = m.live_devices_of_tenant.find(p.tenant);
    const std::uint64_t used = held == m.live_devices_of_tenant.end() ? 0 : held->second;
    if (used + p.count > tit->second.max_devices) {
      return make_error(Errc::quota_exceeded, "tenant " + p.tenant + " may hold or wait for at most " +
                                                  std::to_string(tit->second.max_devices) + " devices (" +
                                                  std::to_string(used) + " in use or queued)");
    }
  }
  double t = m.now();
  Lease l;
  l.id = m.last_id + 1;
  l.tenant = p.tenant;
  l.guest = p.guest;
  l.guest_host =
      p.guest_host.empty() ? (m.host_order.empty() ? std::string("local") : m.host_order.front()) : p.guest_host;
  l.relayed = p.relayed;
  l.kind = p.kind;
  l.bitstream = p.bitstream;
  l.count = p.count;
  l.estimate_s = p.estimate_s;
  l.label = p.label;
  l.created_at = t;
  sched::Decisions out;
  sched::Request r = m.request_of(l, fits);
  Lease& stored = m.live[l.id] = std::move(l);
  if (auto rej = m.scheduler->submit(r, t, out)) {
    // The scheduler knows hosts by number: the guest's host is named here.
    std::string where = " (guest " + p.guest + " on host " + stored.guest_host + ")";
    m.live.erase(r.id);
    return make_error(errc_of(*rej), rej->error + where);
  }
  m.index_live(stored, true);
  m.last_id = r.id;
  m.set_expiry(stored, t + m.options.lease_ttl_s);
  m.touch(stored);
  m.apply(out, t);
  Lease copy = m.live.count(r.id) ? m.live.at(r.id) : *m.find_any(r.id);
  m.flush();
  return copy;
}

Result<Lease> PoolCore::cancel(const Caller& caller, LeaseId id) {
  auto& m = *impl_;
  auto l = m.owned(caller, id);
  if (!l) return l.error();
  if ((*l)->state != LeaseState::queued) {
    return make_error(Errc::invalid_state, "lease " + std::to_string(id) + " is " +
                                               std::string(to_string((*l)->state)) +
                                               ", not queued: release it instead");
  }
  m.end_lease(**l, LeaseState::cancelled, "cancelled by the guest", m.now());
  Lease copy = *m.find_any(id);
  m.flush();
  return copy;
}

Result<Lease> PoolCore::release(const Caller& caller, LeaseId id) {
  auto& m = *impl_;
  auto l = m.owned(caller, id);
  if (!l) return l.error();
  LeaseState end = (*l)->state == LeaseState::queued ? LeaseState::cancelled : LeaseState::released;
  m.end_lease(**l, end, end == LeaseState::cancelled ? "released while queued" : "released by the guest", m.now());
  Lease copy = *m.find_any(id);
  m.flush();
  return copy;
}

// A renewed expiry is kept in memory only: it is not written to the store (nor published), since a restart gives
// every live lease a fresh TTL anyway; a pool with 100,000 waiting requests would otherwise write each of their
// rows every heartbeat.
Result<std::vector<Lease>> PoolCore::heartbeat(const Caller& caller, std::optional<LeaseId> id) {
  auto& m = *impl_;
  double t = m.now();
  std::vector<Lease> out;
  if (id) {
    auto l = m.owned(caller, *id);
    if (!l) return l.error();
    m.set_expiry(**l, t + m.options.lease_ttl_s);
    out.push_back(**l);
  } else {
    auto renew = [&](Lease& l) {
      if (!caller.owns(l)) return;
      m.set_expiry(l, t + m.options.lease_ttl_s);
      out.push_back(l);
    };
    if (caller.tenant.empty()) {
      for (auto& [_, l] : m.live) renew(l);
    } else {
      for (LeaseId id : m.live_of_guest(caller.tenant, caller.guest)) renew(m.live.at(id));
    }
  }
  m.flush();
  return out;
}

Result<Lease> PoolCore::revoke(LeaseId id, const std::string& reason) {
  auto& m = *impl_;
  auto l = m.owned(Caller::admin(), id);
  if (!l) return l.error();
  Lease& lease = **l;
  double t = m.now();
  if (lease.state == LeaseState::queued) {
    m.end_lease(lease, LeaseState::revoked, reason.empty() ? "revoked by an admin" : reason, t);
  } else {
    m.begin_revoke(lease, reason.empty() ? "revoked by an admin" : reason, t);
  }
  Lease copy = *m.find_any(id);
  m.flush();
  return copy;
}

Result<Lease> PoolCore::get(const Caller& caller, LeaseId id) const {
  std::optional<Lease> found;
  if (const Lease* l = impl_->find_any(id)) {
    found = *l;
  } else {
    auto stored = impl_->store.lease(id);
    if (!stored) return stored.error();
    found = std::move(*stored);
  }
  if (!found || !caller.owns(*found)) return make_error(Errc::not_found, "no lease " + std::to_string(id));
  return std::move(*found);
}

namespace {

bool matches(const LeaseFilter& f, const Lease& l) {
  return (!f.tenant || l.tenant == *f.tenant) && (!f.guest || l.guest == *f.guest) && (!f.owner || f.owner->owns(l)) &&
         (!f.state || l.state == *f.state) &&
         (!f.device || std::find(l.devices.begin(), l.devices.end(), *f.device) != l.devices.end());
}

bool wants_ended(const LeaseFilter& f) { return f.include_ended || (f.state && is_terminal(*f.state)); }

const Lease& lease_at(const std::map<LeaseId, Lease>&, const std::pair<const LeaseId, Lease>& entry) {
  return entry.second;
}
const Lease& lease_at(const std::map<LeaseId, Lease>& leases, LeaseId id) { return leases.at(id); }

// Calls `take` on each lease of `ids` (ascending ids of `leases`, or `leases` itself) that lies beyond `spec`'s
// cursor and matches `f`, in the page's order, until `take` returns false.
template <class Ids, class Take>
void visit_page(const Ids& ids, const std::map<LeaseId, Lease>& leases, const LeaseFilter& f, const LeasePageSpec& spec,
                Take&& take) {
  auto visit = [&](auto first, auto last) {
    for (auto it = first; it != last; ++it) {
      const Lease& l = lease_at(leases, *it);
      if (matches(f, l) && !take(l)) return;
    }
  };
  if (spec.newest_first) {
    visit(spec.after ? std::make_reverse_iterator(ids.lower_bound(*spec.after)) : ids.rbegin(), ids.rend());
  } else {
    visit(spec.after ? ids.upper_bound(*spec.after) : ids.begin(), ids.end());
  }
}

// visit_page over the live leases: over `own` (one guest's ids) when given, so that a guest's listing costs its
// own leases and not the pool's, over every live lease otherwise.
template <class Take>
void visit_live(const std::set<LeaseId>* own, const std::map<LeaseId, Lease>& live, const LeaseFilter& f,
                const LeasePageSpec& spec, Take&& take) {
  if (own) {
    visit_page(*own, live, f, spec, take);
  } else {
    visit_page(live, live, f, spec, take);
  }
}

}  // namespace

const std::set<LeaseId>* PoolCore::Impl::own_leases(const LeaseFilter& f) const {
  if (f.owner && !f.owner->tenant.empty()) return &live_of_guest(f.owner->tenant, f.owner->guest);
  if (f.tenant && f.guest) return &live_of_guest(*f.tenant, *f.guest);
  return nullptr;
}

std::vector<Lease> PoolCore::list(const LeaseFilter& f) const {
  std::vector<Lease> out;
  const LeasePageSpec all;
  auto keep = [&](const Lease& l) {
    out.push_back(l);
    return true;
  };
  if (wants_ended(f)) visit_page(impl_->ended, impl_->ended, f, all, keep);
  visit_live(impl_->own_leases(f), impl_->live, f, all, keep);
  std::sort(out.begin(), out.end(), [](const Lease& a, const Lease& b) { return a.id < b.id; });
  return out;
}

Result<PoolCore::LeasePage> PoolCore::page(const LeaseFilter& f, const LeasePageSpec& spec) const {
  // Memory holds every live lease and the newest state of every ended lease not yet committed (ended leases leave
  // memory only after a commit); the store holds every ended lease committed. Each of the three sources gives at
  // most one lease more than the page holds, in the page's order: every lease of the page is among the first of
  // its own source, and one more shows whether more follow.
  std::map<LeaseId, Lease> merged;
  const std::size_t wanted = spec.limit + 1;
  // Takes leases into `merged` until it has taken `wanted` of one source.
  auto upto_wanted = [&merged, wanted] {
    return [&merged, wanted, taken = std::size_t{0}](const Lease& l) mutable {
      merged.insert_or_assign(l.id, l);
      return ++taken < wanted;
    };
  };
  if (wants_ended(f)) {
    LeasePageSpec one_more = spec;
    one_more.limit = wanted;
    auto stored = impl_->store.ended_leases(f, one_more);
    if (!stored) return stored.error();
    for (auto& l : *stored) merged.emplace(l.id, std::move(l));
    visit_page(impl_->ended, impl_->ended, f, spec, upto_wanted());
  }
  visit_live(impl_->own_leases(f), impl_->live, f, spec, upto_wanted());
  LeasePage page;
  auto take = [&](auto first, auto last) {
    for (auto it = first; it != last && page.leases.size() < spec.limit; ++it)
      page.leases.push_back(std::move(it->second));
  };
  if (spec.newest_first) {
    take(merged.rbegin(), merged.rend());
  } else {
    take(merged.begin(), merged.end());
  }
  if (merged.size() > page.leases.size() && !page.leases.empty()) page.next = page.leases.back().id;
  return page;
}

std::vector<Lease> PoolCore::queue(std::size_t limit, std::size_t skip) const {
  const std::size_t shown = limit > SIZE_MAX - skip ? SIZE_MAX : skip + limit;
  const auto order = impl_->scheduler->queue_order(impl_->last_now, shown);
  std::vector<Lease> out;
  for (std::size_t i = skip; i < order.size(); ++i) {
    if (const Lease* l = impl_->find_any(order[i])) out.push_back(*l);
  }
  return out;
}

PoolCore::TenantQueuePage PoolCore::tenant_queue(const std::string& tenant, std::size_t limit, std::size_t skip) const {
  TenantQueuePage page;
  const auto order = impl_->scheduler->queue_order(impl_->last_now);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Lease* l = impl_->find_any(order[i]);
    if (!l || l->tenant != tenant) continue;
    if (page.total >= skip && page.entries.size() < limit) page.entries.emplace_back(*l, i + 1);
    ++page.total;
  }
  return page;
}

std::optional<double> PoolCore::expected_start(LeaseId id) const {
  return impl_->scheduler->expected_start(id, impl_->last_now);
}

// --- devices -----------------------------------------------------------------------------------------------------

std::vector<DeviceView> PoolCore::devices() const {
  std::vector<DeviceView> out;
  for (const auto& [name, d] : impl_->devices) {
    if (d.parent.empty()) out.push_back(*device(name));
  }
  return out;
}

Result<DeviceView> PoolCore::device(const std::string& name) const {
  auto it = impl_->devices.find(name);
  if (it == impl_->devices.end()) return make_error(Errc::not_found, "no device " + name);
  DeviceView v;
  v.record = it->second;
  v.record.available = impl_->grantable(it->second);  // a lost host's devices are shown unavailable
  v.state = device_state_name(impl_->scheduler->device_state(it->second.sched_id));
  if (auto h = impl_->holder.find(name); h != impl_->holder.end()) v.lease = h->second;
  if (auto dl = impl_->drain_deadlines.find(name); dl != impl_->drain_deadlines.end()) v.drain_deadline = dl->second;
  for (sched::DeviceId id : impl_->scheduler->slots_of(it->second.sched_id)) {
    const DeviceRecord& slot = *impl_->device_by_sched(id);
    SlotView sv{slot.name, device_state_name(impl_->scheduler->device_state(id)), slot.loaded, slot.slot_shape,
                std::nullopt};
    if (auto h = impl_->holder.find(slot.name); h != impl_->holder.end()) sv.lease = h->second;
    v.slots.push_back(std::move(sv));
  }
  return v;
}

DevicePage PoolCore::device_page(const DeviceFilter& filter, const PageSpec& spec) const {
  auto& m = *impl_;
  DevicePage page;
  auto match = [&](const std::string&, const DeviceRecord& d) {
    if (!d.parent.empty()) return false;  // a slot is shown with its device
    if (filter.kind && d.kind != *filter.kind) return false;
    return !filter.state || device_state_name(m.scheduler->device_state(d.sched_id)) == *filter.state;
  };
  auto add = [&](const std::string& name, const auto&) { page.devices.push_back(*device(name)); };
  if (!filter.host) {
    page.next = page_of(m.devices, spec, match, add);
    return page;
  }
  auto it = m.host_table.find(*filter.host);
  if (it == m.host_table.end()) return page;
  auto match_indexed = [&](const std::string& name, const DeviceRecord* d) {
    ++m.device_visits;
    return match(name, *d);
  };
  page.next = page_of(it->second.devices, spec, match_indexed, add);
  return page;
}

Result<HostView> PoolCore::host(const std::string& host) const {
  auto it = impl_->host_table.find(host);
  if (it == impl_->host_table.end()) return make_error(Errc::not_found, "no host " + host);
  return HostView{host, host_live(host), host_draining(host), it->second.devices.size()};
}

HostPage PoolCore::host_page(const HostFilter& filter, const PageSpec& spec) const {
  HostPage page;
  auto match = [&](const std::string& name, const auto&) {
    return (!filter.connected || host_live(name) == *filter.connected) &&
           (!filter.draining || host_draining(name) == *filter.draining);
  };
  auto add = [&](const std::string& name, const auto&) { page.hosts.push_back(*host(name)); };
  page.next = page_of(impl_->host_table, spec, match, add);
  return page;
}

std::vector<DeviceView> PoolCore::host_devices(const std::string& host) const {
  std::vector<DeviceView> out;
  impl_->each_device_of(host, [&](const DeviceRecord& d) { out.push_back(*device(d.name)); });
  return out;
}

std::vector<std::string> PoolCore::hosts() const {
  std::vector<std::string> names;
  names.reserve(impl_->host_table.size());
  for (const auto& [name, _] : impl_->host_table) names.push_back(name);
  return names;
}

bool PoolCore::host_known(const std::string& host) const { return impl_->host_table.count(host) > 0; }

std::uint64_t PoolCore::host_device_visits() const { return impl_->device_visits; }

Status PoolCore::set_draining(const std::string& name, bool draining, std::optional<double> deadline_s) {
  auto& m = *impl_;
  auto it = m.devices.find(name);
  if (it == m.devices.end()) return make_error(Errc::not_found, "no device " + name);
  if (auto e = check_drain_deadline(draining, deadline_s)) return *e;
  double t = m.now();
  sched::Decisions out;
  std::optional<double> at;
  if (deadline_s) at = t + *deadline_s;
  if (auto s = m.drain(it->second, draining, at, t, out); !s) return s;
  m.enforce_drain_deadlines(t);
  m.apply(out, t);
  m.flush();
  return Status::ok();
}

Status PoolCore::set_host_draining(const std::string& host, bool draining, std::optional<double> deadline_s) {
  auto& m = *impl_;
  if (!host_known(host)) return make_error(Errc::not_found, "no host " + host);
  if (auto e = check_drain_deadline(draining, deadline_s)) return *e;
  double t = m.now();
  sched::Decisions out;
  std::optional<double> at;
  if (deadline_s) at = t + *deadline_s;
  Status drained = Status::ok();
  m.each_device_of(host, [&](DeviceRecord& d) {
    if (drained) drained = m.drain(d, draining, at, t, out);
  });
  if (!drained) return drained;
  if (draining)
    m.draining_hosts.insert(host);
  else
    m.draining_hosts.erase(host);
  m.batch.meta.emplace_back(Impl::host_draining_key(host), draining ? "1" : "");
  m.enforce_drain_deadlines(t);
  m.apply(out, t);
  m.flush();
  return Status::ok();
}

bool PoolCore::host_draining(const std::string& host) const { return impl_->draining_hosts.count(host) > 0; }

void PoolCore::bitstream_changed(const std::string& bitstream) {
  auto& m = *impl_;
  if (bitstream.empty()) return;
  const double t = m.now();
  const auto fit = m.fit_of(bitstream);
  std::vector<std::pair<LeaseId, sched::ModelSet>> refit;
  std::vector<LeaseId> unfit;
  for (const auto& [id, l] : m.live) {
    if (l.bitstream != bitstream) continue;
    const sched::ModelSet fits = m.fitting_models(m.kinds.intern(l.kind), fit);
    if (fits != 0)
      refit.emplace_back(id, fits);
    else if (l.state == LeaseState::queued)
      unfit.push_back(id);
    // else: a granted lease keeps its devices and the models it was placed by
  }
  // The leases nothing fits any more end first, so that no placement below can grant them.
  const std::string patterns = fit.compatible ? fit.models_text() : std::string();
  for (LeaseId id : unfit) {
    Lease& l = m.live.at(id);
    m.end_lease(l, LeaseState::revoked,
                "bitstream " + bitstream + " was registered again for device models " + patterns +
                    ", which no device of kind '" + l.kind + "' is",
                t);
  }
  sched::Decisions out;
  for (const auto& [id, fits] : refit) (void)m.scheduler->set_models(id, fits, t, out);
  m.apply(out, t);
  m.flush();
}

Status PoolCore::reset_device(const std::string& name) {
  auto& m = *impl_;
  auto it = m.devices.find(name);
  if (it == m.devices.end()) return make_error(Errc::not_found, "no device " + name);
  std::vector<std::string> parts{name};  // the device and its slots: none may be leased
  for (sched::DeviceId id : m.scheduler->slots_of(it->second.sched_id)) parts.push_back(m.device_by_sched(id)->name);
  for (const auto& part : parts) {
    if (m.holder.count(part)) {
      return make_error(Errc::invalid_state, "device " + part + " is leased (lease " +
                                                 std::to_string(m.holder.at(part)) +
                                                 "): drain it and revoke the lease first");
    }
  }
  m.host_call(it->second.host, [&m, name, local = it->second.local_id](HostDriver& h) {
    h.reset(local, [&m, name](Status s, std::string loaded) { m.on_device_reset(name, s, std::move(loaded)); });
  });
  return Status::ok();
}

std::vector<std::string> PoolCore::bitstreams() const {
  std::set<std::string> names;
  for (const auto& [_, d] : impl_->devices) {
    if (!d.loaded.empty()) names.insert(d.loaded);
  }
  for (const auto& [_, l] : impl_->live) {
    if (!l.bitstream.empty()) names.insert(l.bitstream);
  }
  return {names.begin(), names.end()};
}

// --- policy, time, stats --------------------------------------------------------------------------------------

std::string PoolCore::policy() const { return impl_->policy_text; }

Status PoolCore::set_policy(const std::string& text) {
  auto& m = *impl_;
  std::string error;
  auto spec = sched::PolicySpec::parse(text, &error);
  if (!spec) return make_error(Errc::invalid_argument, "policy '" + text + "': " + error);
  double t = m.now();
  sched::Decisions out;
  if (auto r = m.scheduler->set_policy(*spec, t, out))
    return make_error(Errc::invalid_argument, "policy '" + text + "': " + r->error);
  log::info("policy switched", {{"from", m.policy_text}, {"to", spec->to_string()}});
  m.policy_text = spec->to_string();
  m.batch.meta.emplace_back("policy", m.policy_text);
  m.apply(out, t);
  m.flush();
  return Status::ok();
}

void PoolCore::tick() {
  auto& m = *impl_;
  double t = m.now();
  while (!m.expiries.empty() && m.expiries.begin()->first <= t) {
    LeaseId id = m.expiries.begin()->second;
    m.expiries.erase(m.expiries.begin());
    if (Lease* l = m.find_lease(id)) m.end_lease(*l, LeaseState::expired, kNoHeartbeat, t);
  }
  while (!m.deadlines.empty() && m.deadlines.begin()->first <= t) {
    LeaseId id = m.deadlines.begin()->second;
    Lease* l = m.find_lease(id);
    if (!l) {
      m.deadlines.erase(m.deadlines.begin());
      continue;
    }
    if (l->requeue_on_deadline) {
      sched::Decisions out;
      m.requeue(*l, t, out);
      m.apply(out, t);
    } else {
      std::string reason = l->end_reason.empty() ? "revoked" : l->end_reason;
      m.end_lease(*l, LeaseState::revoked, reason, t);
    }
  }
  m.enforce_drain_deadlines(t);
  if (m.options.keep_ended_s > 0 && t >= m.next_prune) {  // the store's history, about once an hour
    m.batch.prune_ended_before = t - m.options.keep_ended_s;
    m.next_prune = t + 3600;
  }
  sched::Decisions out;
  m.scheduler->tick(t, out);
  m.apply(out, t);
  m.flush();
}

std::optional<double> PoolCore::next_wakeup() const {
  std::optional<double> w = impl_->scheduler->next_wakeup();
  auto earlier = [&](double t) { w = w ? std::min(*w, t) : t; };
  if (!impl_->expiries.empty()) earlier(impl_->expiries.begin()->first);
  if (!impl_->deadlines.empty()) earlier(impl_->deadlines.begin()->first);
  for (const auto& [_, at] : impl_->drain_deadlines) earlier(at);
  return w;
}

std::vector<LearnedGroup> PoolCore::learned_estimates() const {
  const auto& m = *impl_;
  const auto& estimator = m.scheduler->estimator();
  std::vector<LearnedGroup> out;
  for (const auto& g : estimator.state().groups) {
    const auto* h = estimator.group(g.key);
    LearnedGroup v;
    v.group = m.estimate_record(g.key, *h);
    v.warm = h->observations() >= estimator.options().warmup;
    v.mean_device_s = h->mean();
    v.estimate_s = v.mean_device_s / std::max<std::uint32_t>(1, v.group.count);
    v.p50_device_s = h->quantile(0.5);
    v.p90_device_s = h->quantile(0.9);
    out.push_back(std::move(v));
  }
  auto order = [](const LearnedGroup& v) {
    const auto& e = v.group;
    return std::tie(e.kind, e.whole_kind, e.tenant, e.bitstream, e.count, e.label);
  };
  std::sort(out.begin(), out.end(), [&](const LearnedGroup& a, const LearnedGroup& b) {
    // The whole kind first: true sorts before false here.
    if (a.group.kind != b.group.kind) return a.group.kind < b.group.kind;
    if (a.group.whole_kind != b.group.whole_kind) return a.group.whole_kind;
    return order(a) < order(b);
  });
  return out;
}

std::uint64_t PoolCore::learning_warmup() const { return impl_->scheduler->estimator().options().warmup; }

Stats PoolCore::stats(double window_s) const {
  Stats s;
  s.window_s = window_s;
  double since = impl_->last_now - window_s;
  std::vector<double> jct, wait;
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_t, by_b;
  for (const auto& x : impl_->samples) {
    if (x.ended_at < since) continue;
    jct.push_back(x.jct);
    wait.push_back(x.wait);
    by_t[x.tenant].first.push_back(x.jct);
    by_t[x.tenant].second.push_back(x.wait);
    std::string b = x.bitstream.empty() ? "(none)" : x.bitstream;
    by_b[b].first.push_back(x.jct);
    by_b[b].second.push_back(x.wait);
  }
  s.all = {percentiles(jct), percentiles(wait)};
  for (auto& [k, v] : by_t) s.by_tenant[k] = {percentiles(v.first), percentiles(v.second)};
  for (auto& [k, v] : by_b) s.by_bitstream[k] = {percentiles(v.first), percentiles(v.second)};
  return s;
}

Counters PoolCore::counters() const { return impl_->counters; }
std::size_t PoolCore::queue_length() const { return impl_->scheduler->waiting_count(); }

std::map<std::string, std::size_t> PoolCore::leases_by_state() const {
  std::map<std::string, std::size_t> out;
  for (std::size_t i = 0; i <= static_cast<std::size_t>(LeaseState::revoked); ++i) {
    out[std::string(to_string(static_cast<LeaseState>(i)))] = 0;
  }
  for (const auto& [_, l] : impl_->live) ++out[std::string(to_string(l.state))];
  for (const auto& [_, l] : impl_->ended) ++out[std::string(to_string(l.state))];
  return out;
}

std::map<std::string, std::size_t> PoolCore::devices_by_state() const {
  std::map<std::string, std::size_t> out;
  for (auto s : {sched::DeviceState::free, sched::DeviceState::leased, sched::DeviceState::draining,
                 sched::DeviceState::unavailable, sched::DeviceState::shared, sched::DeviceState::holding}) {
    out[device_state_name(s)] = impl_->scheduler->count_in_state(s);  // kept by the scheduler: no walk
  }
  return out;
}

Store& PoolCore::store() { return impl_->store; }

void PoolCore::set_group_commit(bool on) {
  impl_->group_commit = on;
  if (!on) impl_->commit({});
}

bool PoolCore::has_uncommitted() const { return impl_->uncommitted(); }

void PoolCore::commit(const std::function<void()>& after_write) { impl_->commit(after_write); }

PoolCore::Commit PoolCore::take_commit() { return impl_->take_commit(); }

void PoolCore::finish_commit(Commit commit) { impl_->finish_commit(std::move(commit)); }

void PoolCore::fail_store(const Error& error) {
  log::error("fatal: cannot write the store", {{"error", error.message}});
  log::flush();
  std::abort();
}

void PoolCore::track_touched(bool on) {
  impl_->tracking_touched = on;
  if (!on) impl_->touched = {};
}

PoolCore::Touched PoolCore::take_touched() { return std::exchange(impl_->touched, {}); }

}  // namespace accelpool::manager
