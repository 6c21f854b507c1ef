// The environment accelpool-run gives its command (docs/guest-guide.md, "accelpool-run"): the ACCELPOOL_* variables
// that describe the grant, and the variables that restrict vendor runtimes to the granted devices. Header-only, so
// that accelpool-run and the shim's tests compile the same code without a library of their own.
#pragma once

#include <accelpool/shim/client.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace accelpool::shim::run {

// Where the facts about this machine's GPUs are read. The defaults are the kernel's own files; tests point them
// at a tree of their own.
struct MachineFiles {
  // NVIDIA's driver: <dir>/<DDDD:BB:SS.F>/information has the line "GPU UUID: \t GPU-..." for each GPU it drives.
  std::string nvidia_gpus_dir = "/proc/driver/nvidia/gpus";
  // amdgpu's KFD topology: <dir>/<node>/properties has the lines "domain N", "location_id N" (bus << 8 | slot << 3
  // | function) and "unique_id N" for each GPU node.
  std::string kfd_nodes_dir = "/sys/class/kfd/kfd/topology/nodes";
  // The PCI functions: <dir>/<DDDD:BB:SS.F>/vendor, /class, and the link /driver.
  std::string pci_devices_dir = "/sys/bus/pci/devices";
};

// What the command gets: "NAME=value" entries, and for --verbose why a vendor variable that could apply to a
// granted device was not set.
struct CommandEnvironment {
  std::vector<std::string> variables;
  std::vector<std::string> notes;
};

namespace detail {

// A PCI address as numbers, and its canonical text "dddd:bb:ss.f" (lower-case hex, as sysfs and NVIDIA's /proc
// files name functions).
struct PciAddress {
  unsigned domain = 0, bus = 0, slot = 0, function = 0;

  std::string text() const {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain & 0xffffu, bus & 0xffu, slot & 0x1fu, function & 7u);
    return buf;
  }
  auto key() const { return std::tie(domain, bus, slot, function); }
  bool operator<(const PciAddress& o) const { return key() < o.key(); }
  bool operator==(const PciAddress& o) const { return key() == o.key(); }
};

// "DDDD:BB:SS.F" or "BB:SS.F" (hex, any case); nothing for anything else.
inline std::optional<PciAddress> parse_pci_address(const std::string& s) {
  PciAddress a;
  char end = 0;
  if (std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &a.domain, &a.bus, &a.slot, &a.function, &end) == 4 ||
      (std::sscanf(s.c_str(), "%x:%x.%x%c", &a.bus, &a.slot, &a.function, &end) == 3 &&
       std::count(s.begin(), s.end(), ':') == 1)) {
    if (a.domain <= 0xffff && a.bus <= 0xff && a.slot <= 0x1f && a.function <= 7) return a;
  }
  return std::nullopt;
}

// Whether `text`, in lower case, contains `lower_word` (given in lower case).
inline bool contains_word(const std::string& text, const std::string& lower_word) {
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find(lower_word) != std::string::npos;
}

// A small text file's content without trailing white space; "" when it cannot be read.
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

// The runtimes accelpool-run restricts, each with the variable that does it.
enum class Runtime { none, cuda, rocr, level_zero, pocl };

// The PoCL CPU driver that made device `d`, from the name PoCL gives its CPU devices, "<driver>-<cpu>" (PoCL 3:
// "pthread", "basic", "tbb"; PoCL 4 and later: "cpu", "cpu-minimal", "cpu-tbb"); "" when `d` is not a PoCL CPU
// device of an OpenCL platform of the program's machine (no OpenCL indexes).
inline std::string pocl_cpu_driver(const DeviceInfo& d) {
  if (d.backend != "opencl" || d.kind != "cpu" || !d.opencl_platform || !d.opencl_device) return "";
  for (const char* driver : {"cpu-minimal", "cpu-tbb", "pthread", "basic", "tbb", "cpu"}) {  // longest prefix first
    if (d.model.rfind(std::string(driver) + "-", 0) == 0) return driver;
  }
  return "";
}

// The vendor runtime that serves `d`, by its PCI vendor id or, where the lease has none, its vendor's name. A CPU
// is never a GPU runtime's, whatever its vendor (PoCL reports the CPU's, e.g. "AuthenticAMD").
inline Runtime runtime_of(const DeviceInfo& d) {
  if (d.kind == "gpu") {
    if (d.pci_vendor_id == 0x10de || (d.pci_vendor_id == 0 && contains_word(d.vendor, "nvidia"))) return Runtime::cuda;
    if (d.pci_vendor_id == 0x1002 || (d.pci_vendor_id == 0 && contains_word(d.vendor, "advanced micro devices")))
      return Runtime::rocr;
    if (d.pci_vendor_id == 0x8086 || (d.pci_vendor_id == 0 && contains_word(d.vendor, "intel")))
      return Runtime::level_zero;
    return Runtime::none;
  }
  return pocl_cpu_driver(d).empty() ? Runtime::none : Runtime::pocl;
}

