// The whole path on real VMs: a private libvirtd (QEMU, pure emulation), the real accelpool-manager and
// accelpool-agent on loopback, the agent with one simulated FPGA attached through libvirt and relaying each VM's
// virtio-serial port to the manager, and two guests booted from the end-to-end image (accelpool-guestd and
// accelpool-run inside, tests/guest/e2e_job.sh as /etc/accelpool/run). Guest 1 gets the FPGA hot-plugged and
// holds it; guest 2 asks meanwhile, waits, and gets the same device once guest 1's lease is released and the
// device is detached. Checked from the guests' consoles and from the admin API.
// Skipped with a warning where the image could not be built or no libvirtd can run.
#include "libvirt_harness.hpp"
#include "manager_fixture.hpp"

#include <accelpool/hypervisor/domain_channels.hpp>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include "skip.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <exception>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace accelpool;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using json = nlohmann::json;
using shim::test::eventually;
using shim::test::ManagerOptions;
using shim::test::ManagerProcess;
using shim::test::read_file;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPortName = "org.accelpool.guest.0";
constexpr const char* kAgentToken = "e2e-agent-token-0123456789";
constexpr const char* kHost = "hv-e2e";
constexpr double kHoldS = 12;  // each guest holds the FPGA this long: the one that asks second queues meanwhile

fs::path image_dir() {
  const char* env = std::getenv("ACCELPOOL_E2E_GUEST_IMAGE_DIR");
  return env != nullptr && *env != '\0' ? fs::path(env) : fs::path(ACCELPOOL_E2E_GUEST_IMAGE_DIR);
}

// Why the VMs cannot run here, or nothing.
std::optional<std::string> unavailable(const fs::path& dir, hypervisor::testing::LibvirtDaemon*& daemon) {
  if (fs::exists(dir / "UNAVAILABLE")) return "the guest image could not be built: " + read_file(dir / "UNAVAILABLE");
  if (!fs::exists(dir / "initramfs.cpio.gz") || (!fs::exists(dir / "vmlinux") && !fs::exists(dir / "vmlinuz")))
    return "no guest image in " + dir.string() + " (build the target e2e-guest-image)";
  std::string why;
  daemon = hypervisor::testing::LibvirtDaemon::shared(&why);
  if (daemon == nullptr) return "no private libvirtd with the QEMU driver can run here: " + why;
  return std::nullopt;
}

// The first console line holding `needle`, waiting up to `timeout`.
std::optional<std::string> console_line(const fs::path& log, const std::string& needle, std::chrono::seconds timeout) {
  std::optional<std::string> found;
  eventually(
      [&] {
        // Complete lines only: the console is read while QEMU writes it, and a line's end may not be there yet.
        std::string text = read_file(log);
        text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line))
          if (line.find(needle) != std::string::npos) {
            found = line;
            return true;
          }
        return false;
      },
      timeout);
  return found;
}

