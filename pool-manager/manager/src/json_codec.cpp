#include "json_codec.hpp"

#include <accelpool/common/guest_id.hpp>
#include <accelpool/common/number_text.hpp>

#include <cmath>

#include <algorithm>
#include <cmath>

namespace accelpool::manager {

namespace json = boost::json;

json::value json_number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<std::int64_t>(v);
  return v;
}

namespace {

// What the guest is told about each device of a lease (docs/guest-protocol.md, "The lease"), from what its host
// answered when it prepared it; the fields of a device whose host has not answered yet are empty.
json::array device_info(const Lease& l, const json::storage_ptr& sp) {
  json::array out(sp);
  out.reserve(l.devices.size());
  for (std::size_t i = 0; i < l.devices.size(); ++i) {
    static const host::PrepareResult kUnanswered;
    const auto& g = i < l.grants.size() ? l.grants[i] : kUnanswered;
    const bool in_guest = g.attach == host::AttachMode::pci_hostdev || g.attach == host::AttachMode::emulated;
    json::object o(11, sp);
    o["name"] = l.devices[i];
    o["kind"] = g.details.kind;
    o["model"] = g.details.model;
    o["vendor"] = g.details.vendor;
    o["pci_vendor_id"] = g.details.pci_vendor_id;
    o["pci_device_id"] = g.details.pci_device_id;
    o["memory_bytes"] = g.details.memory_bytes;
    o["attach"] = host::to_string(g.attach);
    o["pci"] = in_guest ? g.guest_pci : g.details.host_pci;  // where the caller finds it
    o["endpoint"] = g.endpoint;
    o["loaded"] = g.loaded;
    out.emplace_back(std::move(o));
  }
  return out;
}

}  // namespace

json::object to_json(const LearnedGroup& g) {
  const EstimateRecord& e = g.group;
  auto name_or_null = [&](const std::string& s) {
    return e.whole_kind || s.empty() ? json::value(nullptr) : json::value(s);
  };
  json::object o;
  o["kind"] = e.kind;
  o["whole_kind"] = e.whole_kind;
  o["tenant"] = name_or_null(e.tenant);
  o["bitstream"] = name_or_null(e.bitstream);
  o["count"] = e.whole_kind ? json::value(nullptr) : json::value(e.count);
  o["label"] = name_or_null(e.label);
  o["observations"] = e.observations;
  o["warm"] = g.warm;
  o["mean_device_s"] = g.mean_device_s;
  o["estimate_s"] = g.estimate_s;
  o["p50_device_s"] = g.p50_device_s;
  o["p90_device_s"] = g.p90_device_s;
  return o;
}

json::object to_json(const Lease& l, json::storage_ptr sp) {
  json::object o(21, sp);  // room for every member below: no rehash while it fills
  o["id"] = l.id;
  o["state"] = to_string(l.state);
  o["ready"] = l.ready;
  o["tenant"] = l.tenant;
  o["guest"] = l.guest;
  o["guest_host"] = l.guest_host;
  o["relayed"] = l.relayed;
  o["kind"] = l.kind;
  o["bitstream"] = l.bitstream;
  o["count"] = l.count;
  if (l.estimate_s)
    o["estimate_s"] = *l.estimate_s;
  else
    o["estimate_s"] = nullptr;
  o["label"] = l.label.empty() ? json::value(nullptr) : json::value(l.label);
  json::array devs(sp);
  devs.reserve(l.devices.size());
  for (const auto& d : l.devices) devs.emplace_back(d);
  o["devices"] = std::move(devs);
  o["device_info"] = device_info(l, sp);
  o["created_at"] = l.created_at;
  o["granted_at"] = l.granted_at > 0 ? json::value(l.granted_at) : json::value(nullptr);
  o["ended_at"] = l.ended_at > 0 ? json::value(l.ended_at) : json::value(nullptr);
  o["expires_at"] = is_terminal(l.state) ? json::value(nullptr) : json::value(l.expires_at);
  o["revoke_deadline"] = l.state == LeaseState::revoking ? json::value(l.revoke_deadline) : json::value(nullptr);
  o["reprogrammed"] = l.reprogrammed;
  o["preemptions"] = l.preemptions;
  o["end_reason"] = l.end_reason;
  return o;
}

json::array to_json(const std::vector<Lease>& leases, json::storage_ptr sp) {
  json::array a(sp);
  a.reserve(leases.size());
  for (const auto& l : leases) a.emplace_back(to_json(l, sp));
  return a;
}

json::object queue_entry_json(const Lease& l, std::size_t position, std::optional<double> expected_start) {
  json::object o = to_json(l);
  o["position"] = position;
  o["expected_start"] = expected_start ? json::value(*expected_start) : json::value(nullptr);
  return o;
}

