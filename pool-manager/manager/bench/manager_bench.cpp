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
// Soak: --agent-devices N serves the guests from a real accelpool-agent with N simulated FPGAs instead of an
// in-process host (with fewer devices than clients, requests queue), and --sample S prints, every S seconds, what
// must not grow without bound (from the moment every guest has said hello): the manager's and the agent's resident memory, open descriptors and threads, the
// leases by state (from /metrics), and the store's files. The last line compares the end with the first sample.
// --hold-ms H makes each guest hold its ready lease H ms before releasing it.
//
// usage: accelpool-manager-bench [--manager PATH] [--clients C] [--seconds D] [--rate R] [--unix 1]
//                                [--network-thread 1] [--agent-devices N [--agent PATH]] [--sample S] [--hold-ms H]
#include <boost/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
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
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
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

// --- soak samples ------------------------------------------------------------------------------------------------

// What the kernel says of a process: resident memory, open descriptors, threads.
struct ProcSample {
  long rss_kb = 0;
  long fds = 0;
  long threads = 0;
};

ProcSample proc_sample(pid_t pid) {
  ProcSample out;
  const auto dir = std::filesystem::path("/proc") / std::to_string(pid);
  std::ifstream status(dir / "status");
  std::string line;
  while (std::getline(status, line)) {
    auto field = [&](const char* name, long& v) {
      if (line.rfind(name, 0) == 0) v = std::strtol(line.c_str() + std::strlen(name), nullptr, 10);
    };
    field("VmRSS:", out.rss_kb);
    field("Threads:", out.threads);
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir / "fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    ++out.fds;
  }
  return out;
}

// GET `target` from the admin listener at 127.0.0.1:`port`; the body, or "" on any failure.
std::string http_get(int port, const std::string& target) {
  int fd = connect_tcp(port);
  if (fd < 0) return "";
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::string resp;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[16384];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  auto body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// The accelpool_leases{state="..."} gauges of /metrics.
std::map<std::string, long> lease_gauges(int admin_port) {
  std::map<std::string, long> out;
  std::istringstream in(http_get(admin_port, "/metrics"));
  const std::string prefix = "accelpool_leases{state=\"";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    auto q = line.find('"', prefix.size());
    auto sp = line.rfind(' ');
    if (q == std::string::npos || sp == std::string::npos) continue;
    out[line.substr(prefix.size(), q - prefix.size())] = std::lround(std::strtod(line.c_str() + sp + 1, nullptr));
  }
  return out;
}

struct SoakSample {
  double t = 0;
  long cycles = 0;
  ProcSample manager, agent;
  std::map<std::string, long> leases;
  std::uintmax_t db_bytes = 0, wal_bytes = 0;
};

SoakSample soak_sample(double t, long cycles, pid_t manager, pid_t agent, int admin_port, const std::filesystem::path& dir) {
  SoakSample s;
  s.t = t;
  s.cycles = cycles;
  s.manager = proc_sample(manager);
  if (agent > 0) s.agent = proc_sample(agent);
  s.leases = lease_gauges(admin_port);
  std::error_code ec;
  s.db_bytes = std::filesystem::file_size(dir / "pool.db", ec);
  if (ec) s.db_bytes = 0;
  s.wal_bytes = std::filesystem::file_size(dir / "pool.db-wal", ec);
  if (ec) s.wal_bytes = 0;
  return s;
}

void print_sample(const SoakSample& s) {
  std::string leases;
  for (const auto& [state, n] : s.leases) leases += " " + state + "=" + std::to_string(n);
  std::printf("soak t=%5.0fs cycles=%-9ld manager rss=%6.1f MiB fds=%-5ld threads=%-3ld agent rss=%5.1f MiB fds=%-4ld "
              "threads=%-3ld store=%.1f+%.1f MiB leases:%s\n",
              s.t, s.cycles, static_cast<double>(s.manager.rss_kb) / 1024, s.manager.fds, s.manager.threads,
              static_cast<double>(s.agent.rss_kb) / 1024, s.agent.fds, s.agent.threads,
              static_cast<double>(s.db_bytes) / (1 << 20), static_cast<double>(s.wal_bytes) / (1 << 20), leases.c_str());
  std::fflush(stdout);
}

