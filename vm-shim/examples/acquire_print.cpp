// Acquire devices from the pool and print what was granted, then give them back (RAII).
//
//   accelpool-example-acquire [--pool URI] [--token T] [--guest ID] [--kind K] [--bitstream B] [--count N]
//                             [--timeout SECONDS] [--hold SECONDS]
// Defaults come from ACCELPOOL_POOL, ACCELPOOL_TOKEN, ACCELPOOL_GUEST.
#include <accelpool/common/cli.hpp>
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
  double hold_s = 0, timeout_s = 60;
  CLI::App app{
      "accelpool-example-acquire: acquire devices from an accelpool pool, print what was granted, hold them "
      "for --hold seconds, then give them back (RAII).\nDefaults come from ACCELPOOL_POOL, ACCELPOOL_TOKEN "
      "and ACCELPOOL_GUEST."};
  accelpool::common::init_cli(app, "accelpool-example-acquire");
  app.add_option("--pool", copts.uri, "tcp://HOST:PORT, unix:///PATH or serial://NAME")->type_name("URI");
  app.add_option("--token", copts.token, "tenant token");
  app.add_option("--guest", copts.guest, "guest id (default: the host name)")->type_name("ID");
  app.add_option("--kind", aopts.kind, "device kind")->capture_default_str();
  app.add_option("--bitstream", aopts.bitstream, "bitstream the devices must hold");
  app.add_option("--count", aopts.count, "number of devices")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--timeout", timeout_s, "give up if not granted within this")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--hold", hold_s, "seconds to hold the devices before giving them back")
      ->check(CLI::NonNegativeNumber);
  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  aopts.timeout = Seconds(timeout_s);
  auto client = Client::connect(copts);
  if (!client) {
    std::fprintf(stderr, "connect: %s\n", accelpool::describe(client.error()).c_str());
    return 1;
  }
  aopts.on_revoking = [](const LeaseInfo& l) {
    std::printf("lease %llu is being revoked; release before %.3f\n", static_cast<unsigned long long>(l.id),
                l.revoke_deadline.value_or(0));
  };
  auto lease = (*client)->acquire(aopts);
  if (!lease) {
    std::fprintf(stderr, "acquire: %s\n", accelpool::describe(lease.error()).c_str());
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
    std::fprintf(stderr, "release: %s\n", accelpool::describe(s.error()).c_str());
    return 1;
  }
  std::printf("released\n");
  return 0;
}
