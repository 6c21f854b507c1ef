#include "event_stream.hpp"

#include "json_codec.hpp"

#include <boost/json/serialize.hpp>

namespace accelpool::manager {

namespace json = boost::json;

namespace {

// The keys whose objects differ between `before` and `after` (added, changed or gone), by key.
template <class Key>
std::vector<Key> changed_keys(const std::map<Key, json::object>& before, const std::map<Key, json::object>& after) {
  std::vector<Key> out;
  for (const auto& [k, v] : after) {
    auto it = before.find(k);
    if (it == before.end() || it->second != v) out.push_back(k);
  }
  for (const auto& [k, v] : before) {
    if (!after.count(k)) out.push_back(k);
  }
  return out;
}

std::string sse(const char* event, const json::object& data) {
  return std::string("event: ") + event + "\ndata: " + json::serialize(data) + "\n\n";
}

json::object viewer_json(const Viewer& v) {
  if (v.admin()) return {{"role", "admin"}};
  return {{"role", "tenant"}, {"tenant", v.tenant}};
}

}  // namespace

EventStream::EventStream(PoolCore& core, const Clock& clock) : core_(core), clock_(clock) {}

void EventStream::refresh() {
  Changes c;
  now_ = clock_.now();
  std::map<std::string, json::object> devices, hosts;
  for (const auto& d : core_.devices()) devices.emplace(d.record.name, to_json(d));
  for (const auto& name : core_.hosts()) {
    if (auto h = core_.host(name)) hosts.emplace(name, to_json(*h));
  }
  std::map<std::uint64_t, json::object> live;
  std::map<std::uint64_t, std::string> live_tenant;
  for (LeaseState s : {LeaseState::granted, LeaseState::revoking}) {
    LeaseFilter f;
    f.state = s;
    for (const auto& l : core_.list(f)) {
      live.emplace(l.id, to_json(l));
      live_tenant.emplace(l.id, l.tenant);
    }
  }
  c.devices = changed_keys(devices_, devices);
  c.hosts = changed_keys(hosts_, hosts);
  c.leases = changed_keys(live_, live);
  for (auto id : c.leases) {
    if (live.count(id)) continue;
    c.gone_tenant[id] = live_tenant_[id];
    auto l = core_.get(Caller::admin(), id);
    if (l && is_terminal(l->state)) c.ended.push_back(to_json(*l));
  }
  auto queue = core_.queue();
  c.queue = queue.size() != queue_.size();
  for (std::size_t i = 0; !c.queue && i < queue.size(); ++i) c.queue = queue[i].id != queue_[i].id;

  json::object counters;
  Counters n = core_.counters();
  counters = {{"grants", n.grants}, {"reprogrammings", n.reprogrammings}, {"preemptions", n.preemptions},
              {"expirations", n.expirations}};
  devices_ = std::move(devices);
  hosts_ = std::move(hosts);
  live_ = std::move(live);
  live_tenant_ = std::move(live_tenant);
  queue_ = std::move(queue);
  policy_ = core_.policy();
  counters_ = std::move(counters);
  stats_ = to_json(core_.stats(kStatsWindowS));
  queue_length_ = core_.queue_length();
  changes_ = std::move(c);
  ++sequence_;
  delta_cache_.clear();
}

bool EventStream::sees_lease(const Viewer& viewer, std::uint64_t id) const {
  if (viewer.admin()) return true;
  auto it = live_tenant_.find(id);
  return it != live_tenant_.end() && it->second == viewer.tenant;
}

json::object EventStream::device_for(const Viewer& viewer, const json::object& device) const {
  if (viewer.admin()) return device;
  json::object d = device;
  const auto& lease = d["lease"];
  if (!lease.is_null() && !sees_lease(viewer, lease.to_number<std::uint64_t>())) d["lease"] = nullptr;
  return d;
}

json::object EventStream::summary(const Viewer& viewer) const {
  json::object stats = stats_;
  if (!viewer.admin()) {
    json::object own;
    if (auto* mine = stats_.at("by_tenant").as_object().if_contains(viewer.tenant)) own[viewer.tenant] = *mine;
    stats["by_tenant"] = std::move(own);
    stats.erase("by_bitstream");
  }
  return {{"now", now_},          {"policy", policy_}, {"counters", counters_},
          {"queue_length", queue_length_}, {"stats", std::move(stats)}};
}

json::array EventStream::queue_json(const Viewer& viewer) const {
  json::array out;
  for (std::size_t i = 0; i < queue_.size() && out.size() < kQueueShown; ++i) {
    if (!viewer.admin() && queue_[i].tenant != viewer.tenant) continue;
    json::object o = to_json(queue_[i]);
    o["position"] = i + 1;
    out.emplace_back(std::move(o));
  }
  return out;
}

std::string EventStream::snapshot(const Viewer& viewer) const {
  json::array devices, hosts, leases;
  for (const auto& [name, d] : devices_) devices.emplace_back(device_for(viewer, d));
  for (const auto& [name, h] : hosts_) hosts.emplace_back(h);
  for (const auto& [id, l] : live_) {
    if (sees_lease(viewer, id)) leases.emplace_back(l);
  }
  return sse("snapshot", {{"seq", sequence_},
                          {"viewer", viewer_json(viewer)},
                          {"summary", summary(viewer)},
                          {"devices", std::move(devices)},
                          {"hosts", std::move(hosts)},
                          {"leases", std::move(leases)},
                          {"queue", queue_json(viewer)}});
}

std::string EventStream::delta(const Viewer& viewer) const {
  auto cached = delta_cache_.find(viewer.tenant);
  if (cached != delta_cache_.end()) return cached->second;
  const Changes& c = changes_;
  json::object out{{"seq", sequence_}, {"summary", summary(viewer)}};
  json::array up, gone;
  for (const auto& name : c.devices) {
    auto it = devices_.find(name);
    if (it == devices_.end()) gone.emplace_back(name);
    else up.emplace_back(device_for(viewer, it->second));
  }
  out["devices"] = json::object{{"upsert", std::move(up)}, {"remove", std::move(gone)}};
  up = {};
  gone = {};
  for (const auto& name : c.hosts) {
    auto it = hosts_.find(name);
    if (it == hosts_.end()) gone.emplace_back(name);
    else up.emplace_back(it->second);
  }
  out["hosts"] = json::object{{"upsert", std::move(up)}, {"remove", std::move(gone)}};
  up = {};
  gone = {};
  json::array ended;
  for (auto id : c.leases) {
    auto it = live_.find(id);
    if (it != live_.end()) {
      if (sees_lease(viewer, id)) up.emplace_back(it->second);
    } else if (viewer.admin() || c.gone_tenant.at(id) == viewer.tenant) {
      gone.emplace_back(id);
    }
  }
  for (const auto& l : c.ended) {
    if (viewer.admin() || l.at("tenant").as_string() == viewer.tenant) ended.emplace_back(l);
  }
  out["leases"] = json::object{{"upsert", std::move(up)}, {"remove", std::move(gone)}, {"ended", std::move(ended)}};
  if (c.queue) out["queue"] = queue_json(viewer);
  return delta_cache_[viewer.tenant] = sse("delta", out);
}

}  // namespace accelpool::manager
