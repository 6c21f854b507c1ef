// accelpool-link-image-bench: how long does an image take to reach a host agent over the agent link, and does
// the link keep serving other requests while it streams? Not a test: it prints numbers.
//
// One process plays the manager's side: the agent listener (with its image server) over a registry holding one
// image of --image-mib MiB, and this thread as the owner thread. A real accelpool-agent with two simulated
// devices and an empty image folder registers; then device.prepare of sim:0 with the image's sha256 makes the
// agent fetch it (image.manifest, then image.read piece by piece), verify it and program it. While that runs the
// owner sends device.reset of sim:1 back to back over the same connection (the round trip shows how long another
// request waits behind the transfer) and a timer thread posts to the owner queue every millisecond (how late a
// posted job runs: the owner thread's latency). A second prepare, of sim:1 with reprogram and the image now in
// the agent's folder, gives the same work without the transfer.
//
// usage: accelpool-link-image-bench [--image-mib M]
#include "bench_support.hpp"

#include <accelpool/manager/agent_listener.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace fs = std::filesystem;
using namespace accelpool;
using namespace accelpool::manager;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr const char* kProgram = "accelpool-link-image-bench";
[[noreturn]] void die(const std::string& what) { bench::die(kProgram, what); }

double ms_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

void print_row(const char* what, const std::vector<double>& v) {
  std::printf("%-44s n=%-6zu p50 %8.2f ms  p99 %8.2f ms  max %8.2f ms\n", what, v.size(), bench::pct(v, 0.5),
              bench::pct(v, 0.99), bench::pct(v, 1.0));
}

}  // namespace

int main(int argc, char** argv) {
  int image_mib = 256;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--image-mib" && i + 1 < argc && std::atoi(argv[i + 1]) > 0)
      image_mib = std::atoi(argv[++i]);
    else
      die("usage: accelpool-link-image-bench [--image-mib M]");
  }
  const fs::path dir = fs::temp_directory_path() / ("accelpool-link-image-bench-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string sha;
  auto registry = bench::registry_with_image(kProgram, dir, image_mib, sha);

  bench::OwnerQueue owner;
  std::shared_ptr<agent::RemoteHost> host;
  agent::ListenerEvents ev;
  ev.host_joined = [&host](std::unique_ptr<agent::RemoteHost> h) {
    host = std::move(h);
    return Status::ok();
  };
  agent::ListenerOptions lo;
  lo.listen = {"127.0.0.1:0"};
  lo.token = "bench-agent-token";
  lo.images = registry;
  auto listener = agent::AgentListener::create(lo, ev, owner.poster());
  if (!listener) die(listener.error().message);

  const fs::path config = dir / "agent.toml";
  std::ofstream(config) << "[agent]\nmanager = \"127.0.0.1:" << (*listener)->tcp_port() << "\"\ntoken = \"" << lo.token
                        << "\"\nhost = \"bench\"\nheartbeat_interval_ms = 1000\nbitstreams = \""
                        << (dir / "agent-images").string()
                        << "\"\n[backends.sim]\ndevices = \"fpga:sim-u250:2\"\nprogram_base_ms = 1\n"
                           "program_mib_per_s = 1000000\n";
  const pid_t agent = ::fork();
  if (agent == 0) {
    int fd = ::open((dir / "agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 2);
    ::execl(ACCELPOOL_AGENT_BIN, ACCELPOOL_AGENT_BIN, "--config", config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  owner.run_until([&] { return host != nullptr; });

  // One device.reset of sim:1 and its round trip; one prepare and its duration.
  auto reset_round_trip = [&] {
    bool done = false;
    Status status;
    auto t0 = SteadyClock::now();
    host->reset("sim:1", [&](Status s, std::string) {
      status = std::move(s);
      done = true;
    });
    owner.run_until([&] { return done; });
    if (!status) die("device.reset: " + status.error().message);
    return ms_since(t0);
  };
  std::vector<double> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(reset_round_trip());

  // The owner thread's latency: how late a job posted every millisecond runs.
  std::atomic<bool> ticking{true};
  std::vector<double> owner_late;  // owner thread only
  std::thread ticker([&] {
    auto post = owner.poster();
    while (ticking) {
      auto at = SteadyClock::now();
      post([&owner_late, at] { owner_late.push_back(ms_since(at)); });
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  host::PrepareRequest fetch;
  fetch.device = "sim:0";
  fetch.bitstream = "big";
  fetch.sha256 = sha;
  bool prepared = false;
  Status prepare_status;
  auto t0 = SteadyClock::now();
  double fetch_ms = 0;
  host->prepare(fetch, [&](Status s, host::PrepareResult) {
    prepare_status = std::move(s);
    fetch_ms = ms_since(t0);
    prepared = true;
  });
  std::vector<double> busy;
  while (!prepared) busy.push_back(reset_round_trip());
  if (!prepare_status) die("device.prepare with the transfer: " + prepare_status.error().message);
  ticking = false;
  ticker.join();
  const std::vector<double> late = owner_late;

  host::PrepareRequest cached = fetch;
  cached.device = "sim:1";
  cached.reprogram = true;
  prepared = false;
  t0 = SteadyClock::now();
  double cached_ms = 0;
  host->prepare(cached, [&](Status s, host::PrepareResult) {
    prepare_status = std::move(s);
    cached_ms = ms_since(t0);
    prepared = true;
  });
  owner.run_until([&] { return prepared; });
  if (!prepare_status) die("device.prepare from the agent's folder: " + prepare_status.error().message);

  std::printf("image %d MiB, link pieces of 512 KiB\n", image_mib);
  std::printf("prepare with the transfer            %10.1f ms\n", fetch_ms);
  std::printf("prepare from the agent's folder      %10.1f ms (verify + program, no transfer)\n", cached_ms);
  std::printf("transfer (difference)                %10.1f ms = %.0f MiB/s\n", fetch_ms - cached_ms,
              image_mib / ((fetch_ms - cached_ms) / 1000.0));
  print_row("device.reset round trip, link idle", idle);
  print_row("device.reset round trip, during the transfer", busy);
  print_row("owner queue latency, during the transfer", late);

  ::kill(agent, SIGTERM);
  ::waitpid(agent, nullptr, 0);
  listener->reset();
  fs::remove_all(dir);
  return 0;
}
