// The scheduler's vocabulary: devices, requests, decisions.
//
// Everything here is plain data. Names (kinds, bitstreams, tenants, hosts) are interned to small integers
// by the caller (see NameTable) so that the hot path compares integers, never strings.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace accelpool::scheduler {

// Seconds on the caller's clock. The scheduler never reads a clock: every event carries its time.
using Time = double;

using DeviceId = std::uint32_t;   // dense small integers chosen by the caller; storage grows with the largest id
using RequestId = std::uint64_t;  // any value, unique among live requests
using HostId = std::uint32_t;
using KindId = std::uint32_t;  // interchangeable class of device, e.g. "fpga" or "fpga-u250"
using BitstreamId = std::uint32_t;
using TenantId = std::uint32_t;
using LabelId = std::uint32_t;  // a name the guest gives its job (e.g. its command), for learned run times
// A device model within its kind, numbered densely per kind from 0 by the caller (e.g. "u250" and "u280" of kind
// "fpga"): a device's model decides which bitstreams it can run. At most kMaxModelsPerKind per kind.
using ModelId = std::uint8_t;
// A set of models of one kind, bit m for model m: the models a request's bitstream fits.
using ModelSet = std::uint64_t;
inline constexpr std::uint32_t kMaxModelsPerKind = 64;
inline constexpr ModelSet kAnyModel = ~ModelSet{0};
inline constexpr bool model_in(ModelSet set, ModelId model) {
  return model < kMaxModelsPerKind && ((set >> model) & 1U);
}

inline constexpr BitstreamId kNoBitstream = std::numeric_limits<BitstreamId>::max();
inline constexpr LabelId kNoLabel = std::numeric_limits<LabelId>::max();

// How a guest reaches a device: a passthrough device serves only guests on its own host; a network-attached
// device serves guests on any host.
enum class AttachMode : std::uint8_t { passthrough, network };

struct Device {
  DeviceId id = 0;
  HostId host = 0;
  KindId kind = 0;
  AttachMode attach = AttachMode::network;
  ModelId model = 0;                  // its model within its kind, < kMaxModelsPerKind
  BitstreamId loaded = kNoBitstream;  // what the device holds now
};

struct Request {
  RequestId id = 0;
  TenantId tenant = 0;
  KindId kind = 0;
  BitstreamId bitstream = kNoBitstream;  // kNoBitstream: any image will do, nothing to program
  std::uint32_t count = 1;               // gang size, granted all-or-nothing
  HostId guest_host = 0;                 // where the guest runs (matters for passthrough devices)
  std::optional<double> estimate_s;      // run time the guest expects, if it said
  Time arrival = 0;
  LabelId label = kNoLabel;     // groups learned run times (see estimator.hpp), optional
  ModelSet models = kAnyModel;  // device models of its kind it may run on (those its bitstream fits)
  // On slots: the share of its device's memory bandwidth it uses alone (0 to 1, interference.hpp). Placement
  // spreads slot leases so that the demands on a device stay within its bandwidth where they can.
  double demand = 0;
};

struct DeviceGrant {
  DeviceId device = 0;
  bool reprogram = false;  // the device holds another bitstream and must be programmed first
  bool operator==(const DeviceGrant&) const = default;
};

struct Grant {
  RequestId request = 0;
  std::vector<DeviceGrant> devices;
  bool operator==(const Grant&) const = default;
};

enum class PreemptReason : std::uint8_t {
  priority,       // a waiting request outranks this lease
  device_failed,  // one of the lease's devices failed or was removed
};

struct Preemption {
  RequestId request = 0;
  PreemptReason reason = PreemptReason::priority;
  bool operator==(const Preemption&) const = default;
};

// What the caller must carry out after an event. Grants are final: the devices are the request's from now.
// A preempted lease keeps its devices until the caller reports it gone (Scheduler::requeue or ::release).
struct Decisions {
  std::vector<Grant> grants;
  std::vector<Preemption> preemptions;
  bool empty() const { return grants.empty() && preemptions.empty(); }
};

// Interns names to dense ids: the first name gets 0, the next 1, and so on.
class NameTable {
 public:
  std::uint32_t intern(std::string_view name);
  std::optional<std::uint32_t> find(std::string_view name) const;
  const std::string& name(std::uint32_t id) const { return names_.at(id); }
  std::size_t size() const { return names_.size(); }

 private:
  // Looks names up by string_view without building a std::string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::string> names_;
  std::unordered_map<std::string, std::uint32_t, NameHash, std::equal_to<>> ids_;
};

}  // namespace accelpool::scheduler
