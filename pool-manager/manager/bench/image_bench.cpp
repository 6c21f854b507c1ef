// accelpool-image-bench: does a large registered image slow down a grant? Not a test: it prints numbers.
//
// The manager's own parts in one process: the pool core on a SQLite store, the bitstream registry and its
// ImageCatalog (the acquire check), and an in-process host over the simulated backend with D devices. This
// thread plays the owner thread: it calls the core and runs the completions hosts post to it. One guest loops
// acquire -> granted (every device ready) -> release, first naming no bitstream, then naming a registered image
// of --image-mib MiB that every device already holds (a warm-up lease per device programs it first). Reports,
// per mode, the time the acquire call itself takes on the owner thread (where the image check runs) and the time
// from the acquire to the grant, p50/p99/max. With the image checked from the verified-image cache and the
// devices holding it by sha256, nothing reads or hashes the image after the warm-up, so both modes should match.
//
// usage: accelpool-image-bench [--image-mib M] [--cycles N] [--devices D]
#include "bench_support.hpp"

#include <accelpool/backends/sim_backend.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/manager/core.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace accelpool;
using namespace accelpool::manager;
using SteadyClock = std::chrono::steady_clock;

namespace {

struct Options {
  int image_mib = 256;
  int cycles = 500;
  int devices = 4;
};

[[noreturn]] void die(const std::string& what) { bench::die("accelpool-image-bench", what); }

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) die("missing value after " + a);
    int v = std::atoi(argv[++i]);
    if (v <= 0) die(a + " needs a positive number");
    if (a == "--image-mib")
      o.image_mib = v;
    else if (a == "--cycles")
      o.cycles = v;
    else if (a == "--devices")
      o.devices = v;
    else
      die("unknown option " + a + " (usage: accelpool-image-bench [--image-mib M] [--cycles N] [--devices D])");
  }
  return o;
}

using bench::OwnerQueue;
using bench::pct;

struct Granted : CoreListener {
  std::set<LeaseId> granted;
  void lease_event(const Lease& lease, LeaseEvent event) override {
    if (event == LeaseEvent::granted) granted.insert(lease.id);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const fs::path dir = fs::temp_directory_path() / ("accelpool-image-bench-" + std::to_string(::getpid()));
  fs::remove_all(dir);

  // The registry holds one image of the asked size.
  std::string sha;
  auto registry = bench::registry_with_image("accelpool-image-bench", dir, o.image_mib, sha);
  auto catalog = std::make_shared<ImageCatalog>(registry);

  // The core, configured as the daemon configures it.
  auto store = open_sqlite_store(dir / "pool.db", false, StoreCreation::allow_new);
  if (!store) die(store.error().message);
  CoreOptions co;
  co.acquire_check = [catalog](const AcquireParams& p) { return catalog->check(p.kind, p.bitstream); };
  co.image_sha256 = [catalog](const std::string& b) { return catalog->sha256_of(b); };
  co.image_models = [catalog](const std::string& b) { return catalog->compatible_of(b); };
  SystemClock clock;
  auto core_r = PoolCore::create(co, clock, **store);
  if (!core_r) die(core_r.error().message);
  PoolCore& core = **core_r;
  Granted granted;
  core.add_listener(&granted);
  OwnerQueue owner;

  backends::SimConfig sim;
  sim.devices = {{"fpga", "sim-u250", o.devices}};
  sim.attach = "network";
  sim.program_bytes_per_second = 1024.0 * 1024 * 1024;  // warm-up programming: 1 GiB/s
  std::vector<std::unique_ptr<backends::DeviceBackend>> backends;
  backends.push_back(std::make_unique<backends::SimBackend>(sim));
  auto host = make_local_host("local", std::move(backends), catalog, owner.poster());
  if (!host) die(host.error().message);
  if (auto s = core.attach_host(std::move(*host)); !s) die(s.error().message);
  if (auto t = core.create_tenant("bench", 1, 0); !t) die(t.error().message);

  auto acquire = [&](const std::string& bitstream, std::uint32_t count, double* call_us) {
    AcquireParams p;
    p.tenant = "bench";
    p.guest = "vm-bench";
    p.kind = "fpga";
    p.bitstream = bitstream;
    p.count = count;
    auto start = SteadyClock::now();
    auto l = core.acquire(p);
    if (call_us) *call_us = std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
    if (!l) die("acquire: " + l.error().message);
    owner.run_until([&] { return granted.granted.count(l->id) > 0; });
    return l->id;
  };
  auto release = [&](LeaseId id) {
    if (auto r = core.release(Caller::direct("bench", "vm-bench"), id); !r) die("release: " + r.error().message);
  };

  // Warm-up: one gang over every device programs the image on each.
  auto warm_start = SteadyClock::now();
  release(acquire("big", static_cast<std::uint32_t>(o.devices), nullptr));
  const double warm_s = std::chrono::duration<double>(SteadyClock::now() - warm_start).count();

  std::printf("image %d MiB on %d simulated devices, %d cycles per mode (warm-up: every device programmed in %.2f s)\n",
              o.image_mib, o.devices, o.cycles, warm_s);
  std::printf("%-16s %12s %12s %12s %14s %14s %14s\n", "mode", "call p50 us", "call p99 us", "call max us",
              "grant p50 us", "grant p99 us", "grant max us");
  for (const std::string bitstream : {"", "big"}) {
    std::vector<double> call_us, grant_us;
    for (int i = 0; i < o.cycles; ++i) {
      double call = 0;
      auto start = SteadyClock::now();
      LeaseId id = acquire(bitstream, 1, &call);
      grant_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count());
      call_us.push_back(call);
      release(id);
    }
    std::printf("%-16s %12.1f %12.1f %12.1f %14.1f %14.1f %14.1f\n",
                bitstream.empty() ? "no image" : (std::to_string(o.image_mib) + " MiB image").c_str(),
                pct(call_us, 0.5), pct(call_us, 0.99), pct(call_us, 1.0), pct(grant_us, 0.5), pct(grant_us, 0.99),
                pct(grant_us, 1.0));
  }
  core_r->reset();
  fs::remove_all(dir);
  return 0;
}
