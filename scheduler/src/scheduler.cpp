// The event-driven scheduler. See scheduler.hpp for the contract and docs/policies.md for the rules.
//
// Data structures, and why:
// - waiting requests sit in buckets keyed by (kind, guest host, gang size[, tenant], models); a bucket is ordered by
//   the policy's key, so its head is its best request. Requests in one bucket compete for the same devices
//   in the same way: if the head does not fit, nothing in the bucket does. Dispatch therefore looks only at
//   bucket heads: O(B) per grant for B non-empty buckets (a handful of gang sizes x hosts x tenants), never
//   at the whole queue;
// - requests live in a slab of entries found by id through a flat hash map (IdMap): one probe, no node
//   allocation per request, and a reused entry keeps its device vector;
// - free devices sit in FreeIndex, keyed by kind, host, model and bitstream, so fit checks are O(models) and
//   placement O(k log n) for a k-device gang;
// - preemptible running leases sit per kind in a set ordered by victim rank, so the worst lease is found in
//   O(log n); LAS demotions are timed events in `key_changes_`.
#include <accelpool/scheduler/scheduler.hpp>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <tuple>

namespace accelpool::scheduler {

namespace {

std::string id_text(std::uint64_t id) { return std::to_string(id); }

// The whole of `text` as a positive finite number, or nullopt.
std::optional<double> positive_number(std::string_view text) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || ptr != text.data() + text.size() || !(v > 0) || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The policy options NAME=VALUE (and NAME alone where the option has a default): where the value goes and
// what it must be.
struct PolicyOption {
  std::string_view name;
  std::optional<double> PolicySpec::*field;
  std::optional<double> bare;  // the value of NAME alone; none: the value is required
  std::string_view must_be;
};

constexpr PolicyOption kPolicyOptions[] = {
    {"guard", &PolicySpec::tail_guard_s, std::nullopt, "a positive number of seconds"},
    {"age", &PolicySpec::age_slowdown, kDefaultAgeSlowdown, "a positive slowdown"},
    {"hold", &PolicySpec::hold_s, kDefaultHoldS, "a positive number of seconds"},
    {"reuse", &PolicySpec::reuse_s, kDefaultReuseS, "a positive number of seconds"},
};

// The option `part` sets (NAME alone, or NAME=...), or null.
const PolicyOption* find_policy_option(std::string_view part) {
  for (const PolicyOption& o : kPolicyOptions) {
    if (part == o.name && o.bare) return &o;
    if (part.starts_with(o.name) && part.substr(o.name.size()).starts_with('=')) return &o;
  }
  return nullptr;
}

// "NAME must be ..." for the first option of `spec` that is set but not positive (a spec built in code, not
// parsed), or "" when all are valid.
std::string invalid_option(const PolicySpec& spec) {
  for (const PolicyOption& o : kPolicyOptions) {
    if (const auto& v = spec.*o.field; v && !(*v > 0))
      return std::string(o.name) + " must be " + std::string(o.must_be);
  }
  return "";
}

// Running leases examined per preemption attempt or reservation: bounds the work when a wide gang cannot
// gather enough devices.
constexpr std::size_t kMaxLeasesExamined = 1024;

// Requests examined per bucket when backfilling behind a reservation (see backfill_candidate).
constexpr std::size_t kMaxBackfillExamined = 32;

}  // namespace

// --- PolicySpec ----------------------------------------------------------------------------------------------

std::optional<PolicySpec> PolicySpec::parse(std::string_view text, std::string* error) {
  auto fail = [&](std::string message) -> std::optional<PolicySpec> {
    if (error) *error = "policy '" + std::string(text) + "': " + std::move(message);
    return std::nullopt;
  };
  PolicySpec spec;
  std::size_t index = 0;
  while (true) {
    const auto plus = text.find('+');
    const auto part = text.substr(0, plus);
    if (part.empty()) {
      return fail(
          "empty part (expected ORDERING[+PLACEMENT][+guard=SECONDS][+age=SLOWDOWN][+hold=SECONDS][+reuse=SECONDS]"
          "[+nopreempt])");
    }
    if (index == 0) {
      spec.ordering = std::string(part);
    } else if (const PolicyOption* o = find_policy_option(part)) {
      if (part == o->name) {
        spec.*o->field = o->bare;
      } else {
        const auto value = part.substr(o->name.size() + 1);
        spec.*o->field = positive_number(value);
        if (!(spec.*o->field)) {
          return fail(std::string(o->name) + " needs " + std::string(o->must_be) + ", got '" + std::string(value) +
                      "'");
        }
      }
    } else if (part == "nopreempt") {
      spec.preemption = false;
    } else if (index == 1) {
      spec.placement = std::string(part);
    } else {
      return fail("unexpected '" + std::string(part) + "'");
    }
    ++index;
    if (plus == std::string_view::npos) break;
    text.remove_prefix(plus + 1);
  }
  std::string why;
  if (!make_ordering(spec.ordering, &why) || !make_placement(spec.placement, &why)) return fail(why);
  return spec;
}

std::string PolicySpec::to_string() const {
  std::ostringstream out;
  out << ordering << '+' << placement;
  if (tail_guard_s) out << "+guard=" << *tail_guard_s;
  if (age_slowdown) out << "+age=" << *age_slowdown;
  if (hold_s) out << "+hold=" << *hold_s;
  if (reuse_s) out << "+reuse=" << *reuse_s;
  if (!preemption) out << "+nopreempt";
  return out.str();
}

// --- construction --------------------------------------------------------------------------------------------

std::unique_ptr<Scheduler> Scheduler::create(const PolicySpec& spec, std::string* error) {
  auto ordering = make_ordering(spec.ordering, error);
  if (!ordering) return nullptr;
  auto placement = make_placement(spec.placement, error);
  if (!placement) return nullptr;
  if (std::string why = invalid_option(spec); !why.empty()) {
    if (error) *error = why;
    return nullptr;
  }
  return std::unique_ptr<Scheduler>(new Scheduler(spec, std::move(ordering), std::move(placement)));
}

Scheduler::Scheduler(PolicySpec spec, std::unique_ptr<OrderingPolicy> ordering,
                     std::unique_ptr<PlacementPolicy> placement)
    : spec_(std::move(spec)), ordering_(std::move(ordering)), placement_(std::move(placement)), free_(index_needs()) {}

IndexNeeds Scheduler::index_needs() const {
  IndexNeeds needs = placement_->needs();
  // The hold and reuse rules read what free devices hold.
  needs.by_bitstream = needs.by_bitstream || spec_.learns_images();
  return needs;
}

// --- device slots --------------------------------------------------------------------------------------------

Scheduler::Slot* Scheduler::slot(DeviceId id) {
  return id < slots_.size() && (slots_[id].present || slots_[id].held) ? &slots_[id] : nullptr;
}

const Scheduler::Slot* Scheduler::slot(DeviceId id) const { return const_cast<Scheduler*>(this)->slot(id); }

// A device is in the free index exactly when it is present, available, not draining, not held, not on hold and
// not shared (see DeviceState).
bool Scheduler::open_for_slots(const Slot& parent) const {
  return parent.present && parent.available && !parent.draining && !parent.held && !parent.on_hold;
}

void Scheduler::refresh_slot(Slot& s) {
  bool shared = false;
  if (s.has_slots) {
    auto busy = busy_slots_.find(s.device.id);
    shared = busy != busy_slots_.end() && busy->second > 0;
  }
  if (s.is_slot) shared = shared || !open_for_slots(slots_[parent_of_.at(s.device.id)]);
  const bool should_be_free = s.present && s.available && !s.draining && !s.held && !s.on_hold && !shared;
  const bool is_free = s.state == DeviceState::free;
  if (should_be_free && !is_free) {
    free_.insert(s.device);
    ++free_count_;
  } else if (!should_be_free && is_free) {
    free_.erase(s.device);
    --free_count_;
  }
  if (s.counted) --state_counts_[static_cast<std::size_t>(s.state)];
  s.state = should_be_free               ? DeviceState::free
            : s.held                     ? DeviceState::leased
            : !s.available || !s.present ? DeviceState::unavailable
            : s.draining                 ? DeviceState::draining
            : shared                     ? DeviceState::shared
                                         : DeviceState::holding;
  s.counted = s.present || s.held;
  if (s.counted) ++state_counts_[static_cast<std::size_t>(s.state)];
}

void Scheduler::set_use(Slot& s, bool held, bool on_hold) {
  const bool was_busy = s.held || s.on_hold;
  const bool was_open = s.has_slots && open_for_slots(s);
  s.held = held;
  s.on_hold = on_hold;
  refresh_slot(s);
  const bool busy = held || on_hold;
  if (s.is_slot && busy != was_busy) {
    const DeviceId parent = parent_of_.at(s.device.id);
    std::uint32_t& n = busy_slots_[parent];
    n = busy ? n + 1 : n - 1;
    refresh_slot(slots_[parent]);
  }
  if (s.has_slots && open_for_slots(s) != was_open) {
    for (DeviceId child : slots_of_.at(s.device.id)) refresh_slot(slots_[child]);
  }
}

std::optional<Rejection> Scheduler::add_device(const Device& device, Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  if (slot(device.id)) return Rejection{"device " + id_text(device.id) + " already exists"};
  if (device.model >= kMaxModelsPerKind) {
    return Rejection{"device " + id_text(device.id) + " has model " + std::to_string(device.model) +
                     ": a kind has at most " + std::to_string(kMaxModelsPerKind) + " models"};
  }
  if (device.id >= slots_.size()) slots_.resize(device.id + 1);
  Slot& s = slots_[device.id];
  const bool is_slot = s.is_slot;  // set by add_slot
  s = Slot{};
  s.is_slot = is_slot;
  s.device = device;
  s.present = true;
  s.state = DeviceState::unavailable;  // not in the index yet; refresh_slot puts it there
  ++model_count(device);
  ++device_count_;
  refresh_slot(s);
  dispatch(now, out);
  return std::nullopt;
}

std::optional<Rejection> Scheduler::add_slot(const Device& slot_device, DeviceId parent, Time now, Decisions& out) {
  const Slot* p = slot(parent);
  if (!p || !p->present) {
    return Rejection{"slot " + id_text(slot_device.id) + ": no device " + id_text(parent) + " to be a slot of"};
  }
  if (p->is_slot) {
    return Rejection{"slot " + id_text(slot_device.id) + ": device " + id_text(parent) + " is itself a slot"};
  }
  if (slot(slot_device.id)) return Rejection{"device " + id_text(slot_device.id) + " already exists"};
  // Registered before add_device indexes it, so that it enters the free index only if its device is open.
  if (slot_device.id >= slots_.size()) slots_.resize(slot_device.id + 1);
  parent_of_[slot_device.id] = parent;
  slots_of_[parent].push_back(slot_device.id);
  slots_[parent].has_slots = true;
  slots_[slot_device.id].is_slot = true;
  if (auto rejected = add_device(slot_device, now, out)) {
    parent_of_.erase(slot_device.id);
    slots_of_[parent].pop_back();
    slots_[slot_device.id].is_slot = false;
    return rejected;
  }
  return std::nullopt;
}

template <class Change>
std::optional<Rejection> Scheduler::change_device(DeviceId id, Time now, Decisions& out, bool revoke_holder,
                                                  Change change) {
  last_now_ = std::max(last_now_, now);
  Slot* s = slot(id);
  if (!s || !s->present) return Rejection{"no device " + id_text(id)};
  if (s->on_hold) end_hold(id);
  change(*s);
  refresh_slot(*s);
  if (revoke_holder && s->held) mark_revoking(entry(s->holder), PreemptReason::device_failed, out);
  if (s->has_slots) {
    for (DeviceId child : slots_of_.at(id)) {
      Slot& c = slots_[child];
      refresh_slot(c);
      if (revoke_holder && c.held) mark_revoking(entry(c.holder), PreemptReason::device_failed, out);
    }
  }
  dispatch(now, out);
  return std::nullopt;
}

std::optional<Rejection> Scheduler::remove_device(DeviceId id, Time now, Decisions& out) {
  return change_device(id, now, out, true, [&](Slot& s) {
    s.present = false;
    --model_count(s.device);
    --device_count_;
  });
}

std::optional<Rejection> Scheduler::set_available(DeviceId id, bool available, Time now, Decisions& out) {
  return change_device(id, now, out, !available, [&](Slot& s) { s.available = available; });
}

std::optional<Rejection> Scheduler::set_draining(DeviceId id, bool draining, Time now, Decisions& out) {
  return change_device(id, now, out, false, [&](Slot& s) { s.draining = draining; });
}

std::optional<Rejection> Scheduler::set_loaded(DeviceId id, BitstreamId loaded) {
  Slot* s = slot(id);
  if (!s || !s->present) return Rejection{"no device " + id_text(id)};
  if (s->on_hold) end_hold(id);
  const bool indexed = s->state == DeviceState::free;
  if (indexed) free_.erase(s->device);
  s->device.loaded = loaded;
  if (indexed) free_.insert(s->device);
  return std::nullopt;
}

std::optional<Rejection> Scheduler::set_model(DeviceId id, ModelId model, Time now, Decisions& out) {
  Slot* s = slot(id);
  if (!s || !s->present) return Rejection{"no device " + id_text(id)};
  if (model >= kMaxModelsPerKind) {
    return Rejection{"device " + id_text(id) + " cannot have model " + std::to_string(model) + " (at most " +
                     std::to_string(kMaxModelsPerKind) + " per kind)"};
  }
  last_now_ = std::max(last_now_, now);
  const bool indexed = s->state == DeviceState::free;
  if (indexed) free_.erase(s->device);
  --model_count(s->device);
  s->device.model = model;
  ++model_count(s->device);
  if (indexed) free_.insert(s->device);
  dispatch(now, out);
  return std::nullopt;
}

void Scheduler::set_tenant_weight(TenantId tenant, double weight) {
  ledger_.set_weight(tenant, weight > 0 ? weight : 1.0);
}

// --- request entries -----------------------------------------------------------------------------------------

Scheduler::Entry* Scheduler::find(RequestId id) {
  const std::uint32_t index = entry_of_.find(id);
  return index == IdMap::npos ? nullptr : &entries_[index];
}

const Scheduler::Entry* Scheduler::find(RequestId id) const { return const_cast<Scheduler*>(this)->find(id); }

Scheduler::Entry& Scheduler::entry(RequestId id) {
  Entry* e = find(id);
  if (!e) {
    std::fprintf(stderr, "accelpool scheduler: internal error: no entry for live request %llu\n",
                 static_cast<unsigned long long>(id));
    std::abort();
  }
  return *e;
}

const Scheduler::Entry& Scheduler::entry(RequestId id) const { return const_cast<Scheduler*>(this)->entry(id); }

Scheduler::Entry& Scheduler::add_entry(const Request& request) {
  std::uint32_t index;
  if (!unused_entries_.empty()) {
    index = unused_entries_.back();
    unused_entries_.pop_back();
  } else {
    index = static_cast<std::uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  Entry& e = entries_[index];
  std::vector<DeviceId> devices = std::move(e.devices);  // keep the capacity
  devices.clear();
  e = Entry{};
  e.devices = std::move(devices);
  e.request = request;
  take_estimate(e);
  e.live = true;
  entry_of_.insert(request.id, index);
  return e;
}

RequestView Scheduler::view(const Entry& e) const {
  return {e.request, e.attained_device_s, e.attained_s, e.granted_at, e.estimate_s, estimator_.distribution(e.request)};
}

void Scheduler::take_estimate(Entry& e) const {
  e.estimate_s = e.request.estimate_s ? e.request.estimate_s : estimator_.estimate_s(e.request);
}

void Scheduler::remove_entry(Entry& e) {
  entry_of_.erase(e.request.id);
  e.live = false;
  e.devices.clear();
  unused_entries_.push_back(static_cast<std::uint32_t>(&e - entries_.data()));
}

// --- requests ------------------------------------------------------------------------------------------------

std::size_t& Scheduler::model_count(const Device& d) {
  ModelCounts& counts =
      d.attach == AttachMode::passthrough ? passthrough_total_[{d.kind, d.host}] : network_total_[d.kind];
  if (d.model >= counts.size()) counts.resize(std::size_t{d.model} + 1, 0);
  return counts[d.model];
}

std::size_t Scheduler::reachable_devices(const Request& r) const {
  auto of_models = [&](const ModelCounts& counts) {
    std::size_t n = 0;
    for (std::size_t m = 0; m < counts.size(); ++m) {
      if (model_in(r.models, static_cast<ModelId>(m))) n += counts[m];
    }
    return n;
  };
  std::size_t reachable = 0;
  if (auto it = passthrough_total_.find({r.kind, r.guest_host}); it != passthrough_total_.end()) {
    reachable += of_models(it->second);
  }
  if (auto it = network_total_.find(r.kind); it != network_total_.end()) reachable += of_models(it->second);
  return reachable;
}

// Devices of a lease that request `r` could use once the lease gives them back.
std::size_t Scheduler::usable_by(const Entry& lease, const Request& r) const {
  std::size_t usable = 0;
  for (DeviceId id : lease.devices) {
    const Slot& s = slots_[id];
    if (suits(s.device, r) && s.present && s.available && !s.draining) ++usable;
  }
  return usable;
}

bool Scheduler::suits(const Device& d, const Request& r) {
  const bool reachable = d.attach == AttachMode::network || d.host == r.guest_host;
  return d.kind == r.kind && reachable && model_in(r.models, d.model);
}

FreeIndex::Eligible Scheduler::eligible(const Request& r) const {
  return free_.eligible(r.kind, r.guest_host, r.models);
}

Scheduler::BucketKey Scheduler::bucket_key(const Request& r) const {
  return {r.kind, r.guest_host, r.count, ordering_->per_tenant() ? r.tenant : TenantId{0}, r.models};
}

void Scheduler::enqueue(Entry& e, Time now) {
  e.phase = RequestPhase::waiting;
  take_estimate(e);
  e.key = ordering_->waiting_key(view(e), now);
  Bucket& bucket = buckets_[bucket_key(e.request)];
  bucket.by_key.insert(e.key);
  if (spec_.ages()) {
    e.ages_at = ages_at(e);
    aging_[e.request.kind].insert({e.ages_at, e.request.arrival, e.request.id});
    if (e.estimate_s) bucket.by_remaining.insert({remaining_estimate(e), e.key});
  }
  if (spec_.learns_images()) {
    if (e.request.bitstream != kNoBitstream) waiting_for_[e.request.bitstream].insert(e.key);
    waiting_since_[e.request.kind].insert({e.request.arrival, e.request.id});
  }
  ++waiting_count_;
}

void Scheduler::dequeue(Entry& e) {
  auto bucket = buckets_.find(bucket_key(e.request));
  bucket->second.by_key.erase(e.key);
  if (e.estimate_s) bucket->second.by_remaining.erase({remaining_estimate(e), e.key});
  if (bucket->second.by_key.empty()) buckets_.erase(bucket);
  if (spec_.ages()) {
    auto& aging = aging_[e.request.kind];
    aging.erase({e.ages_at, e.request.arrival, e.request.id});
    if (aging.empty()) aging_.erase(e.request.kind);
  }
  if (spec_.learns_images()) {
    if (e.request.bitstream != kNoBitstream) {
      auto w = waiting_for_.find(e.request.bitstream);
      w->second.erase(e.key);
      if (w->second.empty()) waiting_for_.erase(w);
    }
    auto since = waiting_since_.find(e.request.kind);
    since->second.erase({e.request.arrival, e.request.id});
    if (since->second.empty()) waiting_since_.erase(since);
  }
  --waiting_count_;
}

std::optional<Rejection> Scheduler::submit(const Request& request, Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  if (find(request.id)) return Rejection{"request " + id_text(request.id) + " already exists"};
  if (request.count == 0) return Rejection{"request " + id_text(request.id) + " asks for 0 devices"};
  if (const auto reachable = reachable_devices(request); reachable < request.count) {
    const char* which = request.models == kAnyModel ? " of its kind" : " of its kind and of a model its bitstream fits";
    return Rejection{"request " + id_text(request.id) + " asks for " + std::to_string(request.count) +
                         " devices but only " + std::to_string(reachable) + which +
                         " are reachable from its guest's host: it can never be served",
                     Rejection::Kind::infeasible};
  }
  Entry& e = add_entry(request);
  if (spec_.learns_images()) observe_arrival(request, now);
  // Fast path, same outcome as the queue: with nobody waiting and nothing reserved, a request that fits is
  // the only candidate, so it is granted at once without passing through the buckets (unless devices are on
  // hold for its bitstream: serve_held gives it those).
  apply_key_changes(now);
  if (waiting_count_ == 0 && reservations_.empty() && !(spec_.ages() && aged(e, now)) &&
      !held_for_.contains(request.bitstream) && !(spec_.hold_s && deferred(e, now))) {
    const auto eligible = this->eligible(request);
    if (eligible.free() >= request.count) {
      place(e, eligible, now);
      out.grants.push_back(start(e, now, /*protect=*/false));
      return std::nullopt;
    }
  }
  enqueue(e, now);
  dispatch(now, out);
  return std::nullopt;
}

// Takes a waiting request out of the queue and starts it on devices chosen from `eligible`, which must hold
// enough free devices for it.
void Scheduler::grant(Entry& e, const FreeIndex::Eligible& eligible, Time now, bool protect, Decisions& out) {
  dequeue(e);
  place(e, eligible, now);
  out.grants.push_back(start(e, now, protect));
}

// Lets the placement policy choose the request's devices into e.devices; under the reuse rule, a request whose
// image too few free devices hold is told which loaded images to overwrite first.
void Scheduler::place(Entry& e, const FreeIndex::Eligible& eligible, Time now) {
  e.devices.clear();
  if (!parent_of_.empty() && place_on_slots(e, eligible)) return;
  if (spec_.reuse_s && e.request.bitstream != kNoBitstream) {
    std::size_t loaded = 0;
    auto count = [&](const DeviceGroup& g) { loaded += g.holding(e.request.bitstream).size(); };
    eligible.each(eligible.passthrough, count);
    eligible.each(eligible.network, count);
    if (loaded < e.request.count) {
      const std::vector<BitstreamId> order = overwrite_order(e.request, eligible, now);
      FreeIndex::Eligible ranked = eligible;
      ranked.overwrite_first = order;
      placement_->place(e.request, ranked, e.devices);
      return;
    }
  }
  placement_->place(e.request, eligible, e.devices);
}

// Slot by slot, the free slot that (1) keeps its device's demand within its bandwidth (slowdown 1) if any does,
// then (2) holds the request's image, then (3) is on the device with the least demand, then the lowest id.
// O(count x free eligible slots).
bool Scheduler::place_on_slots(Entry& e, const FreeIndex::Eligible& eligible) {
  std::vector<DeviceId> candidates;
  auto collect = [&](const DeviceGroup& g) {
    for (DeviceId id : g.free()) candidates.push_back(id);
  };
  eligible.each(eligible.passthrough, collect);
  eligible.each(eligible.network, collect);
  if (candidates.empty() || !slots_[candidates.front()].is_slot) return false;
  const Request& r = e.request;
  std::unordered_map<DeviceId, double> added;  // demand this grant puts on each device so far
  auto demand_on = [&](DeviceId parent) {
    auto d = slot_demand_.find(parent);
    auto a = added.find(parent);
    return (d == slot_demand_.end() ? 0.0 : d->second) + (a == added.end() ? 0.0 : a->second);
  };
  for (std::uint32_t k = 0; k < r.count; ++k) {
    std::optional<std::tuple<bool, bool, double, DeviceId>> best;
    for (DeviceId id : candidates) {
      if (std::find(e.devices.begin(), e.devices.end(), id) != e.devices.end()) continue;
      const Slot& s = slots_[id];
      const double after = demand_on(parent_of_.at(id)) + r.demand;
      const bool reprogram = r.bitstream != kNoBitstream && s.device.loaded != r.bitstream;
      const std::tuple<bool, bool, double, DeviceId> score{after > 1.0, reprogram, after, id};
      if (!best || score < *best) best = score;
    }
    const DeviceId chosen = std::get<3>(*best);
    e.devices.push_back(chosen);
    added[parent_of_.at(chosen)] += r.demand;
  }
  return true;
}

// Makes a request that is in no queue a running lease on e.devices, which must be free.
Grant Scheduler::start(Entry& e, Time granted_at, bool protect) {
  assert(e.devices.size() == e.request.count);
  e.phase = RequestPhase::running;
  e.granted_at = granted_at;
  e.protected_ = protect;
  Grant g{e.request.id, {}};
  g.devices.reserve(e.devices.size());
  for (DeviceId id : e.devices) {
    Slot& s = slots_[id];
    assert(s.state == DeviceState::free);
    s.holder = e.request.id;
    set_use(s, /*held=*/true, /*on_hold=*/false);
    if (s.is_slot) slot_demand_[parent_of_.at(id)] += e.request.demand;
    const bool reprogram = e.request.bitstream != kNoBitstream && s.device.loaded != e.request.bitstream;
    if (e.request.bitstream != kNoBitstream) s.device.loaded = e.request.bitstream;
    if (spec_.hold_s) ++leased_with_[s.device.loaded];
    g.devices.push_back({id, reprogram});
  }
  ledger_.lease_started(e.request.tenant, e.request.count, granted_at);
  ++running_count_;
  track_running(e, granted_at);
  return g;
}

std::optional<Rejection> Scheduler::restore(const Request& request, std::span<const DeviceId> devices, Time granted_at,
                                            double attained_device_s) {
  const std::string what = "restoring request " + id_text(request.id) + ": ";
  if (find(request.id)) return Rejection{what + "it already exists"};
  if (request.count == 0 || devices.size() != request.count) {
    return Rejection{what + "it asks for " + std::to_string(request.count) + " devices but holds " +
                     std::to_string(devices.size())};
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const Slot* s = slot(devices[i]);
    if (!s || s->state != DeviceState::free || s->device.kind != request.kind ||
        !model_in(request.models, s->device.model) ||
        std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), devices[i]) !=
            devices.begin() + static_cast<std::ptrdiff_t>(i)) {
      return Rejection{what + "device " + id_text(devices[i]) +
                       " is unknown, not free, listed twice, of another kind or of a model it does not fit"};
    }
  }
  Entry& e = add_entry(request);
  e.attained_device_s = attained_device_s;
  e.attained_s = attained_device_s / request.count;
  e.devices.assign(devices.begin(), devices.end());
  (void)start(e, granted_at, /*protect=*/false);
  return std::nullopt;
}

