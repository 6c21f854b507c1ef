// The simulated backend: a full backend with no hardware behind it. It holds N devices of configured kinds and
// models, optionally each with slots for partial images, "programs" them (or a slot) in a time proportional to
// the image size, tracks what each device and slot holds, and fails on
// request (a device that fails, programming that fails, programming that hangs). Large live tests and demos run
// on it; it is not a test double (it makes no assumptions about its caller).
//
// Time: programming waits through an injected Sleeper, so tests can record the waits instead of sleeping.
// Threading: every method may be called from any thread (an internal mutex; the sleep itself happens outside
// it, so failure injection from a test thread works while a programming call waits).
#pragma once

#include <accelpool/backends/config.hpp>
#include <accelpool/backends/device_backend.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace accelpool::backends {

// Waits for a duration. The default sleeps the calling thread.
using Sleeper = std::function<void(std::chrono::nanoseconds)>;

struct SimDeviceGroup {
  std::string kind;   // "fpga", "gpu", ...
  std::string model;  // e.g. "xilinx_u250_gen3x16_xdma_4_1_202210_1", "sim-gpu"
  int count = 1;
};

struct SimConfig {
  std::vector<SimDeviceGroup> devices{{"fpga", "xilinx_u250_gen3x16_xdma_4_1_202210_1", 4}};
  double program_bytes_per_second = 64.0 * 1024 * 1024;                   // programming speed
  std::chrono::nanoseconds program_base = std::chrono::milliseconds(20);  // fixed cost per programming
  // Partial-reconfiguration slots of every device (DeviceInfo::slots), and the fixed cost of programming a partial
  // image into one (published shells reconfigure a region in tens of milliseconds on the hardware path and
  // under a second end to end; docs/bitstreams.md).
  std::uint32_t slots = 0;
  std::chrono::nanoseconds partial_program_base = std::chrono::milliseconds(50);
  std::chrono::nanoseconds hang_duration = std::chrono::seconds(60);  // how long an injected hang blocks
  std::string attach = "shmem";                 // "shmem": passthrough as an emulated PCI device; "network": any host
  bool reset_unloads = false;                   // whether reset() also unloads the image
  std::vector<std::string> failed_devices;      // failed from the start
  std::map<std::string, int> program_failures;  // device -> number of next programmings that fail
  std::vector<std::string> hanging_devices;     // next programming hangs
};

// Parses the "sim" config keys (docs/hosts.md). Errors: "invalid_argument" naming the key.
Result<SimConfig> parse_sim_config(const BackendConfig& config);

class SimBackend final : public DeviceBackend {
 public:
  static Result<std::unique_ptr<SimBackend>> create(const BackendConfig& config, Sleeper sleeper = {});
  explicit SimBackend(SimConfig config, Sleeper sleeper = {});

  std::string_view name() const override { return "sim"; }
  bool parallel_devices() const override { return true; }  // devices wait outside the lock
  Result<std::vector<DeviceInfo>> enumerate() override;
  Status program(std::string_view local_id, const Image& image) override;
  Result<std::string> loaded(std::string_view local_id) override;
  Status reset(std::string_view local_id) override;
  HealthReport health(std::string_view local_id) override;

  // --- failure injection (tests, demos, chaos runs). Errors: "not_found" for an unknown device. ---
  // The device fails: health() reports failed, program() fails, loaded() keeps answering.
  Status fail_device(std::string_view local_id, std::string reason = "injected failure");
  // Undoes fail_device and clears pending programming failures and hangs.
  Status recover_device(std::string_view local_id);
  // The next `count` programmings of the device fail with "program_failed" (after taking their time).
  Status fail_next_programs(std::string_view local_id, int count);
  // The next programming of the device blocks for the configured hang duration, then fails.
  Status hang_next_program(std::string_view local_id);

  // How long programming `image` takes: base (a partial image: partial_program_base) + size / rate (size from
  // Image::size_bytes, else the file's size).
  std::chrono::nanoseconds programming_time(const Image& image) const;
  // Number of successful programmings of the device (or slot) so far.
  Result<std::uint64_t> program_count(std::string_view local_id) const;

 private:
  struct Region {  // the whole device, or one of its slots
    std::string loaded_sha256;
    std::uint64_t programs = 0;
  };
  struct Device {
    DeviceInfo info;
    Region whole;
    std::vector<Region> slots;  // info.slots of them
    std::string failure;        // non-empty: failed, with the reason (its slots with it)
    int failures_pending = 0;   // injected failures and hangs hit the next programming of the device or a slot
    bool hang_pending = false;
  };
  // What a local id names: a device, and the device's region it addresses (the whole device or a slot).
  struct Target {
    Device* device = nullptr;
    Region* region = nullptr;
    std::optional<std::uint32_t> slot;
  };
  Device* find(std::string_view local_id);
  const Device* find(std::string_view local_id) const;
  Target target(std::string_view local_id);
  static Error no_device(std::string_view local_id);

  SimConfig config_;
  Sleeper sleeper_;
  mutable std::mutex mutex_;
  std::vector<Device> devices_;
};

}  // namespace accelpool::backends
