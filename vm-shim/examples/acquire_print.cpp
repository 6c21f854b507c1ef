// Acquire devices from the pool and print what was granted, then give them back (RAII).
//
//   accelpool-example-acquire [--pool URI] [--token T] [--guest ID] [--kind K] [--bitstream B] [--count N]
//                             [--timeout SECONDS] [--hold SECONDS]
// Defaults come from ACCELPOOL_POOL, ACCELPOOL_TOKEN, ACCELPOOL_GUEST.
#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

using namespace accelpool::shim;

int main(int argc, char** argv) {
  ClientOptions copts;
  copts.uri = default_pool_uri();
  copts.token = std::getenv("ACCELPOOL_TOKEN") ? std::getenv("ACCELPOOL_TOKEN") : "";
  copts.guest = std::getenv("ACCELPOOL_GUEST") ? std::getenv("ACCELPOOL_GUEST") : "";
  AcquireOptions aopts;
  aopts.kind = "fpga";
  aopts.timeout = Seconds(60);
  double hold_s = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--pool") copts.uri = v;
    else if (k == "--token") copts.token = v;
    else if (k == "--guest") copts.guest = v;
    else if (k == "--kind") aopts.kind = v;
    else if (k == "--bitstream") aopts.bitstream = v;
    else if (k == "--count") aopts.count = static_cast<std::uint32_t>(std::stoul(v));
    else if (k == "--timeout") aopts.timeout = Seconds(std::stod(v));
    else if (k == "--hold") hold_s = std::stod(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto client = Client::connect(copts);
  if (!client) {
    std::fprintf(stderr, "connect: [%s] %s\n", client.error().code.c_str(), client.error().message.c_str());
    return 1;
  }
  aopts.on_revoking = [](const LeaseInfo& l) {
    std::printf("lease %llu is being revoked; release before %.3f\n", static_cast<unsigned long long>(l.id),
                l.revoke_deadline.value_or(0));
  };
  auto lease = (*client)->acquire(aopts);
  if (!lease) {
    std::fprintf(stderr, "acquire: [%s] %s\n", lease.error().code.c_str(), lease.error().message.c_str());
    return 1;
  }
  LeaseInfo info = lease->info();
  std::printf("lease %llu: kind %s, bitstream %s, %zu device(s)\n", static_cast<unsigned long long>(info.id),
              info.kind.c_str(), info.bitstream.empty() ? "(any)" : info.bitstream.c_str(), info.devices.size());
  for (const auto& d : info.devices) {
    std::printf("  device %s (host %s, backend %s)", d.name.c_str(), d.host.c_str(),
                d.backend.empty() ? "?" : d.backend.c_str());
    if (!d.model.empty()) std::printf(" model %s", d.model.c_str());
    if (!d.pci_address.empty()) std::printf(" pci %s", d.pci_address.c_str());
    if (d.opencl_platform && d.opencl_device) std::printf(" opencl %d:%d", *d.opencl_platform, *d.opencl_device);
    if (d.opencl_subdevice) std::printf("/%d", *d.opencl_subdevice);
    if (d.xrt_index) std::printf(" xrt %d", *d.xrt_index);
    if (!d.endpoint.empty()) std::printf(" endpoint %s", d.endpoint.c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
  if (hold_s > 0) std::this_thread::sleep_for(Seconds(hold_s));
  if (auto s = lease->release(); !s) {
    std::fprintf(stderr, "release: [%s] %s\n", s.error().code.c_str(), s.error().message.c_str());
    return 1;
  }
  std::printf("released\n");
  return 0;
}
