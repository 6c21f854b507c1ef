#include <accelpool/backends/xrt_backend.hpp>

#include <accelpool/bitstreams/xclbin.hpp>

#include <experimental/xrt_system.h>
#include <xclbin.h>
#include <xrt/xrt_device.h>
#include <xrt/xrt_uuid.h>

#include <unistd.h>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <system_error>

namespace accelpool::backends {
namespace {

// Runs `f`, turning any exception into an Error with `code` and `what` as context.
template <typename F>
auto guarded(Errc code, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return make_error(code, "xrt backend: " + what + ": " + e.what());
  } catch (...) {
    return make_error(code, "xrt backend: " + what + ": unknown XRT error");
  }
}

// The card's serial number, from the JSON text of the `platform` query ("serial_num": "...").
std::string serial_from(const std::string& platform_json) {
  auto key = platform_json.find("\"serial_num\"");
  if (key == std::string::npos) return "";
  auto colon = platform_json.find(':', key);
  auto open = platform_json.find('"', colon);
  auto close = open == std::string::npos ? open : platform_json.find('"', open + 1);
  if (colon == std::string::npos || open == std::string::npos || close == std::string::npos) return "";
  return platform_json.substr(open + 1, close - open - 1);
}

}  // namespace

XrtShellSlots xrt_shell_slots(std::string_view shell, std::uint16_t xclbin_mode) {
  static constexpr const char* kModes[] = {
      "XCLBIN_FLAT",   "XCLBIN_PR",     "XCLBIN_TANDEM_STAGE2", "XCLBIN_TANDEM_STAGE2_WITH_PR",
      "XCLBIN_HW_EMU", "XCLBIN_SW_EMU", "XCLBIN_HW_EMU_PR"};
  static_assert(std::size(kModes) == XCLBIN_MODE_MAX);
  XrtShellSlots r;
  const std::string name = "shell '" + std::string(shell) + "'";
  if (xclbin_mode >= XCLBIN_MODE_MAX) {
    r.report =
        name + ": unknown XCLBIN_MODE " + std::to_string(xclbin_mode) + ", so the card is offered whole (no slots)";
    return r;
  }
  const std::string mode = std::string(" (") + kModes[xclbin_mode] + ")";
  r.partial_reconfiguration =
      xclbin_mode == XCLBIN_PR || xclbin_mode == XCLBIN_TANDEM_STAGE2_WITH_PR || xclbin_mode == XCLBIN_HW_EMU_PR;
  r.report =
      r.partial_reconfiguration
          ? name + " reconfigures one user region" + mode +
                ": an xclbin fills all of it and XRT loads one per card, so the card is offered whole (no slots)"
          : name + " is flat" + mode + ": an xclbin replaces the whole device, so the card is offered whole (no slots)";
  return r;
}

Result<XrtConfig> parse_xrt_config(const BackendConfig& config) {
  ConfigReader r("xrt", config);
  XrtConfig c;
  const char* tmp = std::getenv("TMPDIR");
  std::filesystem::path base = tmp && *tmp ? tmp : "/tmp";
  c.runtime_root = r.get_string("runtime_root", (base / ("accelpool-xrt-" + std::to_string(getuid()))).string());
  c.xrt_lib_dir = r.get_string("xrt_lib_dir", c.xrt_lib_dir.string());
  if (auto st = r.finish(); !st) return st.error();
  if (!c.runtime_root.is_absolute())
    return r.error("runtime_root", "'" + c.runtime_root.string() + "' must be absolute");
  return c;
}

Result<std::unique_ptr<XrtBackend>> XrtBackend::create(const BackendConfig& config) {
  auto c = parse_xrt_config(config);
  if (!c) return c.error();
  const char* set = std::getenv("XILINX_XRT");
  if (!set || !*set) {
    std::error_code ec;
    std::filesystem::create_directories(c->runtime_root, ec);
    if (ec)
      return make_error(Errc::backend_failed,
                        "xrt backend: cannot create " + c->runtime_root.string() + ": " + ec.message());
    auto lib = c->runtime_root / "lib";
    if (!std::filesystem::exists(std::filesystem::symlink_status(lib, ec))) {
      std::filesystem::create_directory_symlink(c->xrt_lib_dir, lib, ec);
      if (ec)
        return make_error(Errc::backend_failed, "xrt backend: cannot link " + lib.string() + " -> " +
                                                    c->xrt_lib_dir.string() + ": " + ec.message());
    }
    setenv("XILINX_XRT", c->runtime_root.c_str(), 1);
  }
  return std::unique_ptr<XrtBackend>(new XrtBackend());
}

XrtBackend::~XrtBackend() = default;