// The PCI address at which the command's machine has `d`: the lease's "pci" when the device is in this VM
// (pci_hostdev) or on the manager's host the command shares (in_process). Elsewhere ("none", "network") the
// address is the device host's, which may name another device here. Errors: "not_found" saying why.
inline Result<PciAddress> local_pci_address(const DeviceInfo& d) {
  if (d.attach != "pci_hostdev" && d.attach != "in_process")
    return make_error(Errc::not_found, d.name + " is not a PCI device of this machine (attach '" + d.attach + "')");
  auto a = parse_pci_address(d.pci_address);
  if (!a) return make_error(Errc::not_found, d.name + " has no PCI address in the lease ('" + d.pci_address + "')");
  return *a;
}

// The UUID CUDA_VISIBLE_DEVICES takes for the NVIDIA GPU at `a`, from the driver's /proc file. Errors:
// "not_found" saying which file lacks it.
inline Result<std::string> nvidia_gpu_uuid(const MachineFiles& m, const PciAddress& a) {
  const std::string path = m.nvidia_gpus_dir + "/" + a.text() + "/information";
  std::ifstream in(path);
  if (!in)
    return make_error(Errc::not_found, "no " + path + ": the NVIDIA driver does not drive " + a.text() + " here");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("GPU UUID:", 0) != 0) continue;
    auto start = line.find("GPU-");
    if (start == std::string::npos) break;
    auto end = line.find_first_of(" \t\r", start);
    return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
  }
  return make_error(Errc::not_found, path + " has no GPU UUID (the driver has not initialised the GPU yet)");
}

// The UUID ROCR_VISIBLE_DEVICES takes for the AMD GPU at `a`: "GPU-" and the KFD node's unique_id as 16 hex digits,
// as ROCr itself names the agent. Errors: "not_found" saying why.
inline Result<std::string> amd_gpu_uuid(const MachineFiles& m, const PciAddress& a) {
  std::error_code ec;
  std::filesystem::directory_iterator nodes(m.kfd_nodes_dir, ec);
  if (ec) return make_error(Errc::not_found, "no " + m.kfd_nodes_dir + ": amdgpu's KFD does not run here");
  const unsigned long long location = (a.bus << 8) | (a.slot << 3) | a.function;
  for (const auto& node : nodes) {
    std::map<std::string, unsigned long long> properties;
    std::ifstream in(node.path() / "properties");
    for (std::string line; std::getline(in, line);) {
      const auto space = line.find(' ');
      if (space != std::string::npos)
        properties[line.substr(0, space)] = std::strtoull(line.c_str() + space, nullptr, 10);
    }
    if (!properties.count("location_id") || properties["location_id"] != location || properties["domain"] != a.domain)
      continue;
    if (properties["unique_id"] == 0) {
      return make_error(Errc::not_found, "KFD node " + node.path().filename().string() + " (" + a.text() +
                                             ") has no unique_id: ROCr gives this GPU no UUID");
    }
    char uuid[24];
    std::snprintf(uuid, sizeof uuid, "GPU-%016llx", properties["unique_id"]);
    return std::string(uuid);
  }
  return make_error(Errc::not_found, "no KFD node of " + m.kfd_nodes_dir + " is the GPU at " + a.text());
}

// The index ZE_AFFINITY_MASK takes for the Intel GPU at `a` when Level Zero orders its devices by PCI address
// (ZE_ENABLE_PCI_ID_DEVICE_ORDER=1) and each PCI device is one root device (ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE): its
// rank among the Intel display-class functions that i915 or xe drive. Errors: "not_found" saying why.
inline Result<std::size_t> intel_gpu_rank(const MachineFiles& m, const PciAddress& a) {
  std::error_code ec;
  std::filesystem::directory_iterator functions(m.pci_devices_dir, ec);
  if (ec) return make_error(Errc::not_found, "cannot list " + m.pci_devices_dir);
  std::set<PciAddress> intel_gpus;
  for (const auto& f : functions) {
    auto address = parse_pci_address(f.path().filename().string());
    if (!address || read_text((f.path() / "vendor").string()) != "0x8086") continue;
    if (read_text((f.path() / "class").string()).rfind("0x03", 0) != 0) continue;
    const std::string driver = std::filesystem::read_symlink(f.path() / "driver", ec).filename().string();
    if (!ec && (driver == "i915" || driver == "xe")) intel_gpus.insert(*address);
  }
  auto it = intel_gpus.find(a);
  if (it == intel_gpus.end())
    return make_error(Errc::not_found, a.text() + " is not an Intel GPU that i915 or xe drive here");
  return static_cast<std::size_t>(std::distance(intel_gpus.begin(), it));
}

