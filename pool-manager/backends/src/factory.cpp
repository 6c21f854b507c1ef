#include <accelpool/backends/factory.hpp>

#include <accelpool/backends/sim_backend.hpp>
#ifdef ACCELPOOL_HAVE_OPENCL_BACKEND
#include <accelpool/backends/opencl_backend.hpp>
#endif
#ifdef ACCELPOOL_HAVE_XRT_BACKEND
#include <accelpool/backends/xrt_backend.hpp>
#endif

namespace accelpool::backends {
namespace {

template <typename T>
Result<std::unique_ptr<DeviceBackend>> upcast(Result<std::unique_ptr<T>> r) {
  if (!r) return r.error();
  return std::unique_ptr<DeviceBackend>(std::move(*r));
}

}  // namespace

std::vector<std::string> built_backends() {
  std::vector<std::string> out;
#ifdef ACCELPOOL_HAVE_OPENCL_BACKEND
  out.push_back("opencl");
#endif
  out.push_back("sim");
#ifdef ACCELPOOL_HAVE_XRT_BACKEND
  out.push_back("xrt");
#endif
  return out;
}

Result<std::unique_ptr<DeviceBackend>> make_backend(std::string_view name, const BackendConfig& config) {
  if (name == "sim") return upcast(SimBackend::create(config));
#ifdef ACCELPOOL_HAVE_OPENCL_BACKEND
  if (name == "opencl") return upcast(OpenClBackend::create(config));
#endif
#ifdef ACCELPOOL_HAVE_XRT_BACKEND
  if (name == "xrt") return upcast(XrtBackend::create(config));
#endif
  std::string list;
  for (const auto& b : built_backends()) list += (list.empty() ? "" : ", ") + b;
  return make_error(Errc::not_found,
                    "no device backend '" + std::string(name) + "' in this build (built: " + list + ")");
}

}  // namespace accelpool::backends
