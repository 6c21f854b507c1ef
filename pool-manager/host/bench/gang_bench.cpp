// accelpool-gang-bench: how long a host takes to prepare a gang whose programming takes T per device.
//
// A HostRuntime over the simulated backend (N devices, programming takes --program-ms each: the sim backend's
// fixed cost per programming, an image of 0 bytes) prepares every device with a new image, --rounds times, and
// prints the wall time per gang. With per-device strands it is about T; with --threads 1 (one operation at a
// time, as a host with a single worker did) about N x T.
//
//   accelpool-gang-bench [--devices 4] [--program-ms 250] [--rounds 5] [--threads 0]
#include <accelpool/backends/sim_backend.hpp>
#include <accelpool/host/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

using namespace accelpool;
using Clock = std::chrono::steady_clock;

namespace {

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int devices = arg(argc, argv, "--devices", 4);
  const int program_ms = arg(argc, argv, "--program-ms", 250);
  const int rounds = arg(argc, argv, "--rounds", 5);
  const int threads = arg(argc, argv, "--threads", 0);
  if (devices < 1 || program_ms < 0 || rounds < 1 || threads < 0) {
    std::fprintf(stderr,
                 "usage: accelpool-gang-bench [--devices N>=1] [--program-ms T>=0] [--rounds R>=1] [--threads K>=0]\n");
    return 2;
  }

  backends::SimConfig config;
  config.devices = {{"fpga", "sim-u250", devices}};
  config.program_base = std::chrono::milliseconds(program_ms);
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  list.push_back(std::make_unique<backends::SimBackend>(config));
  host::RuntimeOptions options;
  options.host = "bench";
  options.threads = static_cast<std::size_t>(threads);
  auto runtime = host::HostRuntime::create(options, std::move(list), nullptr, nullptr, {});
  if (!runtime) {
    std::fprintf(stderr, "accelpool-gang-bench: %s\n", runtime.error().message.c_str());
    return 1;
  }

  std::printf("gang of %d devices, programming %d ms each, %s\n", devices, program_ms,
              threads == 0 ? "one strand per device" : (std::to_string(threads) + " thread(s)").c_str());
  std::vector<double> times;
  for (int r = 0; r < rounds; ++r) {
    std::mutex mu;
    std::condition_variable cv;
    int left = devices, failed = 0;
    const auto start = Clock::now();
    for (int d = 0; d < devices; ++d) {
      host::PrepareRequest request;
      request.device = "sim:" + std::to_string(d);
      request.bitstream = "image-" + std::to_string(r);  // a new image each round: every device programs
      (*runtime)->prepare(request, [&](Status s, host::PrepareResult) {
        std::lock_guard lock(mu);
        if (!s) ++failed;
        if (--left == 0) cv.notify_all();
      });
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (failed != 0) {
      std::fprintf(stderr, "accelpool-gang-bench: %d prepares failed\n", failed);
      return 1;
    }
    times.push_back(ms);
    std::printf("round %d: %.1f ms\n", r + 1, ms);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf("median %.1f ms = %.2f x T (T = %d ms; serial would be %d x T)\n", median,
              program_ms > 0 ? median / program_ms : 0.0, program_ms, devices);
  return 0;
}
