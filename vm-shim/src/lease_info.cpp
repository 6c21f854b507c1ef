// Lease objects of the guest protocol -> LeaseInfo, and device names -> DeviceInfo.
#include "lease_json.hpp"

#include <cstdlib>

namespace accelpool::shim {

const char* to_string(LeaseState s) {
  switch (s) {
    case LeaseState::queued:
      return "queued";
    case LeaseState::granted:
      return "granted";
    case LeaseState::revoking:
      return "revoking";
    case LeaseState::released:
      return "released";
    case LeaseState::cancelled:
      return "cancelled";
    case LeaseState::expired:
      return "expired";
    case LeaseState::revoked:
      return "revoked";
    case LeaseState::unknown:
      return "unknown";
  }
  return "unknown";
}

bool is_terminal(LeaseState s) {
  return s == LeaseState::released || s == LeaseState::cancelled || s == LeaseState::expired ||
         s == LeaseState::revoked;
}

namespace {

LeaseState state_from(const std::string& s) {
  for (auto st : {LeaseState::queued, LeaseState::granted, LeaseState::revoking, LeaseState::released,
                  LeaseState::cancelled, LeaseState::expired, LeaseState::revoked}) {
    if (s == to_string(st)) return st;
  }
  return LeaseState::unknown;
}

// A small non-negative integer, or nothing.
std::optional<int> small_int(const std::string& s) {
  if (s.empty() || s.size() > 6) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::atoi(s.c_str());
}

double number_or_zero(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string string_or_empty(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// An unsigned integer no larger than `max`, else 0.
std::uint64_t unsigned_or_zero(const nlohmann::json& o, const char* key, std::uint64_t max) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_unsigned()) return 0;
  auto v = it->get<std::uint64_t>();
  return v <= max ? v : 0;
}

std::optional<int> int_or_none(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int>();
}

}  // namespace

DeviceInfo describe_device(const std::string& name) {
  DeviceInfo d;
  d.name = name;
  auto slash = name.find('/');
  d.host = slash == std::string::npos ? std::string() : name.substr(0, slash);
  d.local_id = slash == std::string::npos ? name : name.substr(slash + 1);
  auto colon = d.local_id.find(':');
  d.backend = colon == std::string::npos ? std::string() : d.local_id.substr(0, colon);
  if (d.backend == "opencl") {
    // opencl:<platform>:<device>[.<sub-device>] (older agents wrote "/<sub-device>")
    std::string rest = d.local_id.substr(colon + 1);
    std::string sub;
    if (auto s = rest.find_first_of("./"); s != std::string::npos) {
      sub = rest.substr(s + 1);
      rest = rest.substr(0, s);
    }
    auto c2 = rest.find(':');
    if (c2 != std::string::npos) {
      d.opencl_platform = small_int(rest.substr(0, c2));
      d.opencl_device = small_int(rest.substr(c2 + 1));
      if (!sub.empty()) d.opencl_subdevice = small_int(sub);
    }
  } else if (d.backend == "xrt") {
    d.pci_address = d.local_id.substr(colon + 1);  // the host's BDF
  }
  return d;
}

Result<LeaseInfo> lease_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return make_error(Errc::protocol, "a lease must be a JSON object, got: " + j.dump());
  auto id = j.find("id");
  if (id == j.end() || !id->is_number_unsigned())
    return make_error(Errc::protocol, "lease without an integer 'id': " + j.dump());
  auto st = j.find("state");
  if (st == j.end() || !st->is_string()) return make_error(Errc::protocol, "lease without a 'state': " + j.dump());
  LeaseInfo l;
  l.id = id->get<std::uint64_t>();
  l.state = state_from(st->get<std::string>());
  if (auto r = j.find("ready"); r != j.end() && r->is_boolean()) l.ready = r->get<bool>();
  l.tenant = string_or_empty(j, "tenant");
  l.guest = string_or_empty(j, "guest");
  l.kind = string_or_empty(j, "kind");
  l.bitstream = string_or_empty(j, "bitstream");
  l.end_reason = string_or_empty(j, "end_reason");
  l.label = string_or_empty(j, "label");
  if (auto c = j.find("count"); c != j.end() && c->is_number_unsigned()) l.count = c->get<std::uint32_t>();
  l.created_at = number_or_zero(j, "created_at");
  l.granted_at = number_or_zero(j, "granted_at");
  l.expires_at = number_or_zero(j, "expires_at");
  if (auto r = j.find("revoke_deadline"); r != j.end() && r->is_number()) l.revoke_deadline = r->get<double>();
  if (auto ds = j.find("devices"); ds != j.end() && ds->is_array()) {
    for (const auto& d : *ds) {
      if (d.is_string()) l.devices.push_back(describe_device(d.get<std::string>()));
    }
  }
  // What each device's host did, matched by device name (docs/guest-protocol.md, "The lease"). What the server
  // says replaces what the name suggested; indexes it does not send stay as the name says.
  if (auto di = j.find("device_info"); di != j.end() && di->is_array()) {
    for (const auto& o : *di) {
      if (!o.is_object()) continue;
      std::string name = string_or_empty(o, "name");
      for (auto& d : l.devices) {
        if (d.name != name) continue;
        d.kind = string_or_empty(o, "kind");
        d.model = string_or_empty(o, "model");
        d.vendor = string_or_empty(o, "vendor");
        d.pci_vendor_id = static_cast<std::uint32_t>(unsigned_or_zero(o, "pci_vendor_id", 0xffffffffu));
        d.pci_device_id = static_cast<std::uint32_t>(unsigned_or_zero(o, "pci_device_id", 0xffffffffu));
        d.memory_bytes = unsigned_or_zero(o, "memory_bytes", ~std::uint64_t{0});
        d.attach = string_or_empty(o, "attach");
        d.loaded = string_or_empty(o, "loaded");
        d.pci_address = string_or_empty(o, "pci");
        d.endpoint = string_or_empty(o, "endpoint");
        if (auto v = int_or_none(o, "opencl_platform")) d.opencl_platform = v;
        if (auto v = int_or_none(o, "opencl_device")) d.opencl_device = v;
        if (auto v = int_or_none(o, "opencl_subdevice")) d.opencl_subdevice = v;
        if (auto v = int_or_none(o, "xrt_index")) d.xrt_index = v;
      }
    }
  }
  l.json = j.dump();
  return l;
}

Result<LeaseInfo> parse_lease(const std::string& json_text) {
  auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded()) return make_error(Errc::protocol, "lease text is not JSON");
  return lease_from_json(j);
}

}  // namespace accelpool::shim