Result<std::vector<DeviceInfo>> XrtBackend::enumerate() {
  return guarded(Errc::backend_failed, "enumerating devices", [&]() -> Result<std::vector<DeviceInfo>> {
    std::vector<DeviceInfo> out;
    unsigned int n = xrt::system::enumerate_devices();
    for (unsigned int i = 0; i < n; ++i) {
      xrt::device device(i);
      DeviceInfo info;
      info.pci_bdf = device.get_info<xrt::info::device::bdf>();
      info.local_id = "xrt:" + info.pci_bdf;
      info.kind = "fpga";
      info.model = device.get_info<xrt::info::device::name>();
      info.passthrough = true;
      info.attributes["index"] = std::to_string(i);
      std::uint16_t mode = XCLBIN_FLAT;
      try {
        if (device.get_info<xrt::info::device::interface_uuid>()) mode = XCLBIN_PR;
      } catch (const std::exception&) {
        // A flat shell may not answer the query: it has no interface UUID.
      }
      const XrtShellSlots shell = xrt_shell_slots(info.model, mode);
      info.slots = shell.slots;
      info.attributes["slot_support"] = shell.report;
      try {
        std::string serial = serial_from(device.get_info<xrt::info::device::platform>());
        if (!serial.empty()) info.attributes["serial"] = serial;
      } catch (const std::exception&) {
        // Older shells do not answer the platform query; the serial is optional.
      }
      out.push_back(std::move(info));
    }
    return out;
  });
}

Result<unsigned int> XrtBackend::index_of(std::string_view local_id) {
  auto devices = enumerate();
  if (!devices) return devices.error();
  for (const auto& d : *devices) {
    if (d.local_id == local_id) return static_cast<unsigned int>(std::stoul(d.attributes.at("index")));
  }
  return make_error(Errc::not_found, "xrt backend: no device '" + std::string(local_id) + "'");
}

Status XrtBackend::program(std::string_view local_id, const Image& image) {
  auto index = index_of(local_id);
  if (!index) return index.error();
  if (image_format(image) != "xclbin")
    return make_error(Errc::incompatible, "xrt backend: image " + image.name + " has format " + image_format(image) +
                                              "; XRT devices load xclbin images");
  auto info = bitstreams::read_xclbin(image.file);
  if (!info) return info.error();
  return guarded(Errc::program_failed, "programming " + std::string(local_id), [&]() -> Status {
    xrt::device device(*index);
    DeviceInfo dev;
    dev.local_id = std::string(local_id);
    dev.model = device.get_info<xrt::info::device::name>();
    if (info->platform != dev.model)
      return make_error(Errc::incompatible, "xrt backend: image " + image.name + " targets platform '" +
                                                info->platform + "' but device " + dev.local_id + " runs shell '" +
                                                dev.model + "'");
    if (auto st = check_compatible(image, dev); !st) return st;
    xrt::uuid uuid = device.load_xclbin(image.file.string());
    sha_by_uuid_[uuid.to_string()] = image.sha256;
    return Status::ok();
  });
}

Result<std::string> XrtBackend::loaded(std::string_view local_id) {
  auto index = index_of(local_id);
  if (!index) return index.error();
  return guarded(Errc::backend_failed, "reading the loaded xclbin of " + std::string(local_id),
                 [&]() -> Result<std::string> {
                   xrt::device device(*index);
                   xrt::uuid uuid = device.get_xclbin_uuid();
                   if (!uuid) return std::string();
                   auto it = sha_by_uuid_.find(uuid.to_string());
                   return it == sha_by_uuid_.end() ? std::string() : it->second;
                 });
}

Status XrtBackend::reset(std::string_view local_id) {
  auto index = index_of(local_id);
  if (!index) return index.error();
  return guarded(Errc::reset_failed, "resetting " + std::string(local_id), [&]() -> Status {
    xrt::device device(*index);
    if (device.get_info<xrt::info::device::offline>())
      return make_error(Errc::reset_failed, "xrt backend: device " + std::string(local_id) + " is offline");
    return Status::ok();
  });
}

HealthReport XrtBackend::health(std::string_view local_id) {
  auto index = index_of(local_id);
  if (!index) return {Health::failed, index.error().message};
  try {
    xrt::device device(*index);
    if (device.get_info<xrt::info::device::offline>()) return {Health::failed, "device reports itself offline"};
    return {Health::ok, ""};
  } catch (const std::exception& e) {
    return {Health::failed, std::string("XRT: ") + e.what()};
  } catch (...) {
    return {Health::failed, "XRT: unknown error"};
  }
}

}  // namespace accelpool::backends