// The vendor variables for a grant, and where they renumber OpenCL devices.
struct VendorRestriction {
  std::vector<std::string> variables;
  std::vector<std::string> notes;
  // PoCL devices under POCL_DEVICES: (host, platform, device index as the host reported it) -> the index the
  // command sees.
  std::map<std::tuple<std::string, int, int>, int> pocl_device_index;

  // The OpenCL device index the command sees for `d`.
  int opencl_device(const DeviceInfo& d) const {
    auto it = pocl_device_index.find({d.host, *d.opencl_platform, *d.opencl_device});
    return it == pocl_device_index.end() ? *d.opencl_device : it->second;
  }
};

// One identifier per granted device of a GPU runtime, in grant order, without repeats; or the first device it
// cannot be had for (then the variable is not set at all: a list without a granted device would hide it).
template <typename Identify>
Result<std::string> identifiers(const std::vector<const DeviceInfo*>& devices, Identify identify) {
  std::vector<std::string> ids;
  for (const DeviceInfo* d : devices) {
    auto address = local_pci_address(*d);
    if (!address) return address.error();
    auto id = identify(*address);
    if (!id) return make_error(id.error().code, d->name + ": " + id.error().message);
    if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  std::string joined;
  for (const auto& id : ids) joined += (joined.empty() ? "" : ",") + id;
  return joined;
}

// The vendor variables for the granted `devices` on the machine `m` describes (see lease_environment below).
inline VendorRestriction restrict_vendor_runtimes(const std::vector<DeviceInfo>& devices, const MachineFiles& m) {
  VendorRestriction out;
  std::map<Runtime, std::vector<const DeviceInfo*>> by_runtime;
  for (const auto& d : devices) {
    if (Runtime r = runtime_of(d); r != Runtime::none) by_runtime[r].push_back(&d);
  }
  auto set_or_note = [&](const char* variable, const Result<std::string>& value) {
    if (value) {
      out.variables.push_back(std::string(variable) + "=" + *value);
    } else {
      out.notes.push_back(std::string(variable) + " not set: " + value.error().message);
    }
    return value.is_ok();
  };
  if (by_runtime.count(Runtime::cuda)) {
    set_or_note("CUDA_VISIBLE_DEVICES",
                identifiers(by_runtime[Runtime::cuda], [&](const PciAddress& a) { return nvidia_gpu_uuid(m, a); }));
  }
  if (by_runtime.count(Runtime::rocr)) {
    set_or_note("ROCR_VISIBLE_DEVICES",
                identifiers(by_runtime[Runtime::rocr], [&](const PciAddress& a) { return amd_gpu_uuid(m, a); }));
  }
  if (by_runtime.count(Runtime::level_zero)) {
    auto rank = [&](const PciAddress& a) -> Result<std::string> {
      auto r = intel_gpu_rank(m, a);
      if (!r) return r.error();
      return std::to_string(*r);
    };
    if (set_or_note("ZE_AFFINITY_MASK", identifiers(by_runtime[Runtime::level_zero], rank))) {
      out.variables.push_back("ZE_ENABLE_PCI_ID_DEVICE_ORDER=1");
      out.variables.push_back("ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE");
    }
  }
  if (by_runtime.count(Runtime::pocl)) {
    // One driver instance per distinct granted device, in the order the host numbered them: PoCL numbers its
    // devices by driver and instance, so the granted ones keep their order and become 0, 1, ...
    std::map<std::tuple<std::string, int, int>, std::string> drivers;
    for (const DeviceInfo* d : by_runtime[Runtime::pocl]) {
      drivers[{d->host, *d->opencl_platform, *d->opencl_device}] = pocl_cpu_driver(*d);
      if (d->opencl_subdevice) {
        out.notes.push_back("no compute-unit limit for PoCL: the lease does not say how many compute units " + d->name +
                            " (a sub-device) has, so the command sees its whole device");
      }
    }
    std::string list;
    for (const auto& [key, driver] : drivers) {
      out.pocl_device_index[key] = static_cast<int>(out.pocl_device_index.size());
      list += (list.empty() ? "" : " ") + driver;
    }
    out.variables.push_back("POCL_DEVICES=" + list);
  }
  return out;
}

}  // namespace detail

