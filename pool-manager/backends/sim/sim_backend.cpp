#include <accelpool/backends/sim_backend.hpp>
#include <accelpool/common/slots.hpp>

#include <filesystem>
#include <sstream>
#include <thread>

namespace accelpool::backends {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) {
    auto b = item.find_first_not_of(" \t");
    auto e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace

Result<SimConfig> parse_sim_config(const BackendConfig& config) {
  ConfigReader r("sim", config);
  SimConfig c;
  std::string devices = r.get_string("devices", "");
  if (!devices.empty()) {
    c.devices.clear();
    for (const auto& group : split(devices, ',')) {
      auto parts = split(group, ':');
      // kind:model:count, where the model may itself contain ':' (VBNVs like xilinx:u250:...).
      if (parts.size() < 3) return r.error("devices", "'" + group + "' is not kind:model:count");
      SimDeviceGroup g;
      g.kind = parts.front();
      const std::string& count = parts.back();
      g.model = group.substr(group.find(':') + 1, group.rfind(':') - group.find(':') - 1);
      try {
        std::size_t used = 0;
        g.count = std::stoi(count, &used);
        if (used != count.size()) throw std::invalid_argument(count);
      } catch (const std::exception&) {
        return r.error("devices", "count '" + count + "' in '" + group + "' is not a number");
      }
      if (g.count < 1 || g.count > 4096) return r.error("devices", "count in '" + group + "' must be 1..4096");
      if (g.kind.empty() || g.model.empty()) return r.error("devices", "'" + group + "' has an empty kind or model");
      c.devices.push_back(g);
    }
    if (c.devices.empty()) return r.error("devices", "lists no devices");
  }
  auto rate = r.get_double("program_mib_per_s", c.program_bytes_per_second / (1024 * 1024), 1e-6);
  if (!rate) return rate.error();
  c.program_bytes_per_second = *rate * 1024 * 1024;
  auto base = r.get_int("program_base_ms", 20, 0, 3'600'000);
  if (!base) return base.error();
  c.program_base = std::chrono::milliseconds(*base);
  auto slots = r.get_int("slots", 0, 0, kMaxSlotsPerDevice);
  if (!slots) return slots.error();
  c.slots = static_cast<std::uint32_t>(*slots);
  auto partial = r.get_int("partial_program_base_ms", 50, 0, 3'600'000);
  if (!partial) return partial.error();
  c.partial_program_base = std::chrono::milliseconds(*partial);
  auto hang = r.get_int("hang_ms", 60'000, 0, 86'400'000);
  if (!hang) return hang.error();
  c.hang_duration = std::chrono::milliseconds(*hang);
  c.attach = r.get_string("attach", "shmem");
  if (c.attach != "shmem" && c.attach != "network")
    return r.error("attach", "'" + c.attach + "' is not shmem or network");
  auto unload = r.get_bool("reset_unloads", false);
  if (!unload) return unload.error();
  c.reset_unloads = *unload;
  c.failed_devices = split(r.get_string("failed_devices", ""), ',');
  c.hanging_devices = split(r.get_string("hanging_devices", ""), ',');
  for (const auto& item : split(r.get_string("program_failures", ""), ',')) {
    auto eq = item.rfind('=');
    int n = 1;
    std::string id = item;
    if (eq != std::string::npos) {
      id = item.substr(0, eq);
      try {
        n = std::stoi(item.substr(eq + 1));
      } catch (const std::exception&) {
        return r.error("program_failures", "'" + item + "' is not device=count");
      }
    }
    c.program_failures[id] = n;
  }
  if (auto st = r.finish(); !st) return st.error();
  // Device names in the failure keys must exist.
  int total = 0;
  for (const auto& g : c.devices) total += g.count;
  auto check_id = [&](const std::string& key, const std::string& id) -> Status {
    for (int i = 0; i < total; ++i) {
      if (id == "sim:" + std::to_string(i)) return Status::ok();
    }
    return r.error(key, "no device '" + id + "' (devices are sim:0..sim:" + std::to_string(total - 1) + ")");
  };
  for (const auto& id : c.failed_devices)
    if (auto st = check_id("failed_devices", id); !st) return st.error();
  for (const auto& id : c.hanging_devices)
    if (auto st = check_id("hanging_devices", id); !st) return st.error();
  for (const auto& [id, n] : c.program_failures)
    if (auto st = check_id("program_failures", id); !st) return st.error();
  return c;
}

Result<std::unique_ptr<SimBackend>> SimBackend::create(const BackendConfig& config, Sleeper sleeper) {
  auto c = parse_sim_config(config);
  if (!c) return c.error();
  return std::make_unique<SimBackend>(std::move(*c), std::move(sleeper));
}

SimBackend::SimBackend(SimConfig config, Sleeper sleeper) : config_(std::move(config)), sleeper_(std::move(sleeper)) {
  if (!sleeper_) sleeper_ = [](std::chrono::nanoseconds d) { std::this_thread::sleep_for(d); };
  int index = 0;
  for (const auto& g : config_.devices) {
    for (int i = 0; i < g.count; ++i, ++index) {
      Device d;
      d.info.local_id = "sim:" + std::to_string(index);
      d.info.kind = g.kind;
      d.info.model = g.model;
      d.info.passthrough = config_.attach == "shmem";
      d.info.attributes["attach"] = config_.attach;
      if (config_.attach == "shmem") d.info.attributes["shmem_name"] = "accelpool-sim-" + std::to_string(index);
      d.info.attributes["serial"] = "SIM" + std::to_string(100000 + index);
      d.info.attributes["vendor"] = "accelpool simulator";
      d.info.slots = config_.slots;
      d.slots.resize(config_.slots);
      devices_.push_back(std::move(d));
    }
  }
  for (const auto& id : config_.failed_devices) {
    if (Device* d = find(id)) d->failure = "failed by configuration";
  }
  for (const auto& id : config_.hanging_devices) {
    if (Device* d = find(id)) d->hang_pending = true;
  }
  for (const auto& [id, n] : config_.program_failures) {
    if (Device* d = find(id)) d->failures_pending = n;
  }
}

SimBackend::Device* SimBackend::find(std::string_view local_id) {
  for (auto& d : devices_) {
    if (d.info.local_id == local_id) return &d;
  }
  return nullptr;
}

const SimBackend::Device* SimBackend::find(std::string_view local_id) const {
  return const_cast<SimBackend*>(this)->find(local_id);
}

SimBackend::Target SimBackend::target(std::string_view local_id) {
  if (Device* d = find(local_id)) return {d, &d->whole, std::nullopt};
  if (auto slot = parse_slot_local_id(local_id)) {
    if (Device* d = find(slot->device); d && slot->index < d->slots.size())
      return {d, &d->slots[slot->index], slot->index};
  }
  return {};
}

Error SimBackend::no_device(std::string_view local_id) {
  return make_error(Errc::not_found, "sim backend: no device '" + std::string(local_id) + "'");
}

Result<std::vector<DeviceInfo>> SimBackend::enumerate() {
  std::lock_guard lock(mutex_);
  std::vector<DeviceInfo> out;
  for (const auto& d : devices_) out.push_back(d.info);
  return out;
}

std::chrono::nanoseconds SimBackend::programming_time(const Image& image) const {
  std::uint64_t size = image.size_bytes;
  if (size == 0 && !image.file.empty()) {
    std::error_code ec;
    auto s = std::filesystem::file_size(image.file, ec);
    if (!ec) size = s;
  }
  double seconds = static_cast<double>(size) / config_.program_bytes_per_second;
  return (image.partial ? config_.partial_program_base : config_.program_base) +
         std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9));
}

