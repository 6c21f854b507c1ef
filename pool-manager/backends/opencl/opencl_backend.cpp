#include <accelpool/backends/opencl_backend.hpp>
#include <accelpool/common/slots.hpp>

#include "remote_server.hpp"

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>

namespace accelpool::backends {
namespace {

std::string cl_error(cl_int code) { return "OpenCL error " + std::to_string(code); }

// A string property of an OpenCL object: `get` is clGetDeviceInfo or clGetPlatformInfo. "" when the call
// fails; trailing NULs and spaces are dropped.
template <typename Handle, typename Info, typename Getter>
std::string info_string(Getter get, Handle h, Info what) {
  std::size_t size = 0;
  if (get(h, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  if (get(h, what, size, s.data(), nullptr) != CL_SUCCESS) return "";
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string device_string(cl_device_id d, cl_device_info what) { return info_string(clGetDeviceInfo, d, what); }

std::string platform_string(cl_platform_id p, cl_platform_info what) { return info_string(clGetPlatformInfo, p, what); }

template <typename T>
T device_value(cl_device_id d, cl_device_info what, T fallback = {}) {
  T v{};
  return clGetDeviceInfo(d, what, sizeof v, &v, nullptr) == CL_SUCCESS ? v : fallback;
}

// Owning handles (release on destruction).
struct ContextDel {
  void operator()(cl_context c) const { clReleaseContext(c); }
};
struct QueueDel {
  void operator()(cl_command_queue q) const { clReleaseCommandQueue(q); }
};
struct ProgramDel {
  void operator()(cl_program p) const { clReleaseProgram(p); }
};
struct KernelDel {
  void operator()(cl_kernel k) const { clReleaseKernel(k); }
};
struct MemDel {
  void operator()(cl_mem m) const { clReleaseMemObject(m); }
};
using Context = std::unique_ptr<std::remove_pointer_t<cl_context>, ContextDel>;
using Queue = std::unique_ptr<std::remove_pointer_t<cl_command_queue>, QueueDel>;
using Program = std::unique_ptr<std::remove_pointer_t<cl_program>, ProgramDel>;
using Kernel = std::unique_ptr<std::remove_pointer_t<cl_kernel>, KernelDel>;
using Mem = std::unique_ptr<std::remove_pointer_t<cl_mem>, MemDel>;

constexpr const char* kHealthSource = R"CL(
__kernel void accelpool_health(__global uint* x) {
  const size_t i = get_global_id(0);
  x[i] = x[i] * 3u + 7u;
}
)CL";

std::string build_log(cl_program program, cl_device_id device) {
  std::size_t size = 0;
  clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
  std::string log(size, '\0');
  if (size) clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (log.size() > 2000) log = log.substr(0, 2000) + " ...";
  return log;
}

}  // namespace

struct OpenClBackend::Impl {
  // A device the backend lists, or one of its slots (listed only as the device's DeviceInfo::slots).
  struct Device {
    DeviceInfo info;  // a slot's: its own local id, the rest as its device's
    cl_device_id id = nullptr;
    bool is_sub_device = false;
    Context context;
    Queue queue;
    Program program;  // the loaded image
    std::string loaded_sha256;
    Program health_program;
    std::vector<std::unique_ptr<Device>> slots;  // info.slots sub-devices, slot n at index n
    std::string shape;                           // a slot's: "cu<compute units of its sub-device>"; "" otherwise

    ~Device() {
      slots.clear();
      program.reset();
      health_program.reset();
      queue.reset();
      context.reset();
      if (is_sub_device && id) clReleaseDevice(id);
    }
  };
  // What a local id names: a listed device, and its region the id addresses (the device itself or a slot).
  struct Target {
    Device* device = nullptr;
    Device* region = nullptr;
    std::optional<std::uint32_t> slot;
  };
  OpenClConfig config;
  std::vector<std::unique_ptr<Device>> devices;
  // Serves devices over the network when config.remote_listen is set; destroyed before the devices it serves.
  std::unique_ptr<RemoteServer> remote;

  Device* find(std::string_view local_id) { return target(local_id).region; }

  Target target(std::string_view local_id) {
    for (auto& d : devices) {
      if (d->info.local_id == local_id) return {d.get(), d.get(), std::nullopt};
    }
    if (auto slot = parse_slot_local_id(local_id)) {
      for (auto& d : devices) {
        if (d->info.local_id == slot->device && slot->index < d->slots.size())
          return {d.get(), d->slots[slot->index].get(), slot->index};
      }
    }
    return {};
  }
  static Error no_device(std::string_view local_id) {
    return make_error(Errc::not_found, "opencl backend: no device '" + std::string(local_id) + "'");
  }

  // A device record with its own context and queue (a sub-device is released with it).
  static Result<std::unique_ptr<Device>> open_device(cl_device_id id, bool sub, DeviceInfo info) {
    auto d = std::make_unique<Device>();
    d->id = id;
    d->is_sub_device = sub;
    d->info = std::move(info);
    cl_int err = CL_SUCCESS;
    d->context.reset(clCreateContext(nullptr, 1, &id, nullptr, nullptr, &err));
    if (err != CL_SUCCESS)
      return make_error(Errc::backend_failed,
                        "opencl backend: creating a context for " + d->info.local_id + ": " + cl_error(err));
    d->queue.reset(clCreateCommandQueue(d->context.get(), id, 0, &err));
    if (err != CL_SUCCESS)
      return make_error(Errc::backend_failed,
                        "opencl backend: creating a queue for " + d->info.local_id + ": " + cl_error(err));
    return d;
  }

  Status add_device(cl_device_id id, bool sub, DeviceInfo info) {
    auto d = open_device(id, sub, std::move(info));
    if (!d) return d.error();
    devices.push_back(std::move(*d));
    return Status::ok();
  }

  // Device `info` (OpenCL device `id`) with one slot per sub-device in `subs`, slot n on subs[n], which it takes
  // over (released with the device, or here on failure). A slot's shape is "cu<compute units of its sub-device>";
  // the device's attribute "slot_shapes" lists them in slot order ("cu2,cu1,cu1"), and "slot_shape" names the one
  // shape when all its slots have it.
  Status add_device_with_slots(cl_device_id id, DeviceInfo info, std::vector<cl_device_id> subs) {
    info.slots = static_cast<std::uint32_t>(subs.size());
    auto d = open_device(id, false, std::move(info));
    if (!d) {
      for (cl_device_id sub : subs) clReleaseDevice(sub);
      return d.error();
    }
    std::string shapes;
    for (std::size_t s = 0; s < subs.size(); ++s) {
      const std::string slot_cus = std::to_string(device_value<cl_uint>(subs[s], CL_DEVICE_MAX_COMPUTE_UNITS));
      DeviceInfo slot = (*d)->info;
      slot.local_id = slot_local_id((*d)->info.local_id, static_cast<std::uint32_t>(s));
      slot.slots = 0;
      slot.attributes["compute_units"] = slot_cus;
      auto record = open_device(subs[s], true, std::move(slot));
      if (!record) {
        for (std::size_t rest = s + 1; rest < subs.size(); ++rest) clReleaseDevice(subs[rest]);
        return record.error();
      }
      (*record)->shape = "cu" + slot_cus;
      shapes += (s ? "," : "") + (*record)->shape;
      (*d)->slots.push_back(std::move(*record));
    }
    const auto& slots = (*d)->slots;
    (*d)->info.attributes["slot_shapes"] = shapes;
    if (std::all_of(slots.begin(), slots.end(), [&](const auto& slot) { return slot->shape == slots.front()->shape; }))
      (*d)->info.attributes["slot_shape"] = slots.front()->shape;
    devices.push_back(std::move(*d));
    return Status::ok();
  }

  // An "invalid_argument" error for config key `key` about device `info`: "... device <id> ('<model>') <why>".
  static Error refuse_split(const std::string& key, const DeviceInfo& info, const std::string& why) {
    return make_error(Errc::invalid_argument, "backend opencl: config key '" + key + "': device " + info.local_id +
                                                  " ('" + info.model + "') " + why);
  }

  // Whether device `id` lists partition type `kind` in CL_DEVICE_PARTITION_PROPERTIES.
  static bool can_partition(cl_device_id id, cl_device_partition_property kind) {
    std::size_t size = 0;
    std::vector<cl_device_partition_property> kinds;
    if (clGetDeviceInfo(id, CL_DEVICE_PARTITION_PROPERTIES, 0, nullptr, &size) == CL_SUCCESS && size > 0) {
      kinds.resize(size / sizeof(cl_device_partition_property));
      if (clGetDeviceInfo(id, CL_DEVICE_PARTITION_PROPERTIES, size, kinds.data(), nullptr) != CL_SUCCESS) kinds.clear();
    }
    return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
  }

  // Splits device `id` as partition properties `props` say into `n` sub-devices (OpenCL may make up to `room`;
  // those beyond the first `n` are released). Errors: "invalid_argument" (refuse_split) when the split fails or
  // gives fewer than `n`.
  static Result<std::vector<cl_device_id>> create_sub_devices(cl_device_id id, const DeviceInfo& info,
                                                              const cl_device_partition_property* props, cl_uint room,
                                                              std::uint32_t n, const std::string& key,
                                                              const std::string& what) {
    std::vector<cl_device_id> subs(std::max<std::size_t>(room, n));
    cl_uint made = 0;
    cl_int err = clCreateSubDevices(id, props, static_cast<cl_uint>(subs.size()), subs.data(), &made);
    if (err != CL_SUCCESS)
      return refuse_split(key, info, "cannot be split into " + std::to_string(n) + " " + what + ": " + cl_error(err));
    subs.resize(made);
    if (made < n) {
      for (cl_device_id sub : subs) clReleaseDevice(sub);
      return refuse_split(key, info, "gave " + std::to_string(made) + " sub-devices, not " + std::to_string(n));
    }
    for (cl_uint extra = n; extra < made; ++extra) clReleaseDevice(subs[extra]);
    subs.resize(n);
    return subs;
  }

  // Splits device `id` (`cus` compute units) into `n` sub-devices of cus / n compute units each
  // (CL_DEVICE_PARTITION_EQUALLY). `what` names the pieces in errors ("sub-devices", "slots"). Errors:
  // "invalid_argument" naming config key `key` and the device: it cannot be partitioned equally, has too few
  // compute units, or the split fails.
  static Result<std::vector<cl_device_id>> split_equally(cl_device_id id, const DeviceInfo& info, cl_uint cus,
                                                         std::uint32_t n, const std::string& key,
                                                         const std::string& what) {
    if (!can_partition(id, CL_DEVICE_PARTITION_EQUALLY))
      return refuse_split(key, info,
                          "cannot be partitioned into equal sub-devices (CL_DEVICE_PARTITION_PROPERTIES lacks "
                          "CL_DEVICE_PARTITION_EQUALLY): it can be offered whole only");
    if (cus < n)
      return refuse_split(
          key, info, "has " + std::to_string(cus) + " compute units, too few for " + std::to_string(n) + " " + what);
    cl_device_partition_property props[] = {CL_DEVICE_PARTITION_EQUALLY,
                                            static_cast<cl_device_partition_property>(cus / n), 0};
    return create_sub_devices(id, info, props, cus, n, key, what);
  }

  // Splits device `id` (`cus` compute units) into one sub-device per entry of `counts`, sub-device n of counts[n]
  // compute units (CL_DEVICE_PARTITION_BY_COUNTS), for config key "slots". Errors: "invalid_argument" naming the
  // key, the counts and the device: it cannot be partitioned by counts, allows fewer sub-devices
  // (CL_DEVICE_PARTITION_MAX_SUB_DEVICES) or has fewer compute units than the counts ask, or the split fails.
  static Result<std::vector<cl_device_id>> split_by_counts(cl_device_id id, const DeviceInfo& info, cl_uint cus,
                                                           const std::vector<std::uint32_t>& counts) {
    std::string spelt;
    std::uint64_t sum = 0;
    for (std::uint32_t c : counts) {
      spelt += (spelt.empty() ? "" : ", ") + std::to_string(c);
      sum += c;
    }
    spelt = "[" + spelt + "]";
    if (!can_partition(id, CL_DEVICE_PARTITION_BY_COUNTS))
      return refuse_split("slots", info,
                          "cannot be partitioned by counts (CL_DEVICE_PARTITION_PROPERTIES lacks "
                          "CL_DEVICE_PARTITION_BY_COUNTS): slots " +
                              spelt + " cannot be made on it");
    const auto most = device_value<cl_uint>(id, CL_DEVICE_PARTITION_MAX_SUB_DEVICES);
    if (counts.size() > most)
      return refuse_split("slots", info,
                          "can be split into at most " + std::to_string(most) + " sub-devices, not the " +
                              std::to_string(counts.size()) + " slots of " + spelt);
    if (sum > cus)
      return refuse_split("slots", info,
                          "has " + std::to_string(cus) + " compute units, fewer than the " + std::to_string(sum) +
                              " that slots " + spelt + " take");
    std::vector<cl_device_partition_property> props{CL_DEVICE_PARTITION_BY_COUNTS};
    for (std::uint32_t c : counts) props.push_back(static_cast<cl_device_partition_property>(c));
    props.push_back(CL_DEVICE_PARTITION_BY_COUNTS_LIST_END);
    props.push_back(0);
    return create_sub_devices(id, info, props.data(), 0, static_cast<std::uint32_t>(counts.size()), "slots", "slots");
  }

  // Waits for the device's queued work and drops its program. Errors: "reset_failed" (the wait failed; the
  // program is dropped anyway).
  static Status unload(Device& d) {
    cl_int err = clFinish(d.queue.get());
    d.program.reset();
    d.loaded_sha256.clear();
    if (err != CL_SUCCESS)
      return make_error(Errc::reset_failed,
                        "opencl backend: " + d.info.local_id + ": waiting for queued work: " + cl_error(err));
    return Status::ok();
  }

  Result<Program> build(Device& d, const Image& image) {
    std::ifstream in(image.file, std::ios::binary);
    if (!in)
      return make_error(Errc::program_failed,
                        "opencl backend: image " + image.name + ": cannot read " + image.file.string());
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    cl_int err = CL_SUCCESS;
    Program program;
    if (image_format(image) == "opencl-source") {
      const char* src = bytes.c_str();
      std::size_t len = bytes.size();
      program.reset(clCreateProgramWithSource(d.context.get(), 1, &src, &len, &err));
    } else {
      const auto* bin = reinterpret_cast<const unsigned char*>(bytes.data());
      std::size_t len = bytes.size();
      cl_int status = CL_SUCCESS;
      program.reset(clCreateProgramWithBinary(d.context.get(), 1, &d.id, &len, &bin, &status, &err));
      if (err == CL_SUCCESS && status != CL_SUCCESS) err = status;
    }
    if (err != CL_SUCCESS)
      return make_error(Errc::program_failed, "opencl backend: image " + image.name + " on " + d.info.local_id +
                                                  ": creating the program failed: " + cl_error(err));
    err = clBuildProgram(program.get(), 1, &d.id, "", nullptr, nullptr);
    if (err != CL_SUCCESS)
      return make_error(Errc::program_failed, "opencl backend: image " + image.name + " on " + d.info.local_id +
                                                  ": build failed (" + cl_error(err) +
                                                  "): " + build_log(program.get(), d.id));
    return program;
  }
};

Result<OpenClConfig> parse_opencl_config(const BackendConfig& config) {
  ConfigReader r("opencl", config);
  OpenClConfig c;
  auto sub = r.get_int("subdevices", 0, 0, 1024);
  if (!sub) return sub.error();
  c.subdevices = static_cast<int>(*sub);
  if (r.is_list("slots")) {
    auto counts = r.get_int_list("slots");
    if (!counts) return counts.error();
    const std::string& spelt = config.at("slots");
    if (counts->empty())
      return r.error(
          "slots", "[] declares no slots: give each slot's compute units, e.g. [2, 1, 1], or a number of equal slots");
    if (counts->size() > kMaxSlotsPerDevice)
      return r.error("slots", spelt + " declares " + std::to_string(counts->size()) + " slots, more than " +
                                  std::to_string(kMaxSlotsPerDevice));
    for (std::size_t n = 0; n < counts->size(); ++n) {
      const std::int64_t count = (*counts)[n];
      const std::string which = "count " + std::to_string(n + 1) + " of " + spelt + " is " + std::to_string(count);
      if (count < 1) return r.error("slots", which + ": a slot takes at least one compute unit");
      if (count > std::numeric_limits<std::uint32_t>::max())
        return r.error("slots", which + ", more compute units than an OpenCL device can report");
      c.slot_counts.push_back(static_cast<std::uint32_t>(count));
    }
  } else {
    auto slots = r.get_int("slots", 0, 0, kMaxSlotsPerDevice);
    if (!slots) return slots.error();
    c.slots = static_cast<std::uint32_t>(*slots);
  }
  if ((c.slots > 0 || !c.slot_counts.empty()) && c.subdevices >= 2)
    return r.error("slots", "a device is either split into sub-devices ('subdevices') or declares slots, not both");
  c.platform = r.get_string("platform", "");
  c.device_type = r.get_string("device_type", "all");
  if (c.device_type != "all" && c.device_type != "cpu" && c.device_type != "gpu" && c.device_type != "accelerator")
    return r.error("device_type", "'" + c.device_type + "' is not all, cpu, gpu or accelerator");
  c.cache_dir = r.get_string("cache_dir", "");
  c.remote_listen = r.get_string("remote_listen", "");
  c.remote_advertise = r.get_string("remote_advertise", "");
  c.remote_tls_cert = r.get_string("remote_tls_cert", "");
  c.remote_tls_key = r.get_string("remote_tls_key", "");
  if (c.remote_listen.empty() && !c.remote_advertise.empty())
    return r.error("remote_advertise", "is set but remote_listen is not: set the address to serve devices on");
  if (c.remote_tls_cert.empty() != c.remote_tls_key.empty())
    return r.error(c.remote_tls_cert.empty() ? "remote_tls_cert" : "remote_tls_key",
                   "is missing: TLS needs both remote_tls_cert and remote_tls_key");
  if (c.remote_listen.empty() && !c.remote_tls_cert.empty())
    return r.error("remote_tls_cert", "is set but remote_listen is not: set the address to serve devices on");
  if (auto st = r.finish(); !st) return st.error();
  return c;
}

OpenClBackend::OpenClBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenClBackend::~OpenClBackend() = default;

Result<std::unique_ptr<OpenClBackend>> OpenClBackend::create(const BackendConfig& config) {
  auto c = parse_opencl_config(config);
  if (!c) return c.error();
  if (!c->cache_dir.empty()) setenv("POCL_CACHE_DIR", c->cache_dir.c_str(), 1);
  auto impl = std::make_unique<Impl>();
  impl->config = *c;
  if (!c->remote_listen.empty()) {
    common::tls::Context tls;
    if (!c->remote_tls_cert.empty()) {
      common::tls::Files files{c->remote_tls_cert, c->remote_tls_key, "", "backends.opencl.remote_tls_cert",
                               "backends.opencl.remote_tls_key"};
      auto context = common::tls::server_context(files);
      if (!context) return context.error();
      tls = *context;
    }
    auto server = RemoteServer::start(c->remote_listen, c->remote_advertise, tls, {});
    if (!server)
      return make_error(server.error().code, "backend opencl: config key 'remote_listen': " + server.error().message);
    impl->remote = std::move(*server);
  }

  cl_uint num_platforms = 0;
  cl_int err = clGetPlatformIDs(0, nullptr, &num_platforms);
  if (err == CL_PLATFORM_NOT_FOUND_KHR || num_platforms == 0) {
    return std::unique_ptr<OpenClBackend>(new OpenClBackend(std::move(impl)));
  }
  if (err != CL_SUCCESS) return make_error(Errc::backend_failed, "opencl backend: listing platforms: " + cl_error(err));
  std::vector<cl_platform_id> platforms(num_platforms);
  clGetPlatformIDs(num_platforms, platforms.data(), nullptr);

  cl_device_type type = CL_DEVICE_TYPE_ALL;
  if (c->device_type == "cpu") type = CL_DEVICE_TYPE_CPU;
  if (c->device_type == "gpu") type = CL_DEVICE_TYPE_GPU;
  if (c->device_type == "accelerator") type = CL_DEVICE_TYPE_ACCELERATOR;

  for (cl_uint p = 0; p < num_platforms; ++p) {
    std::string pname = platform_string(platforms[p], CL_PLATFORM_NAME);
    if (!c->platform.empty() && pname.find(c->platform) == std::string::npos) continue;
    cl_uint num_devices = 0;
    err = clGetDeviceIDs(platforms[p], type, 0, nullptr, &num_devices);
    if (err == CL_DEVICE_NOT_FOUND || num_devices == 0) continue;
    if (err != CL_SUCCESS)
      return make_error(Errc::backend_failed,
                        "opencl backend: listing devices of platform '" + pname + "': " + cl_error(err));
    std::vector<cl_device_id> ids(num_devices);
    clGetDeviceIDs(platforms[p], type, num_devices, ids.data(), nullptr);
    for (cl_uint i = 0; i < num_devices; ++i) {
      cl_device_id dev = ids[i];
      DeviceInfo base;
      base.local_id = "opencl:" + std::to_string(p) + ":" + std::to_string(i);
      auto dtype = device_value<cl_device_type>(dev, CL_DEVICE_TYPE);
      base.kind = (dtype & CL_DEVICE_TYPE_GPU) ? "gpu" : (dtype & CL_DEVICE_TYPE_CPU) ? "cpu" : "accelerator";
      base.model = device_string(dev, CL_DEVICE_NAME);
      base.attributes["platform"] = pname;
      base.attributes["vendor"] = device_string(dev, CL_DEVICE_VENDOR);
      base.attributes["driver_version"] = device_string(dev, CL_DRIVER_VERSION);
      base.attributes["opencl_version"] = device_string(dev, CL_DEVICE_VERSION);
      base.attributes["global_mem_bytes"] = std::to_string(device_value<cl_ulong>(dev, CL_DEVICE_GLOBAL_MEM_SIZE));
      auto cus = device_value<cl_uint>(dev, CL_DEVICE_MAX_COMPUTE_UNITS);
      base.attributes["compute_units"] = std::to_string(cus);
      std::string extensions = device_string(dev, CL_DEVICE_EXTENSIONS);
      if (extensions.find("cl_khr_pci_bus_info") != std::string::npos) {
        cl_device_pci_bus_info_khr pci{};
        if (clGetDeviceInfo(dev, CL_DEVICE_PCI_BUS_INFO_KHR, sizeof pci, &pci, nullptr) == CL_SUCCESS) {
          char bdf[32];
          std::snprintf(bdf, sizeof bdf, "%04x:%02x:%02x.%x", pci.pci_domain & 0xffff, pci.pci_bus & 0xff,
                        pci.pci_device & 0x1f, pci.pci_function & 0x7);
          base.pci_bdf = bdf;
        }
      }
      // A device without a PCI function (a CPU) cannot be handed to a VM by passthrough.
      base.passthrough = !base.pci_bdf.empty();

      if (c->subdevices >= 2) {
        auto subs =
            Impl::split_equally(dev, base, cus, static_cast<std::uint32_t>(c->subdevices), "subdevices", "sub-devices");
        if (!subs) return subs.error();
        for (std::size_t s = 0; s < subs->size(); ++s) {
          DeviceInfo info = base;
          info.local_id = base.local_id + "." + std::to_string(s);
          info.attributes["parent"] = base.local_id;
          info.attributes["compute_units"] =
              std::to_string(device_value<cl_uint>((*subs)[s], CL_DEVICE_MAX_COMPUTE_UNITS));
          if (auto st = impl->add_device((*subs)[s], true, std::move(info)); !st) {
            for (std::size_t rest = s + 1; rest < subs->size(); ++rest) clReleaseDevice((*subs)[rest]);
            return st.error();
          }
        }
      } else if (c->slots > 0 || !c->slot_counts.empty()) {
        auto subs = c->slot_counts.empty() ? Impl::split_equally(dev, base, cus, c->slots, "slots", "slots")
                                           : Impl::split_by_counts(dev, base, cus, c->slot_counts);
        if (!subs) return subs.error();
        if (auto st = impl->add_device_with_slots(dev, std::move(base), std::move(*subs)); !st) return st.error();
      } else {
        if (auto st = impl->add_device(dev, false, std::move(base)); !st) return st.error();
      }
    }
  }
  return std::unique_ptr<OpenClBackend>(new OpenClBackend(std::move(impl)));
}

Result<std::vector<DeviceInfo>> OpenClBackend::enumerate() {
  std::vector<DeviceInfo> out;
  for (const auto& d : impl_->devices) out.push_back(d->info);
  return out;
}

Status OpenClBackend::program(std::string_view local_id, const Image& image) {
  Impl::Target t = impl_->target(local_id);
  if (!t.device) return Impl::no_device(local_id);
  std::string format = image_format(image);
  if (format != "opencl-source" && format != "opencl-binary")
    return make_error(Errc::incompatible, "opencl backend: image " + image.name + " has format " + format +
                                              "; OpenCL devices load opencl-source or opencl-binary");
  if (auto st = check_compatible(image, t.device->info, t.slot); !st) return st;
  if (t.slot && !image.slot_shape.empty() && image.slot_shape != t.region->shape)
    return make_error(Errc::incompatible, "opencl backend: image " + image.name + "@" + image.version +
                                              " fits slots of shape '" + image.slot_shape + "', but slot " +
                                              std::to_string(*t.slot) + " of device " + t.device->info.local_id +
                                              " has shape '" + t.region->shape + "'");
  auto program = impl_->build(*t.region, image);
  if (!program) return program.error();
  // A full image replaces what the device's slots hold (their queued work finishes first).
  if (!t.slot) {
    for (auto& slot : t.device->slots) (void)Impl::unload(*slot);
  }
  t.region->program = std::move(*program);
  t.region->loaded_sha256 = image.sha256;
  return Status::ok();
}

Result<std::string> OpenClBackend::loaded(std::string_view local_id) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return Impl::no_device(local_id);
  return d->loaded_sha256;
}

Status OpenClBackend::reset(std::string_view local_id) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return Impl::no_device(local_id);
  return Impl::unload(*d);
}

Result<std::string> OpenClBackend::open_remote(std::string_view local_id) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return Impl::no_device(local_id);
  if (!impl_->remote) return std::string();
  return impl_->remote->open(std::string(local_id), d->id);
}

