// accelpool-opencl-bench: what a program pays for running its OpenCL calls on a device over the network, measured
// by a plain OpenCL program (docs/benchmarks.md, "Remote OpenCL"). It links the ICD loader only, so the same binary
// runs on whatever the loader finds: local PoCL (OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd) or
// libaccelpool-opencl.so (OCL_ICD_VENDORS=<build>/opencl-vendors, ACCELPOOL_POOL, ACCELPOOL_TOKEN, ...).
//
// One line per measure, "NAME MEDIAN [min=MIN max=MAX runs=N]", the first two fields machine-readable:
//   first_platform_ms   the process's first clGetPlatformIDs (the loader loads its ICDs)
//   first_device_ms     ... and its first clGetDeviceIDs (CL_DEVICE_TYPE_ALL, first platform): under the remote ICD
//                       this includes the lease's acquire and the connection to the device's host
//   context_ms          clCreateContext + clCreateCommandQueue
//   batched_launch_us   a trivial kernel enqueued --commands times without waiting, then one clFinish: per launch
//   batched_setarg_launch_us  the same with clSetKernelArg before every launch
//   finish_each_us      the kernel enqueued and clFinish'ed --commands times: per launch (a round trip each)
//   empty_finish_us     clFinish on an empty queue: the bare round trip under the remote ICD
//   write_mibps         blocking clEnqueueWriteBuffer of --mib MiB
//   read_mibps          blocking clEnqueueReadBuffer of --mib MiB
//   loopback_mibps      --mib MiB over a TCP connection on 127.0.0.1 between two threads of this process
//   loopback_rtt_us     one byte there and back over that connection (TCP_NODELAY)
// Medians over --runs runs; times from std::chrono::steady_clock.
//
//   accelpool-opencl-bench [--runs 5] [--mib 64] [--commands 1000]
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const char* what, cl_int err) {
  std::fprintf(stderr, "accelpool-opencl-bench: %s failed: %d\n", what, err);
  std::exit(1);
}
void check(const char* what, cl_int err) {
  if (err != CL_SUCCESS) die(what, err);
}
[[noreturn]] void die_errno(const char* what) {
  std::fprintf(stderr, "accelpool-opencl-bench: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

// Prints "NAME MEDIAN min=MIN max=MAX runs=N".
void report(const char* name, std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  const double median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  std::printf("%s %.2f min=%.2f max=%.2f runs=%zu\n", name, median, values.front(), values.back(), n);
  std::fflush(stdout);
}

std::string platform_string(cl_platform_id p, cl_platform_info what) {
  std::size_t n = 0;
  if (clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "?";
  std::string s(n, '\0');
  if (clGetPlatformInfo(p, what, n, s.data(), nullptr) != CL_SUCCESS) return "?";
  s.resize(std::strlen(s.c_str()));
  return s;
}
std::string device_string(cl_device_id d, cl_device_info what) {
  std::size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "?";
  std::string s(n, '\0');
  if (clGetDeviceInfo(d, what, n, s.data(), nullptr) != CL_SUCCESS) return "?";
  s.resize(std::strlen(s.c_str()));
  return s;
}

const char* kSource = R"CL(
__kernel void nop(__global int* p, int v) {
  if (get_global_id(0) == 0 && v < 0) p[0] = v;
}
)CL";

// --- the loopback socket's own figures ------------------------------------------------------------------------

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      die_errno("loopback send");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}
void read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die_errno("loopback recv");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

// A TCP connection on 127.0.0.1 between this thread and another: `runs` transfers of `bytes` (each acknowledged by
// one byte, so the time covers the data's arrival), then `pings` one-byte round trips.
void loopback(std::size_t bytes, int runs, int pings) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) die_errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    die_errno("loopback listen");
  const int one = 1;
  std::thread receiver([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) die_errno("accept");
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<char> buf(1 << 20);
    for (int r = 0; r < runs + 1; ++r) {  // one warm-up
      std::size_t left = bytes;
      while (left > 0) {
        const ssize_t got = ::recv(fd, buf.data(), std::min(left, buf.size()), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) die_errno("loopback recv");
        left -= static_cast<std::size_t>(got);
      }
      write_all(fd, "k", 1);
    }
    char c;
    for (int i = 0; i < pings + 1; ++i) {
      read_all(fd, &c, 1);
      write_all(fd, &c, 1);
    }
    ::close(fd);
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die_errno("loopback connect");
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> data(bytes, 'x');
  std::vector<double> mibps;
  char ack;
  for (int r = 0; r < runs + 1; ++r) {
    const auto t0 = Clock::now();
    write_all(fd, data.data(), data.size());
    read_all(fd, &ack, 1);
    const double s = since(t0);
    if (r > 0) mibps.push_back(static_cast<double>(bytes) / (1 << 20) / s);
  }
  std::vector<double> rtt;
  for (int i = 0; i < pings + 1; ++i) {
    const auto t0 = Clock::now();
    write_all(fd, "p", 1);
    read_all(fd, &ack, 1);
    if (i > 0) rtt.push_back(since(t0) * 1e6);
  }
  receiver.join();
  ::close(fd);
  ::close(listener);
  report("loopback_mibps", mibps);
  report("loopback_rtt_us", rtt);
}

int flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: accelpool-opencl-bench [--runs N] [--mib M] [--commands N]\n"
          "Measures, on the first device of the first OpenCL platform the ICD loader finds:\n"
          "  first-call-to-device latency (clGetPlatformIDs + clGetDeviceIDs), per-command cost of a trivial kernel\n"
          "  (batched: N launches then clFinish; and clFinish after every launch), blocking write/read bandwidth of\n"
          "  an M MiB buffer, and the loopback TCP socket's own bandwidth and round trip in this process.\n"
          "Prints one line per measure: NAME MEDIAN min=MIN max=MAX runs=N.\n"
          "  --runs N      runs per measure, the median is printed (default 5)\n"
          "  --mib M       buffer size for the bandwidths, MiB (default 64)\n"
          "  --commands N  kernel launches per run (default 1000)\n");
      return 0;
    }
  const int runs = std::max(1, flag(argc, argv, "--runs", 5));
  const int mib = std::max(1, flag(argc, argv, "--mib", 64));
  const int commands = std::max(1, flag(argc, argv, "--commands", 1000));
  const std::size_t bytes = static_cast<std::size_t>(mib) << 20;

  // (a) The first call to the device.
  const auto t0 = Clock::now();
  cl_uint platforms = 0;
  check("clGetPlatformIDs", clGetPlatformIDs(0, nullptr, &platforms));
  if (platforms == 0) die("clGetPlatformIDs (no platform)", CL_INVALID_PLATFORM);
  std::vector<cl_platform_id> ids(platforms);
  check("clGetPlatformIDs", clGetPlatformIDs(platforms, ids.data(), nullptr));
  const double platform_ms = since(t0) * 1e3;
  cl_device_id device = nullptr;
  check("clGetDeviceIDs", clGetDeviceIDs(ids[0], CL_DEVICE_TYPE_ALL, 1, &device, nullptr));
  const double device_ms = since(t0) * 1e3;
  std::printf("platform %s\n", platform_string(ids[0], CL_PLATFORM_NAME).c_str());
  std::printf("device %s\n", device_string(device, CL_DEVICE_NAME).c_str());
  std::printf("settings runs=%d mib=%d commands=%d\n", runs, mib, commands);
  std::printf("first_platform_ms %.2f\n", platform_ms);
  std::printf("first_device_ms %.2f\n", device_ms);
  std::fflush(stdout);

  cl_int err = CL_SUCCESS;
  const auto tc = Clock::now();
  cl_context context = clCreateContext(nullptr, 1, &device, nullptr, nullptr, &err);
  check("clCreateContext", err);
  cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
  check("clCreateCommandQueue", err);
  std::printf("context_ms %.2f\n", since(tc) * 1e3);
  const auto tb = Clock::now();
  cl_program program = clCreateProgramWithSource(context, 1, &kSource, nullptr, &err);
  check("clCreateProgramWithSource", err);
  check("clBuildProgram", clBuildProgram(program, 1, &device, "", nullptr, nullptr));
  cl_kernel kernel = clCreateKernel(program, "nop", &err);
  check("clCreateKernel", err);
  cl_mem flagbuf = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof(cl_int), nullptr, &err);
  check("clCreateBuffer", err);
  cl_int v = 1;
  check("clSetKernelArg", clSetKernelArg(kernel, 0, sizeof flagbuf, &flagbuf));
  check("clSetKernelArg", clSetKernelArg(kernel, 1, sizeof v, &v));
  const std::size_t global = 1;
  check("clEnqueueNDRangeKernel",
        clEnqueueNDRangeKernel(queue, kernel, 1, nullptr, &global, nullptr, 0, nullptr, nullptr));
  check("clFinish", clFinish(queue));
  std::printf("build_and_first_launch_ms %.2f\n", since(tb) * 1e3);
  std::fflush(stdout);

  // (b) Per-command cost.
  auto launch = [&] {
    check("clEnqueueNDRangeKernel",
          clEnqueueNDRangeKernel(queue, kernel, 1, nullptr, &global, nullptr, 0, nullptr, nullptr));
  };
  std::vector<double> batched, batched_setarg, each, empty;
  for (int r = 0; r < runs; ++r) {
    auto t = Clock::now();
    for (int i = 0; i < commands; ++i) launch();
    check("clFinish", clFinish(queue));
    batched.push_back(since(t) * 1e6 / commands);

    t = Clock::now();
    for (int i = 0; i < commands; ++i) {
      v = i + 1;
      check("clSetKernelArg", clSetKernelArg(kernel, 1, sizeof v, &v));
      launch();
    }
    check("clFinish", clFinish(queue));
    batched_setarg.push_back(since(t) * 1e6 / commands);

    t = Clock::now();
    for (int i = 0; i < commands; ++i) {
      launch();
      check("clFinish", clFinish(queue));
    }
    each.push_back(since(t) * 1e6 / commands);

    t = Clock::now();
    for (int i = 0; i < commands; ++i) check("clFinish", clFinish(queue));
    empty.push_back(since(t) * 1e6 / commands);
  }
  report("batched_launch_us", batched);
  report("batched_setarg_launch_us", batched_setarg);
  report("finish_each_us", each);
  report("empty_finish_us", empty);

  // (c) Write and read bandwidth, blocking.
  std::vector<char> host(bytes);
  for (std::size_t i = 0; i < bytes; i += 4096) host[i] = static_cast<char>(i >> 12);
  cl_mem buffer = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
  check("clCreateBuffer", err);
  check("clEnqueueWriteBuffer",
        clEnqueueWriteBuffer(queue, buffer, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr));
  check("clEnqueueReadBuffer", clEnqueueReadBuffer(queue, buffer, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr));
  std::vector<double> write, read;
  for (int r = 0; r < runs; ++r) {
    auto t = Clock::now();
    check("clEnqueueWriteBuffer",
          clEnqueueWriteBuffer(queue, buffer, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr));
    write.push_back(mib / since(t));
    t = Clock::now();
    check("clEnqueueReadBuffer",
          clEnqueueReadBuffer(queue, buffer, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr));
    read.push_back(mib / since(t));
  }
  report("write_mibps", write);
  report("read_mibps", read);
  for (std::size_t i = 0; i < bytes; i += 4096)
    if (host[i] != static_cast<char>(i >> 12)) die("read back (data differs)", CL_INVALID_VALUE);

  clReleaseMemObject(buffer);
  clReleaseMemObject(flagbuf);
  clReleaseKernel(kernel);
  clReleaseProgram(program);
  clReleaseCommandQueue(queue);
  clReleaseContext(context);

  // (d) The loopback socket's own bandwidth and round trip, in this process.
  loopback(bytes, std::max(runs, 3), commands);
  return 0;
}
