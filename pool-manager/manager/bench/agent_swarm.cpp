// AgentSwarm: one thread, one epoll set, every emulated agent a small state machine.
#include "agent_swarm.hpp"

#include <boost/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

namespace accelpool::bench {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kFullEvery = 10;  // as accelpool-agent: every 10th heartbeat lists every device
constexpr auto kRetry = std::chrono::milliseconds(50);
constexpr auto kScanEvery = std::chrono::milliseconds(5);

struct Agent {
  int index = 0;
  std::string host;
  int fd = -1;
  bool connecting = false;
  bool registered = false;
  bool watching_out = false;  // EPOLLOUT is registered
  std::string in, out;
  std::int64_t next_id = 2;  // 1 is the registration
  std::uint64_t beats = 0;
  Clock::time_point next_beat{}, retry_at{};
  std::map<std::string, std::string> loaded;  // device -> bitstream held
};

}  // namespace

struct AgentSwarm::Impl {
  SwarmOptions options;
  std::vector<Agent> agents;
  int ep = -1, wake_fd = -1;
  std::atomic<bool> stop{false}, want_connected{false};
  std::atomic<int> registered{0};
  std::atomic<std::uint64_t> answered{0}, refused{0};
  std::thread thread;
  std::string full_health;  // the devices array of a full heartbeat (every agent's devices are named alike)
  Clock::time_point next_scan{};
  bool scanned_connected = false;

  void wake() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }

  std::string register_line(const Agent& a) const {
    json::array devs;
    for (int d = 0; d < options.devices; ++d) {
      std::string id = "fpga" + std::to_string(d);
      auto it = a.loaded.find(id);
      devs.push_back(json::object{{"id", id},
                                  {"kind", "fpga"},
                                  {"model", "emu-u250"},
                                  {"passthrough", false},
                                  {"loaded", it == a.loaded.end() ? std::string() : it->second},
                                  {"health", "ok"}});
    }
    json::object params{{"token", options.token},
                        {"host", a.host},
                        {"protocol", 1},
                        {"agent", "accelpool-scale-bench"},
                        {"devices", std::move(devs)}};
    return json::serialize(
               json::object{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "agent.register"}, {"params", params}}) +
           "\n";
  }

  void close_agent(Agent& a) {
    if (a.fd >= 0) ::close(a.fd);
    a.fd = -1;
    a.connecting = false;
    if (a.registered) --registered;
    a.registered = false;
    a.in.clear();
    a.out.clear();
    a.retry_at = Clock::now() + kRetry;
  }

  void start_connect(Agent& a) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      a.retry_at = Clock::now() + kRetry;
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(options.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (rc != 0 && errno != EINPROGRESS) {
      ::close(fd);
      a.retry_at = Clock::now() + kRetry;
      return;
    }
    a.fd = fd;
    a.connecting = true;
    a.out = register_line(a);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    ev.data.u32 = static_cast<std::uint32_t>(a.index);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    a.watching_out = true;
  }

  void flush(Agent& a) {
    while (!a.out.empty()) {
      ssize_t n = ::send(a.fd, a.out.data(), a.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        a.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      close_agent(a);
      return;
    }
    if (a.watching_out == !a.out.empty()) return;  // as registered already: no system call
    a.watching_out = !a.out.empty();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (a.watching_out ? EPOLLOUT : 0u);
    ev.data.u32 = static_cast<std::uint32_t>(a.index);
    ::epoll_ctl(ep, EPOLL_CTL_MOD, a.fd, &ev);
  }

  void on_line(Agent& a, const std::string& line) {
    json::error_code ec;
    auto v = json::parse(line, ec);
    if (ec || !v.is_object()) return;
    auto& o = v.get_object();
    if (auto* m = o.if_contains("method")) {
      const auto& p = o.at("params").as_object();
      std::string device(p.at("device").as_string());
      std::string& held = a.loaded[device];
      if (*m == "device.prepare") held = std::string(p.at("bitstream").as_string());
      if (*m == "device.reset") held.clear();
      a.out += json::serialize(
                   json::object{{"jsonrpc", "2.0"}, {"id", o.at("id")}, {"result", json::object{{"loaded", held}}}}) +
               "\n";
      ++answered;
      return;
    }
    if (o.at("id") != 1) return;  // a heartbeat's reply
    if (o.contains("error")) {
      if (++refused <= 3) std::fprintf(stderr, "agent %s refused: %s\n", a.host.c_str(), line.c_str());
      return;
    }
    a.registered = true;
    ++registered;
    a.next_beat = Clock::now() + options.heartbeat;
  }

  void read(Agent& a) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(a.fd, buf, sizeof buf, 0);
      if (n > 0) {
        a.in.append(buf, static_cast<std::size_t>(n));
        if (static_cast<std::size_t>(n) < sizeof buf) break;  // drained for now (epoll is level-triggered)
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      close_agent(a);
      return;
    }
    std::size_t start = 0;
    for (auto nl = a.in.find('\n'); nl != std::string::npos; nl = a.in.find('\n', start)) {
      on_line(a, a.in.substr(start, nl - start));
      start = nl + 1;
    }
    a.in.erase(0, start);
  }

  void beat(Agent& a, Clock::time_point now) {
    a.next_beat = now + options.heartbeat;
    const bool full = options.full_heartbeats || ++a.beats % kFullEvery == 0;
    std::string params = full ? "{\"devices\":" + full_health + (options.full_heartbeats ? "}" : ",\"full\":true}")
                              : std::string("{\"devices\":[]}");
    a.out += "{\"jsonrpc\":\"2.0\",\"id\":" + std::to_string(a.next_id++) +
             ",\"method\":\"agent.heartbeat\",\"params\":" + params + "}\n";
  }

  void run() {
    std::vector<epoll_event> events(1024);
    while (!stop) {
      int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 10);
      for (int i = 0; i < n; ++i) {
        auto idx = events[static_cast<std::size_t>(i)].data.u32;
        if (idx == UINT32_MAX) {
          std::uint64_t c;
          [[maybe_unused]] auto r = ::read(wake_fd, &c, sizeof c);
          continue;
        }
        Agent& a = agents[idx];
        if (a.fd < 0) continue;
        a.connecting = false;
        read(a);
        if (a.fd >= 0) flush(a);
      }
      // Connections, retries and heartbeats: every few milliseconds, not after each request answered.
      auto now = Clock::now();
      const bool connect = want_connected;
      if (connect == scanned_connected && now < next_scan) continue;
      scanned_connected = connect;
      next_scan = now + kScanEvery;
      for (auto& a : agents) {
        if (!connect) {
          if (a.fd >= 0) close_agent(a);
          continue;
        }
        if (a.fd < 0) {
          if (now >= a.retry_at) start_connect(a);
          continue;
        }
        if (a.registered && now >= a.next_beat) {
          beat(a, now);
          flush(a);
        }
      }
    }
    for (auto& a : agents) close_agent(a);
  }
};

