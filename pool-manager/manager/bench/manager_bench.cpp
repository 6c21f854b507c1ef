// accelpool-manager-bench: how fast the real daemon grants, on loopback. Not a test: it prints numbers.
//
// C concurrent guest connections each loop acquire -> lease ready -> release for D seconds on a static host with
// enough devices that nobody queues. Reports acquire->grant latency (acquire sent -> lease ready, without
// reprogramming) and acquire+release cycles per second. The scheduler's own decision time is measured by
// accelpool-decision-bench (scheduler/bench).
//
// usage: accelpool-manager-bench [--manager PATH] [--clients C] [--seconds D]
#include <boost/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
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

int connect_port(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

struct Conn {
  int fd;
  std::string buf;
  bool send(const std::string& s) {
    std::string l = s + "\n";
    return ::send(fd, l.data(), l.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(l.size());
  }
  bool line(std::string& out) {
    for (;;) {
      auto nl = buf.find('\n');
      if (nl != std::string::npos) {
        out = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      char tmp[16384];
      ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
  }
};

void bench_daemon(const std::string& manager, int clients, double seconds, int devices) {
  auto dir = std::filesystem::temp_directory_path() / ("apm-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "manager.toml") << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
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
  std::string token;
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
  std::mutex mu;
  std::vector<double> grant_us;
  std::atomic<long> cycles{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      Conn conn{connect_port(port), {}};
      if (conn.fd < 0) return;
      std::string line;
      conn.send(R"({"jsonrpc":"2.0","id":0,"method":"hello","params":{"protocol":1,"token":")" + token +
                R"(","guest":"bench)" + std::to_string(c) + "\"}}");
      conn.line(line);
      std::vector<double> mine;
      std::uint64_t id = 1;
      while (!stop) {
        auto a = Clock::now();
        conn.send(R"({"jsonrpc":"2.0","id":)" + std::to_string(id++) + R"(,"method":"acquire","params":{"kind":"fpga"}})");
        std::uint64_t lease = 0;
        bool ready = false;
        while (!ready) {  // the reply, then lease.granted when the devices are ready
          if (!conn.line(line)) return;
          auto v = json::parse(line).as_object();
          const json::object* l = nullptr;
          if (v.contains("result")) l = &v.at("result").at("lease").as_object();
          else if (v.contains("params")) l = &v.at("params").at("lease").as_object();
          else return;
          lease = l->at("id").to_number<std::uint64_t>();
          ready = l->at("ready").as_bool();
        }
        mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
        conn.send(R"({"jsonrpc":"2.0","id":)" + std::to_string(id++) + R"(,"method":"release","params":{"lease":)" +
                  std::to_string(lease) + "}}");
        for (;;) {  // the reply; a lease.ended notification follows it
          if (!conn.line(line)) return;
          if (line.find("\"result\"") != std::string::npos) break;
        }
        ++cycles;
      }
      std::lock_guard lock(mu);
      grant_us.insert(grant_us.end(), mine.begin(), mine.end());
      ::close(conn.fd);
    });
  }
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : threads) t.join();
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  std::printf("daemon    clients=%d devices=%d  %.0f acquire+release cycles/s  grant latency p50=%.0f us p99=%.0f us  (%zu grants)\n",
              clients, devices, static_cast<double>(cycles.load()) / elapsed, pct(grant_us, 0.5), pct(grant_us, 0.99),
              grant_us.size());
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::string manager = (std::filesystem::canonical("/proc/self/exe").parent_path() / "accelpool-manager").string();
  int clients = 16, devices_live = 256;
  double seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--manager") manager = v;
    else if (a == "--clients") clients = std::stoi(v);
    else if (a == "--seconds") seconds = std::stod(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  bench_daemon(manager, clients, seconds, devices_live);
  return 0;
}
