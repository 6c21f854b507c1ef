// The placement policies and the free-device index they read.
#include <accelpool/scheduler/placement.hpp>

#include <algorithm>
#include <array>

namespace accelpool::scheduler {

// --- FreeIndex -------------------------------------------------------------------------------------------

namespace {
const IdSet kEmpty;
}  // namespace

const IdSet& DeviceGroup::holding(BitstreamId b) const {
  const std::size_t slot = bitstream_slot(b);
  return slot < by_bitstream_.size() ? by_bitstream_[slot] : kEmpty;
}

IdSet& DeviceGroup::holding_slot(BitstreamId b) {
  const std::size_t slot = bitstream_slot(b);
  if (slot >= by_bitstream_.size()) by_bitstream_.resize(slot + 1);
  return by_bitstream_[slot];
}

const IdSet& DeviceGroup::on_host(HostId host) const { return host < by_host_.size() ? by_host_[host] : kEmpty; }

std::optional<HostId> DeviceGroup::tightest_host(std::size_t n) const {
  for (std::size_t c = std::max<std::size_t>(n, 1); c < hosts_with_free_.size(); ++c) {
    if (!hosts_with_free_[c].empty()) return hosts_with_free_[c].first();
  }
  return std::nullopt;
}

DeviceGroup& FreeIndex::group(const Device& d) {
  const HostId host = d.attach == AttachMode::passthrough ? d.host : kNetworkHost;
  std::vector<DeviceGroup>& by_model = groups_[GroupKey{d.kind, host}];
  if (d.model >= by_model.size()) by_model.resize(std::size_t{d.model} + 1);
  return by_model[d.model];
}

// Moves `host` from the "n free" class `from` to `to` (0 = not listed).
void FreeIndex::move_host(DeviceGroup& g, HostId host, std::size_t from, std::size_t to) {
  if (from > 0) g.hosts_with_free_[from].erase(host);
  if (to > 0) {
    if (to >= g.hosts_with_free_.size()) g.hosts_with_free_.resize(to + 1);
    g.hosts_with_free_[to].insert(host);
  }
}

void FreeIndex::insert(const Device& d) {
  DeviceGroup& g = group(d);
  if (!g.free_.insert(d.id)) return;
  if (needs_.by_bitstream) g.holding_slot(d.loaded).insert(d.id);
  if (needs_.by_host) {
    if (d.id >= g.host_of_.size()) g.host_of_.resize(d.id + 1);
    g.host_of_[d.id] = d.host;
    if (d.host >= g.by_host_.size()) g.by_host_.resize(d.host + 1);
    IdSet& on_host = g.by_host_[d.host];
    on_host.insert(d.id);
    move_host(g, d.host, on_host.size() - 1, on_host.size());
  }
  if (d.kind >= free_by_kind_.size()) free_by_kind_.resize(d.kind + 1, 0);
  ++free_by_kind_[d.kind];
}

void FreeIndex::erase(const Device& d) {
  DeviceGroup& g = group(d);
  if (!g.free_.erase(d.id)) return;
  if (needs_.by_bitstream) g.holding_slot(d.loaded).erase(d.id);
  if (needs_.by_host) {
    IdSet& on_host = g.by_host_[d.host];
    on_host.erase(d.id);
    move_host(g, d.host, on_host.size() + 1, on_host.size());
  }
  --free_by_kind_[d.kind];
}

std::size_t FreeIndex::Eligible::free() const {
  std::size_t n = 0;
  auto count = [&](const DeviceGroup& g) { n += g.free().size(); };
  each(passthrough, count);
  each(network, count);
  return n;
}

FreeIndex::Eligible FreeIndex::eligible(KindId kind, HostId guest_host, ModelSet models) const {
  Eligible e;
  e.models = models;
  if (auto it = groups_.find({kind, guest_host}); it != groups_.end()) e.passthrough = it->second;
  if (auto it = groups_.find({kind, kNetworkHost}); it != groups_.end()) e.network = it->second;
  return e;
}

std::size_t FreeIndex::free_of_kind(KindId kind) const { return kind < free_by_kind_.size() ? free_by_kind_[kind] : 0; }

// --- placement policies -------------------------------------------------------------------------------------

namespace {

// Collects up to `need` devices from `from` into `out`, skipping ones already chosen. O(k) for k taken,
// plus the skipped ones (at most out.size()).
void take(const IdSet& from, std::size_t need, std::vector<DeviceId>& out) {
  for (DeviceId id : from) {
    if (out.size() >= need) return;
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
}

// Fills `out` up to `need` from a network group using as few hosts as possible: the host with the fewest free
// devices that still fits the remainder (best fit); if none fits, the hosts with the most free devices first.
void take_packed(const DeviceGroup& g, std::size_t need, std::vector<DeviceId>& out) {
  if (out.size() >= need) return;
  if (auto host = g.tightest_host(need - out.size())) take(g.on_host(*host), need, out);
  if (out.size() >= need) return;
  g.hosts_most_free_first([&](HostId host) {
    take(g.on_host(host), need, out);
    return out.size() < need;
  });
}

// first-fit: the lowest-numbered eligible devices, the guest's own passthrough devices first. O(k).
class FirstFit final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "first-fit"; }
  void place(const Request& r, const FreeIndex::Eligible& e, std::vector<DeviceId>& out) const override {
    out.reserve(r.count);
    auto take_free = [&](const DeviceGroup& g) { take(g.free(), r.count, out); };
    e.each(e.passthrough, take_free);
    e.each(e.network, take_free);
  }
};

// pack: best fit for gangs, to limit fragmentation: the guest's passthrough devices first, then the network
// host whose free devices fit the rest most tightly, so large holes stay open for large gangs.
// O(h log n) for the h hosts used.
class Pack final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "pack"; }
  IndexNeeds needs() const override { return {.by_bitstream = false, .by_host = true}; }
  void place(const Request& r, const FreeIndex::Eligible& e, std::vector<DeviceId>& out) const override {
    out.reserve(r.count);
    e.each(e.passthrough, [&](const DeviceGroup& g) { take(g.free(), r.count, out); });
    e.each(e.network, [&](const DeviceGroup& g) { take_packed(g, r.count, out); });
  }
};