json::object to_json(const DeviceView& d) {
  json::object o;
  o["name"] = d.record.name;
  o["host"] = d.record.host;
  o["local_id"] = d.record.local_id;
  o["kind"] = d.record.kind;
  o["model"] = d.record.model;
  o["attach"] = d.record.passthrough ? "passthrough" : "network";
  o["loaded"] = d.record.loaded;
  o["state"] = d.state;
  o["draining"] = d.record.draining;
  o["available"] = d.record.available;
  o["lease"] = d.lease ? json::value(*d.lease) : json::value(nullptr);
  o["drain_deadline"] = d.drain_deadline ? json::value(*d.drain_deadline) : json::value(nullptr);
  o["parent"] = d.record.parent.empty() ? json::value(nullptr) : json::value(d.record.parent);
  json::array slots;
  for (const auto& s : d.slots) {
    slots.emplace_back(json::object{{"name", s.name},
                                    {"state", s.state},
                                    {"loaded", s.loaded},
                                    {"shape", s.shape},
                                    {"lease", s.lease ? json::value(*s.lease) : json::value(nullptr)}});
  }
  o["slots"] = std::move(slots);
  return o;
}

json::object to_json(const HostView& h) {
  return {{"name", h.name}, {"connected", h.connected}, {"draining", h.draining}, {"device_count", h.device_count}};
}

json::object to_json(const TenantRecord& t) {
  json::object o;
  o["name"] = t.name;
  o["weight"] = json_number(t.weight);
  o["max_devices"] = t.max_devices;
  return o;
}

namespace {
json::object to_json(const Percentiles& p) {
  return {{"count", p.count}, {"avg", p.avg}, {"p50", p.p50}, {"p95", p.p95}, {"p99", p.p99}};
}
json::object to_json(const StatsGroup& g) { return {{"jct_s", to_json(g.jct)}, {"wait_s", to_json(g.wait)}}; }
}  // namespace

json::object to_json(const Stats& s) {
  json::object o;
  o["window_s"] = json_number(s.window_s);
  o["all"] = to_json(s.all);
  json::object t, b;
  for (const auto& [k, v] : s.by_tenant) t[k] = to_json(v);
  for (const auto& [k, v] : s.by_bitstream) b[k] = to_json(v);
  o["by_tenant"] = std::move(t);
  o["by_bitstream"] = std::move(b);
  return o;
}

// --- FieldReader -------------------------------------------------------------------------------------------------

void FieldReader::fail(std::string message) {
  if (!error_) error_ = make_error(Errc::invalid_argument, where_ + ": " + std::move(message));
}

const json::value* FieldReader::take(std::string_view key, bool required) {
  seen_.emplace_back(key);
  auto it = obj_.find(key);
  if (it == obj_.end() || (it->value().is_null() && !required)) {
    if (required) fail("missing field '" + std::string(key) + "'");
    return nullptr;
  }
  return &it->value();
}

std::optional<std::string> FieldReader::string(std::string_view key, bool required, std::size_t max_len) {
  const auto* v = take(key, required);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    fail("field '" + std::string(key) + "' must be a string");
    return std::nullopt;
  }
  const auto& s = v->get_string();
  if (s.size() > max_len) {
    fail("field '" + std::string(key) + "' is longer than " + std::to_string(max_len) + " characters");
    return std::nullopt;
  }
  return std::string(s);
}

std::optional<std::string> FieldReader::guest_id(std::string_view key) {
  auto id = string(key, true, 128);
  if (id && !common::valid_guest_id(*id)) {
    fail("'" + std::string(key) + "' must be " + common::kGuestIdSyntax);
    return std::nullopt;
  }
  return id;
}

std::optional<std::uint64_t> FieldReader::uint(std::string_view key, bool required, std::uint64_t max) {
  const auto* v = take(key, required);
  if (!v) return std::nullopt;
  std::optional<std::uint64_t> out;
  if (v->is_uint64())
    out = v->get_uint64();
  else if (v->is_int64() && v->get_int64() >= 0)
    out = static_cast<std::uint64_t>(v->get_int64());
  if (!out || *out > max) {
    fail("field '" + std::string(key) + "' must be an integer in 0.." + std::to_string(max));
    return std::nullopt;
  }
  return out;
}

std::optional<double> FieldReader::number(std::string_view key, bool required, double min, double max) {
  const auto* v = take(key, required);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    fail("field '" + std::string(key) + "' must be a number");
    return std::nullopt;
  }
  double d = v->to_number<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    fail("field '" + std::string(key) + "' must be between " + common::number_text(min) + " and " +
         common::number_text(max));
    return std::nullopt;
  }
  return d;
}

std::optional<bool> FieldReader::boolean(std::string_view key, bool required) {
  const auto* v = take(key, required);
  if (!v) return std::nullopt;
  if (!v->is_bool()) {
    fail("field '" + std::string(key) + "' must be true or false");
    return std::nullopt;
  }
  return v->get_bool();
}

std::optional<Error> FieldReader::finish() {
  for (const auto& kv : obj_) {
    if (std::find(seen_.begin(), seen_.end(), kv.key()) == seen_.end()) {
      fail("unknown field '" + std::string(kv.key()) + "'");
      break;
    }
  }
  return error_;
}

}  // namespace accelpool::manager
