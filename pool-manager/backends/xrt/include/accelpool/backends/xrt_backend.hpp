// XRT backend (Xilinx/AMD Alveo FPGAs): enumerates the cards XRT sees (BDF, shell VBNV, serial), loads an
// xclbin, reads back the loaded xclbin UUID, resets and checks health. Every XRT exception is caught here and
// turned into an Error; none escapes. With no card present it reports 0 devices.
//
// Environment: XRT finds its driver plug-ins under $XILINX_XRT/lib and refuses to enumerate without it.
// When XILINX_XRT is unset, create() points it at `runtime_root` (config), a folder whose `lib` links to
// `xrt_lib_dir` (the multiarch library folder where Debian installs XRT). An operator may set XILINX_XRT
// instead; it is then left alone.
#pragma once

#include <accelpool/backends/config.hpp>
#include <accelpool/backends/device_backend.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

namespace accelpool::backends {

struct XrtConfig {
  std::filesystem::path runtime_root;  // default: $TMPDIR (or /tmp)/accelpool-xrt-<uid>
  std::filesystem::path xrt_lib_dir = "/usr/lib/x86_64-linux-gnu";
};

// Parses the "xrt" config keys (docs/hosts.md). Errors: "invalid_argument" naming the key.
Result<XrtConfig> parse_xrt_config(const BackendConfig& config);

class XrtBackend final : public DeviceBackend {
 public:
  // Prepares XILINX_XRT (see above). Errors: "invalid_argument" (config), "backend_failed" (the runtime root
  // cannot be created).
  static Result<std::unique_ptr<XrtBackend>> create(const BackendConfig& config);
  ~XrtBackend() override;

  std::string_view name() const override { return "xrt"; }
  // Devices are named "xrt:<BDF>"; model = shell VBNV; attributes: serial (when the card reports it), index.
  // Errors: "backend_failed" when XRT itself fails (not when there is no card).
  Result<std::vector<DeviceInfo>> enumerate() override;
  // Reads the xclbin with the registry's checker + XRT's parser, requires its platform to be the device's shell
  // (and the image's compatible list to match), then loads it. Errors: "not_found", "incompatible",
  // "corrupt_image", "program_failed".
  Status program(std::string_view local_id, const Image& image) override;
  // sha256 of the image whose UUID the device reports as loaded; "" when none or loaded by someone else.
  Result<std::string> loaded(std::string_view local_id) override;
  // XRT's public API has no reset call: this re-opens the device and checks it is not offline; device memory
  // is freed when the previous tenant's buffers are released. A full hot reset is `xbutil reset` (operator).
  Status reset(std::string_view local_id) override;
  // Failed when the device cannot be opened or reports itself offline.
  HealthReport health(std::string_view local_id) override;

 private:
  XrtBackend() = default;
  Result<unsigned int> index_of(std::string_view local_id);

  std::map<std::string, std::string> sha_by_uuid_;  // what this backend loaded
};

}  // namespace accelpool::backends