// One guest connection of the load generator: a small state machine driven by the lines the daemon sends.
struct Client {
  enum class Phase { hello, acquiring, holding, releasing, idle };
  int fd = -1;
  int index = 0;
  Phase phase = Phase::hello;
  std::string in;
  std::uint64_t next_id = 1;
  std::uint64_t acquire_id = 0;
  std::uint64_t lease = 0;  // of the acquire in flight, once its reply came
  Clock::time_point sent{};        // when the cycle in flight was started (or due, with --rate)
  Clock::time_point next_start{};  // with --rate: when the next cycle is due
  Clock::time_point release_at{};  // with --hold-ms: when the lease held now is released

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

struct BenchOptions {
  std::string manager, agent;
  int clients = 16, devices = 256;
  double seconds = 5, rate = 0;
  bool use_unix = false, network_thread = false;
  int agent_devices = 0;  // > 0: the devices come from an accelpool-agent, not an in-process host
  double sample_s = 0;    // > 0: soak samples this often
  int hold_ms = 0;        // how long a guest holds a ready lease before it releases
};

constexpr const char* kSoakAgentToken = "soak-agent-token-0123456789";

// Starts `argv[0]` with its standard output (and error, with `both`) in `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log, bool both) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    if (both) ::dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

void bench_daemon(const BenchOptions& o) {
  const int clients = o.clients, devices = o.devices;
  const double seconds = o.seconds, rate = o.rate;
  const bool use_unix = o.use_unix, network_thread = o.network_thread;
  const int hold_ms = o.hold_ms;
  auto dir = std::filesystem::temp_directory_path() / ("apm-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "manager.toml") << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"" << (use_unix ? (dir / "guest.sock").string() : "") << "\"\nnetwork_thread = "
                                      << (network_thread ? "true" : "false") << "\n[admin]\nlisten = \"127.0.0.1:0\"\n"
                                      << (o.agent_devices > 0
                                              ? std::string("[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"") + kSoakAgentToken + "\"\n" +
                                                    // the in-process host holds no fpga: the agent serves them all
                                                    "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"spare\"\ncount = 1\n"
                                              : "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\n"
                                                "count = " + std::to_string(devices) + "\n");
  std::fflush(stdout);
  const pid_t pid = spawn({o.manager, "--config", (dir / "manager.toml").string(), "--data-dir", dir.string()},
                          dir / "output.log", false);
  int port = 0, admin_port = 0;
  std::string agents_endpoint;
  std::string token, unix_path = (dir / "guest.sock").string();
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream in(dir / "endpoints.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.empty()) continue;
    auto v = json::parse(text).as_object();
    std::string tcp(v.at("guest_tcp").as_string()), admin(v.at("admin").as_string());
    port = std::stoi(tcp.substr(tcp.rfind(':') + 1));
    admin_port = std::stoi(admin.substr(admin.rfind(':') + 1));
    agents_endpoint = std::string(v.at("agents").as_string());
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
  pid_t agent = 0;
  if (o.agent_devices > 0) {
    std::ofstream(dir / "agent.toml") << "[agent]\nmanager = \"" << agents_endpoint << "\"\ntoken = \"" << kSoakAgentToken
                                      << "\"\nhost = \"soak\"\n[backends.sim]\ndevices = \"fpga:sim-u250:" << o.agent_devices
                                      << "\"\nprogram_base_ms = 5\nattach = \"network\"\n";
    agent = spawn({o.agent, "--config", (dir / "agent.toml").string()}, dir / "agent.log", true);
    // Ready when the manager lists the agent's devices (and the one spare) as free.
    bool joined = false;
    for (int i = 0; i < 3000 && !joined; ++i) {
      joined = http_get(admin_port, "/metrics").find("accelpool_devices{state=\"free\"} " + std::to_string(o.agent_devices + 1)) !=
               std::string::npos;
      if (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!joined) {
      std::fprintf(stderr, "the agent's devices did not join (see %s)\n", (dir / "agent.log").c_str());
      ::kill(agent, SIGKILL);
      ::kill(pid, SIGKILL);
      return;
    }
  }
  std::vector<SoakSample> samples;
  auto sample = [&](double t, long cycles) {
    samples.push_back(soak_sample(t, cycles, pid, agent, admin_port, dir));
    print_sample(samples.back());
  };
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
  double next_sample = 0;
  int greeted = 0;  // connections whose hello was answered: soak samples start once all are
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
        ++greeted;
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
    if (hold_ms <= 0) return k.release();
    k.phase = Client::Phase::holding;
    k.release_at = Clock::now() + std::chrono::milliseconds(hold_ms);
    return true;
  };
  std::vector<epoll_event> events(static_cast<std::size_t>(clients));
  char buf[65536];
  while ((busy > 0 || (rate > 0 && !stopping)) && !failed) {
    auto now = Clock::now();
    if (!stopping && now >= until) stopping = true;  // connections finish their cycle, then stop
    if (o.sample_s > 0 && greeted == clients && std::chrono::duration<double>(now - t0).count() >= next_sample) {
      sample(std::chrono::duration<double>(now - t0).count(), cycles);
      next_sample = samples.back().t + o.sample_s;
    }
    auto timeout = std::chrono::nanoseconds(std::chrono::milliseconds(100));
    if (hold_ms > 0) {
      for (auto& k : conns) {
        if (k.phase != Client::Phase::holding) continue;
        if (k.release_at <= now) {
          if (!k.release()) failed = true;
        } else {
          timeout = std::min(timeout, std::chrono::duration_cast<std::chrono::nanoseconds>(k.release_at - now));
        }
      }
    }
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
  if (o.sample_s > 0) {
    sample(elapsed, cycles);
    const SoakSample &a = samples.front(), &b = samples.back();
    std::printf("soak growth over %.0f s: manager rss %+.1f MiB, fds %+ld, threads %+ld; agent rss %+.1f MiB, fds %+ld, "
                "threads %+ld; store %+.1f MiB\n",
                b.t - a.t, static_cast<double>(b.manager.rss_kb - a.manager.rss_kb) / 1024, b.manager.fds - a.manager.fds,
                b.manager.threads - a.manager.threads, static_cast<double>(b.agent.rss_kb - a.agent.rss_kb) / 1024,
                b.agent.fds - a.agent.fds, b.agent.threads - a.agent.threads,
                (static_cast<double>(b.db_bytes + b.wal_bytes) - static_cast<double>(a.db_bytes + a.wal_bytes)) / (1 << 20));
  }
  for (auto& k : conns) ::close(k.fd);
  ::close(ep);
  if (agent > 0) {
    ::kill(agent, SIGTERM);
    ::waitpid(agent, nullptr, 0);
  }
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
              use_unix ? "unix" : "tcp", network_thread ? " network-thread" : "", clients, o.agent_devices > 0 ? o.agent_devices : devices, rate > 0 ? (" rate=" + std::to_string(static_cast<long>(rate))).c_str() : "", static_cast<double>(cycles) / elapsed, pct(grant_us, 0.5), pct(grant_us, 0.99),
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
  const auto bin = std::filesystem::canonical("/proc/self/exe").parent_path();
  BenchOptions o;
  o.manager = (bin / "accelpool-manager").string();
  o.agent = (bin / "accelpool-agent").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--manager") o.manager = v;
    else if (a == "--agent") o.agent = v;
    else if (a == "--clients") o.clients = std::stoi(v);
    else if (a == "--seconds") o.seconds = std::stod(v);
    else if (a == "--unix") o.use_unix = v == "1";
    else if (a == "--rate") o.rate = std::stod(v);
    else if (a == "--network-thread") o.network_thread = v == "1";
    else if (a == "--agent-devices") o.agent_devices = std::stoi(v);
    else if (a == "--sample") o.sample_s = std::stod(v);
    else if (a == "--hold-ms") o.hold_ms = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  // A thousand guest connections need a thousand descriptors here and in the manager.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  bench_daemon(o);
  return 0;
}
