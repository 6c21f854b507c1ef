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
// must not grow without bound (from the moment every guest has said hello): the manager's and the agent's resident
// memory, open descriptors and threads, the leases by state (from /metrics), and the store's files. The last line
// compares the end with the first sample.
// --hold-ms H makes each guest hold its ready lease H ms before releasing it.
//
// Scale: --agents N serves the guests from N emulated host agents of --devices-per-agent M devices each
// (bench/agent_swarm.hpp: one thread of this process, speaking the agent protocol). It reports the join storm
// (all N connect at once: until every registration is accepted and the manager lists every device free), then
// runs the guest load, and with --storms 1 the drop storm (every agent closes at once: until every device is
// unavailable), the return storm, and a manager crash (SIGKILL) and restart with every agent reconnecting. During
// each storm a separate guest asks `list` again and again; the slowest of those calls is reported, as well as
// the manager's CPU time and resident memory. --full-heartbeats 1 makes the agents list every device in every
// heartbeat (as agents did before heartbeat deltas; what a manager of that time accepts).
// --rounds R runs R rounds of the in-process 256-device reference and then the agents (with their storms when
// asked for), and prints each round's cycles/s at the agents as a share of that round's reference, then the median
// share: the machine's speed drifts, so the two are compared round by round.
//
// usage: accelpool-manager-bench [--manager PATH] [--clients C] [--seconds D] [--rate R] [--unix 1]
//                                [--network-thread 1] [--agent-devices N [--agent PATH]] [--sample S] [--hold-ms H]
//                                [--agents N [--devices-per-agent M] [--storms 1] [--full-heartbeats 1] [--rounds R]]
//                                [--watchers N] [--waiting N]
//                                [--store-url postgresql://...]
//
// --waiting N keeps N requests waiting in the queue during the run (a device of kind "held" is held and N requests
// for it wait, from guests of at most 1,000 requests each, the manager's per-guest bound), and reports the time of
// GET /v1/queue for the first page and for the last, as the dashboard's queue view and an operator's tool read it.
//
// --store-url runs the manager on the PostgreSQL store (an empty database; docs/ha.md) instead of SQLite.
// --takeovers N (with --store-url) runs two managers on that store instead of the guest load, and N times kills
// the leader (SIGKILL) and measures the takeover: from the kill to the first lease the standby, now leading,
// grants to a guest that keeps trying it. The killed one comes back as the standby each time.
#include "agent_swarm.hpp"

#include <accelpool/common/connect.hpp>

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
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace json = boost::json;
namespace bench = accelpool::bench;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

// --- the daemon ------------------------------------------------------------------------------------------------

