// device.prepare's params and result as JSON (docs/agent-protocol.md, "device.prepare").
#include <accelpool/agent/prepare_codec.hpp>
#include <accelpool/agent/wire.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace accelpool::agent {

namespace json = boost::json;

json::object to_json(const host::PrepareRequest& request) {
  json::object p{{"device", request.device}, {"bitstream", request.bitstream}, {"reprogram", request.reprogram}};
  if (!request.sha256.empty()) p["sha256"] = request.sha256;
  if (!request.vm.empty()) p["vm"] = request.vm;
  if (!request.lease.empty()) p["lease"] = request.lease;
  return p;
}

Result<host::PrepareRequest> parse_prepare_request(const json::object& params, std::string_view where) {
  if (auto s = only_fields(params, "device,bitstream,sha256,reprogram,vm,lease", where); !s) return s.error();
  auto device = get_string(params, "device", where, true);
  auto bitstream = get_string(params, "bitstream", where, false);
  auto sha256 = get_string(params, "sha256", where, false);
  auto reprogram = get_bool(params, "reprogram", where, false);
  auto vm = get_string(params, "vm", where, false);
  auto lease = get_string(params, "lease", where, false);
  for (const Status& s : {device.status(), bitstream.status(), sha256.status(), reprogram.status(), vm.status(),
                          lease.status()})
    if (!s) return s.error();
  return host::PrepareRequest{*device, *lease, *vm, *bitstream, *sha256, *reprogram};
}

json::object to_json(const host::DeviceDetails& details) {
  return json::object{{"kind", details.kind},
                      {"model", details.model},
                      {"vendor", details.vendor},
                      {"pci_vendor_id", details.pci_vendor_id},
                      {"pci_device_id", details.pci_device_id},
                      {"memory_bytes", details.memory_bytes},
                      {"host_pci", details.host_pci}};
}

json::object to_json(const host::PrepareResult& result) {
  return json::object{{"loaded", result.loaded},
                      {"attach", host::to_string(result.attach)},
                      {"guest_pci", result.guest_pci},
                      {"endpoint", result.endpoint},
                      {"details", to_json(result.details)}};
}

namespace {

Result<host::DeviceDetails> parse_details(const json::value& value, const std::string& where) {
  if (!value.is_object()) return make_error("invalid_argument", where + ": must be an object");
  const auto& o = value.get_object();
  if (auto s = only_fields(o, "kind,model,vendor,pci_vendor_id,pci_device_id,memory_bytes,host_pci", where); !s)
    return s.error();
  constexpr auto kMax32 = std::numeric_limits<std::uint32_t>::max();
  auto kind = get_string(o, "kind", where, false);
  auto model = get_string(o, "model", where, false);
  auto vendor = get_string(o, "vendor", where, false);
  auto vendor_id = get_uint(o, "pci_vendor_id", where, kMax32);
  auto device_id = get_uint(o, "pci_device_id", where, kMax32);
  auto memory = get_uint(o, "memory_bytes", where, std::numeric_limits<std::uint64_t>::max());
  auto host_pci = get_string(o, "host_pci", where, false);
  for (const Status& s : {kind.status(), model.status(), vendor.status(), vendor_id.status(), device_id.status(),
                          memory.status(), host_pci.status()})
    if (!s) return s.error();
  return host::DeviceDetails{*kind,
                             *model,
                             *vendor,
                             static_cast<std::uint32_t>(*vendor_id),
                             static_cast<std::uint32_t>(*device_id),
                             *memory,
                             *host_pci};
}

}  // namespace

Result<host::PrepareResult> parse_prepare_result(const json::value& value, std::string_view where) {
  const std::string w(where);
  if (!value.is_object()) return make_error("invalid_argument", w + ": must be an object");
  const auto& o = value.get_object();
  if (auto s = only_fields(o, "loaded,attach,guest_pci,endpoint,details", w); !s) return s.error();
  auto loaded = get_string(o, "loaded", w, false);
  auto attach = get_string(o, "attach", w, false);
  auto guest_pci = get_string(o, "guest_pci", w, false);
  auto endpoint = get_string(o, "endpoint", w, false);
  for (const Status& s : {loaded.status(), attach.status(), guest_pci.status(), endpoint.status()})
    if (!s) return s.error();
  host::PrepareResult result;
  result.loaded = *loaded;
  if (!attach->empty() && !host::parse_attach_mode(*attach, result.attach))
    return make_error("invalid_argument", w + ": field 'attach' has unknown mode '" + *attach + "'");
  result.guest_pci = *guest_pci;
  result.endpoint = *endpoint;
  if (auto* details = o.if_contains("details")) {
    auto parsed = parse_details(*details, w + ": field 'details'");
    if (!parsed) return parsed.error();
    result.details = std::move(*parsed);
  }
  return result;
}

}  // namespace accelpool::agent
