// Acquire an OpenCL device from the pool, run the sample `vadd` kernel on it with real data, verify the result.
//
//   accelpool-example-opencl-vadd [KERNEL.cl] [N]
//
// Under accelpool-run (ACCELPOOL_LEASE is set) it uses the device the run was granted (ACCELPOOL_OPENCL_PLATFORM,
// ACCELPOOL_OPENCL_DEVICE). Otherwise it acquires one itself with the client library: ACCELPOOL_POOL,
// ACCELPOOL_TOKEN, ACCELPOOL_GUEST and ACCELPOOL_KIND (default "cpu", PoCL's CPU device) say from where.
// KERNEL.cl defaults to the sample bitstream bitstreams/samples/opencl/vadd.cl of the source tree.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef ACCELPOOL_SAMPLE_VADD
#define ACCELPOOL_SAMPLE_VADD "vadd.cl"
#endif

using namespace accelpool::shim;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "opencl-vadd: %s\n", what.c_str());
  return 1;
}

std::string env(const char* k, const char* def = "") {
  const char* v = std::getenv(k);
  return v && *v ? v : def;
}

// Runs vadd on device (platform, device) of the ICD loader's list. Returns an error text, empty on success.
std::string run_vadd(int platform, int device, const std::string& source, cl_uint n) {
  cl_uint np = 0;
  clGetPlatformIDs(0, nullptr, &np);
  if (platform < 0 || static_cast<cl_uint>(platform) >= np) return "no OpenCL platform " + std::to_string(platform);
  std::vector<cl_platform_id> platforms(np);
  clGetPlatformIDs(np, platforms.data(), nullptr);
  cl_uint nd = 0;
  clGetDeviceIDs(platforms[platform], CL_DEVICE_TYPE_ALL, 0, nullptr, &nd);
  if (device < 0 || static_cast<cl_uint>(device) >= nd) return "no OpenCL device " + std::to_string(device);
  std::vector<cl_device_id> devices(nd);
  clGetDeviceIDs(platforms[platform], CL_DEVICE_TYPE_ALL, nd, devices.data(), nullptr);
  cl_device_id dev = devices[device];
  char name[256] = {};
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name - 1, name, nullptr);
  std::printf("device %d:%d: %s\n", platform, device, name);

  cl_int err = CL_SUCCESS;
  cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
  if (err != CL_SUCCESS) return "clCreateContext: " + std::to_string(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
  const char* src = source.c_str();
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, nullptr, &err);
  std::string result;
  if (clBuildProgram(prog, 1, &dev, "", nullptr, nullptr) != CL_SUCCESS) {
    char log[4096] = {};
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, nullptr);
    result = std::string("build failed: ") + log;
  } else {
    std::vector<float> a(n), b(n), out(n, -1.0f);
    for (cl_uint i = 0; i < n; ++i) {
      a[i] = static_cast<float>(i) * 0.5f;
      b[i] = 1000.0f - static_cast<float>(i);
    }
    cl_kernel k = clCreateKernel(prog, "vadd", &err);
    cl_mem ba = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(float), a.data(), &err);
    cl_mem bb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(float), b.data(), &err);
    cl_mem bo = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, n * sizeof(float), nullptr, &err);
    clSetKernelArg(k, 0, sizeof ba, &ba);
    clSetKernelArg(k, 1, sizeof bb, &bb);
    clSetKernelArg(k, 2, sizeof bo, &bo);
    clSetKernelArg(k, 3, sizeof n, &n);
    size_t global = n;
    err = clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr);
    if (err == CL_SUCCESS)
      err = clEnqueueReadBuffer(q, bo, CL_TRUE, 0, n * sizeof(float), out.data(), 0, nullptr, nullptr);
    if (err != CL_SUCCESS) {
      result = "kernel run failed: " + std::to_string(err);
    } else {
      cl_uint bad = 0;
      for (cl_uint i = 0; i < n; ++i) {
        if (std::fabs(out[i] - (a[i] + b[i])) > 1e-3f) ++bad;
      }
      if (bad)
        result = std::to_string(bad) + " of " + std::to_string(n) + " results wrong";
      else
        std::printf("vadd: %u elements verified\n", n);
    }
    clReleaseMemObject(ba);
    clReleaseMemObject(bb);
    clReleaseMemObject(bo);
    clReleaseKernel(k);
  }
  clReleaseProgram(prog);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kernel_file = argc > 1 ? argv[1] : ACCELPOOL_SAMPLE_VADD;
  cl_uint n = argc > 2 ? static_cast<cl_uint>(std::strtoul(argv[2], nullptr, 10)) : 1u << 20;
  std::ifstream f(kernel_file);
  if (!f) return fail("cannot read the kernel source " + kernel_file);
  std::stringstream ss;
  ss << f.rdbuf();

  std::unique_ptr<Client> client;
  std::optional<Lease> lease;
  int platform = -1, device = -1;
  if (!env("ACCELPOOL_LEASE").empty()) {
    // Under accelpool-run: the grant is in the environment.
    if (env("ACCELPOOL_OPENCL_PLATFORM").empty())
      return fail("the granted device is not an OpenCL device (" + env("ACCELPOOL_DEVICES") + ")");
    platform = std::atoi(env("ACCELPOOL_OPENCL_PLATFORM").c_str());
    device = std::atoi(env("ACCELPOOL_OPENCL_DEVICE").c_str());
    std::printf("lease %s (from accelpool-run): %s\n", env("ACCELPOOL_LEASE").c_str(),
                env("ACCELPOOL_DEVICES").c_str());
  } else {
    ClientOptions o;
    o.uri = default_pool_uri();
    o.token = env("ACCELPOOL_TOKEN");
    o.guest = env("ACCELPOOL_GUEST");
    auto c = Client::connect(o);
    if (!c) return fail(c.error().message);
    client = std::move(*c);
    AcquireOptions a;
    a.kind = env("ACCELPOOL_KIND", "cpu");
    a.timeout = Seconds(60);
    auto l = client->acquire(a);
    if (!l) return fail(l.error().message);
    lease = std::move(*l);
    auto info = lease->info();
    const DeviceInfo& d = info.devices.at(0);
    if (!d.opencl_platform || !d.opencl_device)
      return fail("the granted device " + d.name + " is not an OpenCL device");
    platform = *d.opencl_platform;
    device = *d.opencl_device;
    std::printf("lease %llu: %s\n", static_cast<unsigned long long>(info.id), d.name.c_str());
  }
  std::string err = run_vadd(platform, device, ss.str(), n);
  if (!err.empty()) return fail(err);
  return 0;  // the lease (if we took one) is released here
}