// Indexes a running lease under the current policy: by estimated finish (tail guard reservations), by victim
// rank and next key change (preemption).
void Scheduler::track_running(Entry& e, Time now) {
  if (spec_.ages()) {
    if (auto finish = estimated_finish(e)) finishes_[e.request.kind].insert({*finish, e.request.id});
  }
  if (ordering_->preemptive() && !e.protected_) {
    e.victim_rank = ordering_->victim_rank(view(e), now);
    victims_[e.request.kind].insert(e.victim_rank);
    e.key_change_at = ordering_->next_key_change(view(e), now);
    if (e.key_change_at) key_changes_.insert({*e.key_change_at, e.request.id});
  }
}

// Undoes track_running: the lease stops, is being revoked, or the policy changes.
void Scheduler::untrack_running(Entry& e) {
  if (spec_.ages()) {
    auto finish = estimated_finish(e);
    auto f = finishes_.find(e.request.kind);
    if (finish && f != finishes_.end()) f->second.erase({*finish, e.request.id});
  }
  if (auto it = victims_.find(e.request.kind); it != victims_.end()) it->second.erase(e.victim_rank);
  if (e.key_change_at) key_changes_.erase({*e.key_change_at, e.request.id});
  e.key_change_at.reset();
}

void Scheduler::stop_running(Entry& e, Time now, bool may_hold) {
  if (e.phase == RequestPhase::running) untrack_running(e);  // a revoking lease was untracked already
  const double ran = std::max(0.0, now - e.granted_at);
  e.attained_s += ran;
  e.attained_device_s += ran * e.request.count;
  ledger_.lease_stopped(e.request.tenant, e.request.count, now);
  if (e.phase == RequestPhase::revoking) revoking_devices_[e.request.kind] -= e.request.count;
  for (DeviceId id : e.devices) {
    Slot& s = slots_[id];
    set_use(s, /*held=*/false, /*on_hold=*/false);
    if (s.is_slot) slot_demand_[parent_of_.at(id)] -= e.request.demand;
    if (auto n = leased_with_.find(s.device.loaded); n != leased_with_.end() && n->second > 0) --n->second;
    if (may_hold && spec_.hold_s) maybe_hold(s, now);
  }
  e.devices.clear();
  --running_count_;
}

