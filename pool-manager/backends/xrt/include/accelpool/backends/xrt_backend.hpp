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

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace accelpool::backends {

struct XrtConfig {
  std::filesystem::path runtime_root;  // default: $TMPDIR (or /tmp)/accelpool-xrt-<uid>
  std::filesystem::path xrt_lib_dir = "/usr/lib/x86_64-linux-gnu";
};

// Parses the "xrt" config keys (docs/hosts.md). Errors: "invalid_argument" naming the key.
Result<XrtConfig> parse_xrt_config(const BackendConfig& config);

// Whether a card's shell supports slots, as XRT's metadata says.
struct XrtShellSlots {
  bool partial_reconfiguration = false;  // the shell has a reconfigurable user region (an XCLBIN_*PR mode)
  std::uint32_t slots = 0;               // the DeviceInfo::slots the backend declares for the card
  std::string report;                    // why, in words: the device's attribute "slot_support"
};

// The slots of a card whose shell is `shell` (VBNV), from the XCLBIN_MODE of an xclbin built for that shell
// (bitstreams::XclbinInfo::mode; for a card, XCLBIN_PR when it reports an interface UUID, which only shells with
// a reconfigurable user region have). Slots need a shell with several user regions that images are loaded into
// one by one; XRT's metadata names no region in an image (an axlf holds one user image) and XRT loads one xclbin
// per card, so a shell with partial reconfiguration has one user region, which an image fills whole: every mode
// gives 0 slots (whole devices only), and the report says whether the shell is flat or reconfigures its user
// region, or that the mode is unknown. Pure: reads nothing.
XrtShellSlots xrt_shell_slots(std::string_view shell, std::uint16_t xclbin_mode);

class XrtBackend final : public DeviceBackend {
 public:
  // Prepares XILINX_XRT (see above). Errors: "invalid_argument" (config), "backend_failed" (the runtime root
  // cannot be created).
  static Result<std::unique_ptr<XrtBackend>> create(const BackendConfig& config);
  ~XrtBackend() override;

  std::string_view name() const override { return "xrt"; }
  // Devices are named "xrt:<BDF>"; model = shell VBNV; attributes: serial (when the card reports it), index,
  // slot_support (xrt_shell_slots' report); slots as xrt_shell_slots says (none).
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