AgentSwarm::AgentSwarm(SwarmOptions options) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.options = std::move(options);
  json::array health;
  for (int d = 0; d < m.options.devices; ++d) {
    health.push_back(json::object{{"id", "fpga" + std::to_string(d)}, {"health", "ok"}, {"detail", ""}});
  }
  m.full_health = json::serialize(health);
  m.agents.resize(static_cast<std::size_t>(m.options.agents));
  for (int i = 0; i < m.options.agents; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "emu%04d", i);
    m.agents[static_cast<std::size_t>(i)].index = i;
    m.agents[static_cast<std::size_t>(i)].host = name;
  }
  m.ep = ::epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = UINT32_MAX;
  ::epoll_ctl(m.ep, EPOLL_CTL_ADD, m.wake_fd, &ev);
  m.thread = std::thread([&m] { m.run(); });
}

AgentSwarm::~AgentSwarm() {
  impl_->stop = true;
  impl_->wake();
  impl_->thread.join();
  ::close(impl_->ep);
  ::close(impl_->wake_fd);
}

void AgentSwarm::connect_all() {
  impl_->want_connected = true;
  impl_->wake();
}

void AgentSwarm::drop_all() {
  impl_->want_connected = false;
  impl_->wake();
}

int AgentSwarm::registered() const { return impl_->registered; }
std::uint64_t AgentSwarm::answered() const { return impl_->answered; }
std::uint64_t AgentSwarm::refused() const { return impl_->refused; }

}  // namespace accelpool::bench