void OpenClBackend::close_remote(std::string_view local_id) {
  if (impl_->remote) impl_->remote->close(std::string(local_id));
}

Result<std::string> OpenClBackend::program_binary(std::string_view local_id) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return Impl::no_device(local_id);
  if (!d->program)
    return make_error(Errc::not_programmed, "opencl backend: device " + d->info.local_id + " holds no image");
  std::size_t size = 0;
  cl_int err = clGetProgramInfo(d->program.get(), CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr);
  if (err != CL_SUCCESS || size == 0)
    return make_error(Errc::run_failed,
                      "opencl backend: device " + d->info.local_id + ": no program binary (" + cl_error(err) + ")");
  std::string binary(size, '\0');
  unsigned char* ptr = reinterpret_cast<unsigned char*>(binary.data());
  err = clGetProgramInfo(d->program.get(), CL_PROGRAM_BINARIES, sizeof ptr, &ptr, nullptr);
  if (err != CL_SUCCESS)
    return make_error(Errc::run_failed,
                      "opencl backend: device " + d->info.local_id + ": reading the binary: " + cl_error(err));
  return binary;
}

Result<std::vector<std::string>> OpenClBackend::kernel_names(std::string_view local_id) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return Impl::no_device(local_id);
  if (!d->program)
    return make_error(Errc::not_programmed, "opencl backend: device " + d->info.local_id + " holds no image");
  std::size_t size = 0;
  clGetProgramInfo(d->program.get(), CL_PROGRAM_KERNEL_NAMES, 0, nullptr, &size);
  std::string names(size, '\0');
  clGetProgramInfo(d->program.get(), CL_PROGRAM_KERNEL_NAMES, size, names.data(), nullptr);
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(names.c_str());
  while (std::getline(in, item, ';')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

namespace {

Status run_on(cl_context context, cl_command_queue queue, cl_program program, const std::string& where,
              const std::string& kernel_name, std::vector<KernelArg>& args, const std::vector<std::size_t>& global) {
  if (global.empty() || global.size() > 3)
    return make_error(Errc::invalid_argument, where + ": global size must have 1 to 3 dimensions");
  for (auto g : global) {
    if (g == 0) return make_error(Errc::invalid_argument, where + ": global size has a zero dimension");
  }
  cl_int err = CL_SUCCESS;
  Kernel kernel(clCreateKernel(program, kernel_name.c_str(), &err));
  if (err != CL_SUCCESS)
    return make_error(Errc::not_found,
                      where + ": the loaded program has no kernel '" + kernel_name + "' (" + cl_error(err) + ")");
  cl_uint num_args = 0;
  clGetKernelInfo(kernel.get(), CL_KERNEL_NUM_ARGS, sizeof num_args, &num_args, nullptr);
  if (num_args != args.size())
    return make_error(Errc::invalid_argument, where + ": kernel '" + kernel_name + "' takes " +
                                                  std::to_string(num_args) + " arguments, " +
                                                  std::to_string(args.size()) + " given");
  std::vector<Mem> buffers(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto& a = args[i];
    if (a.kind == KernelArg::Kind::scalar) {
      err = clSetKernelArg(kernel.get(), static_cast<cl_uint>(i), a.bytes.size(), a.bytes.data());
    } else {
      const bool shared = a.kind == KernelArg::Kind::shared;
      if (shared ? a.memory.empty() : a.bytes.empty())
        return make_error(Errc::invalid_argument, where + ": argument " + std::to_string(i) + " is an empty buffer");
      cl_mem_flags flags = a.kind == KernelArg::Kind::input    ? CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR
                           : a.kind == KernelArg::Kind::output ? CL_MEM_WRITE_ONLY
                           : shared                            ? CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR
                                                               : CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR;
      void* host = shared                              ? static_cast<void*>(a.memory.data())
                   : a.kind == KernelArg::Kind::output ? nullptr
                                                       : a.bytes.data();
      buffers[i].reset(clCreateBuffer(context, flags, shared ? a.memory.size() : a.bytes.size(), host, &err));
      if (err != CL_SUCCESS)
        return make_error(Errc::run_failed,
                          where + ": allocating argument " + std::to_string(i) + ": " + cl_error(err));
      cl_mem m = buffers[i].get();
      err = clSetKernelArg(kernel.get(), static_cast<cl_uint>(i), sizeof m, &m);
    }
    if (err != CL_SUCCESS)
      return make_error(Errc::invalid_argument, where + ": setting argument " + std::to_string(i) + " of '" +
                                                    kernel_name + "': " + cl_error(err));
  }
  err = clEnqueueNDRangeKernel(queue, kernel.get(), static_cast<cl_uint>(global.size()), nullptr, global.data(),
                               nullptr, 0, nullptr, nullptr);
  if (err != CL_SUCCESS)
    return make_error(Errc::run_failed, where + ": launching '" + kernel_name + "': " + cl_error(err));
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto& a = args[i];
    if (a.kind == KernelArg::Kind::output || a.kind == KernelArg::Kind::inout) {
      err =
          clEnqueueReadBuffer(queue, buffers[i].get(), CL_TRUE, 0, a.bytes.size(), a.bytes.data(), 0, nullptr, nullptr);
      if (err != CL_SUCCESS)
        return make_error(Errc::run_failed,
                          where + ": reading back argument " + std::to_string(i) + ": " + cl_error(err));
    }
    if (a.kind == KernelArg::Kind::shared) {  // mapping makes the caller's memory hold the kernel's writes
      void* mapped = clEnqueueMapBuffer(queue, buffers[i].get(), CL_TRUE, CL_MAP_READ, 0, a.memory.size(), 0, nullptr,
                                        nullptr, &err);
      if (err == CL_SUCCESS) err = clEnqueueUnmapMemObject(queue, buffers[i].get(), mapped, 0, nullptr, nullptr);
      if (err != CL_SUCCESS)
        return make_error(Errc::run_failed,
                          where + ": synchronising shared argument " + std::to_string(i) + ": " + cl_error(err));
    }
  }
  err = clFinish(queue);
  if (err != CL_SUCCESS)
    return make_error(Errc::run_failed, where + ": finishing '" + kernel_name + "': " + cl_error(err));
  return Status::ok();
}

}  // namespace