// How many console lines hold `needle`.
std::size_t console_count(const fs::path& log, const std::string& needle) {
  std::istringstream in(read_file(log));
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

// accelpool-agent as a child process, stopped with SIGTERM at the end.
struct AgentProcess {
  pid_t pid = -1;
  fs::path log;
  AgentProcess(const fs::path& config, fs::path log_file) : log(std::move(log_file)) {
    pid = fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(ACCELPOOL_AGENT_BIN, ACCELPOOL_AGENT_BIN, "--config", config.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~AgentProcess() {
    ::kill(pid, SIGTERM);
    int st;
    if (!eventually([&] { return waitpid(pid, &st, WNOHANG) == pid; }, 10s)) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
  }
};

json admin_get(const ManagerProcess& m, const std::string& path) {
  std::string body;
  int code = m.admin_request("GET", path, "", body);
  INFO(path << " -> " << code << " " << body);
  REQUIRE(code == 200);
  return json::parse(body);
}

}  // namespace

TEST_CASE("the relay finds the host socket of a VM's guest channel in its live XML", "[relay]") {
  const std::string xml = R"(<domain type='qemu'><name>vm</name><devices>
    <channel type='pty'><target type='virtio' name='org.accelpool.guest.0'/></channel>
    <channel type='unix'><source mode='bind' path='/run/other.sock'/><target type='virtio' name='org.other'/></channel>
    <channel type='unix'><source mode='bind' path='/run/guest.sock'/>
      <target type='virtio' name='org.accelpool.guest.0' state='connected'/><alias name='channel1'/></channel>
  </devices></domain>)";
  auto p = hypervisor::channel_socket_path(xml, kPortName);
  REQUIRE(p);
  REQUIRE(p->has_value());
  CHECK(**p == "/run/guest.sock");
  auto none = hypervisor::channel_socket_path(xml, "org.absent");
  REQUIRE(none);
  CHECK_FALSE(none->has_value());
  auto bad = hypervisor::channel_socket_path("<domain><devices>", kPortName);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == Errc::invalid_argument);
  CHECK_FALSE(hypervisor::ChannelFinder::create("", kPortName));
  CHECK_FALSE(hypervisor::ChannelFinder::create("qemu:///system", ""));
}