void Scheduler::forget(Entry& e, Time now) {
  if (e.phase == RequestPhase::running) {
    estimator_.observe(e.request, e.attained_device_s + e.request.count * std::max(0.0, now - e.granted_at));
  }
  if (e.phase == RequestPhase::waiting)
    dequeue(e);
  else
    stop_running(e, now, /*may_hold=*/true);
  remove_entry(e);
}

std::optional<Rejection> Scheduler::release(RequestId id, Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  Entry* e = find(id);
  if (!e) return Rejection{"no request " + id_text(id)};
  forget(*e, now);
  dispatch(now, out);
  return std::nullopt;
}

std::optional<Rejection> Scheduler::release(std::span<const RequestId> ids, Time now, Decisions& out) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!find(ids[i])) return Rejection{"no request " + id_text(ids[i])};
    if (std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(i), ids[i]) !=
        ids.begin() + static_cast<std::ptrdiff_t>(i)) {
      return Rejection{"request " + id_text(ids[i]) + " is listed twice"};
    }
  }
  last_now_ = std::max(last_now_, now);
  for (RequestId id : ids) forget(entry(id), now);
  dispatch(now, out);
  return std::nullopt;
}

std::optional<Rejection> Scheduler::set_models(RequestId id, ModelSet models, Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  Entry* found = find(id);
  if (!found) return Rejection{"no request " + id_text(id)};
  Entry& e = *found;
  if (e.request.models == models) return std::nullopt;
  if (e.phase != RequestPhase::waiting) {
    e.request.models = models;  // its devices stay; only the next wait goes by the new set
    return std::nullopt;
  }
  dequeue(e);
  e.request.models = models;
  enqueue(e, now);
  dispatch(now, out);
  return std::nullopt;
}

