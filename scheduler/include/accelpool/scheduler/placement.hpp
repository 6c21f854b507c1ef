// Placement policies decide "which devices" a granted request gets, from an index of free devices.
#pragma once

#include <accelpool/scheduler/model.hpp>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace accelpool::scheduler {

// The free devices of one pool: one kind, and either one host's passthrough devices or the network-attached
// devices of all hosts. Kept by FreeIndex; placement reads it.
struct DeviceGroup {
  std::set<DeviceId> free;                                          // ascending id
  std::unordered_map<BitstreamId, std::set<DeviceId>> by_bitstream; // free devices by what they hold
  std::map<HostId, std::set<DeviceId>> by_host;                     // free devices by host
  std::unordered_map<DeviceId, HostId> host_of;                     // host of each free device
  std::set<std::pair<std::size_t, HostId>> hosts_by_free;           // (free count, host), hosts with >= 1 free
};

// Index of free devices, updated by the scheduler on every grant and release in O(log n).
class FreeIndex {
 public:
  void insert(const Device& d);
  void erase(const Device& d);

  // The groups a request may draw from: its host's passthrough devices of its kind, then the network
  // devices of its kind. Either may be null. Pointers are valid until the next insert or erase.
  struct Eligible {
    const DeviceGroup* passthrough = nullptr;
    const DeviceGroup* network = nullptr;
    std::size_t free() const;
  };
  Eligible eligible(KindId kind, HostId guest_host) const;

  // Free devices of a kind on all groups.
  std::size_t free_of_kind(KindId kind) const;

 private:
  struct GroupKey {
    KindId kind;
    HostId host;  // kNetworkHost for the network group
    auto operator<=>(const GroupKey&) const = default;
  };
  static constexpr HostId kNetworkHost = ~HostId{0};
  DeviceGroup& group(const Device& d);
  std::map<GroupKey, DeviceGroup> groups_;
  std::unordered_map<KindId, std::size_t> free_by_kind_;
};

// Contract for a placement policy. Called only when `eligible.free() >= request.count`; must return exactly
// request.count distinct devices from the eligible groups, must not modify anything, and should be
// O(count * log n). `loaded` tells what a device holds now (kNoBitstream if nothing).
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual std::vector<DeviceId> place(const Request& request, const FreeIndex::Eligible& eligible) const = 0;
};

// Builds a placement policy by name: first-fit, affinity, pack. nullptr and `error` set if unknown.
std::unique_ptr<PlacementPolicy> make_placement(std::string_view name, std::string* error);
std::span<const std::string_view> placement_names();

}  // namespace accelpool::scheduler