Status OpenClBackend::run_kernel(std::string_view local_id, const std::string& kernel, std::vector<KernelArg>& args,
                                 const std::vector<std::size_t>& global_size) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return Impl::no_device(local_id);
  if (!d->program)
    return make_error(Errc::not_programmed, "opencl backend: device " + d->info.local_id + " holds no image");
  return run_on(d->context.get(), d->queue.get(), d->program.get(), "opencl backend: device " + d->info.local_id,
                kernel, args, global_size);
}

HealthReport OpenClBackend::health(std::string_view local_id) {
  Impl::Device* d = impl_->find(local_id);
  if (!d) return {Health::failed, "opencl backend: no device '" + std::string(local_id) + "'"};
  if (!d->health_program) {
    cl_int err = CL_SUCCESS;
    const char* src = kHealthSource;
    Program p(clCreateProgramWithSource(d->context.get(), 1, &src, nullptr, &err));
    if (err == CL_SUCCESS) err = clBuildProgram(p.get(), 1, &d->id, "", nullptr, nullptr);
    if (err != CL_SUCCESS) return {Health::failed, "health kernel does not build: " + cl_error(err)};
    d->health_program = std::move(p);
  }
  constexpr std::size_t n = 256;
  std::vector<cl_uint> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<cl_uint>(i * 2654435761u);
  std::vector<KernelArg> args{KernelArg::inout<cl_uint>(values)};
  auto st = run_on(d->context.get(), d->queue.get(), d->health_program.get(), "health of " + d->info.local_id,
                   "accelpool_health", args, {n});
  if (!st) return {Health::failed, st.error().message};
  auto result = args[0].as<cl_uint>();
  for (std::size_t i = 0; i < n; ++i) {
    if (result[i] != values[i] * 3u + 7u)
      return {Health::failed, "health kernel computed a wrong value at index " + std::to_string(i)};
  }
  return {Health::ok, ""};
}

}  // namespace accelpool::backends