std::optional<Rejection> Scheduler::requeue(RequestId id, Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  Entry* found = find(id);
  if (!found) return Rejection{"no request " + id_text(id)};
  Entry& e = *found;
  if (e.phase == RequestPhase::waiting) return Rejection{"request " + id_text(id) + " is not running"};
  stop_running(e, now);
  e.protected_ = false;
  enqueue(e, now);
  dispatch(now, out);
  return std::nullopt;
}

void Scheduler::mark_revoking(Entry& e, PreemptReason reason, Decisions& out) {
  if (e.phase != RequestPhase::running) return;
  untrack_running(e);
  e.phase = RequestPhase::revoking;
  revoking_devices_[e.request.kind] += e.request.count;
  out.preemptions.push_back({e.request.id, reason});
}

// --- time ----------------------------------------------------------------------------------------------------

void Scheduler::apply_key_changes(Time now) {
  while (!key_changes_.empty() && key_changes_.begin()->first <= now) {
    const RequestId id = key_changes_.begin()->second;
    key_changes_.erase(key_changes_.begin());
    Entry& e = entry(id);
    auto& victims = victims_[e.request.kind];
    victims.erase(e.victim_rank);
    e.victim_rank = ordering_->victim_rank(view(e), now);
    victims.insert(e.victim_rank);
    e.key_change_at = ordering_->next_key_change(view(e), now);
    // A change due exactly now was just applied; the next one must lie in the future.
    if (e.key_change_at && *e.key_change_at <= now) e.key_change_at = std::nextafter(now, now + 1);
    if (e.key_change_at) key_changes_.insert({*e.key_change_at, id});
  }
}

