// OpenCL backend: every device of every platform the ICD loader reports (GPUs, and CPUs through PoCL),
// optionally split into equal sub-devices offered as devices of their own (`subdevices`), or declaring slots
// (`slots`, equal or of given compute-unit counts): each slot is an OpenCL sub-device of the device, addressed as
// "<device>:slot<n>" (common/slots.hpp), that takes partial images while the other slots run theirs.
// "Programming" builds the image's kernel program (OpenCL C source or a device binary) for the device or slot and
// keeps it, so kernels of the loaded image can be run (run_kernel); health is a tiny kernel run. No OpenCL type
// appears in this header.
//
// Threading: one thread at a time per backend object (the host runtime serialises it), as DeviceBackend says,
// except run_kernel: calls for different devices or slots may run at the same time (each has its own queue).
#pragma once

#include <accelpool/backends/config.hpp>
#include <accelpool/backends/device_backend.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace accelpool::backends {

struct OpenClConfig {
  int subdevices = 0;  // 0 or 1: whole devices; N >= 2: split each device into N equal sub-devices
  // 0: no slots; N >= 1 (`slots = N`): each device declares N slots, each an equal sub-device (compute units / N).
  // Every device must support equal partitioning into N (CL_DEVICE_PARTITION_EQUALLY).
  std::uint32_t slots = 0;
  // `slots = [c0, c1, ...]` instead (slots is then 0): each device declares one slot per count, slot n a
  // sub-device of c_n compute units (CL_DEVICE_PARTITION_BY_COUNTS). Every device must support partitioning by
  // counts, have at least the counts' sum of compute units and allow as many sub-devices as there are counts
  // (CL_DEVICE_PARTITION_MAX_SUB_DEVICES). Neither form goes with `subdevices`.
  std::vector<std::uint32_t> slot_counts;
  std::string platform;             // only platforms whose name contains this ("" = all)
  std::string device_type = "all";  // "all", "cpu", "gpu", "accelerator"
  std::string cache_dir;            // when set, POCL_CACHE_DIR for PoCL's kernel cache (set before discovery)
  // Serving devices to programs on other machines (docs/remote-opencl.md): "HOST:PORT" to listen on ("" serves
  // none), and the "HOST:PORT" guests reach it at ("" the listening address).
  std::string remote_listen;
  std::string remote_advertise;
  // PEM certificate chain and key: served connections are TLS ("ocl+tls://" endpoints); both or neither.
  std::string remote_tls_cert;
  std::string remote_tls_key;
};

// Parses the "opencl" config keys (docs/hosts.md). Errors: "invalid_argument" naming the key.
Result<OpenClConfig> parse_opencl_config(const BackendConfig& config);

// One kernel argument for run_kernel.
struct KernelArg {
  // shared: caller's memory the kernel reads and writes in place (CL_MEM_USE_HOST_PTR; coherent again when
  // run_kernel returns): kernels running at the same time on other devices or slots that are given the same
  // memory see each other's writes, where the device works in host memory (PoCL's CPU device does).
  enum class Kind { input, output, inout, scalar, shared };
  Kind kind = Kind::scalar;
  std::vector<std::byte> bytes;  // input data; output buffers are sized by it and receive the results
  std::span<std::byte> memory;   // Kind::shared: the caller's memory, which must outlive the call

  template <typename T>
  static KernelArg in(std::span<const T> data) {
    return {Kind::input, to_bytes(data), {}};
  }
  template <typename T>
  static KernelArg inout(std::span<const T> data) {
    return {Kind::inout, to_bytes(data), {}};
  }
  template <typename T>
  static KernelArg out(std::size_t count) {
    return {Kind::output, std::vector<std::byte>(count * sizeof(T)), {}};
  }
  template <typename T>
  static KernelArg scalar(const T& value) {
    return {Kind::scalar, to_bytes(std::span<const T>(&value, 1)), {}};
  }
  template <typename T>
  static KernelArg shared(std::span<T> memory) {
    return {Kind::shared, {}, std::as_writable_bytes(memory)};
  }

  // Reads the buffer back as an array of T.
  template <typename T>
  std::vector<T> as() const {
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return out;
  }

 private:
  template <typename T>
  static std::vector<std::byte> to_bytes(std::span<const T> data) {
    std::vector<std::byte> b(data.size_bytes());
    std::memcpy(b.data(), data.data(), b.size());
    return b;
  }
};

class OpenClBackend final : public DeviceBackend {
 public:
  // Discovers platforms and devices and creates the sub-devices and slots. Errors: "invalid_argument" naming the
  // config key and, for a device that cannot be split as asked, the device (e.g. more sub-devices or slots than it
  // has compute units, slot counts summing to more, or a device that cannot be partitioned that way);
  // "backend_failed" (an OpenCL call failed). No platform at all is not an error: the backend then has no devices.
  // On error nothing stays open.
  static Result<std::unique_ptr<OpenClBackend>> create(const BackendConfig& config);
  ~OpenClBackend() override;

  std::string_view name() const override { return "opencl"; }
  Result<std::vector<DeviceInfo>> enumerate() override;
  // Builds the image (format opencl-source or opencl-binary) for the device, or for the slot `local_id` names.
  // A slot takes partial images only (their slot_shape, when given, must be the slot's shape "cu<compute units>"),
  // the whole device full images only; a full image drops what the device's slots hold. Errors: "not_found",
  // "incompatible" (model not in the image's compatible list, an xclbin/opaque image, a full image for a slot or a
  // partial one for a whole device, another slot shape), "program_failed" (unreadable file, build error with the
  // compiler's log). On failure the previous program stays loaded.
  Status program(std::string_view local_id, const Image& image) override;
  Result<std::string> loaded(std::string_view local_id) override;
  // Waits for queued work to finish and drops the loaded program (the device then holds no image).
  Status reset(std::string_view local_id) override;
  // Builds (once per device, then cached) and runs a tiny kernel on 256 values and checks the results.
  HealthReport health(std::string_view local_id) override;
  // With `remote_listen` set: the device (or slot) is served to one lease's program at the returned endpoint until
  // close_remote. Without it: "" (not served). Errors: "not_found".
  Result<std::string> open_remote(std::string_view local_id) override;
  void close_remote(std::string_view local_id) override;

  // Runs `kernel` of the loaded program on the device with `args` (in kernel-parameter order) over the global
  // range `global_size` (1 to 3 dimensions); output and inout buffers receive the results. Blocks until done.
  // `local_id` may name a slot: the kernel then runs on the slot's sub-device, beside the other slots' kernels.
  // Errors: "not_found" (device, or kernel not in the loaded program), "not_programmed", "invalid_argument",
  // "run_failed".
  Status run_kernel(std::string_view local_id, const std::string& kernel, std::vector<KernelArg>& args,
                    const std::vector<std::size_t>& global_size);

  // The device binary of the loaded program (clGetProgramInfo CL_PROGRAM_BINARIES), e.g. to publish a
  // pre-built "opencl-binary" image for identical devices. Errors: "not_found", "not_programmed", "run_failed".
  Result<std::string> program_binary(std::string_view local_id);

  // Kernel names of the loaded program. Errors: "not_found", "not_programmed".
  Result<std::vector<std::string>> kernel_names(std::string_view local_id);

  struct Impl;

 private:
  explicit OpenClBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelpool::backends