Status SimBackend::program(std::string_view local_id, const Image& image) {
  std::chrono::nanoseconds wait{};
  bool hang = false, fail = false;
  {
    std::lock_guard lock(mutex_);
    Target t = target(local_id);
    if (!t.device) return no_device(local_id);
    if (!t.device->failure.empty())
      return make_error(Errc::program_failed,
                        "sim backend: device " + t.device->info.local_id + " has failed: " + t.device->failure);
    if (auto st = check_compatible(image, t.device->info, t.slot); !st) return st;
    if (image.sha256.empty())
      return make_error(Errc::invalid_argument, "sim backend: image " + image.name + " has no sha256");
    wait = programming_time(image);
    if (t.device->hang_pending) {
      t.device->hang_pending = false;
      hang = true;
      wait = config_.hang_duration;
    } else if (t.device->failures_pending > 0) {
      --t.device->failures_pending;
      fail = true;
    }
    // Programming replaces the image: during and after a failed attempt the region holds none. A full image
    // replaces the shell's regions too.
    t.region->loaded_sha256.clear();
    if (!t.slot) {
      for (auto& slot : t.device->slots) slot.loaded_sha256.clear();
    }
  }
  sleeper_(wait);  // outside the lock: the device is busy, the backend is not
  std::lock_guard lock(mutex_);
  Target t = target(local_id);
  const std::string what = std::string(local_id);
  if (hang)
    return make_error(Errc::program_failed,
                      "sim backend: programming device " + what + " with " + image.name + " hung (no answer for " +
                          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()) + " ms)");
  if (fail)
    return make_error(Errc::program_failed,
                      "sim backend: programming device " + what + " with " + image.name + " failed (injected)");
  if (!t.device->failure.empty())
    return make_error(Errc::program_failed, "sim backend: device " + t.device->info.local_id +
                                                " failed while programming: " + t.device->failure);
  t.region->loaded_sha256 = image.sha256;
  ++t.region->programs;
  return Status::ok();
}