void Scheduler::tick(Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  dispatch(now, out);
}

std::optional<Time> Scheduler::next_wakeup() const {
  std::optional<Time> next;
  auto consider = [&](Time t) {
    if (!next || t < *next) next = t;
  };
  if (!key_changes_.empty()) consider(key_changes_.begin()->first);
  if (!hold_ends_.empty()) consider(std::max(hold_ends_.begin()->first, std::nextafter(last_now_, last_now_ + 1)));
  if (spec_.hold_s) {
    // The next waiting request whose deferral ends (it has waited hold_s): it may then take any device.
    for (const auto& [kind, since] : waiting_since_) {
      auto it = since.upper_bound({last_now_ - *spec_.hold_s, std::numeric_limits<RequestId>::max()});
      if (it != since.end()) consider(std::max(it->first + *spec_.hold_s, std::nextafter(last_now_, last_now_ + 1)));
    }
  }
  if (spec_.ages()) {
    // The next request to age: the first one per kind that has not aged yet.
    for (const auto& [kind, aging] : aging_) {
      auto it = aging.upper_bound({last_now_, std::numeric_limits<Time>::infinity(), 0});
      if (it != aging.end()) consider(std::max(std::get<0>(*it), std::nextafter(last_now_, last_now_ + 1)));
    }
  }
  return next;
}

// --- the hold rule -------------------------------------------------------------------------------------------
//
// See docs/policies.md, "The hold rule". Arrivals of each bitstream are modelled as Poisson with the mean gap
// between them (decayed: each new gap weighs 1/kHoldGapWeight, the first few weigh equally). A device whose
// lease ended while it holds bitstream b goes on hold for b, for at most hold_s seconds, when
//   - no request of its kind has waited longer than hold_s and no preempting request waits for its kind, and
//   - a request for b waits now, or the next one is more likely than not within hold_s: with gap g (the mean
//     gap, or the time since the last arrival if that is longer, so a bitstream no longer asked for stops
//     being held) that is 1 - exp(-hold_s / g) >= 1/2, i.e. hold_s / g >= ln 2; and at most
//     max(1, floor(hold_s / g)) devices (the arrivals expected within hold_s) are on hold for b at once.
// A device on hold serves only requests for b (serve_held, before the ordering's own choice) and is freed for
// everyone when its time is up.

namespace {
constexpr double kHoldGapWeight = 8;           // decay of the mean gap: the last ~8 gaps count
constexpr std::uint64_t kHoldMinArrivals = 3;  // arrivals of a bitstream before its rate is trusted
}  // namespace

void Scheduler::observe_arrival(const Request& r, Time now) {
  if (r.bitstream == kNoBitstream) return;
  if (r.bitstream >= arrivals_.size()) arrivals_.resize(std::size_t{r.bitstream} + 1);
  ArrivalRate& a = arrivals_[r.bitstream];
  if (a.seen > 0) {
    const double gap = std::max(0.0, now - a.last);
    const double weight = std::max(1.0 / static_cast<double>(a.seen), 1.0 / kHoldGapWeight);
    a.mean_gap += weight * (gap - a.mean_gap);
  }
  a.last = std::max(a.last, now);
  ++a.seen;
}

// Whether the rate of bitstream b makes a request for it more likely than not within hold_s.
bool Scheduler::likely_soon(BitstreamId b, Time now) const {
  const Time gap = arrival_gap(b, now);
  return std::isfinite(gap) && (!(gap > 0) || *spec_.hold_s / gap >= std::log(2.0));
}

Time Scheduler::arrival_gap(BitstreamId b, Time now) const {
  if (b >= arrivals_.size() || arrivals_[b].seen < kHoldMinArrivals) return std::numeric_limits<Time>::infinity();
  const ArrivalRate& a = arrivals_[b];
  return std::max(a.mean_gap, now - a.last);
}

bool Scheduler::deferred(const Entry& e, Time now) const {
  const Request& r = e.request;
  if (r.bitstream == kNoBitstream || now - r.arrival >= *spec_.hold_s) return false;
  auto leased = leased_with_.find(r.bitstream);
  if (leased == leased_with_.end() || leased->second == 0) return false;  // no device of its image will free
  // Completions of b run at its arrival rate in steady state: defer only if one is likely within hold_s.
  if (!likely_soon(r.bitstream, now)) return false;
  const auto eligible = this->eligible(r);
  std::size_t loaded = 0;
  auto count = [&](const DeviceGroup& g) { loaded += g.holding(r.bitstream).size(); };
  eligible.each(eligible.passthrough, count);
  eligible.each(eligible.network, count);
  return loaded < r.count;
}

const PriorityKey* Scheduler::first_not_deferred(const Bucket& bucket, Time now) const {
  std::size_t examined = 0;
  for (const PriorityKey& k : bucket.by_key) {
    if (!deferred(entry(k.id), now)) return &k;
    if (++examined == kMaxBackfillExamined) break;
  }
  return nullptr;
}

void Scheduler::maybe_hold(Slot& s, Time now) {
  const BitstreamId b = s.device.loaded;
  if (b == kNoBitstream || s.state != DeviceState::free) return;
  const KindId kind = s.device.kind;
  if (reservations_.contains(kind)) return;
  if (auto since = waiting_since_.find(kind);
      since != waiting_since_.end() && !since->second.empty() && now - since->second.begin()->first > *spec_.hold_s) {
    return;
  }
  std::size_t cap = 1;
  if (!waiting_for_.contains(b)) {
    if (!likely_soon(b, now)) return;
    const double gap = arrival_gap(b, now);
    const double expected = gap > 0 ? *spec_.hold_s / gap : 1e9;
    cap = static_cast<std::size_t>(std::max(1.0, std::min(std::floor(expected), 1e9)));
  } else {
    cap = std::numeric_limits<std::size_t>::max();  // a request for b waits: serve_held gives it the device now
  }
  std::set<DeviceId>& held = held_for_[b];
  if (held.size() >= cap) return;
  const Time until = now + *spec_.hold_s;
  held.insert(s.device.id);
  holds_[s.device.id] = Hold{until, b};
  hold_ends_.insert({until, s.device.id});
  set_use(s, s.held, /*on_hold=*/true);
}

