// Partial-reconfiguration slots (docs/hosts.md, "Slots"): regions of a device's shell that are programmed
// independently with partial images. Slot n of device `local_id` is addressed as "<local_id>:slot<n>" by the
// manager, the hosts and the device backends alike, and joins the pool as a device of kind "<kind>:slot".
#pragma once

#include <accelpool/common/guest_id.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool {

// The most slots one device may declare.
inline constexpr std::uint32_t kMaxSlotsPerDevice = 64;

// The kind of the slots of devices of `kind` ("fpga" -> "fpga:slot"): a lease asks for a slot by this kind.
inline std::string slot_kind(std::string_view kind) { return std::string(kind) + ":slot"; }

// The local id of slot `n` of device `local_id` ("fpga0", 1 -> "fpga0:slot1").
inline std::string slot_local_id(std::string_view local_id, std::uint32_t n) {
  return std::string(local_id) + ":slot" + std::to_string(n);
}

// The slots' shapes of a device in slot order, as a comma-separated list spells them ("cu2,cu1,cu1"; an empty item
// is a slot without a shape); none for "".
inline std::vector<std::string> split_slot_shapes(std::string_view list) {
  std::vector<std::string> shapes;
  while (!list.empty()) {
    const auto comma = list.find(',');
    shapes.emplace_back(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return shapes;
}

// Whether `shape` may name a slot's shape: 1-64 characters of [A-Za-z0-9._:-] ("" is a slot without a shape,
// which callers accept on their own).
inline bool valid_slot_shape(std::string_view shape) {
  return !shape.empty() && shape.size() <= 64 && std::all_of(shape.begin(), shape.end(), common::is_name_char);
}

struct SlotId {
  std::string device;       // the whole device's local id
  std::uint32_t index = 0;  // < kMaxSlotsPerDevice
};

// The device and slot that a slot's local id names, as slot_local_id spells it; nullopt for any other id (a
// whole device's, or a malformed slot number).
inline std::optional<SlotId> parse_slot_local_id(std::string_view id) {
  const auto at = id.rfind(":slot");
  if (at == std::string_view::npos || at == 0) return std::nullopt;
  const std::string_view digits = id.substr(at + 5);
  if (digits.empty() || digits.size() > 2 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  std::uint32_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (n >= kMaxSlotsPerDevice) return std::nullopt;
  return SlotId{std::string(id.substr(0, at)), n};
}

}  // namespace accelpool
