// Names that cross the guest protocol: the one syntax of a guest id (docs/guest-protocol.md, hello), shared by the
// manager, which checks it, and the guest shim, which makes one from the host name. Header-only.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

namespace accelpool::common {

// The characters of every name in the pool: guest ids, tenants, hosts, device kinds, bitstreams.
inline bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == ':';
}

inline constexpr std::size_t kMaxGuestId = 128;
inline constexpr const char* kGuestIdSyntax = "1-128 characters of [A-Za-z0-9._:-]";

inline bool valid_guest_id(std::string_view id) {
  return !id.empty() && id.size() <= kMaxGuestId && std::all_of(id.begin(), id.end(), is_name_char);
}

// A guest id made from any text (a host name): other characters become '_', and it is cut to the longest id.
inline std::string guest_id_from(std::string_view text) {
  std::string id(text.substr(0, kMaxGuestId));
  std::replace_if(
      id.begin(), id.end(), [](char c) { return !is_name_char(c); }, '_');
  return id;
}

}  // namespace accelpool::common