void Scheduler::end_hold(DeviceId id) {
  auto it = holds_.find(id);
  if (it == holds_.end()) return;
  const Hold hold = it->second;
  holds_.erase(it);
  hold_ends_.erase({hold.until, id});
  auto held = held_for_.find(hold.bitstream);
  held->second.erase(id);
  if (held->second.empty()) held_for_.erase(held);
  Slot& s = slots_[id];
  set_use(s, s.held, /*on_hold=*/false);
}

void Scheduler::end_holds_due(Time now) {
  while (!hold_ends_.empty() && hold_ends_.begin()->first <= now) end_hold(hold_ends_.begin()->second);
}

void Scheduler::end_all_holds() {
  while (!holds_.empty()) end_hold(holds_.begin()->first);
}

// For each bitstream with devices on hold, its waiting requests best first: one that the held devices it suits
// cover is started on them; one that needs more takes them with free devices through placement, if enough are
// free. O(waiting requests of those bitstreams x held devices).
void Scheduler::serve_held(Time now, Decisions& out) {
  std::vector<BitstreamId> bitstreams;
  for (const auto& [b, held] : held_for_) {
    if (waiting_for_.contains(b)) bitstreams.push_back(b);
  }
  for (BitstreamId b : bitstreams) {
    std::vector<RequestId> candidates;
    for (const PriorityKey& k : waiting_for_.at(b)) candidates.push_back(k.id);
    for (RequestId id : candidates) {
      auto held = held_for_.find(b);
      if (held == held_for_.end()) break;
      Entry& e = entry(id);
      std::vector<DeviceId> usable;
      for (DeviceId d : held->second) {
        if (suits(slots_[d].device, e.request)) usable.push_back(d);
      }
      if (usable.empty()) continue;
      if (usable.size() >= e.request.count) {
        usable.resize(e.request.count);
        for (DeviceId d : usable) end_hold(d);
        dequeue(e);
        e.devices = std::move(usable);
        out.grants.push_back(start(e, now, /*protect=*/false));
      } else if (eligible(e.request).free() + usable.size() >= e.request.count) {
        for (DeviceId d : usable) end_hold(d);
        grant(e, eligible(e.request), now, /*protect=*/false, out);
      }
    }
  }
}

// --- the reuse rule ------------------------------------------------------------------------------------------
//
// See docs/policies.md, "The reuse rule". Free devices are a cache of loaded images: a grant that finds its image
// on enough free devices costs no programming (a hit), any other overwrites free devices (a miss). The rule
// raises the hit rate in both regimes of a loaded pool:
//   - while requests wait, a device that frees holding b goes to the best waiting request for b rather than to
//     the ordering's choice (which holds b about as often as b's share of requests), unless a request of the kind
//     has waited reuse_s or more: the ordering then decides alone, so the rule passes no request over once it
//     has waited reuse_s;
//   - while devices idle, a miss overwrites the free copy with the least expected demand: arrival rate of its
//     image (learned as for the hold rule) over the free devices holding it, so popular images keep free copies
//     in proportion to their demand and rare ones give way first.
// Neither idles a device: the rule is work-conserving. Slots are left to their own placement (place_on_slots),
// which already prefers a slot holding the image among those within their device's bandwidth.

void Scheduler::serve_loaded(Time now, Decisions& out, const std::set<KindId>& blocked,
                             const std::map<KindId, Window>& windows) {
  std::vector<BitstreamId> bitstreams;
  bitstreams.reserve(waiting_for_.size());
  for (const auto& [b, waiting] : waiting_for_) bitstreams.push_back(b);
  std::vector<RequestId> candidates;
  for (BitstreamId b : bitstreams) {
    if (free_count_ == 0) return;
    auto waiting = waiting_for_.find(b);
    if (waiting == waiting_for_.end()) continue;
    candidates.clear();
    for (const PriorityKey& k : waiting->second) {
      candidates.push_back(k.id);
      if (candidates.size() == kMaxBackfillExamined) break;
    }
    for (RequestId id : candidates) {
      Entry& e = entry(id);
      const KindId kind = e.request.kind;
      if (blocked.contains(kind) || windows.contains(kind) || reuse_passes_over_aged(e, now)) continue;
      const auto eligible = this->eligible(e.request);
      e.devices.clear();
      auto take_loaded = [&](const DeviceGroup& g) {
        for (DeviceId d : g.holding(b)) {
          if (e.devices.size() == e.request.count) return;
          if (!slots_[d].is_slot) e.devices.push_back(d);  // slots go by their own placement (place_on_slots)
        }
      };
      eligible.each(eligible.passthrough, take_loaded);
      eligible.each(eligible.network, take_loaded);
      if (e.devices.size() < e.request.count) {
        e.devices.clear();
        continue;
      }
      dequeue(e);
      out.grants.push_back(start(e, now, /*protect=*/false));
    }
  }
}

bool Scheduler::reuse_passes_over_aged(const Entry& e, Time now) const {
  auto since = waiting_since_.find(e.request.kind);
  if (since == waiting_since_.end()) return false;
  for (const auto& [arrival, id] : since->second) {
    if (id != e.request.id) return now - arrival >= *spec_.reuse_s;
  }
  return false;
}