Result<std::string> SimBackend::loaded(std::string_view local_id) {
  std::lock_guard lock(mutex_);
  Target t = target(local_id);
  if (!t.device) return no_device(local_id);
  return t.region->loaded_sha256;
}

Status SimBackend::reset(std::string_view local_id) {
  std::lock_guard lock(mutex_);
  Target t = target(local_id);
  if (!t.device) return no_device(local_id);
  if (!t.device->failure.empty())
    return make_error(Errc::reset_failed,
                      "sim backend: device " + t.device->info.local_id + " has failed: " + t.device->failure);
  if (config_.reset_unloads) t.region->loaded_sha256.clear();
  return Status::ok();
}

HealthReport SimBackend::health(std::string_view local_id) {
  std::lock_guard lock(mutex_);
  const Device* d = target(local_id).device;
  if (!d) return {Health::failed, "sim backend: no device '" + std::string(local_id) + "'"};
  if (!d->failure.empty()) return {Health::failed, d->failure};
  if (d->hang_pending || d->failures_pending > 0) return {Health::degraded, "programming failures pending (injected)"};
  return {Health::ok, ""};
}

Status SimBackend::fail_device(std::string_view local_id, std::string reason) {
  std::lock_guard lock(mutex_);
  Device* d = find(local_id);
  if (!d) return no_device(local_id);
  d->failure = reason.empty() ? "injected failure" : std::move(reason);
  return Status::ok();
}

Status SimBackend::recover_device(std::string_view local_id) {
  std::lock_guard lock(mutex_);
  Device* d = find(local_id);
  if (!d) return no_device(local_id);
  d->failure.clear();
  d->failures_pending = 0;
  d->hang_pending = false;
  return Status::ok();
}

Status SimBackend::fail_next_programs(std::string_view local_id, int count) {
  std::lock_guard lock(mutex_);
  Device* d = find(local_id);
  if (!d) return no_device(local_id);
  if (count < 0) return make_error(Errc::invalid_argument, "sim backend: failure count must be >= 0");
  d->failures_pending = count;
  return Status::ok();
}

Status SimBackend::hang_next_program(std::string_view local_id) {
  std::lock_guard lock(mutex_);
  Device* d = find(local_id);
  if (!d) return no_device(local_id);
  d->hang_pending = true;
  return Status::ok();
}

Result<std::uint64_t> SimBackend::program_count(std::string_view local_id) const {
  std::lock_guard lock(mutex_);
  Target t = const_cast<SimBackend*>(this)->target(local_id);
  if (!t.device) return no_device(local_id);
  return t.region->programs;
}

}  // namespace accelpool::backends
