// accelpool-manager-bench: how fast the real daemon grants, on loopback. Not a test: it prints numbers.
//
// C concurrent guest connections each loop acquire -> lease ready -> release for D seconds on a static host with
// enough devices that nobody queues. One load-generator thread drives every connection through epoll, as a
// proxy or an agent relay with many guests behind it would, so the generator takes little of the machine's CPU
// away from the daemon. Reports acquire->grant latency (acquire sent -> lease ready, without reprogramming),
// acquire+release cycles per second, and the CPU time the daemon and the generator spent per cycle. The
// scheduler's own decision time is measured by accelpool-decision-bench (scheduler/bench).
//
// By default every connection starts its next cycle as soon as the last one ends (closed loop: the highest
// throughput, and latencies that include queueing behind the other connections). With --rate R the connections
// together start R cycles per second on a fixed schedule (open loop), and a latency counts from the moment its
// cycle was due, so a stalled daemon cannot hide behind clients that wait for it.
//
// --network-thread 1 runs the daemon with [guest] network_thread = true.
//
// usage: accelpool-manager-bench [--manager PATH] [--clients C] [--seconds D] [--rate R] [--unix 1]
//                                [--network-thread 1]
#include <boost/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

// --- the daemon ------------------------------------------------------------------------------------------------

int connect_tcp(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return -1;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One guest connection of the load generator: a small state machine driven by the lines the daemon sends.
struct Client {
  enum class Phase { hello, acquiring, releasing, idle };
  int fd = -1;
  int index = 0;
  Phase phase = Phase::hello;
  std::string in;
  std::uint64_t next_id = 1;
  std::uint64_t acquire_id = 0;
  std::uint64_t lease = 0;  // of the acquire in flight, once its reply came
  Clock::time_point sent{};        // when the cycle in flight was started (or due, with --rate)
  Clock::time_point next_start{};  // with --rate: when the next cycle is due

  bool send(const std::string& line) {
    std::string l = line + "\n";
    return ::send(fd, l.data(), l.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(l.size());
  }
  bool acquire(Clock::time_point started) {
    acquire_id = next_id++;
    lease = 0;
    phase = Phase::acquiring;
    sent = started;
    return send(R"({"jsonrpc":"2.0","id":)" + std::to_string(acquire_id) + R"(,"method":"acquire","params":{"kind":"fpga"}})");
  }
  bool release() {
    phase = Phase::releasing;
    return send(R"({"jsonrpc":"2.0","id":)" + std::to_string(next_id++) + R"(,"method":"release","params":{"lease":)" +
                std::to_string(lease) + "}}");
  }
};

void bench_daemon(const std::string& manager, int clients, double seconds, double rate, int devices, bool use_unix,
                  bool network_thread) {
  auto dir = std::filesystem::temp_directory_path() / ("apm-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "manager.toml") << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"" << (use_unix ? (dir / "guest.sock").string() : "") << "\"\nnetwork_thread = "
                                      << (network_thread ? "true" : "false") << "\n[admin]\nlisten = \"127.0.0.1:0\"\n"
                                      << "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\n"
                                      << "count = " << devices << "\n";
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string out = (dir / "output.log").string();
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    (void)f;
    std::string cfg = (dir / "manager.toml").string(), dd = dir.string();
    ::execl(manager.c_str(), manager.c_str(), "--config", cfg.c_str(), "--data-dir", dd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int port = 0;
  std::string token, unix_path = (dir / "guest.sock").string();
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream in(dir / "endpoints.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.empty()) continue;
    auto v = json::parse(text).as_object();
    std::string tcp(v.at("guest_tcp").as_string());
    port = std::stoi(tcp.substr(tcp.rfind(':') + 1));
  }
  {
    std::ifstream in(dir / "output.log");
    std::string l;
    while (std::getline(in, l)) {
      if (l.rfind("guest token for tenant default", 0) == 0) token = l.substr(l.rfind(' ') + 1);
    }
  }
  if (port == 0 || token.empty()) {
    std::fprintf(stderr, "the manager did not start (see %s)\n", (dir / "output.log").c_str());
    ::kill(pid, SIGKILL);
    return;
  }
  std::vector<Client> conns(static_cast<std::size_t>(clients));
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  for (int c = 0; c < clients; ++c) {
    Client& k = conns[static_cast<std::size_t>(c)];
    k.index = c;
    k.fd = use_unix ? connect_unix(unix_path) : connect_tcp(port);
    if (k.fd < 0) {
      std::fprintf(stderr, "cannot connect to the manager\n");
      ::kill(pid, SIGKILL);
      return;
    }
    k.send(R"({"jsonrpc":"2.0","id":0,"method":"hello","params":{"protocol":1,"token":")" + token +
           R"(","guest":"bench)" + std::to_string(c) + "\"}}");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(c);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, k.fd, &ev);
  }
  std::vector<double> grant_us;
  grant_us.reserve(1 << 20);
  long cycles = 0;
  bool failed = false;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  bool stopping = false;
  int busy = clients;  // connections with a call in flight
  // With --rate, each connection starts a cycle every `interval`, the connections evenly staggered.
  const auto interval = rate > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(clients / rate))
                                 : Clock::duration::zero();
  // A connection whose call just ended starts its next cycle, or waits for it to be due.
  auto next_cycle = [&](Client& k) {
    if (rate <= 0 && !stopping) return k.acquire(Clock::now());
    --busy;
    k.phase = Client::Phase::idle;
    return true;
  };
  // Handles one line from the daemon; false on anything unexpected.
  auto on_line = [&](Client& k, const std::string& line) {
    json::error_code ec;
    auto v = json::parse(line, ec);
    if (ec || !v.is_object()) return false;
    const auto& o = v.get_object();
    if (o.contains("error")) {
      std::fprintf(stderr, "client %d: %s\n", k.index, line.c_str());
      return false;
    }
    const json::object* l = nullptr;
    if (const auto* r = o.if_contains("result")) {
      if (k.phase == Client::Phase::hello) {
        k.next_start = t0 + interval * k.index / clients;
        return next_cycle(k);
      }
      if (k.phase == Client::Phase::releasing) {
        ++cycles;
        k.next_start += interval;
        return next_cycle(k);
      }
      l = &r->at("lease").as_object();
    } else if (const auto* p = o.if_contains("params")) {
      if (o.at("method").as_string() != "lease.granted") return true;  // lease.ended of the last cycle
      l = &p->at("lease").as_object();
    } else {
      return false;
    }
    if (k.phase != Client::Phase::acquiring) return true;
    const auto id = l->at("id").to_number<std::uint64_t>();
    if (k.lease == 0) k.lease = id;
    if (id != k.lease || !l->at("ready").as_bool()) return true;  // granted, devices being prepared
    grant_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - k.sent).count());
    return k.release();
  };
  std::vector<epoll_event> events(static_cast<std::size_t>(clients));
  char buf[65536];
  while ((busy > 0 || (rate > 0 && !stopping)) && !failed) {
    auto now = Clock::now();
    if (!stopping && now >= until) stopping = true;  // connections finish their cycle, then stop
    auto timeout = std::chrono::nanoseconds(std::chrono::milliseconds(100));
    if (rate > 0 && !stopping) {
      for (auto& k : conns) {
        if (k.phase != Client::Phase::idle) continue;
        if (k.next_start <= now) {
          ++busy;
          if (!k.acquire(k.next_start)) failed = true;  // its latency counts from when it was due
        } else {
          timeout = std::min(timeout, std::chrono::duration_cast<std::chrono::nanoseconds>(k.next_start - now));
        }
      }
    }
    const timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
    int n = ::epoll_pwait2(ep, events.data(), clients, &ts, nullptr);
    for (int i = 0; i < n && !failed; ++i) {
      Client& k = conns[events[static_cast<std::size_t>(i)].data.u32];
      ssize_t got = ::recv(k.fd, buf, sizeof buf, 0);
      if (got <= 0) {
        std::fprintf(stderr, "client %d: the manager closed the connection\n", k.index);
        failed = true;
        break;
      }
      k.in.append(buf, static_cast<std::size_t>(got));
      std::size_t start = 0;
      for (auto nl = k.in.find('\n'); nl != std::string::npos; nl = k.in.find('\n', start)) {
        if (!on_line(k, k.in.substr(start, nl - start))) failed = true;
        start = nl + 1;
      }
      k.in.erase(0, start);
    }
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& k : conns) ::close(k.fd);
  ::close(ep);
  ::kill(pid, SIGTERM);
  rusage daemon_use{}, self_use{};
  int status = 0;
  ::wait4(pid, &status, 0, &daemon_use);
  ::getrusage(RUSAGE_SELF, &self_use);
  auto cpu_s = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  };
  if (failed) std::printf("the run failed; numbers up to the failure:\n");
  std::printf("daemon    %s%s clients=%d devices=%d%s  %.0f acquire+release cycles/s  grant latency p50=%.0f us p99=%.0f us  (%zu grants)\n",
              use_unix ? "unix" : "tcp", network_thread ? " network-thread" : "", clients, devices, rate > 0 ? (" rate=" + std::to_string(static_cast<long>(rate))).c_str() : "", static_cast<double>(cycles) / elapsed, pct(grant_us, 0.5), pct(grant_us, 0.99),
              grant_us.size());
  std::printf("          grant latency p90=%.0f us p99.9=%.0f us max=%.0f us\n", pct(grant_us, 0.9), pct(grant_us, 0.999),
              grant_us.empty() ? 0.0 : *std::max_element(grant_us.begin(), grant_us.end()));
  double n = std::max(1.0, static_cast<double>(cycles));
  std::printf("          cpu per cycle: daemon %.0f us, load generator %.0f us\n", 1e6 * cpu_s(daemon_use) / n,
              1e6 * cpu_s(self_use) / n);
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::string manager = (std::filesystem::canonical("/proc/self/exe").parent_path() / "accelpool-manager").string();
  int clients = 16, devices_live = 256;
  double seconds = 5;
  bool use_unix = false;
  double rate = 0;
  bool network_thread = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--manager") manager = v;
    else if (a == "--clients") clients = std::stoi(v);
    else if (a == "--seconds") seconds = std::stod(v);
    else if (a == "--unix") use_unix = v == "1";
    else if (a == "--rate") rate = std::stod(v);
    else if (a == "--network-thread") network_thread = v == "1";
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  bench_daemon(manager, clients, seconds, rate, devices_live, use_unix, network_thread);
  return 0;
}
