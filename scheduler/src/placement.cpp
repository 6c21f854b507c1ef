// The placement policies and the free-device index they read.
#include <accelpool/scheduler/placement.hpp>

#include <algorithm>
#include <array>

namespace accelpool::scheduler {

// --- FreeIndex -------------------------------------------------------------------------------------------

DeviceGroup& FreeIndex::group(const Device& d) {
  const HostId host = d.attach == AttachMode::passthrough ? d.host : kNetworkHost;
  return groups_[GroupKey{d.kind, host}];
}

namespace {
// Moves `host` within hosts_by_free after its free count went from `before` to `after`.
void rerank_host(DeviceGroup& g, HostId host, std::size_t before, std::size_t after) {
  if (before > 0) g.hosts_by_free.erase({before, host});
  if (after > 0) g.hosts_by_free.insert({after, host});
}
}  // namespace

void FreeIndex::insert(const Device& d) {
  DeviceGroup& g = group(d);
  if (!g.free.insert(d.id).second) return;
  g.by_bitstream[d.loaded].insert(d.id);
  g.host_of[d.id] = d.host;
  auto& on_host = g.by_host[d.host];
  on_host.insert(d.id);
  rerank_host(g, d.host, on_host.size() - 1, on_host.size());
  ++free_by_kind_[d.kind];
}

void FreeIndex::erase(const Device& d) {
  DeviceGroup& g = group(d);
  if (g.free.erase(d.id) == 0) return;
  if (auto it = g.by_bitstream.find(d.loaded); it != g.by_bitstream.end()) {
    it->second.erase(d.id);
    if (it->second.empty()) g.by_bitstream.erase(it);
  }
  g.host_of.erase(d.id);
  auto host_it = g.by_host.find(d.host);
  host_it->second.erase(d.id);
  rerank_host(g, d.host, host_it->second.size() + 1, host_it->second.size());
  if (host_it->second.empty()) g.by_host.erase(host_it);
  --free_by_kind_[d.kind];
}

std::size_t FreeIndex::Eligible::free() const {
  return (passthrough ? passthrough->free.size() : 0) + (network ? network->free.size() : 0);
}

FreeIndex::Eligible FreeIndex::eligible(KindId kind, HostId guest_host) const {
  Eligible e;
  if (auto it = groups_.find({kind, guest_host}); it != groups_.end()) e.passthrough = &it->second;
  if (auto it = groups_.find({kind, kNetworkHost}); it != groups_.end()) e.network = &it->second;
  return e;
}

std::size_t FreeIndex::free_of_kind(KindId kind) const {
  auto it = free_by_kind_.find(kind);
  return it == free_by_kind_.end() ? 0 : it->second;
}

// --- placement policies -------------------------------------------------------------------------------------

namespace {

// Collects up to `need` devices from `from` into `out`, skipping ones already chosen. O(k log n) for k taken,
// plus the skipped ones (at most out.size()).
template <typename Range>
void take(const Range& from, std::size_t need, std::vector<DeviceId>& out) {
  for (DeviceId id : from) {
    if (out.size() >= need) return;
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
}

// Fills `out` up to `need` from a network group using as few hosts as possible: the host with the fewest free
// devices that still fits the remainder (best fit); if none fits, the hosts with the most free devices first.
// Hosts already used in `out` are preferred by the callers before this. O(h log n) for h hosts used.
void take_packed(const DeviceGroup& g, std::size_t need, std::vector<DeviceId>& out) {
  while (out.size() < need) {
    const std::size_t rest = need - out.size();
    auto fit = g.hosts_by_free.lower_bound({rest, 0});
    // Skip hosts whose devices were all taken already (only possible for hosts already in `out`).
    const std::size_t before = out.size();
    if (fit != g.hosts_by_free.end()) {
      take(g.by_host.at(fit->second), need, out);
    }
    if (out.size() == before) {
      for (auto it = g.hosts_by_free.rbegin(); it != g.hosts_by_free.rend() && out.size() < need; ++it) {
        take(g.by_host.at(it->second), need, out);
      }
      return;
    }
  }
}

// first-fit: the lowest-numbered eligible devices, the guest's own passthrough devices first. O(k log n).
class FirstFit final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "first-fit"; }
  std::vector<DeviceId> place(const Request& r, const FreeIndex::Eligible& e) const override {
    std::vector<DeviceId> out;
    out.reserve(r.count);
    if (e.passthrough) take(e.passthrough->free, r.count, out);
    if (e.network) take(e.network->free, r.count, out);
    return out;
  }
};

// pack: best fit for gangs, to limit fragmentation: the guest's passthrough devices first, then the network
// host whose free devices fit the rest most tightly, so large holes stay open for large gangs.
// O(h log n) for the h hosts used.
class Pack final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "pack"; }
  std::vector<DeviceId> place(const Request& r, const FreeIndex::Eligible& e) const override {
    std::vector<DeviceId> out;
    out.reserve(r.count);
    if (e.passthrough) take(e.passthrough->free, r.count, out);
    if (e.network) take_packed(*e.network, r.count, out);
    return out;
  }
};

// affinity: reconfiguration-aware. Devices that already hold the requested bitstream first (no programming),
// then other devices on the hosts already chosen (keep the gang together), then devices holding nothing
// (no one loses a loaded image), then best-fit hosts as in pack. O(k log n + h log n).
class Affinity final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "affinity"; }
  std::vector<DeviceId> place(const Request& r, const FreeIndex::Eligible& e) const override {
    std::vector<DeviceId> out;
    out.reserve(r.count);
    for (const DeviceGroup* g : {e.passthrough, e.network}) {
      if (!g) continue;
      if (r.bitstream != kNoBitstream) {
        if (auto it = g->by_bitstream.find(r.bitstream); it != g->by_bitstream.end()) take(it->second, r.count, out);
      }
      if (out.size() >= r.count) break;
      if (g == e.network) take_near(*g, r.count, out);
      if (auto it = g->by_bitstream.find(kNoBitstream); it != g->by_bitstream.end()) take(it->second, r.count, out);
      if (g == e.network) take_packed(*g, r.count, out);
      else take(g->free, r.count, out);
    }
    return out;
  }

 private:
  // Free devices on the hosts of the devices chosen so far. O(k log n).
  static void take_near(const DeviceGroup& g, std::size_t need, std::vector<DeviceId>& out) {
    std::vector<HostId> hosts;
    for (DeviceId id : out) {
      if (auto it = g.host_of.find(id); it != g.host_of.end() &&
                                        std::find(hosts.begin(), hosts.end(), it->second) == hosts.end()) {
        hosts.push_back(it->second);
      }
    }
    for (HostId host : hosts) take(g.by_host.at(host), need, out);
  }
};

constexpr std::array<std::string_view, 3> kNames{"first-fit", "affinity", "pack"};

}  // namespace

std::unique_ptr<PlacementPolicy> make_placement(std::string_view name, std::string* error) {
  if (name == "first-fit") return std::make_unique<FirstFit>();
  if (name == "affinity") return std::make_unique<Affinity>();
  if (name == "pack") return std::make_unique<Pack>();
  if (error) {
    *error = "unknown placement '" + std::string(name) + "' (known:";
    for (auto n : kNames) *error += " " + std::string(n);
    *error += ")";
  }
  return nullptr;
}

std::span<const std::string_view> placement_names() { return kNames; }

}  // namespace accelpool::scheduler
