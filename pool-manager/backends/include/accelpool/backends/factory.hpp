// Creating backends by name from configuration, and building backend Images from registry entries.
#pragma once

#include <accelpool/backends/config.hpp>
#include <accelpool/backends/device_backend.hpp>
#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/common/result.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::backends {

// Names of the backends this build contains, e.g. {"opencl", "sim", "xrt"}.
std::vector<std::string> built_backends();

// Creates backend `name` ("sim", "opencl", "xrt") with `config` (keys in docs/hosts.md). Called once per backend
// when an agent starts; may take a moment (OpenCL platform discovery). Errors: "not_found" (unknown name, or a
// backend this build does not contain), "invalid_argument" (bad or unknown config key), "backend_failed".
Result<std::unique_ptr<DeviceBackend>> make_backend(std::string_view name, const BackendConfig& config);

// The Image to program for a verified registry entry (in accelpool_backend_api: no backend needed).
Image make_image(const bitstreams::Bitstream& bitstream);

}  // namespace accelpool::backends
