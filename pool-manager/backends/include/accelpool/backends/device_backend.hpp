// One interface for every kind of device a host can drive: XRT FPGAs, OpenCL devices (GPUs, PoCL CPU
// sub-devices), and the simulated backend. Each backend lives in its own folder and CMake target beside
// this header; vendor SDKs are touched only there.
//
// Threading: a backend object is used from one thread at a time (the host runtime serialises its calls), unless
// it declares parallel_devices(): then calls on different devices may run at the same time. Calls may block
// (programming an FPGA takes seconds), so the pool manager's state owner never calls them directly.
// Errors: every call returns a Status/Result; vendor exceptions never escape a backend.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/common/slots.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::backends {

// A device as the backend found it. `local_id` is unique within the backend and stable across restarts
// of the agent (e.g. "xrt:0000:65:00.1", "opencl:0:0.2", "sim:3").
struct DeviceInfo {
  std::string local_id;
  std::string kind;         // scheduling class: "fpga", "gpu", "cpu", ...
  std::string model;        // e.g. "xilinx_u250_gen3x16_xdma_4_1_202210_1", "pthread-haswell", "sim-u250"
  std::string pci_bdf;      // "0000:65:00.1" when the device is a PCI function, else empty
  bool passthrough = true;  // false: network-attached, reachable from guests on any host
  std::map<std::string, std::string> attributes;  // backend-specific facts (serial, vendor, memory, ...)
  // Partial-reconfiguration slots (common/slots.hpp): 0 for a device programmed whole only. Slot n is addressed
  // as slot_local_id(local_id, n) in program(), loaded(), reset() and health(); it takes partial images only,
  // and the whole device full images only.
  std::uint32_t slots = 0;
};

// The shape of each of `device`'s slots, in slot order, as its backend reports them in its attributes:
// `slot_shapes` ("cu2,cu1,cu1"), else `slot_shape` for every slot, else none (an empty list). The hosts pass
// them on to the manager, which places a partial image only on slots of its manifest's `slot_shape`.
inline std::vector<std::string> slot_shapes_of(const DeviceInfo& device) {
  std::vector<std::string> shapes;
  if (auto listed = device.attributes.find("slot_shapes"); listed != device.attributes.end()) {
    shapes = split_slot_shapes(listed->second);
  } else if (auto one = device.attributes.find("slot_shape"); one != device.attributes.end()) {
    shapes.assign(device.slots, one->second);
  }
  return shapes;
}

// What to program: a bitstream image already verified by the registry (checksum, compatibility).
// make_image() in <accelpool/backends/factory.hpp> builds one from a registry entry.
struct Image {
  std::string name;  // registry name, e.g. "vadd"
  std::string version;
  std::string sha256;          // identity of the image
  std::filesystem::path file;  // .xclbin, OpenCL source (.cl) or binary; may be empty for the sim backend
  std::uint64_t size_bytes = 0;
  std::string format;                   // "xclbin", "opencl-source", "opencl-binary", "opaque"; "" = by file extension
  std::vector<std::string> compatible;  // device models/shells it fits ('*' wildcards); empty = not checked
  std::vector<std::string> kernels;     // kernel names it provides
  bool partial = false;                 // a partial image: goes into one slot of a device, never a whole device
  // A partial image: the slot shape it fits (manifest `slot_shape`). A backend whose slots have a shape refuses
  // another one (opencl: "cu<compute units>"); the sim backend's slots take any.
  std::string slot_shape;
};

enum class Health : std::uint8_t { ok, degraded, failed };

struct HealthReport {
  Health health = Health::ok;
  std::string detail;  // why, when not ok
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // "xrt", "opencl", "sim".
  virtual std::string_view name() const = 0;

  // True when calls on different devices may run concurrently (calls on one device still come one at a time).
  virtual bool parallel_devices() const { return false; }

  // Lists the devices present now. Absent hardware is not an error: it is an empty list.
  virtual Result<std::vector<DeviceInfo>> enumerate() = 0;

  // Loads `image` onto the device; returns when the device is ready to run it. The caller passes only images
  // the registry verified (Registry::verify right before, then make_image); the backend still refuses images
  // whose format it cannot load or whose `compatible` list misses the device model, without touching the device.
  // `local_id` may name a slot (DeviceInfo::slots): a partial image goes into a slot, a full one on the whole
  // device (which empties its slots).
  // Errors: "not_found" (no such device), "incompatible" (image not for this device, a partial image for a whole
  // device or a full one for a slot), "corrupt_image" (XRT: the
  // file no longer parses), "invalid_argument" (the image has no sha256), "program_failed" (the device or driver
  // failed; the message says why).
  virtual Status program(std::string_view local_id, const Image& image) = 0;

  // sha256 of the image the device holds now, or "" when none (or when the backend cannot tell).
  virtual Result<std::string> loaded(std::string_view local_id) = 0;

  // Returns the device to a clean state between tenants (clears memory, may unload the image: sim keeps it
  // unless configured, OpenCL drops its program, XRT keeps the xclbin). Errors: "not_found", "reset_failed".
  virtual Status reset(std::string_view local_id) = 0;

  // A quick check that the device works (e.g. a tiny kernel run). Must not take more than about a second
  // (OpenCL's first call per device may take longer while the driver compiles the check kernel). Never throws;
  // an unknown device is reported as failed.
  virtual HealthReport health(std::string_view local_id) = 0;

  // Serving a device over the network (docs/remote-opencl.md): makes `local_id` reachable by one lease's program
  // on any machine and returns where ("ocl+tcp://HOST:PORT/CAPABILITY"), or "" when the backend serves none of its
  // devices that way (the default). Called when the device is prepared for a lease, after programming; a device
  // opened already is closed first. Errors: "not_found".
  virtual Result<std::string> open_remote(std::string_view local_id) {
    (void)local_id;
    return std::string();
  }

  // Ends what open_remote opened: its capability ends, its connections are cut and everything they made on the
  // device is released. Called when the lease ends, before reset(). A device that is not open: nothing to do.
  virtual void close_remote(std::string_view local_id) { (void)local_id; }
};

}  // namespace accelpool::backends