// The variables the command gets: the grant's ACCELPOOL_* (each device's PCI address, OpenCL indexes, ...), and the
// vendor variables that show a vendor's runtime only the granted devices: CUDA_VISIBLE_DEVICES (NVIDIA GPUs, by
// UUID), ROCR_VISIBLE_DEVICES (AMD GPUs, by UUID), ZE_AFFINITY_MASK with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1 and
// ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE (Intel GPUs, by index in PCI order), POCL_DEVICES (PoCL CPU devices, by
// driver). A vendor variable is set only when the grant has devices of that runtime and every one of them can be
// identified on this machine (`machine`); a note says why not otherwise. They replace what the caller's environment
// holds: the grant decides what the command may use. Under POCL_DEVICES the PoCL devices are renumbered, and
// ACCELPOOL_OPENCL_* give the indexes the command sees.
inline CommandEnvironment lease_environment(const LeaseInfo& l, const std::string& pool, const std::string& ca_file,
                                            const std::string& guest, const MachineFiles& machine = {}) {
  const detail::VendorRestriction vendor = detail::restrict_vendor_runtimes(l.devices, machine);
  CommandEnvironment out;
  std::vector<std::string>& env = out.variables;
  auto add = [&](const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };
  std::string names, pci, ocl, xrt, endpoints, models;
  for (const auto& d : l.devices) {
    auto join = [](std::string& list, const std::string& v) { list += (list.empty() ? "" : ",") + v; };
    join(names, d.name);
    if (!d.pci_address.empty()) join(pci, d.pci_address);
    if (d.opencl_platform && d.opencl_device) {
      join(ocl, std::to_string(*d.opencl_platform) + ":" + std::to_string(vendor.opencl_device(d)) +
                    (d.opencl_subdevice ? "/" + std::to_string(*d.opencl_subdevice) : ""));
    }
    if (d.xrt_index) join(xrt, std::to_string(*d.xrt_index));
    if (!d.endpoint.empty()) join(endpoints, d.endpoint);
    if (!d.model.empty()) join(models, d.model);
  }
  add("ACCELPOOL_LEASE", std::to_string(l.id));
  add("ACCELPOOL_KIND", l.kind);
  add("ACCELPOOL_BITSTREAM", l.bitstream);
  add("ACCELPOOL_COUNT", std::to_string(l.devices.size()));
  add("ACCELPOOL_DEVICES", names);
  add("ACCELPOOL_LEASE_JSON", l.json);
  add("ACCELPOOL_POOL", pool);
  if (!ca_file.empty()) add("ACCELPOOL_POOL_CA", ca_file);
  add("ACCELPOOL_GUEST", guest);
  if (!models.empty()) add("ACCELPOOL_MODELS", models);
  if (!pci.empty()) add("ACCELPOOL_PCI", pci);
  if (!ocl.empty()) {
    add("ACCELPOOL_OPENCL_DEVICES", ocl);
    const auto& d = *std::find_if(l.devices.begin(), l.devices.end(),
                                  [](const DeviceInfo& x) { return x.opencl_platform && x.opencl_device; });
    add("ACCELPOOL_OPENCL_PLATFORM", std::to_string(*d.opencl_platform));
    add("ACCELPOOL_OPENCL_DEVICE", std::to_string(vendor.opencl_device(d)));
    if (d.opencl_subdevice) add("ACCELPOOL_OPENCL_SUBDEVICE", std::to_string(*d.opencl_subdevice));
  }
  if (!xrt.empty()) add("ACCELPOOL_XRT_INDEX", xrt.substr(0, xrt.find(',')));
  if (!endpoints.empty()) add("ACCELPOOL_ENDPOINTS", endpoints);
  // Each device on its own: ACCELPOOL_DEVICE_<i>_<FIELD>, i from 0 in the order of ACCELPOOL_DEVICES.
  for (std::size_t i = 0; i < l.devices.size(); ++i) {
    const DeviceInfo& d = l.devices[i];
    const std::string p = "ACCELPOOL_DEVICE_" + std::to_string(i) + "_";
    add(p + "NAME", d.name);
    add(p + "KIND", d.kind);
    add(p + "MODEL", d.model);
    add(p + "VENDOR", d.vendor);
    add(p + "ATTACH", d.attach);
    add(p + "PCI", d.pci_address);
    add(p + "ENDPOINT", d.endpoint);
    add(p + "LOADED", d.loaded);
    auto hex = [](std::uint32_t v) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "0x%04x", v);
      return std::string(buf);
    };
    if (d.pci_vendor_id) add(p + "PCI_VENDOR_ID", hex(d.pci_vendor_id));
    if (d.pci_device_id) add(p + "PCI_DEVICE_ID", hex(d.pci_device_id));
    if (d.memory_bytes) add(p + "MEMORY_BYTES", std::to_string(d.memory_bytes));
  }
  env.insert(env.end(), vendor.variables.begin(), vendor.variables.end());
  out.notes = vendor.notes;
  return out;
}

}  // namespace accelpool::shim::run
