// The contract between the pool manager and a host, whether the host runs in the manager's process or is a
// remote accelpool-agent: what the manager asks when it prepares a device for a lease, and what the host
// answers. Plain data, no dependencies: the manager's core, the agent protocol codec, the host runtime and the
// guest protocol all speak these types, so nothing a guest needs is lost on the way.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace accelpool::host {

// What a device is, as its host knows it. Fields a backend cannot tell stay empty / zero.
struct DeviceDetails {
  std::string kind;                 // scheduling class: "fpga", "gpu", "cpu", ...
  std::string model;                // device model / shell, e.g. "xilinx_u250_gen3x16_xdma_4_1_202210_1"
  std::string vendor;               // e.g. "Xilinx", "NVIDIA Corporation", "The pocl project"
  std::uint32_t pci_vendor_id = 0;  // PCI ids when the device is a PCI function (0: unknown)
  std::uint32_t pci_device_id = 0;
  std::uint64_t memory_bytes = 0;  // device memory (0: unknown)
  std::string host_pci;            // the host's PCI address "DDDD:BB:SS.F", "" when not a PCI function
};

// How the guest reaches a prepared device.
enum class AttachMode : std::uint8_t {
  none,         // not attached: prepared without a VM (programming only), or the host has no hypervisor
  in_process,   // the embedded default: the guest shares the host's process space, nothing to attach
  pci_hostdev,  // a host PCI function hot-plugged into the VM (VFIO passthrough)
  emulated,     // an emulated PCI device hot-plugged into the VM (e.g. ivshmem backed by the device)
  network,      // network-attached: the guest reaches it at `endpoint`, on any host
};

// The manager asks a host to make one device ready for one lease.
struct PrepareRequest {
  std::string device;      // the host's local id of the device
  std::string lease;       // the lease id, recorded by the host (e.g. in the VM's metadata) for reconciliation
  std::string vm;          // the guest (libvirt domain name or UUID) to attach to; "" programs without attaching
  std::string bitstream;   // image to hold, "" for any
  std::string sha256;      // the image's identity in the manager's registry, "" when it has none
  bool reprogram = false;  // program even when the device already holds the image
};

// What the host did. On failure `loaded` still says what the device holds afterwards.
struct PrepareResult {
  std::string loaded;  // bitstream name the device holds now, "" for none
  AttachMode attach = AttachMode::none;
  std::string guest_pci;  // the PCI address at which the guest sees the device ("DDDD:BB:SS.F"), pci modes only
  std::string endpoint;   // network mode: where the guest reaches the device
  DeviceDetails details;
};

// The mode's name on the wire and in the APIs.
inline std::string_view to_string(AttachMode mode) {
  switch (mode) {
    case AttachMode::none:
      return "none";
    case AttachMode::in_process:
      return "in_process";
    case AttachMode::pci_hostdev:
      return "pci_hostdev";
    case AttachMode::emulated:
      return "emulated";
    case AttachMode::network:
      return "network";
  }
  return "none";
}

// The mode named `text` (as to_string writes it); false when there is none.
inline bool parse_attach_mode(std::string_view text, AttachMode& mode) {
  for (auto m :
       {AttachMode::none, AttachMode::in_process, AttachMode::pci_hostdev, AttachMode::emulated, AttachMode::network}) {
    if (text == to_string(m)) {
      mode = m;
      return true;
    }
  }
  return false;
}

}  // namespace accelpool::host