TEST_CASE("two real VMs share one pool FPGA through guestd, the agent's relay and hot-plug", "[vm][e2e]") {
  const auto t0 = Clock::now();
  hypervisor::testing::LibvirtDaemon* daemon = nullptr;
  const fs::path dir = image_dir();
  if (auto why = unavailable(dir, daemon)) {
    ACCELPOOL_SKIP(*why);
  }
  ManagerOptions mo;
  mo.fpgas = 1;
  mo.local_kind = "asic";  // the manager's own host serves no fpga: the agent's host has the only one
  mo.agent_token = kAgentToken;
  ManagerProcess m(mo);
  REQUIRE(m.start());
  const fs::path tmp = m.dir();
  // What went on, printed when a REQUIRE fails (the folder goes away with the manager fixture).
  struct Logs {
    fs::path dir;
    ~Logs() {
      if (std::uncaught_exceptions() == 0 && std::getenv("ACCELPOOL_E2E_VERBOSE") == nullptr) return;
      for (const auto& f : {"manager.log", "agent.log", "agent2.log"})
        std::fprintf(stderr, "---- %s\n%s\n", f, read_file(dir / f).c_str());
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".console")
          std::fprintf(stderr, "---- %s\n%s\n", e.path().filename().c_str(), read_file(e.path()).c_str());
    }
  } logs{tmp};
  const std::string guest_port = m.tcp_uri().substr(6);  // 127.0.0.1:PORT

  const fs::path agent_cfg = tmp / "agent.toml";
  std::ofstream(agent_cfg) << "[agent]\nmanager = \"" << m.agents() << "\"\ntoken = \"" << kAgentToken
                           << "\"\nhost = \"" << kHost << "\"\nheartbeat_interval_ms = 500\nreconnect_max_ms = 1000\n"
                           << "[backends.sim]\ndevices = \"fpga:sim-u250:1\"\nprogram_base_ms = 5\n"
                           << "[libvirt]\nuri = \"" << daemon->uri() << "\"\ndetach_timeout_ms = 20000\n"
                           << "[relay]\nmanager = \"" << guest_port << "\"\nscan_interval_ms = 250\n";
  auto agent = std::make_unique<AgentProcess>(agent_cfg, tmp / "agent.log");
  const std::string device = std::string(kHost) + "/sim:0";
  REQUIRE(eventually(
      [&] {
        std::string body;
        return m.admin_request("GET", "/v1/devices/" + device, "", body) == 200;
      },
      20s));

  // Two guests, booted together, each holding the device kHoldS once granted: whichever asks second (the machine
  // decides which boots faster) waits in the queue while the other holds it.
  const std::string suffix = std::to_string(::getpid());
  const std::string g1 = "e2e-1-" + suffix, g2 = "e2e-2-" + suffix;
  const bool pvh = fs::exists(dir / "vmlinux");
  auto boot = [&](const std::string& name, double hold, double delay) {
    hypervisor::testing::VmOptions vm;
    vm.name = name;
    // The initramfs unpacks into RAM: with the statically linked OpenSSL (TLS to the pool) its programs no longer
    // fit beside the kernel in 128 MiB ("Initramfs unpacking failed: write error").
    vm.memory_mib = 256;
    vm.kernel = pvh ? dir / "vmlinux" : dir / "vmlinuz";
    vm.initrd = dir / "initramfs.cpio.gz";
    std::ostringstream cmd;
    cmd << "console=ttyS0 quiet panic=-1 accelpool.guest=" << name << " accelpool.token=" << m.guest_token()
        << " accelpool.hold=" << hold << " accelpool.delay=" << delay << " accelpool.probe=asic";
    vm.cmdline = cmd.str();
    vm.console_log = tmp / (name + ".console");
    vm.channels.push_back({kPortName, tmp / (name + ".port")});
    auto uuid = daemon->create_vm(vm);
    INFO(daemon->log_tail());
    REQUIRE(uuid);
    return vm.console_log;
  };
  const fs::path c1 = boot(g1, kHoldS, 0);
  const fs::path c2 = boot(g2, kHoldS, 0);
  struct Cleanup {
    hypervisor::testing::LibvirtDaemon* d;
    std::vector<std::string> vms;
    ~Cleanup() {
      for (const auto& v : vms) (void)d->destroy_vm(v);
    }
  } cleanup{daemon, {g1, g2}};

  // The PCI address the grant gave the guest (accelpool-run's ACCELPOOL_DEVICE_0_PCI, from the lease's
  // device_info) is the one at which the device appears in the guest's /sys/bus/pci/devices.
  auto check_granted_pci = [](const std::string& line) {
    std::smatch m;
    REQUIRE(std::regex_search(line, m, std::regex(R"(sees pci (\S+) .* granted pci \[(\S*)\] attach (\S*))")));
    CHECK(m[2].str() == m[1].str());
    CHECK(m[3].str() == "emulated");
  };

  // Each guest in turn: granted, the device hot-plugged and seen by its kernel and by its command at the PCI
  // address of its grant, its job done with status 0 after at least its hold (JCT as the guest measured it,
  // accelpool-run start to end), and the device removed again (the guest acknowledged the eject).
  const std::regex jct_re("jct ([0-9.]+) s");
  std::map<std::string, double> jct;
  for (const auto& [console, name] : {std::pair{c1, g1}, std::pair{c2, g2}}) {
    auto sees = console_line(console, "job lease", std::chrono::seconds(90 + 2 * static_cast<int>(kHoldS)));
    REQUIRE(sees);
    INFO(name << ": " << *sees);
    CHECK(sees->find("devices " + device + " sees pci") != std::string::npos);
    check_granted_pci(*sees);
    CHECK(console_line(console, "pci added", 1s));
    auto done = console_line(console, "job: " + name + " done", std::chrono::seconds(static_cast<int>(kHoldS) + 30));
    REQUIRE(done);
    CHECK(done->find("status 0") != std::string::npos);
    std::smatch sm;
    REQUIRE(std::regex_search(*done, sm, jct_re));
    jct[name] = std::stod(sm[1]);
    CHECK(jct[name] >= kHoldS);
    CHECK(console_line(console, "pci removed", 20s));
  }

  // The device's history in the admin API: exactly these two leases, one after the other.
  json leases;
  REQUIRE(eventually(
      [&] {
        leases = admin_get(m, "/v1/leases?all=true&device=" + device)["leases"];
        std::size_t ended = 0;
        for (const auto& l : leases)
          if (l["state"] == "released") ++ended;
        return ended >= 2;
      },
      10s));
  std::vector<json> history;
  for (const auto& l : leases) {
    const auto& devs = l["devices"];
    CHECK(std::find(devs.begin(), devs.end(), device) != devs.end());  // the server's device filter
    history.push_back(l);
  }
  std::sort(history.begin(), history.end(),
            [](const json& a, const json& b) { return a["granted_at"].get<double>() < b["granted_at"].get<double>(); });
  INFO("history of " << device << ": " << json(history).dump());
  REQUIRE(history.size() == 2);
  const json& l1 = history[0];  // the first granted, whichever guest that was
  const json& l2 = history[1];
  CHECK(std::set<std::string>{l1["guest"].get<std::string>(), l2["guest"].get<std::string>()} ==
        std::set<std::string>{g1, g2});
  CHECK(l1["guest_host"] == kHost);  // pinned by the relay
  CHECK(l2["guest_host"] == kHost);
  CHECK(l1["state"] == "released");
  CHECK(l2["state"] == "released");
  const double created2 = l2["created_at"], granted2 = l2["granted_at"], ended1 = l1["ended_at"];
  CHECK(created2 < ended1);   // the second guest was waiting while the first held the device
  CHECK(granted2 >= ended1);  // and got it only after the first gave it back
  const double admin_jct1 = l1["ended_at"].get<double>() - l1["created_at"].get<double>();
  const double admin_jct2 = l2["ended_at"].get<double>() - l2["created_at"].get<double>();
  const double wait2 = granted2 - created2;
  CHECK(admin_jct1 >= kHoldS - 1);  // the hold is timed by the guest's clock, which may run a little fast
  CHECK(admin_jct2 > wait2);
  CHECK(admin_jct2 >= kHoldS - 1);
  CHECK(wait2 > 0.5);
  // The device is free again and back in the agent's hands.
  CHECK(eventually([&] { return admin_get(m, "/v1/devices/" + device)["state"] == "free"; }, 10s));
  // The agent relayed both ports.
  const std::string alog = read_file(tmp / "agent.log");
  CHECK(alog.find("relay: VM '" + g1 + "' connected") != std::string::npos);
  CHECK(alog.find("relay: VM '" + g2 + "' connected") != std::string::npos);

  // The host side of the ports goes away (the agent stops) and comes back (a new agent): guestd in each guest
  // notices, keeps running, and has its stream up again through the new agent's relay.
  const std::string up = "accelpool-guestd: pool stream serial://" + std::string(kPortName) + " is up";
  const std::string away = "accelpool-guestd: pool stream serial://" + std::string(kPortName) + " went away";
  CHECK(console_count(c1, up) == 1);
  REQUIRE(eventually([&] { return console_count(c1, "probe ok") > 0 && console_count(c2, "probe ok") > 0; }, 20s));
  agent.reset();
  CHECK(eventually([&] { return console_count(c1, away) == 1 && console_count(c2, away) == 1; }, 15s));
  // While no agent runs, guestd finds the port's host side unconnected and waits.
  CHECK(eventually(
      [&] { return console_count(c1, "host side of serial://" + std::string(kPortName) + " is not connected") == 1; },
      10s));
  agent = std::make_unique<AgentProcess>(agent_cfg, tmp / "agent2.log");
  CHECK(eventually([&] { return console_count(c1, up) == 2 && console_count(c2, up) == 2; }, 30s));
  // Programs reach the pool again through the same guestd (each guest acquires the manager's asic every second).
  const std::size_t ok1 = console_count(c1, "probe ok"), ok2 = console_count(c2, "probe ok");
  CHECK(eventually([&] { return console_count(c1, "probe ok") > ok1 && console_count(c2, "probe ok") > ok2; }, 20s));

  const double whole = std::chrono::duration<double>(Clock::now() - t0).count();
  WARN("timings: first " << l1["guest"].get<std::string>() << ", JCT " << jct[l1["guest"].get<std::string>()]
                         << " s (admin " << admin_jct1 << " s), then " << l2["guest"].get<std::string>() << ", JCT "
                         << jct[l2["guest"].get<std::string>()] << " s (admin " << admin_jct2 << " s, waited " << wait2
                         << " s); whole test " << whole << " s");
}
