// A device as its backend enumerates it (DeviceInfo) -> what its host tells the manager about it
// (host::DeviceDetails, part of every prepare's result).
#pragma once

#include <accelpool/backends/device_backend.hpp>
#include <accelpool/host/contract.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace accelpool::backends {

// kind, model and the host PCI address from `info`; vendor, PCI ids and memory from the attributes a backend
// sets: "vendor", "pci_vendor_id" / "pci_device_id" (hex "0x10ee" or decimal) and "memory_bytes" (or OpenCL's
// "global_mem_bytes"). An attribute that is absent or not a number leaves the field empty / zero.
inline host::DeviceDetails details_of(const DeviceInfo& info) {
  auto attribute = [&](const char* key) {
    auto it = info.attributes.find(key);
    return it == info.attributes.end() ? std::string() : it->second;
  };
  auto number = [&](const char* key) -> std::uint64_t {
    std::string text = attribute(key);
    if (text.empty()) return 0;
    char* end = nullptr;
    errno = 0;
    unsigned long long n = std::strtoull(text.c_str(), &end, 0);
    return (errno != 0 || *end != '\0' || text[0] == '-') ? 0 : n;
  };
  host::DeviceDetails d;
  d.kind = info.kind;
  d.model = info.model;
  d.vendor = attribute("vendor");
  d.pci_vendor_id = static_cast<std::uint32_t>(number("pci_vendor_id") & 0xffffffffu);
  d.pci_device_id = static_cast<std::uint32_t>(number("pci_device_id") & 0xffffffffu);
  d.memory_bytes = info.attributes.count("memory_bytes") ? number("memory_bytes") : number("global_mem_bytes");
  d.host_pci = info.pci_bdf;
  return d;
}

}  // namespace accelpool::backends
