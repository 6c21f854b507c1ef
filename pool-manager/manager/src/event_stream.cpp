#include "event_stream.hpp"

#include "json_codec.hpp"

#include <boost/json/serialize.hpp>

#include <algorithm>
#include <utility>

namespace accelpool::manager {

namespace json = boost::json;

namespace {

json::object viewer_json(const Viewer& v) {
  if (v.admin()) return {{"role", "admin"}};
  return {{"role", "tenant"}, {"tenant", v.tenant}};
}

// Appends `item` to a JSON array's text being built in `out` (which ends with '[' or an earlier item).
void append_item(std::string& out, const std::string& item) {
  if (out.back() != '[') out += ',';
  out += item;
}

bool is_live(LeaseState s) { return s == LeaseState::granted || s == LeaseState::revoking; }

}  // namespace

EventStream::EventStream(PoolCore& core, const Clock& clock) : core_(core), clock_(clock) {}

void EventStream::start() {
  if (active_) return;
  active_ = true;
  load_hosts_after_ = "";
  load_devices_after_ = "";
  now_ = clock_.now();
}

void EventStream::stop() {
  active_ = false;
  load_hosts_after_.reset();
  load_devices_after_.reset();
  pending_devices_.clear();
  pending_hosts_.clear();
  pending_leases_.clear();
  devices_.clear();
  holding_.clear();
  hosts_.clear();
  live_.clear();
  queue_.clear();
  changes_ = {};
  sealed_ = {};
  delta_cache_.clear();
  snapshot_cache_.clear();
}

void EventStream::note(PoolCore::Touched touched) {
  if (!active_) return;
  pending_devices_.merge(touched.devices);
  pending_hosts_.merge(touched.hosts);
  pending_leases_.merge(touched.leases);
  // A hold ends inside the scheduler without a commit touching its device: held devices are read at each commit.
  pending_devices_.insert(holding_.begin(), holding_.end());
}

void EventStream::put_device(const DeviceView& view) {
  DeviceText t;
  json::object o = to_json(view);
  t.admin = json::serialize(o);
  if (view.lease) {
    t.lease = view.lease;
    o["lease"] = nullptr;
    t.anonymous = json::serialize(o);
  }
  // The live leases on it (its own or its slots') are read too: a loading pool finds them this way.
  if (view.lease && !live_.count(*view.lease)) pending_leases_.insert(*view.lease);
  for (const auto& slot : view.slots) {
    if (slot.lease && !live_.count(*slot.lease)) pending_leases_.insert(*slot.lease);
  }
  const bool holding = view.state == "holding" || std::any_of(view.slots.begin(), view.slots.end(),
                                                              [](const SlotView& s) { return s.state == "holding"; });
  if (holding)
    holding_.insert(view.record.name);
  else
    holding_.erase(view.record.name);
  devices_[view.record.name] = std::move(t);
  changes_.devices.insert(view.record.name);
}

void EventStream::read_device(const std::string& name) {
  auto view = core_.device(name);
  if (!view) {
    holding_.erase(name);
    if (devices_.erase(name)) changes_.devices.insert(name);
    return;
  }
  if (!view->record.parent.empty()) return read_device(view->record.parent);  // a slot shows in its device
  put_device(*view);
}

void EventStream::read_host(const std::string& name) {
  auto view = core_.host(name);
  if (!view) {
    if (hosts_.erase(name)) changes_.hosts.insert(name);
    return;
  }
  hosts_[name] = json::serialize(to_json(*view));
  changes_.hosts.insert(name);
  // Its loss or return changes every device's availability.
  for (const auto& d : core_.host_devices(name)) {
    if (d.record.parent.empty()) put_device(d);
  }
}

void EventStream::read_lease(LeaseId id) {
  auto lease = core_.get(Caller::admin(), id);
  if (!lease) return;
  // Its devices changed holder (or will show it): they are read again.
  pending_devices_.insert(lease->devices.begin(), lease->devices.end());
  if (is_live(lease->state)) {
    live_[id] = {lease->tenant, json::serialize(to_json(*lease))};
    changes_.leases.insert(id);
    return;
  }
  auto was = live_.find(id);
  const bool was_live = was != live_.end();
  if (was_live) {
    changes_.gone_tenant[id] = was->second.tenant;
    changes_.leases.insert(id);
    live_.erase(was);
  }
  // Ended since the last refresh (a lease that was live then, or that lived and ended between two refreshes).
  if (is_terminal(lease->state) && (was_live || lease->ended_at >= now_)) {
    changes_.ended.push_back({lease->tenant, json::serialize(to_json(*lease))});
  }
}

bool EventStream::work(std::size_t budget) {
  if (!active_) return true;
  PageSpec spec;
  spec.limit = std::clamp<std::size_t>(budget, 1, PageSpec::kMaxLimit);
  if (load_hosts_after_) {  // the first load: the hosts a page at a time, then the devices
    if (!load_hosts_after_->empty()) spec.after = *load_hosts_after_;
    auto page = core_.host_page({}, spec);
    for (const auto& h : page.hosts) hosts_[h.name] = json::serialize(to_json(h));
    load_hosts_after_ = page.next;
    return false;
  }
  if (load_devices_after_) {
    if (!load_devices_after_->empty()) spec.after = *load_devices_after_;
    auto page = core_.device_page({}, spec);
    for (const auto& d : page.devices) put_device(d);
    load_devices_after_ = page.next;
    return false;
  }
  std::size_t done = 0;
  auto take = [&](auto& pending, auto&& read) {
    while (!pending.empty() && done < budget) {
      auto key = *pending.begin();
      pending.erase(pending.begin());
      read(key);
      ++done;
    }
  };
  take(pending_leases_, [&](LeaseId id) { read_lease(id); });
  take(pending_hosts_, [&](const std::string& name) { read_host(name); });
  take(pending_devices_, [&](const std::string& name) { read_device(name); });
  return pending_leases_.empty() && pending_hosts_.empty() && pending_devices_.empty();
}

void EventStream::refresh() {
  now_ = clock_.now();
  auto queue = core_.queue(kQueueScanned);
  bool queue_changed = queue.size() != queue_.size();
  for (std::size_t i = 0; !queue_changed && i < queue.size(); ++i) queue_changed = queue[i].id != queue_[i].id;
  queue_ = std::move(queue);
  changes_.queue = queue_changed;
  Counters n = core_.counters();
  counters_ = {{"grants", n.grants},
               {"reprogrammings", n.reprogrammings},
               {"preemptions", n.preemptions},
               {"expirations", n.expirations}};
  policy_ = core_.policy();
  stats_ = to_json(core_.stats(kStatsWindowS));
  queue_length_ = core_.queue_length();
  sealed_ = std::exchange(changes_, {});
  ++sequence_;
  delta_cache_.clear();
  snapshot_cache_.clear();
}

bool EventStream::sees_lease(const Viewer& viewer, LeaseId id) const {
  if (viewer.admin()) return true;
  auto it = live_.find(id);
  return it != live_.end() && it->second.tenant == viewer.tenant;
}

const std::string& EventStream::device_text(const Viewer& viewer, const DeviceText& device) const {
  if (!device.lease || sees_lease(viewer, *device.lease)) return device.admin;
  return device.anonymous;
}

json::object EventStream::summary(const Viewer& viewer) const {
  json::object stats = stats_;
  if (!viewer.admin()) {
    json::object own;
    if (auto* mine = stats_.at("by_tenant").as_object().if_contains(viewer.tenant)) own[viewer.tenant] = *mine;
    stats["by_tenant"] = std::move(own);
    stats.erase("by_bitstream");
  }
  return {{"now", now_},
          {"policy", policy_},
          {"counters", counters_},
          {"queue_length", queue_length_},
          {"stats", std::move(stats)}};
}

std::string EventStream::queue_text(const Viewer& viewer) const {
  json::array out;
  const std::size_t scanned = viewer.admin() ? std::min(queue_.size(), kQueueShown) : queue_.size();
  for (std::size_t i = 0; i < scanned && out.size() < kQueueShown; ++i) {
    if (!viewer.admin() && queue_[i].tenant != viewer.tenant) continue;
    out.emplace_back(queue_entry_json(queue_[i], i + 1, core_.expected_start(queue_[i].id)));
  }
  return json::serialize(out);
}

std::shared_ptr<const std::string> EventStream::snapshot(const Viewer& viewer) const {
  auto& cached = snapshot_cache_[viewer.tenant];
  if (cached) return cached;
  std::string devices = "[", hosts = "[", leases = "[";
  for (const auto& [name, d] : devices_) append_item(devices, device_text(viewer, d));
  for (const auto& [name, h] : hosts_) append_item(hosts, h);
  for (const auto& [id, l] : live_) {
    if (sees_lease(viewer, id)) append_item(leases, l.text);
  }
  return cached = std::make_shared<const std::string>(
             "event: snapshot\ndata: {\"seq\":" + std::to_string(sequence_) +
             ",\"viewer\":" + json::serialize(viewer_json(viewer)) +
             ",\"summary\":" + json::serialize(summary(viewer)) + ",\"devices\":" + devices + "],\"hosts\":" + hosts +
             "],\"leases\":" + leases + "],\"queue\":" + queue_text(viewer) + "}\n\n");
}

std::string EventStream::delta(const Viewer& viewer) const {
  auto cached = delta_cache_.find(viewer.tenant);
  if (cached != delta_cache_.end()) return cached->second;
  const Changes& c = sealed_;
  std::string up = "[", gone = "[";
  for (const auto& name : c.devices) {
    auto it = devices_.find(name);
    if (it == devices_.end())
      append_item(gone, json::serialize(json::value(name)));
    else
      append_item(up, device_text(viewer, it->second));
  }
  std::string out = "event: delta\ndata: {\"seq\":" + std::to_string(sequence_) +
                    ",\"summary\":" + json::serialize(summary(viewer)) + ",\"devices\":{\"upsert\":" + up +
                    "],\"remove\":" + gone + "]}";
  up = "[";
  gone = "[";
  for (const auto& name : c.hosts) {
    auto it = hosts_.find(name);
    if (it == hosts_.end())
      append_item(gone, json::serialize(json::value(name)));
    else
      append_item(up, it->second);
  }
  out += ",\"hosts\":{\"upsert\":" + up + "],\"remove\":" + gone + "]}";
  up = "[";
  gone = "[";
  std::string ended = "[";
  for (auto id : c.leases) {
    auto it = live_.find(id);
    if (it != live_.end()) {
      if (sees_lease(viewer, id)) append_item(up, it->second.text);
    } else if (auto t = c.gone_tenant.find(id);
               t != c.gone_tenant.end() && (viewer.admin() || t->second == viewer.tenant)) {
      append_item(gone, std::to_string(id));
    }
  }
  for (const auto& l : c.ended) {
    if (viewer.admin() || l.tenant == viewer.tenant) append_item(ended, l.text);
  }
  out += ",\"leases\":{\"upsert\":" + up + "],\"remove\":" + gone + "],\"ended\":" + ended + "]}";
  if (c.queue) out += ",\"queue\":" + queue_text(viewer);
  out += "}\n\n";
  return delta_cache_[viewer.tenant] = std::move(out);
}

}  // namespace accelpool::manager