std::vector<BitstreamId> Scheduler::overwrite_order(const Request& r, const FreeIndex::Eligible& eligible,
                                                    Time now) const {
  std::map<BitstreamId, std::size_t> copies;  // free eligible devices holding each image
  auto count = [&](const DeviceGroup& g) {
    g.each_loaded([&](BitstreamId b, const IdSet& devices) {
      if (b != r.bitstream) copies[b] += devices.size();
    });
  };
  eligible.each(eligible.passthrough, count);
  eligible.each(eligible.network, count);
  std::vector<std::pair<double, BitstreamId>> ranked;  // (expected arrivals per second per free copy, image)
  ranked.reserve(copies.size());
  for (const auto& [b, n] : copies) {
    const Time gap = arrival_gap(b, now);
    const double rate = !std::isfinite(gap) ? 0.0 : gap > 0 ? 1.0 / gap : std::numeric_limits<double>::infinity();
    ranked.push_back({rate / static_cast<double>(n), b});
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<BitstreamId> order;
  order.reserve(ranked.size());
  for (const auto& [per_copy, b] : ranked) order.push_back(b);
  return order;
}

// --- dispatch ------------------------------------------------------------------------------------------------

// Serves requests that waited past the tail guard, oldest first, per kind. If the oldest aged request of a
// kind does not fit, it gets a reservation, EASY-backfilling style: from the running leases' estimated
// finish times, the "shadow" time at which enough devices will be free for it; until then others of the kind
// may start only if they are estimated to end by the shadow time, or if they use devices it will not need
// then. Without estimates nothing passes it.
bool Scheduler::aged(const Entry& e, Time now) const { return now >= ages_at(e); }

// Slowdown aging compares the time since arrival with the run time the request is known to need at least:
// its estimate, or the service it already received if that is more (a preempted request that outlived its
// estimate has run that long), so it ages when its slowdown so far reaches the bound.
Time Scheduler::ages_at(const Entry& e) const {
  Time at = std::numeric_limits<Time>::infinity();
  if (spec_.tail_guard_s) at = e.request.arrival + *spec_.tail_guard_s;
  if (spec_.age_slowdown && e.estimate_s) {
    at = std::min(at, e.request.arrival + *spec_.age_slowdown * std::max({1.0, *e.estimate_s, e.attained_s}));
  }
  return at;
}

void Scheduler::serve_aged(Time now, Decisions& out, std::map<KindId, Window>& windows) {
  std::vector<KindId> kinds;
  kinds.reserve(aging_.size());
  for (const auto& [kind, aging] : aging_) kinds.push_back(kind);
  std::sort(kinds.begin(), kinds.end());  // deterministic order regardless of hashing
  for (KindId kind : kinds) {
    while (true) {
      auto it = aging_.find(kind);
      if (it == aging_.end() || it->second.empty()) break;
      Entry& e = entry(std::get<2>(*it->second.begin()));
      if (!aged(e, now)) break;
      const auto eligible = this->eligible(e.request);
      if (eligible.free() < e.request.count) {
        if (auto window = reservation_window(e.request, eligible.free(), now)) windows[kind] = *window;
        break;
      }
      grant(e, eligible, now, /*protect=*/true, out);
    }
  }
}

std::optional<Scheduler::Window> Scheduler::reservation_window(const Request& r, std::size_t free_now, Time now) const {
  const std::size_t needed = r.count - free_now;
  std::size_t freed = 0;
  std::size_t examined = 0;
  auto f = finishes_.find(r.kind);
  if (f == finishes_.end()) return Window{now, 0};
  for (const auto& [finish, id] : f->second) {
    if (++examined > kMaxLeasesExamined) break;
    freed += usable_by(entry(id), r);
    if (freed >= needed) {
      // Every lease it waits for has outlived its estimate: when they end is unknown (under heavy-tailed run
      // times a lease past its mean has far to go), and a reservation for "now" would idle the kind until
      // then. No reservation: it keeps its place at the head and starts as soon as it fits.
      if (finish <= now) return std::nullopt;
      return Window{finish, freed - needed};
    }
  }
  return Window{now, 0};  // leases without estimates hold what it needs: let nothing pass
}

std::optional<Time> Scheduler::estimated_finish(const Entry& e) const {
  if (!e.estimate_s) return std::nullopt;
  return e.granted_at + remaining_estimate(e);
}

// Full EASY backfilling inside one bucket: its requests all take the same number of devices, so either all
// of them fit in the devices the reservation will not need (then the head, the best, goes) or only those
// estimated to end by the shadow time may start. Those are a prefix of `by_remaining`; the best key among
// the first kMaxBackfillExamined of them is chosen, so the cost is O(kMaxBackfillExamined) per bucket
// whatever the queue length, and exact whenever fewer than that many requests of the bucket end in time.
const PriorityKey* Scheduler::backfill_candidate(const BucketKey& bk, const Bucket& bucket, const Window& window,
                                                 Time now) const {
  if (bk.count <= window.extra) return &*bucket.by_key.begin();
  const double time_left = window.shadow - now;
  const PriorityKey* best = nullptr;
  std::size_t examined = 0;
  for (auto it = bucket.by_remaining.begin(); it != bucket.by_remaining.end() && it->first <= time_left; ++it) {
    if (!best || it->second < *best) best = &it->second;
    if (++examined == kMaxBackfillExamined) break;
  }
  return best;
}

// Devices given back by preempted leases belong to the request they were preempted for: until it fits, no
// one else of its kind is granted (not even the victims), or partial frees would be taken by others and the
// same leases preempted again and again.
void Scheduler::serve_reserved(Time now, Decisions& out, std::set<KindId>& blocked) {
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    const auto [kind, id] = *it;
    Entry* e = find(id);
    if (!e || e->phase != RequestPhase::waiting) {
      it = reservations_.erase(it);
      continue;
    }
    const Request& r = e->request;
    const auto eligible = this->eligible(r);
    if (eligible.free() >= r.count) {
      grant(*e, eligible, now, /*protect=*/false, out);
      it = reservations_.erase(it);
    } else if (auto rev = revoking_devices_.find(kind); rev != revoking_devices_.end() && rev->second > 0) {
      blocked.insert(kind);
      ++it;
    } else {
      it = reservations_.erase(it);  // the victims are gone and it still does not fit: ordinary rules again
    }
  }
}

void Scheduler::dispatch(Time now, Decisions& out) {
  apply_key_changes(now);
  std::set<KindId> blocked;          // kinds whose free devices are held for a preempting request
  std::map<KindId, Window> windows;  // kinds with an aged request waiting: only backfill that keeps its place
  if (!holds_.empty()) end_holds_due(now);
  if (spec_.ages()) serve_aged(now, out, windows);
  if (!holds_.empty()) serve_held(now, out);
  if (!reservations_.empty()) serve_reserved(now, out, blocked);
  if (spec_.reuse_s && !waiting_for_.empty()) serve_loaded(now, out, blocked, windows);
  const bool per_tenant = ordering_->per_tenant();
  while (free_count_ > 0 && !buckets_.empty()) {
    // The best head among buckets whose head fits now.
    const PriorityKey* best = nullptr;
    double best_rank = 0;
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const BucketKey& bk = it->first;
      if (blocked.count(bk.kind) || free_.free_of_kind(bk.kind) < bk.count) {
        // Skip the rest of this kind's buckets with this gang size or larger: none can fit.
        if (blocked.count(bk.kind) || free_.free_of_kind(bk.kind) == 0) {
          it = buckets_.lower_bound(BucketKey{bk.kind + 1, 0, 0, 0, 0});
        } else {
          ++it;
        }
        continue;
      }
      if (free_.eligible(bk.kind, bk.host, bk.models).free() >= bk.count) {
        const PriorityKey* head = &*it->second.by_key.begin();
        if (auto w = windows.find(bk.kind); w != windows.end()) {
          head = backfill_candidate(bk, it->second, w->second, now);
        } else if (spec_.hold_s) {
          head = first_not_deferred(it->second, now);
        }
        if (!head) {
          ++it;
          continue;
        }
        const double rank = per_tenant ? ordering_->tenant_rank(ledger_, bk.tenant, now) : 0;
        if (!best || rank < best_rank || (rank == best_rank && *head < *best)) {
          best = head;
          best_rank = rank;
        }
      }
      ++it;
    }
    if (!best) break;
    Entry& e = entry(best->id);
    if (auto w = windows.find(e.request.kind); w != windows.end()) w->second.take(e, now);
    grant(e, eligible(e.request), now, /*protect=*/false, out);
  }
  for (const auto& [kind, w] : windows) blocked.insert(kind);  // no preemption around a reservation either
  if (ordering_->preemptive() && spec_.preemption) preempt_for_waiting(now, out, blocked);
}

// For each kind whose best waiting request cannot be placed, preempts the lowest-ranked running leases that
// it strictly outranks, if together with the free devices they make room for it. One request per kind per
// event, and none while earlier preemptions of that kind are still giving their devices back.
void Scheduler::preempt_for_waiting(Time now, Decisions& out, const std::set<KindId>& blocked) {
  std::map<KindId, const PriorityKey*> best_per_kind;
  for (const auto& [bk, bucket] : buckets_) {
    if (blocked.count(bk.kind)) continue;
    const PriorityKey*& best = best_per_kind[bk.kind];
    if (!best || *bucket.by_key.begin() < *best) best = &*bucket.by_key.begin();
  }
  for (const auto& [kind, candidate_key] : best_per_kind) {
    if (auto r = revoking_devices_.find(kind); r != revoking_devices_.end() && r->second > 0) continue;
    auto v = victims_.find(kind);
    if (v == victims_.end() || v->second.empty()) continue;
    const Entry& candidate = entry(candidate_key->id);
    const Request& c = candidate.request;
    const std::size_t free_now = eligible(c).free();
    if (free_now >= c.count) continue;  // it fits: it is blocked by something else, not by running leases
    std::size_t gathered = free_now;
    std::vector<Entry*> chosen;
    std::size_t examined = 0;
    for (auto it = v->second.rbegin(); it != v->second.rend() && gathered < c.count; ++it) {
      if (++examined > kMaxLeasesExamined) break;
      Entry& victim = entry(it->id);
      if (!(candidate_key->primary < ordering_->running_key(view(victim), now).primary)) break;
      const std::size_t usable = usable_by(victim, c);
      if (usable == 0) continue;
      gathered += usable;
      chosen.push_back(&victim);
    }
    if (gathered < c.count) continue;
    for (Entry* victim : chosen) mark_revoking(*victim, PreemptReason::priority, out);
    reservations_[kind] = c.id;
  }
}

