// Placement policies decide "which devices" a granted request gets, from an index of free devices.
#pragma once

#include <accelpool/scheduler/id_set.hpp>
#include <accelpool/scheduler/model.hpp>

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace accelpool::scheduler {

// What a placement policy needs indexed besides the free set. Each index costs time on every grant and
// release, so the scheduler keeps only those its placement asks for.
struct IndexNeeds {
  bool by_bitstream = false;
  bool by_host = false;
};

// The free devices of one pool: one kind and one model of it, and either one host's passthrough devices or the
// network-attached devices of all hosts. Kept by FreeIndex; placement reads it. All lookups are O(1) unless noted.
class DeviceGroup {
 public:
  const IdSet& free() const { return free_; }
  // Free devices holding bitstream `b` (kNoBitstream: holding nothing). Empty unless indexed by bitstream.
  const IdSet& holding(BitstreamId b) const;
  // Calls `visit(b, devices)` for each bitstream b that free devices hold (not kNoBitstream), in id order.
  // Nothing unless indexed by bitstream. O(bitstreams ever indexed).
  template <typename Visit>
  void each_loaded(Visit visit) const {
    for (std::size_t slot = 1; slot < by_bitstream_.size(); ++slot) {
      if (!by_bitstream_[slot].empty()) visit(static_cast<BitstreamId>(slot - 1), by_bitstream_[slot]);
    }
  }
  // Free devices on `host`. Empty unless indexed by host.
  const IdSet& on_host(HostId host) const;
  // The host of a free device (indexed by host only).
  HostId host_of(DeviceId id) const { return host_of_[id]; }
  // The host with the fewest free devices among those with at least `n`, if any. O(devices per host).
  std::optional<HostId> tightest_host(std::size_t n) const;
  // Calls `visit(host)` for hosts with free devices, most free first, until it returns false.
  // O(devices per host + hosts visited).
  template <typename Visit>
  void hosts_most_free_first(Visit visit) const {
    for (std::size_t n = hosts_with_free_.size(); n-- > 1;) {
      for (HostId host : hosts_with_free_[n]) {
        if (!visit(host)) return;
      }
    }
  }

 private:
  friend class FreeIndex;
  // by_bitstream_ slot of a bitstream: [0] holds nothing (kNoBitstream), [b + 1] holds b (ids are dense).
  static std::size_t bitstream_slot(BitstreamId b) { return b == kNoBitstream ? 0 : std::size_t{b} + 1; }
  IdSet& holding_slot(BitstreamId b);

  IdSet free_;
  std::vector<IdSet> by_bitstream_;
  std::vector<IdSet> by_host_;  // by host id (dense)
  std::vector<HostId> host_of_;
  std::vector<IdSet> hosts_with_free_;  // [n]: hosts with exactly n free devices (n >= 1)
};

// Index of free devices, updated by the scheduler on every grant and release: O(1) per device and index.
class FreeIndex {
 public:
  explicit FreeIndex(IndexNeeds needs = {}) : needs_(needs) {}
  IndexNeeds needs() const { return needs_; }

  void insert(const Device& d);
  void erase(const Device& d);

  // The groups a request may draw from: its host's passthrough devices of its kind, then the network
  // devices of its kind, each split by model (indexed by ModelId; a model no device of the pool has is an empty
  // group); only the groups of models in `models` are eligible. Either span may be empty. Valid until the next
  // insert or erase.
  struct Eligible {
    std::span<const DeviceGroup> passthrough;
    std::span<const DeviceGroup> network;
    ModelSet models = kAnyModel;
    // Images loaded on eligible free devices in the order a grant that must reprogram should overwrite them,
    // the first the least needed (the reuse rule, scheduler.hpp); empty: no preference. Placements that mind
    // loaded images (affinity) read it; it must outlive the place() call.
    std::span<const BitstreamId> overwrite_first;
    // Free devices in the eligible groups. O(models of the kind).
    std::size_t free() const;
    // Calls `visit(group)` for each group of `groups` (passthrough or network) whose model is eligible, in
    // model order.
    template <typename Visit>
    void each(std::span<const DeviceGroup> groups, Visit visit) const {
      for (std::size_t m = 0; m < groups.size(); ++m) {
        if (model_in(models, static_cast<ModelId>(m))) visit(groups[m]);
      }
    }
  };
  Eligible eligible(KindId kind, HostId guest_host, ModelSet models = kAnyModel) const;

  // Free devices of a kind on all groups, whatever their model.
  std::size_t free_of_kind(KindId kind) const;

 private:
  struct GroupKey {
    KindId kind;
    HostId host;  // kNetworkHost for the network group
    auto operator<=>(const GroupKey&) const = default;
  };
  static constexpr HostId kNetworkHost = ~HostId{0};
  DeviceGroup& group(const Device& d);
  void move_host(DeviceGroup& g, HostId host, std::size_t from, std::size_t to);
  IndexNeeds needs_;
  std::map<GroupKey, std::vector<DeviceGroup>> groups_;  // by model within the key
  std::vector<std::size_t> free_by_kind_;
};

// Contract for a placement policy. Implementations are pure functions of their arguments (no I/O, no clock,
// no state that changes between calls).
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string_view name() const = 0;
  // The indexes place() reads besides DeviceGroup::free().
  virtual IndexNeeds needs() const { return {}; }
  // Chooses the devices of a grant. Called only when `eligible.free() >= request.count`, with `out` empty;
  // must append exactly request.count distinct devices from the eligible groups to `out` (the caller reuses
  // its capacity), must not modify anything else, and should be O(count * log n). Cannot fail.
  virtual void place(const Request& request, const FreeIndex::Eligible& eligible, std::vector<DeviceId>& out) const = 0;
};

// Builds a placement policy by name: first-fit, affinity, pack. nullptr and `error` set if unknown.
std::unique_ptr<PlacementPolicy> make_placement(std::string_view name, std::string* error);
std::span<const std::string_view> placement_names();

}  // namespace accelpool::scheduler