// A loopback TCP connection without Nagle's delay (small request/reply lines), or -1.
int connect_tcp(int port) {
  int fd = accelpool::common::connect_loopback_tcp(port);
  if (fd < 0) return -1;
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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
  for (auto it = std::filesystem::directory_iterator(dir / "fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++out.fds;
  }
  return out;
}

// GET `target` from the admin listener at 127.0.0.1:`port` (with the admin `token` when given); the body, or ""
// on any failure.
std::string http_get(int port, const std::string& target, const std::string& token = "") {
  int fd = connect_tcp(port);
  if (fd < 0) return "";
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                          (token.empty() ? "" : "Authorization: Bearer " + token + "\r\n") + "\r\n";
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

SoakSample soak_sample(double t, long cycles, pid_t manager, pid_t agent, int admin_port,
                       const std::filesystem::path& dir) {
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
  std::printf(
      "soak t=%5.0fs cycles=%-9ld manager rss=%6.1f MiB fds=%-5ld threads=%-3ld agent rss=%5.1f MiB fds=%-4ld "
      "threads=%-3ld store=%.1f+%.1f MiB leases:%s\n",
      s.t, s.cycles, static_cast<double>(s.manager.rss_kb) / 1024, s.manager.fds, s.manager.threads,
      static_cast<double>(s.agent.rss_kb) / 1024, s.agent.fds, s.agent.threads,
      static_cast<double>(s.db_bytes) / (1 << 20), static_cast<double>(s.wal_bytes) / (1 << 20), leases.c_str());
  std::fflush(stdout);
}

// An accelpool_devices{state=...} gauge of /metrics (-1 when unreadable).
long device_gauge(int admin_port, const std::string& state) {
  const std::string text = http_get(admin_port, "/metrics");
  const std::string key = "accelpool_devices{state=\"" + state + "\"} ";
  auto at = text.find(key);
  return at == std::string::npos ? -1 : std::strtol(text.c_str() + at + key.size(), nullptr, 10);
}

long free_devices(int admin_port) { return device_gauge(admin_port, "free"); }

bool wait_free_devices(int admin_port, long count, double timeout_s) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < until) {
    if (free_devices(admin_port) == count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// CPU seconds (user + system) used so far by what `stat` describes (/proc/PID/stat: a process, its threads
// together; /proc/PID/task/TID/stat: one thread).
double stat_cpu_s(const std::filesystem::path& stat) {
  std::ifstream in(stat);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; rest >> field; ++i) {  // fields 14 and 15: utime, stime in clock ticks
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) {
      stime = std::strtod(field.c_str(), nullptr);
      break;
    }
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double proc_cpu_s(pid_t pid) { return stat_cpu_s(std::filesystem::path("/proc") / std::to_string(pid) / "stat"); }

// The CPU seconds of the manager as a whole and of its two busy threads: the owner thread (the process's first)
// and the agent listener's I/O thread (named "ap-agents"; 0 when it has none).
struct ManagerCpu {
  double total = 0, owner = 0, listener = 0;
  ManagerCpu operator-(const ManagerCpu& o) const { return {total - o.total, owner - o.owner, listener - o.listener}; }
};

ManagerCpu manager_cpu(pid_t pid) {
  const auto tasks = std::filesystem::path("/proc") / std::to_string(pid) / "task";
  ManagerCpu c;
  c.total = proc_cpu_s(pid);
  c.owner = stat_cpu_s(tasks / std::to_string(pid) / "stat");
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(tasks, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::ifstream comm(it->path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == "ap-agents") c.listener = stat_cpu_s(it->path() / "stat");
  }
  return c;
}

// A guest that asks `list` again and again on a thread of its own, so a stalled owner thread shows as a slow
// reply. Each round trip is recorded with the time it started.
class Prober {
 public:
  Prober(int port, std::string token) : port_(port), token_(std::move(token)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Prober() {
    stop_ = true;
    thread_.join();
  }
  // The longest round trip among those that started in [from, to], and the number of them.
  std::pair<double, std::size_t> longest(Clock::time_point from, Clock::time_point to) {
    std::lock_guard lock(mu_);
    double worst = 0;
    std::size_t n = 0;
    for (const auto& [at, s] : trips_) {
      if (at < from || at > to) continue;
      worst = std::max(worst, s);
      ++n;
    }
    // A call still waiting counts for as long as it has waited.
    if (in_flight_since_ && *in_flight_since_ <= to) {
      worst = std::max(worst, std::chrono::duration<double>(Clock::now() - *in_flight_since_).count());
      ++n;
    }
    return {worst, n};
  }

 private:
  void run() {
    int fd = -1;
    std::string in;
    std::uint64_t id = 0;
    while (!stop_) {
      if (fd < 0) {  // (re)connect: the manager may be restarting
        fd = connect_tcp(port_);
        if (fd < 0 ||
            !send_line(fd, R"({"jsonrpc":"2.0","id":0,"method":"hello","params":{"protocol":1,"token":")" + token_ +
                               R"(","guest":"prober"}})") ||
            !read_line(fd, in)) {
          if (fd >= 0) ::close(fd);
          fd = -1;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
      }
      auto start = Clock::now();
      {
        std::lock_guard lock(mu_);
        in_flight_since_ = start;
      }
      bool ok =
          send_line(fd, R"({"jsonrpc":"2.0","id":)" + std::to_string(++id) + R"(,"method":"list","params":{}})") &&
          read_line(fd, in);
      {
        std::lock_guard lock(mu_);
        in_flight_since_.reset();
        if (ok) trips_.emplace_back(start, std::chrono::duration<double>(Clock::now() - start).count());
      }
      if (!ok) {
        ::close(fd);
        fd = -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (fd >= 0) ::close(fd);
  }
  static bool send_line(int fd, const std::string& line) {
    std::string l = line + "\n";
    return ::send(fd, l.data(), l.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(l.size());
  }
  // Reads up to the next reply line (notifications skipped); false when the connection ends or stop is asked.
  bool read_line(int fd, std::string& in) {
    char buf[65536];
    for (;;) {
      auto nl = in.find('\n');
      if (nl != std::string::npos) {
        std::string line = in.substr(0, nl);
        in.erase(0, nl + 1);
        if (line.find("\"method\"") == std::string::npos) return true;
        continue;
      }
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) == 0) {
        if (stop_) return false;
        continue;
      }
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<std::size_t>(n));
    }
  }

  int port_;
  std::string token_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::pair<Clock::time_point, double>> trips_;
  std::optional<Clock::time_point> in_flight_since_;
  std::thread thread_;
};

struct Storm {
  bool settled = false;
  double seconds = 0;          // until `done` held
  double longest_guest_s = 0;  // the slowest guest call that started meanwhile
  std::size_t guest_calls = 0;
};

// Waits (up to 120 s) until `done` holds, asking every `poll`, and reads the prober's view of the wait. `done`
// reads /metrics: the manager keeps its device gauges as states change, so asking every 10 ms costs it little and
// a storm's time is known to 10 ms (a manager that walked every device for them was asked every 100 ms at 100,000
// devices).
template <class Done>
Storm settle(Clock::time_point started, Prober& probe, std::chrono::milliseconds poll, Done done) {
  Storm s;
  const auto until = started + std::chrono::seconds(120);
  while (Clock::now() < until && !(s.settled = done())) std::this_thread::sleep_for(poll);
  auto end = Clock::now();
  s.seconds = std::chrono::duration<double>(end - started).count();
  std::tie(s.longest_guest_s, s.guest_calls) = probe.longest(started, end);
  return s;
}

void report_storm(const char* what, int agents, int devices_per_agent, const Storm& s, const ManagerCpu& cpu,
                  const ProcSample& after) {
  std::printf(
      "storm     %-8s agents=%d devices/agent=%d  %s in %.3f s  longest guest call %.3f s (%zu calls)  "
      "manager cpu %.2f s (owner thread %.2f, agent listener %.2f)  rss %.0f MiB\n",
      what, agents, devices_per_agent, s.settled ? "settled" : "NOT settled", s.seconds, s.longest_guest_s,
      s.guest_calls, cpu.total, cpu.owner, cpu.listener, static_cast<double>(after.rss_kb) / 1024);
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
  std::uint64_t lease = 0;         // of the acquire in flight, once its reply came
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
    return send(R"({"jsonrpc":"2.0","id":)" + std::to_string(acquire_id) +
                R"(,"method":"acquire","params":{"kind":"fpga"}})");
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
  int agents = 0;         // > 0: the devices come from this many emulated agents (AgentSwarm)
  int devices_per_agent = 100;
  bool full_heartbeats = false;  // emulated agents list every device in every heartbeat (as before deltas)
  bool storms = false;           // after the guest load: all agents drop, return, and the manager restarts
  int watchers = 0;              // dashboards watching GET /v1/events during the run
  int waiting = 0;               // requests kept waiting in the queue during the run
  std::string store_url;         // "postgresql://...": the PostgreSQL store (an empty database) instead of SQLite
  int takeovers = 0;             // > 0 (with store_url): kill the leader of two managers this many times
};

// The reply line of the one call in flight on blocking socket `fd` (notifications skipped); "" when it closed.
std::string call_line(int fd, const std::string& request) {
  const std::string line = request + "\n";
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) return "";
  std::string in;
  char buf[4096];
  for (;;) {
    for (auto nl = in.find('\n'); nl != std::string::npos; nl = in.find('\n')) {
      std::string reply = in.substr(0, nl);
      in.erase(0, nl + 1);
      if (reply.find("\"method\"") == std::string::npos) return reply;
    }
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    in.append(buf, static_cast<std::size_t>(n));
  }
}

// Reads `n` reply lines (notifications skipped) from blocking socket `fd`; false when it closed first.
bool read_replies(int fd, std::size_t n) {
  std::string in;
  char buf[65536];
  while (n > 0) {
    for (auto nl = in.find('\n'); n > 0 && nl != std::string::npos; nl = in.find('\n')) {
      if (in.substr(0, nl).find("\"method\"") == std::string::npos) --n;
      in.erase(0, nl + 1);
    }
    if (n == 0) break;
    ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got <= 0) return false;
    in.append(buf, static_cast<std::size_t>(got));
  }
  return true;
}