// --- policy switch -------------------------------------------------------------------------------------------

std::optional<Rejection> Scheduler::set_policy(const PolicySpec& spec, Time now, Decisions& out) {
  last_now_ = std::max(last_now_, now);
  std::string error;
  auto ordering = make_ordering(spec.ordering, &error);
  if (!ordering) return Rejection{error};
  auto placement = make_placement(spec.placement, &error);
  if (!placement) return Rejection{error};
  if (std::string why = invalid_option(spec); !why.empty()) return Rejection{why};

  std::vector<Entry*> waiting;
  std::vector<Entry*> running;
  for (Entry& e : entries_) {
    if (!e.live) continue;
    if (e.phase == RequestPhase::waiting)
      waiting.push_back(&e);
    else if (e.phase == RequestPhase::running)
      running.push_back(&e);
  }
  for (Entry* e : waiting) dequeue(*e);
  for (Entry* e : running) untrack_running(*e);  // under the old policy's indexes
  end_all_holds();
  spec_ = spec;
  ordering_ = std::move(ordering);
  placement_ = std::move(placement);
  free_ = FreeIndex(index_needs());
  for (const Slot& s : slots_) {
    if (s.state == DeviceState::free) free_.insert(s.device);
  }
  for (Entry* e : waiting) enqueue(*e, now);
  for (Entry* e : running) track_running(*e, now);
  dispatch(now, out);
  return std::nullopt;
}

// --- views ---------------------------------------------------------------------------------------------------

std::optional<RequestPhase> Scheduler::phase(RequestId id) const {
  const Entry* e = find(id);
  if (!e) return std::nullopt;
  return e->phase;
}

std::optional<DeviceState> Scheduler::device_state(DeviceId id) const {
  const Slot* s = slot(id);
  if (!s) return std::nullopt;
  return s->state;
}

const Device* Scheduler::device(DeviceId id) const {
  const Slot* s = slot(id);
  return s ? &s->device : nullptr;
}

std::vector<DeviceId> Scheduler::slots_of(DeviceId id) const {
  std::vector<DeviceId> out;
  if (auto it = slots_of_.find(id); it != slots_of_.end()) {
    for (DeviceId child : it->second) {
      if (slot(child)) out.push_back(child);
    }
  }
  return out;
}

std::optional<DeviceId> Scheduler::parent_of(DeviceId id) const {
  if (!slot(id)) return std::nullopt;
  auto it = parent_of_.find(id);
  if (it == parent_of_.end()) return std::nullopt;
  return it->second;
}

std::optional<Scheduler::Hold> Scheduler::hold_of(DeviceId id) const {
  auto it = holds_.find(id);
  if (it == holds_.end()) return std::nullopt;
  return it->second;
}

std::optional<Time> Scheduler::expected_start(RequestId id, Time now) const {
  const Entry* e = find(id);
  if (!e || e->phase != RequestPhase::waiting || !aged(*e, now)) return std::nullopt;
  // Only the first aged request of its kind holds the reservation (serve_aged).
  auto aging = aging_.find(e->request.kind);
  if (aging == aging_.end() || aging->second.empty() || std::get<2>(*aging->second.begin()) != id) return std::nullopt;
  const auto free = eligible(e->request).free();
  if (free >= e->request.count) return std::nullopt;  // it fits now: served at the next dispatch
  auto window = reservation_window(e->request, free, now);
  if (!window || window->shadow <= now) return std::nullopt;
  return window->shadow;
}

std::vector<DeviceId> Scheduler::devices_of(RequestId id) const {
  const Entry* e = find(id);
  if (!e) return {};
  return e->devices;
}

std::vector<RequestId> Scheduler::queue_order(Time now, std::size_t limit) const {
  struct Item {
    double rank;
    PriorityKey key;
    auto operator<=>(const Item&) const = default;
  };
  const bool per_tenant = ordering_->per_tenant();
  if (!spec_.ages()) {
    // Each bucket's requests are in key order and share one rank, so the head of the whole order is a merge of
    // the buckets' heads: O(limit log buckets), not a pass over every waiting request (100,000 of them made each
    // refresh of the dashboards' queue cost the owner thread tens of milliseconds).
    struct Head {
      Item item;
      std::set<PriorityKey>::const_iterator next, end;
    };
    auto later = [](const Head& a, const Head& b) { return b.item < a.item; };
    std::vector<Head> heads;
    for (const auto& [bk, bucket] : buckets_) {
      if (bucket.by_key.empty()) continue;
      const double rank = per_tenant ? ordering_->tenant_rank(ledger_, bk.tenant, now) : 0;
      heads.push_back({{rank, *bucket.by_key.begin()}, std::next(bucket.by_key.begin()), bucket.by_key.end()});
    }
    std::make_heap(heads.begin(), heads.end(), later);
    std::vector<RequestId> ids;
    ids.reserve(std::min(limit, waiting_count_));
    while (!heads.empty() && ids.size() < limit) {
      std::pop_heap(heads.begin(), heads.end(), later);
      Head& h = heads.back();
      ids.push_back(h.item.key.id);
      if (h.next == h.end) {
        heads.pop_back();
        continue;
      }
      h.item.key = *h.next++;
      std::push_heap(heads.begin(), heads.end(), later);
    }
    return ids;
  }
  std::vector<Item> items;
  items.reserve(waiting_count_);
  for (const auto& [bk, bucket] : buckets_) {
    const double rank = per_tenant ? ordering_->tenant_rank(ledger_, bk.tenant, now) : 0;
    for (const PriorityKey& k : bucket.by_key) items.push_back({rank, k});
  }
  // Aged requests come first, in the order they aged, as serve_aged would take them; then the rest by key.
  auto aged_end = items.begin();
  if (spec_.ages()) {
    aged_end = std::partition(items.begin(), items.end(), [&](const Item& i) { return aged(entry(i.key.id), now); });
  }
  auto aged_order = [&](const Item& a, const Item& b) {
    const Entry& ea = entry(a.key.id);
    const Entry& eb = entry(b.key.id);
    return std::tuple{ea.ages_at, ea.request.arrival, ea.request.id} <
           std::tuple{eb.ages_at, eb.request.arrival, eb.request.id};
  };
  // Sorts the first `n` of [first, last) into place; returns how many of `limit` are left for what follows.
  auto head = [](auto first, auto last, std::size_t n, auto less) {
    n = std::min<std::size_t>(n, static_cast<std::size_t>(last - first));
    std::partial_sort(first, first + static_cast<std::ptrdiff_t>(n), last, less);
    return n;
  };
  std::size_t aged_shown = head(items.begin(), aged_end, limit, aged_order);
  std::vector<RequestId> ids;
  ids.reserve(std::min(limit, items.size()));
  for (auto it = items.begin(); it != items.begin() + static_cast<std::ptrdiff_t>(aged_shown); ++it)
    ids.push_back(it->key.id);
  if (aged_shown == static_cast<std::size_t>(aged_end - items.begin())) {
    std::size_t rest = head(aged_end, items.end(), limit - aged_shown, std::less<Item>{});
    for (auto it = aged_end; it != aged_end + static_cast<std::ptrdiff_t>(rest); ++it) ids.push_back(it->key.id);
  }
  return ids;
}

}  // namespace accelpool::scheduler