// affinity: reconfiguration-aware. Devices that already hold the requested bitstream first (no programming),
// then other devices on the hosts already chosen (keep the gang together), then devices holding nothing
// (no one loses a loaded image), then devices holding the images of `overwrite_first` in its order, then
// best-fit hosts as in pack. O(k log n + h log n), plus O(overwrite_first) when it is given.
class Affinity final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "affinity"; }
  IndexNeeds needs() const override { return {.by_bitstream = true, .by_host = true}; }
  void place(const Request& r, const FreeIndex::Eligible& e, std::vector<DeviceId>& out) const override {
    out.reserve(r.count);
    // Each step over every eligible model before the next, so a matching device of any model comes first.
    auto take_holding = [&](BitstreamId b) {
      return [&, b](const DeviceGroup& g) { take(g.holding(b), r.count, out); };
    };
    if (r.bitstream != kNoBitstream) e.each(e.passthrough, take_holding(r.bitstream));
    auto take_least_needed = [&](std::span<const DeviceGroup> groups) {
      for (BitstreamId b : e.overwrite_first) {
        if (out.size() >= r.count) return;
        e.each(groups, take_holding(b));
      }
    };
    e.each(e.passthrough, take_holding(kNoBitstream));
    take_least_needed(e.passthrough);
    e.each(e.passthrough, [&](const DeviceGroup& g) { take(g.free(), r.count, out); });
    if (r.bitstream != kNoBitstream) e.each(e.network, take_holding(r.bitstream));
    e.each(e.network, [&](const DeviceGroup& g) { take_near(g, r.count, out); });
    e.each(e.network, take_holding(kNoBitstream));
    take_least_needed(e.network);
    e.each(e.network, [&](const DeviceGroup& g) { take_packed(g, r.count, out); });
  }

 private:
  // Free devices on the hosts of the devices chosen so far. O(k) for a k-device gang.
  static void take_near(const DeviceGroup& g, std::size_t need, std::vector<DeviceId>& out) {
    std::vector<HostId> hosts;
    for (DeviceId id : out) {
      if (g.free().contains(id) && std::find(hosts.begin(), hosts.end(), g.host_of(id)) == hosts.end()) {
        hosts.push_back(g.host_of(id));
      }
    }
    for (HostId host : hosts) take(g.on_host(host), need, out);
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