// `n` requests waiting in the queue for as long as this lives: the one device of kind "held" is acquired, then
// guests ask for it n times in all (1,000 a guest, pipelined), and a thread heartbeats every guest so that none of
// them is reclaimed while the run lasts.
class Waiting {
 public:
  Waiting(int port, const std::string& token, int n) {
    auto hello = [&](int fd, const std::string& guest) {
      return !call_line(fd, R"({"jsonrpc":"2.0","id":0,"method":"hello","params":{"protocol":1,"token":")" + token +
                                R"(","guest":")" + guest + "\"}}")
                  .empty();
    };
    int holder = connect_tcp(port);
    if (holder < 0 || !hello(holder, "held-holder") ||
        call_line(holder, R"({"jsonrpc":"2.0","id":1,"method":"acquire","params":{"kind":"held"}})").empty()) {
      std::fprintf(stderr, "--waiting: could not hold the device of kind held\n");
      return;
    }
    fds_.push_back(holder);
    for (int i = 0; queued_ < n; ++i) {
      int fd = connect_tcp(port);
      if (fd < 0 || !hello(fd, "waiting" + std::to_string(i))) {
        std::fprintf(stderr, "--waiting: a guest could not connect\n");
        break;
      }
      fds_.push_back(fd);
      const int batch = std::min(1000, n - queued_);
      std::string lines;
      for (int k = 0; k < batch; ++k) {
        lines += R"({"jsonrpc":"2.0","id":)" + std::to_string(k + 1) +
                 R"(,"method":"acquire","params":{"kind":"held"}})"
                 "\n";
      }
      if (::send(fd, lines.data(), lines.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(lines.size()) ||
          !read_replies(fd, static_cast<std::size_t>(batch))) {
        std::fprintf(stderr, "--waiting: a guest's acquires were not answered\n");
        break;
      }
      queued_ += batch;
    }
    heartbeat_ = std::thread([this] {
      while (!stop_) {
        for (int fd : fds_) call_line(fd, R"({"jsonrpc":"2.0","id":2,"method":"heartbeat","params":{}})");
        for (int i = 0; i < 50 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  ~Waiting() {
    stop_ = true;
    if (heartbeat_.joinable()) heartbeat_.join();
    for (int fd : fds_) ::close(fd);
  }
  int queued() const { return queued_; }

 private:
  std::vector<int> fds_;
  int queued_ = 0;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

// N connections watching GET /v1/events, read by one thread until destroyed: what ten open dashboards cost.
class Watchers {
 public:
  Watchers(int admin_port, const std::string& token, int n) {
    const std::string req = "GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token + "\r\n\r\n";
    for (int i = 0; i < n; ++i) {
      int fd = connect_tcp(admin_port);
      if (fd < 0 || ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
        std::fprintf(stderr, "a watcher could not open GET /v1/events\n");
        if (fd >= 0) ::close(fd);
        continue;
      }
      fds_.push_back(fd);
    }
    reader_ = std::thread([this] { read_all(); });
  }
  ~Watchers() {
    stop_ = true;
    reader_.join();
    for (int fd : fds_) ::close(fd);
  }
  std::size_t watching() const { return fds_.size(); }
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t events() const { return events_; }

 private:
  void read_all() {
    std::vector<pollfd> polled;
    for (int fd : fds_) polled.push_back({fd, POLLIN, 0});
    std::vector<char> last(fds_.size(), 0);  // each stream's last byte: an event ends with a blank line
    char buf[65536];
    while (!stop_) {
      if (::poll(polled.data(), polled.size(), 50) <= 0) continue;
      for (std::size_t i = 0; i < polled.size(); ++i) {
        if (!(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::recv(polled[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          polled[i].fd = -1;  // closed: poll skips it
          continue;
        }
        bytes_ += static_cast<std::uint64_t>(n);
        for (ssize_t k = 0; k < n; ++k) {
          if (buf[k] == '\n' && last[i] == '\n') ++events_;
          last[i] = buf[k];
        }
      }
    }
  }
  std::vector<int> fds_;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> bytes_{0}, events_{0};
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

// A free TCP port on 127.0.0.1 (bound and released: the manager binds it again at once).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The daemon as the benchmark started it.
struct Daemon {
  pid_t pid = 0;
  int port = 0, admin_port = 0;
  std::string agents_endpoint, token, admin_token;
};

// Starts the manager on `dir` (its config there) and waits for its endpoints and guest token; pid 0 on failure.
Daemon start_daemon(const BenchOptions& o, const std::filesystem::path& dir) {
  Daemon d;
  std::filesystem::remove(dir / "endpoints.json");
  // With emulated agents its log (a line per host joining, leaving, returning) goes to output.log too.
  d.pid = spawn({o.manager, "--config", (dir / "manager.toml").string(), "--data-dir", dir.string()},
                dir / "output.log", o.agents > 0);
  for (int i = 0; i < 3000 && d.port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::ifstream in(dir / "endpoints.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.empty()) continue;
    auto v = json::parse(text).as_object();
    std::string tcp(v.at("guest_tcp").as_string()), admin(v.at("admin").as_string());
    d.port = std::stoi(tcp.substr(tcp.rfind(':') + 1));
    d.admin_port = std::stoi(admin.substr(admin.rfind(':') + 1));
    d.agents_endpoint = std::string(v.at("agents").as_string());
  }
  // The token is printed once, at the first start (kept in first_output.log); a restart keeps it.
  for (const char* log : {"output.log", "first_output.log"}) {
    std::ifstream in(dir / log);
    for (std::string l; std::getline(in, l);) {
      if (d.token.empty() && l.rfind("guest token for tenant default", 0) == 0) d.token = l.substr(l.rfind(' ') + 1);
      if (d.admin_token.empty() && l.rfind("admin token", 0) == 0) d.admin_token = l.substr(l.rfind(' ') + 1);
    }
  }
  if (d.port == 0 || d.token.empty()) {
    std::fprintf(stderr, "the manager did not start (see %s)\n", (dir / "output.log").c_str());
    ::kill(d.pid, SIGKILL);
    d.pid = 0;
  }
  return d;
}

// Returns the acquire+release cycles per second (0 when the run could not start).
double bench_daemon(const BenchOptions& o) {
  rusage self_start{};
  ::getrusage(RUSAGE_SELF, &self_start);
  const int clients = o.clients, devices = o.devices;
  const double seconds = o.seconds, rate = o.rate;
  const bool use_unix = o.use_unix, network_thread = o.network_thread;
  const int hold_ms = o.hold_ms;
  auto dir = std::filesystem::temp_directory_path() / ("apm-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int agent_port = o.agents > 0 ? free_port() : 0;
  std::string agents_config;
  if (o.agent_devices > 0) agents_config = "listen = [\"127.0.0.1:0\"]\n";
  if (o.agents > 0) {
    agents_config = "listen = [\"127.0.0.1:" + std::to_string(agent_port) +
                    "\"]\nmax_connections = " + std::to_string(o.agents + 16) + "\n";
  }
  // With emulated agents the manager restarts: its guest port stays the same.
  const std::string guest_tcp = "127.0.0.1:" + std::to_string(o.agents > 0 ? free_port() : 0);
  std::ofstream(dir / "manager.toml")
      << "[guest]\ntcp = \"" << guest_tcp << "\"\nunix = \"" << (use_unix ? (dir / "guest.sock").string() : "")
      << "\"\nnetwork_thread = " << (network_thread ? "true" : "false") << "\n[admin]\nlisten = \"127.0.0.1:0\"\n"
      << (!agents_config.empty()
              ? "[agents]\n" + agents_config + "token = \"" + kSoakAgentToken + "\"\n" +
                    // the in-process host holds no fpga: the agents serve them all
                    "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"spare\"\ncount = "
                    "1\n[[hosts.devices]]\nkind = \"held\"\ncount = 1\n"
              : "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\n"
                "count = " +
                    std::to_string(devices) + "\n[[hosts.devices]]\nkind = \"held\"\ncount = 1\n")
      << (o.store_url.empty() ? "" : "[store]\nurl = \"" + o.store_url + "\"\n");
  std::fflush(stdout);
  Daemon daemon = start_daemon(o, dir);
  std::filesystem::copy_file(dir / "output.log", dir / "first_output.log",
                             std::filesystem::copy_options::overwrite_existing);
  if (daemon.pid == 0) return 0;
  pid_t pid = daemon.pid;
  const int port = daemon.port;
  int admin_port = daemon.admin_port;
  const std::string token = daemon.token, agents_endpoint = daemon.agents_endpoint;
  const std::string unix_path = (dir / "guest.sock").string();
  pid_t agent = 0;
  if (o.agent_devices > 0) {
    std::ofstream(dir / "agent.toml") << "[agent]\nmanager = \"" << agents_endpoint << "\"\ntoken = \""
                                      << kSoakAgentToken
                                      << "\"\nhost = \"soak\"\n[backends.sim]\ndevices = \"fpga:sim-u250:"
                                      << o.agent_devices << "\"\nprogram_base_ms = 5\nattach = \"network\"\n";
    agent = spawn({o.agent, "--config", (dir / "agent.toml").string()}, dir / "agent.log", true);
    // Ready when the manager lists the agent's devices (and the in-process spare and held ones) as free.
    if (!wait_free_devices(admin_port, o.agent_devices + 2, 30.0)) {
      std::fprintf(stderr, "the agent's devices did not join (see %s)\n", (dir / "agent.log").c_str());
      ::kill(agent, SIGKILL);
      ::kill(pid, SIGKILL);
      return 0;
    }
  }
  std::unique_ptr<bench::AgentSwarm> swarm;
  const long agent_devices_total = static_cast<long>(o.agents) * o.devices_per_agent;
  const auto poll = std::chrono::milliseconds(10);
  if (o.agents > 0) {
    bench::SwarmOptions so;
    so.port = agent_port;
    so.token = kSoakAgentToken;
    so.agents = o.agents;
    so.devices = o.devices_per_agent;
    so.full_heartbeats = o.full_heartbeats;
    swarm = std::make_unique<bench::AgentSwarm>(so);
    Prober probe(port, token);
    auto cpu0 = manager_cpu(pid);
    auto t = Clock::now();
    swarm->connect_all();
    Storm join = settle(t, probe, poll, [&] {
      return swarm->registered() == o.agents && free_devices(admin_port) == agent_devices_total + 2;
    });
    report_storm("join", o.agents, o.devices_per_agent, join, manager_cpu(pid) - cpu0, proc_sample(pid));
    if (!join.settled) {
      ::kill(pid, SIGKILL);
      return 0;
    }
    // The admin device listing, one page of 500 as an operator's tool asks (a manager without paging answers
    // every device).
    std::vector<double> list_ms;
    std::size_t list_bytes = 0;
    for (int i = 0; i < 20; ++i) {
      auto start = Clock::now();
      list_bytes = http_get(admin_port, "/v1/devices?limit=500", daemon.admin_token).size();
      list_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    std::printf("admin     GET /v1/devices?limit=500 at %ld devices: p50 %.1f ms, max %.1f ms, %zu bytes\n",
                agent_devices_total + 2, pct(list_ms, 0.5), *std::max_element(list_ms.begin(), list_ms.end()),
                list_bytes);
  }
  std::unique_ptr<Waiting> waiting;
  if (o.waiting > 0) {
    auto start = Clock::now();
    waiting = std::make_unique<Waiting>(port, token, o.waiting);
    const double fill_s = std::chrono::duration<double>(Clock::now() - start).count();
    // The queue's first page and its last, as the dashboard and accelpoolctl read them.
    auto page_ms = [&](const std::string& target) {
      std::vector<double> ms;
      for (int i = 0; i < 10; ++i) {
        auto t = Clock::now();
        http_get(admin_port, target, daemon.admin_token);
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      }
      return pct(ms, 0.5);
    };
    const int last = std::max(0, waiting->queued() - 1000);
    std::printf("waiting   %d requests queued in %.1f s; GET /v1/queue?limit=1000 p50 %.1f ms, cursor=%d p50 %.1f ms\n",
                waiting->queued(), fill_s, page_ms("/v1/queue?limit=1000"), last,
                page_ms("/v1/queue?limit=1000&cursor=" + std::to_string(last)));
  }
  std::unique_ptr<Watchers> watchers;
  if (o.watchers > 0) watchers = std::make_unique<Watchers>(admin_port, daemon.admin_token, o.watchers);
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
    k.fd = use_unix ? accelpool::common::connect_unix_stream(unix_path) : connect_tcp(port);
    if (k.fd < 0) {
      std::fprintf(stderr, "cannot connect to the manager\n");
      ::kill(pid, SIGKILL);
      return 0;
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
  const double guest_cpu0 = proc_cpu_s(pid);
  long cycles = 0;
  bool failed = false;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  bool stopping = false;
  int busy = clients;  // connections with a call in flight
  double next_sample = 0;
  int greeted = 0;  // connections whose hello was answered: soak samples start once all are
  // With --rate, each connection starts a cycle every `interval`, the connections evenly staggered.
  const auto interval = rate > 0
                            ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(clients / rate))
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
    const timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
                      static_cast<long>(timeout.count() % 1'000'000'000)};
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
    std::printf(
        "soak growth over %.0f s: manager rss %+.1f MiB, fds %+ld, threads %+ld; agent rss %+.1f MiB, fds %+ld, "
        "threads %+ld; store %+.1f MiB\n",
        b.t - a.t, static_cast<double>(b.manager.rss_kb - a.manager.rss_kb) / 1024, b.manager.fds - a.manager.fds,
        b.manager.threads - a.manager.threads, static_cast<double>(b.agent.rss_kb - a.agent.rss_kb) / 1024,
        b.agent.fds - a.agent.fds, b.agent.threads - a.agent.threads,
        (static_cast<double>(b.db_bytes + b.wal_bytes) - static_cast<double>(a.db_bytes + a.wal_bytes)) / (1 << 20));
  }
  const double guest_cpu_s = proc_cpu_s(pid) - guest_cpu0;
  if (watchers) {
    std::printf("watchers  %zu dashboards on GET /v1/events: %llu events, %.1f MiB received\n", watchers->watching(),
                static_cast<unsigned long long>(watchers->events()),
                static_cast<double>(watchers->bytes()) / (1 << 20));
    watchers.reset();
  }
  const ProcSample guest_end = proc_sample(pid);
  for (auto& k : conns) ::close(k.fd);
  ::close(ep);
  if (swarm && o.storms && !failed) {
    Prober probe(port, token);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the prober says hello
    auto cpu0 = manager_cpu(pid);
    auto t = Clock::now();
    swarm->drop_all();
    Storm drop = settle(t, probe, poll, [&] { return device_gauge(admin_port, "unavailable") == agent_devices_total; });
    report_storm("drop", o.agents, o.devices_per_agent, drop, manager_cpu(pid) - cpu0, proc_sample(pid));
    cpu0 = manager_cpu(pid);
    t = Clock::now();
    swarm->connect_all();
    Storm back = settle(t, probe, poll, [&] {
      return swarm->registered() == o.agents && free_devices(admin_port) == agent_devices_total + 2;
    });
    report_storm("return", o.agents, o.devices_per_agent, back, manager_cpu(pid) - cpu0, proc_sample(pid));
    // A crash and restart: the agents reconnect as soon as the manager listens again.
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    t = Clock::now();
    daemon = start_daemon(o, dir);
    pid = daemon.pid;
    if (pid == 0) return 0;
    admin_port = daemon.admin_port;
    const double up_s = std::chrono::duration<double>(Clock::now() - t).count();
    cpu0 = manager_cpu(pid);  // what the start (loading the store, rebuilding the pool) took
    Storm restart = settle(t, probe, poll, [&] {
      return swarm->registered() == o.agents && free_devices(admin_port) == agent_devices_total + 2;
    });
    report_storm("restart", o.agents, o.devices_per_agent, restart, manager_cpu(pid) - cpu0, proc_sample(pid));
    std::printf(
        "          restart: guest and agent ports listening after %.3f s (manager cpu %.2f s, owner thread "
        "%.2f s)\n",
        up_s, cpu0.total, cpu0.owner);
  }
  if (swarm) {
    std::printf(
        "agents    %d x %d devices (%s heartbeats): guest phase manager cpu %.2f s (%.0f%% of one core), rss %.0f MiB, "
        "%llu agent requests answered, %llu registrations refused\n",
        o.agents, o.devices_per_agent, o.full_heartbeats ? "full" : "delta", guest_cpu_s,
        100 * guest_cpu_s / std::max(1e-9, elapsed), static_cast<double>(guest_end.rss_kb) / 1024,
        static_cast<unsigned long long>(swarm->answered()), static_cast<unsigned long long>(swarm->refused()));
    swarm.reset();
  }
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
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  };
  if (failed) std::printf("the run failed; numbers up to the failure:\n");
  std::printf(
      "daemon    %s%s clients=%d devices=%ld%s  %.0f acquire+release cycles/s  grant latency p50=%.0f us p99=%.0f us  "
      "(%zu grants)\n",
      use_unix ? "unix" : "tcp", network_thread ? " network-thread" : "", clients,
      o.agents > 0          ? agent_devices_total
      : o.agent_devices > 0 ? o.agent_devices
                            : devices,
      rate > 0 ? (" rate=" + std::to_string(static_cast<long>(rate))).c_str() : "",
      static_cast<double>(cycles) / elapsed, pct(grant_us, 0.5), pct(grant_us, 0.99), grant_us.size());
  std::printf("          grant latency p90=%.0f us p99.9=%.0f us max=%.0f us\n", pct(grant_us, 0.9),
              pct(grant_us, 0.999), grant_us.empty() ? 0.0 : *std::max_element(grant_us.begin(), grant_us.end()));
  double n = std::max(1.0, static_cast<double>(cycles));
  std::printf("          cpu per cycle: daemon %.0f us, load generator %.0f us\n", 1e6 * cpu_s(daemon_use) / n,
              1e6 * (cpu_s(self_use) - cpu_s(self_start)) / n);
  std::filesystem::remove_all(dir);
  return static_cast<double>(cycles) / elapsed;
}

void bench_takeovers(const BenchOptions& o) {
  auto base = std::filesystem::temp_directory_path() / ("apm-takeover-" + std::to_string(::getpid()));
  std::filesystem::remove_all(base);
  std::filesystem::path dirs[2] = {base / "m0", base / "m1"};
  int guest_ports[2] = {free_port(), free_port()};
  for (int i = 0; i < 2; ++i) {
    std::filesystem::create_directories(dirs[i]);
    std::ofstream(dirs[i] / "manager.toml")
        << "[store]\nurl = \"" << o.store_url << "\"\n[ha]\nname = \"m" << i
        << "\"\nleader_timeout_s = 10\nstandby_poll_s = 0.05\n[guest]\ntcp = \"127.0.0.1:" << guest_ports[i]
        << "\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
        << "[[hosts.devices]]\nkind = \"fpga\"\ncount = 4\n";
  }
  Daemon first = start_daemon(o, dirs[0]);
  if (first.pid == 0) return;
  const std::string token = first.token;
  pid_t pids[2] = {first.pid, 0};
  // Starts manager i as the standby and waits until it says so.
  auto start_standby = [&](int i) {
    pids[i] = spawn({o.manager, "--config", (dirs[i] / "manager.toml").string(), "--data-dir", dirs[i].string()},
                    dirs[i] / "output.log", true);
    for (;;) {
      std::ifstream in(dirs[i] / "output.log");
      std::string text((std::istreambuf_iterator<char>(in)), {});
      if (text.find("taking over when it is gone manager=m") != std::string::npos) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  start_standby(1);
  std::vector<double> takeover_ms;
  int leader = 0;
  for (int k = 0; k < o.takeovers; ++k) {
    const int standby = 1 - leader;
    const auto killed = std::chrono::steady_clock::now();
    ::kill(pids[leader], SIGKILL);
    ::waitpid(pids[leader], nullptr, 0);
    for (bool granted = false; !granted;) {  // a guest that keeps trying the standby's address
      int fd = connect_tcp(guest_ports[standby]);
      if (fd < 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      const std::string hello =
          call_line(fd, R"({"jsonrpc":"2.0","id":1,"method":"hello","params":{"protocol":1,"token":")" + token +
                            R"(","guest":"takeover"}})");
      const std::string reply =
          hello.find("\"result\"") == std::string::npos
              ? ""
              : call_line(fd, R"({"jsonrpc":"2.0","id":2,"method":"acquire","params":{"kind":"fpga"}})");
      if (reply.find("\"granted\"") != std::string::npos) {
        granted = true;
        takeover_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed).count());
        auto id = json::parse(reply).at("result").at("lease").at("id").to_number<long>();
        call_line(fd, R"({"jsonrpc":"2.0","id":3,"method":"release","params":{"lease":)" + std::to_string(id) + "}}");
      }
      ::close(fd);
    }
    start_standby(leader);
    leader = standby;
  }
  ::kill(pids[0], SIGKILL);
  ::kill(pids[1], SIGKILL);
  ::waitpid(pids[0], nullptr, 0);
  ::waitpid(pids[1], nullptr, 0);
  std::printf(
      "takeover  %d kills: leader killed -> first grant by the new leader p50=%.0f ms p99=%.0f ms max=%.0f ms\n",
      o.takeovers, pct(takeover_ms, 0.5), pct(takeover_ms, 0.99),
      *std::max_element(takeover_ms.begin(), takeover_ms.end()));
  std::filesystem::remove_all(base);
}

}  // namespace

int main(int argc, char** argv) {
  const auto bin = std::filesystem::canonical("/proc/self/exe").parent_path();
  BenchOptions o;
  int rounds = 0;
  o.manager = (bin / "accelpool-manager").string();
  o.agent = (bin / "accelpool-agent").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--manager")
      o.manager = v;
    else if (a == "--agent")
      o.agent = v;
    else if (a == "--clients")
      o.clients = std::stoi(v);
    else if (a == "--seconds")
      o.seconds = std::stod(v);
    else if (a == "--unix")
      o.use_unix = v == "1";
    else if (a == "--rate")
      o.rate = std::stod(v);
    else if (a == "--network-thread")
      o.network_thread = v == "1";
    else if (a == "--agent-devices")
      o.agent_devices = std::stoi(v);
    else if (a == "--sample")
      o.sample_s = std::stod(v);
    else if (a == "--hold-ms")
      o.hold_ms = std::stoi(v);
    else if (a == "--agents")
      o.agents = std::stoi(v);
    else if (a == "--devices-per-agent")
      o.devices_per_agent = std::stoi(v);
    else if (a == "--full-heartbeats")
      o.full_heartbeats = v == "1";
    else if (a == "--storms")
      o.storms = v == "1";
    else if (a == "--watchers")
      o.watchers = std::stoi(v);
    else if (a == "--waiting")
      o.waiting = std::stoi(v);
    else if (a == "--store-url")
      o.store_url = v;
    else if (a == "--takeovers")
      o.takeovers = std::stoi(v);
    else if (a == "--rounds")
      rounds = std::stoi(v);
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
  if (o.waiting > 0 && o.storms) {
    // The held device stays leased until its guests' leases expire, so the storms' counts of free devices differ.
    std::fprintf(stderr, "--waiting and --storms do not go together\n");
    return 2;
  }
  if (o.takeovers > 0) {
    if (o.store_url.empty()) {
      std::fprintf(stderr, "--takeovers needs --store-url (managers share a PostgreSQL store)\n");
      return 2;
    }
    bench_takeovers(o);
    return 0;
  }
  if (rounds > 0) {
    if (o.agents == 0) {
      std::fprintf(stderr, "--rounds compares --agents runs with the in-process reference: give --agents\n");
      return 2;
    }
    // Each round: the in-process 256-device reference, then the agents, so that both meet the machine as it is
    // then; the share of each round's reference, and their median.
    BenchOptions reference = o;
    reference.agents = 0;
    reference.storms = false;
    std::vector<double> shares;
    for (int r = 1; r <= rounds; ++r) {
      const double in_process = bench_daemon(reference);
      const double agents = bench_daemon(o);
      shares.push_back(in_process > 0 ? 100 * agents / in_process : 0);
      std::printf("round %d: %.0f cycles/s at %d agents, %.0f in-process: %.0f%%\n", r, agents, o.agents, in_process,
                  shares.back());
      std::fflush(stdout);
    }
    std::sort(shares.begin(), shares.end());
    const std::size_t mid = shares.size() / 2;
    const double median = shares.size() % 2 ? shares[mid] : (shares[mid - 1] + shares[mid]) / 2;
    std::printf("share of in-process over %d rounds: median %.0f%%, lowest %.0f%%, highest %.0f%%\n", rounds, median,
                shares.front(), shares.back());
    return 0;
  }
  bench_daemon(o);
  return 0;
}
