// The host contract (accelpool/host/contract.hpp) on the agent link: device.prepare's params and result as JSON
// (docs/agent-protocol.md). One codec for both sides: the manager's RemoteHost writes requests and reads
// results; accelpool-agent reads requests and writes results. No I/O.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/host/contract.hpp>

#include <boost/json.hpp>

#include <string_view>

namespace accelpool::agent {

// device.prepare params: {device, bitstream, reprogram, and sha256, vm, lease when not empty}.
boost::json::object to_json(const host::PrepareRequest& request);

// Reads device.prepare params. `device` is required, the rest optional; unknown fields and wrong types are
// "invalid_argument" errors naming the field and `where`.
Result<host::PrepareRequest> parse_prepare_request(const boost::json::object& params, std::string_view where);

// device.prepare result: {loaded, attach, guest_pci, endpoint, details: {kind, model, vendor, pci_vendor_id,
// pci_device_id, memory_bytes, host_pci}}; every field is written.
boost::json::object to_json(const host::PrepareResult& result);
boost::json::object to_json(const host::DeviceDetails& details);

// Reads a device.prepare result, strictly: it must be an object; every field is optional (absent: the default),
// but a field of the wrong type or range, an unknown attach mode or an unknown field is an "invalid_argument"
// error naming the field (e.g. "device.prepare result: field 'details.memory_bytes' must be a non-negative
// integer") and `where`.
Result<host::PrepareResult> parse_prepare_result(const boost::json::value& result, std::string_view where);

}  // namespace accelpool::agent
