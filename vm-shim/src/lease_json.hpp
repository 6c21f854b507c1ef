// Internal: JSON <-> lease descriptions.
#pragma once

#include <accelpool/shim/client.hpp>

#include <nlohmann/json.hpp>

namespace accelpool::shim {

// Parses one lease object of the protocol. Errors: "protocol" naming what is missing.
Result<LeaseInfo> lease_from_json(const nlohmann::json& j);

// What a device name says about the device (see DeviceInfo).
DeviceInfo describe_device(const std::string& name);

}  // namespace accelpool::shim
