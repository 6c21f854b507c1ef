// OpenCL backend: every device of every platform the ICD loader reports (GPUs, and CPUs through PoCL),
// optionally split into equal sub-devices. "Programming" builds the image's kernel program (OpenCL C source or
// a device binary) for the device and keeps it, so kernels of the loaded image can be run (run_kernel); health
// is a tiny kernel run. No OpenCL type appears in this header.
//
// Threading: one thread at a time per backend object (the host runtime serialises it), as DeviceBackend says.
#pragma once

#include <accelpool/backends/config.hpp>
#include <accelpool/backends/device_backend.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace accelpool::backends {

struct OpenClConfig {
  int subdevices = 0;           // 0 or 1: whole devices; N >= 2: split each device into N equal sub-devices
  std::string platform;         // only platforms whose name contains this ("" = all)
  std::string device_type = "all";  // "all", "cpu", "gpu", "accelerator"
  std::string cache_dir;        // when set, POCL_CACHE_DIR for PoCL's kernel cache (set before discovery)
};

// Parses the "opencl" config keys (docs/hosts.md). Errors: "invalid_argument" naming the key.
Result<OpenClConfig> parse_opencl_config(const BackendConfig& config);

// One kernel argument for run_kernel.
struct KernelArg {
  enum class Kind { input, output, inout, scalar };
  Kind kind = Kind::scalar;
  std::vector<std::byte> bytes;  // input data; output buffers are sized by it and receive the results

  template <typename T>
  static KernelArg in(std::span<const T> data) { return {Kind::input, to_bytes(data)}; }
  template <typename T>
  static KernelArg inout(std::span<const T> data) { return {Kind::inout, to_bytes(data)}; }
  template <typename T>
  static KernelArg out(std::size_t count) { return {Kind::output, std::vector<std::byte>(count * sizeof(T))}; }
  template <typename T>
  static KernelArg scalar(const T& value) { return {Kind::scalar, to_bytes(std::span<const T>(&value, 1))}; }

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
  // Discovers platforms and devices and creates the sub-devices. Errors: "invalid_argument" (config, e.g. more
  // sub-devices than a device has compute units), "backend_failed" (an OpenCL call failed). No platform at all
  // is not an error: the backend then has no devices.
  static Result<std::unique_ptr<OpenClBackend>> create(const BackendConfig& config);
  ~OpenClBackend() override;

  std::string_view name() const override { return "opencl"; }
  Result<std::vector<DeviceInfo>> enumerate() override;
  // Builds the image (format opencl-source or opencl-binary) for the device. Errors: "not_found",
  // "incompatible" (model not in the image's compatible list, or an xclbin/opaque image), "program_failed"
  // (unreadable file, build error with the compiler's log). On failure the previous program stays loaded.
  Status program(std::string_view local_id, const Image& image) override;
  Result<std::string> loaded(std::string_view local_id) override;
  // Waits for queued work to finish and drops the loaded program (the device then holds no image).
  Status reset(std::string_view local_id) override;
  // Builds (once per device, then cached) and runs a tiny kernel on 256 values and checks the results.
  HealthReport health(std::string_view local_id) override;

  // Runs `kernel` of the loaded program on the device with `args` (in kernel-parameter order) over the global
  // range `global_size` (1 to 3 dimensions); output and inout buffers receive the results. Blocks until done.
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
