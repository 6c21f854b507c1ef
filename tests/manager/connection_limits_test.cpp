// Connection limits of the real accelpool-manager on loopback: file descriptors, connections that never say
// hello, pipelined calls, slow admin clients (docs/operations.md "Connection limits").
#include "hung_after.hpp"
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

using namespace accelpool::manager::itest;
using namespace std::chrono_literals;

namespace {

// Generous bound for waits on events: only a hung test reaches it.
constexpr auto kPatience = 60s;

// `guest` and `admin` are added to those tables, `extra` at the end.
std::string config(const std::string& guest, const std::string& admin, const std::string& extra) {
  std::ostringstream o;
  o << "[leases]\nttl_s = 600\n"
    << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"guest.sock\"\n"
    << guest << "[admin]\nlisten = \"127.0.0.1:0\"\n"
    << admin << "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
    << "[[hosts.devices]]\nkind = \"fpga\"\ncount = 4\n"
    << "[[tenants]]\nname = \"a\"\n"
    << extra;
  return o.str();
}

struct Daemon : ScratchDaemon {
  explicit Daemon(const std::string& cfg) : ScratchDaemon("apm-cl-", cfg) {}
  void start() {
    daemon.start();
    token = daemon.token("guest token for tenant a");
    admin = daemon.token("admin token");
  }
  int admin_port() const { return daemon.endpoints().admin_port; }
  int guest_port() const { return daemon.endpoints().guest_port; }
  std::string token, admin;
};

// A TCP connection to 127.0.0.1:`port` from `source` (any 127.0.0.0/8 address is this host).
int connect_from(const char* source, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &a.sin_addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

void send_text(int fd, const std::string& text) {
  REQUIRE(::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size()));
}

// Reads until the peer closes (true) or kPatience passes (false); what arrived is appended to `got`.
bool read_until_closed(int fd, std::string* got = nullptr) {
  auto deadline = std::chrono::steady_clock::now() + kPatience;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
    if (got) got->append(buf, static_cast<std::size_t>(n));
  }
  return false;
}

// Waits (the shared eventually(): until the line shows, failing only a hung run) for `text` in the output.
bool output_shows(const DaemonProcess& d, const std::string& text) {
  return accelpool::testing::eventually([&] { return d.output().find(text) != std::string::npos; });
}

std::size_t open_fds(int pid) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd"))
    ++n;
  return n;
}

rlimit own_fd_limit() {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  return lim;
}

}  // namespace

TEST_CASE("at start the soft file descriptor limit is raised to the hard limit", "[connections][fd]") {
  Daemon d(config("", "", "[limits]\nmax_connections = 16\n"));
  rlimit own = own_fd_limit();
  REQUIRE(own.rlim_max > 200);
  d.daemon.set_fd_limit(128, own.rlim_max);
  d.start();
  rlimit now{};
  REQUIRE(::prlimit(d.daemon.pid(), RLIMIT_NOFILE, nullptr, &now) == 0);
  CHECK(now.rlim_cur == own.rlim_max);
}

TEST_CASE("a config whose connection limits cannot fit the file descriptor limit is refused at start",
          "[connections][fd]") {
  Daemon d(config("", "", "[limits]\nmax_connections = 4096\n"));
  d.daemon.set_fd_limit(1024, 1024);
  REQUIRE_THROWS(d.start());
  std::string out = d.daemon.output();
  CHECK(out.find("max_connections") != std::string::npos);
  CHECK(out.find("need 8256 file descriptors") != std::string::npos);
  CHECK(out.find("limit (RLIMIT_NOFILE, hard) is 1024") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(d.dir / "pool.db"));  // refused before anything was created

  // Limits that fit start.
  Daemon fits(config("", "", "[limits]\nmax_connections = 400\n"));
  fits.daemon.set_fd_limit(1024, 1024);
  fits.start();
  CHECK(http(fits.admin_port(), "GET", "/healthz", "").status == 200);

  // The default limit, not set in the config, shrinks to fit and says so: a small `ulimit -n` still starts.
  Daemon defaults(config("", "", ""));
  defaults.daemon.set_fd_limit(1024, 1024);
  defaults.start();
  CHECK(http(defaults.admin_port(), "GET", "/healthz", "").status == 200);
  // Written by the log's own thread: soon after the start, not necessarily before it.
  CHECK(accelpool::testing::eventually([&] {
    return defaults.daemon.output().find("[limits] max_connections lowered from 4096 to 480") != std::string::npos;
  }));
}

TEST_CASE("out of file descriptors, every listener backs off, says why, and accepts again once some close",
          "[connections][fd]") {
  Daemon d(config("max_silent = 1000\nhello_timeout_s = 600\n", "",
                  "[limits]\nmax_connections = 256\nrequest_timeout_s = 600\n"
                  "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"agent-token-0123456789\"\n"));
  d.start();
  const int pid = d.daemon.pid();
  // Leave the daemon a few descriptors more than it holds now.
  rlimit low{static_cast<rlim_t>(open_fds(pid) + 4), own_fd_limit().rlim_max};
  REQUIRE(::prlimit(pid, RLIMIT_NOFILE, &low, nullptr) == 0);

  std::vector<int> flood;
  for (int i = 0; i < 40; ++i) flood.push_back(connect_from("127.0.0.1", d.guest_port()));
  const std::string guest_listener = "guest listener tcp 127.0.0.1:" + std::to_string(d.guest_port());
  const std::string admin_listener = "admin API 127.0.0.1:" + std::to_string(d.admin_port());
  REQUIRE(output_shows(d.daemon, guest_listener + ": cannot accept connections: Too many open files"));
  // An admin request and an agent connection wait in their backlogs meanwhile.
  int admin = connect_from("127.0.0.1", d.admin_port());
  send_text(admin, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string agents = d.daemon.endpoints().agents;
  int agent = connect_from("127.0.0.1", std::stoi(agents.substr(agents.rfind(':') + 1)));
  REQUIRE(output_shows(d.daemon, admin_listener + ": cannot accept connections: Too many open files"));
  REQUIRE(output_shows(d.daemon, ": agent listener: cannot accept connections: Too many open files"));

  for (int fd : flood) ::close(fd);
  std::string response;
  CHECK(read_until_closed(admin, &response));
  CHECK(response.rfind("HTTP/1.1 200", 0) == 0);
  ::close(admin);
  ::close(agent);
  CHECK(output_shows(d.daemon, admin_listener + ": accepting connections again"));
  CHECK(output_shows(d.daemon, "agent listener: accepting connections again"));
  CHECK(output_shows(d.daemon, guest_listener + ": accepting connections again"));
  auto g = GuestClient::tcp(d.guest_port());
  CHECK(g.hello(d.token, "vm1").contains("result"));
}

TEST_CASE("connections that never say hello cannot lock real guests out", "[connections][hello]") {
  const bool network_thread = GENERATE(false, true);
  CAPTURE(network_thread);
  Daemon d(
      config(std::string("max_silent = 8\nhello_timeout_s = 600\n") + (network_thread ? "network_thread = true\n" : ""),
             "", "[limits]\nmax_connections = 64\nrequest_timeout_s = 600\n"));
  d.start();
  // More silent connections than there are connection slots at all.
  std::vector<int> flood;
  for (int i = 0; i < 100; ++i) flood.push_back(connect_from("127.0.0.1", d.guest_port()));
  // The listener takes connections in order: the flood is in before this guest.
  auto g = GuestClient::tcp(d.guest_port());
  auto hello = g.hello(d.token, "vm1");
  CHECK(hello.contains("result"));
  CHECK(lease_state(g.call("acquire", {{"kind", "fpga"}})) == "granted");
  // The oldest silent connections were closed to make room.
  CHECK(read_until_closed(flood.front()));
  for (int fd : flood) ::close(fd);
}

TEST_CASE("guests that connect all at once are not closed while their hellos wait to be handled",
          "[connections][hello]") {
  const bool network_thread = GENERATE(true, false);
  CAPTURE(network_thread);
  Daemon d(config(std::string("max_silent = 8\n") + (network_thread ? "network_thread = true\n" : ""), "",
                  "[limits]\nmax_connections = 1000\n"));
  d.start();
  // Many more guests than the silent budget, each saying hello at once (as after a manager restart).
  std::vector<GuestClient> guests;
  for (int i = 0; i < 300; ++i) {
    guests.push_back(GuestClient::tcp(d.guest_port()));
    guests.back().send_line(json::serialize(
        json::object{{"jsonrpc", "2.0"},
                     {"id", 1},
                     {"method", "hello"},
                     {"params", {{"protocol", 1}, {"token", d.token}, {"guest", "vm" + std::to_string(i)}}}}));
  }
  int welcomed = 0;
  for (auto& g : guests) {
    auto line = g.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(kPatience));
    if (line && json::parse(*line).as_object().contains("result")) ++welcomed;
  }
  CHECK(welcomed == 300);
}

TEST_CASE("a connection must say hello within [guest] hello_timeout_s", "[connections][hello]") {
  Daemon d(config("hello_timeout_s = 0.2\n", "", "[limits]\nrequest_timeout_s = 600\n"));
  d.start();
  auto idle = GuestClient::tcp(d.guest_port());
  auto line = idle.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(kPatience));
  REQUIRE(line);
  CHECK(line->find("\"timeout\"") != std::string::npos);
  CHECK_FALSE(idle.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(kPatience)));  // closed
}

TEST_CASE("a pipelined burst of calls is answered in full, however much the replies weigh", "[connections][pipeline]") {
  const bool network_thread = GENERATE(true, false);
  CAPTURE(network_thread);
  constexpr int kLeases = 5000;
  std::string cfg = config(network_thread ? "network_thread = true\n" : "", "", "");
  cfg.replace(cfg.find("count = 4"), 9, "count = " + std::to_string(kLeases));
  cfg.replace(cfg.find("ttl_s = 600\n"), 12, "ttl_s = 600\nmax_per_guest = " + std::to_string(kLeases) + "\n");
  Daemon d(cfg);
  d.start();
  auto g = GuestClient::tcp(d.guest_port());
  REQUIRE(g.hello(d.token, "vm1").contains("result"));

  // Sends one call per entry of `params` in one stream (from a thread of its own, so that writing never waits
  // for this thread to read); returns the leases of the replies in `state`, up to where the connection ended.
  auto pipeline = [&](const std::string& method, const std::vector<json::object>& params, const std::string& state) {
    std::thread writer([&] {
      std::string burst;
      for (std::size_t i = 0; i < params.size(); ++i) {
        burst +=
            json::serialize(json::object{{"jsonrpc", "2.0"}, {"id", i + 1}, {"method", method}, {"params", params[i]}});
        burst += "\n";
      }
      std::size_t cut = burst.find('\n', burst.size() / 2);  // two writes: the second while replies are in flight
      g.send_line(burst.substr(0, cut));
      g.send_line(burst.substr(cut + 1, burst.size() - cut - 2));
    });
    std::vector<std::uint64_t> leases;
    std::size_t replies = 0;
    while (replies < params.size()) {
      auto line = g.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(kPatience));
      if (!line) break;
      auto v = json::parse(*line).as_object();
      if (v.contains("method")) continue;  // a notification
      ++replies;
      if (v.contains("result") && lease_state(v) == state) leases.push_back(lease_id(v));
    }
    writer.join();
    return leases;
  };
  auto granted = pipeline("acquire", std::vector<json::object>(kLeases, json::object{{"kind", "fpga"}}), "granted");
  REQUIRE(granted.size() == kLeases);
  std::vector<json::object> releases;
  for (auto id : granted) releases.push_back(json::object{{"lease", id}});
  CHECK(pipeline("release", releases, "released").size() == kLeases);
  CHECK(lease_state(g.call("acquire", {{"kind", "fpga"}})) == "granted");  // still connected
}

TEST_CASE("slow admin clients hold neither every connection nor one for long", "[connections][admin]") {
  SECTION("connections per source address are limited") {
    Daemon d(config("", "max_connections_per_source = 4\nheader_timeout_s = 600\n",
                    "[limits]\nmax_connections = 32\nrequest_timeout_s = 600\n"));
    d.start();
    // A slowloris from 127.0.0.2: more half-sent requests than there are admin connections at all.
    std::vector<int> slow;
    for (int i = 0; i < 40; ++i) {
      slow.push_back(connect_from("127.0.0.2", d.admin_port()));
      send_text(slow.back(), "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    }
    // The fifth and later were closed at once; another source is served.
    CHECK(read_until_closed(slow.back()));
    CHECK(http(d.admin_port(), "GET", "/healthz", "").status == 200);
    CHECK(http(d.admin_port(), "GET", "/v1/devices", d.admin).status == 200);
    for (int fd : slow) ::close(fd);
  }
  SECTION("the headers must arrive within header_timeout_s") {
    Daemon d(config("", "header_timeout_s = 0.2\n", "[limits]\nrequest_timeout_s = 600\n"));
    d.start();
    int fd = connect_from("127.0.0.1", d.admin_port());
    send_text(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    std::string got;
    CHECK(read_until_closed(fd, &got));
    CHECK(got.empty());
    ::close(fd);
    // A whole request is still served.
    CHECK(http(d.admin_port(), "GET", "/healthz", "").status == 200);
  }
}

TEST_CASE("agent connections over [agents] max_connections are closed at accept", "[connections][agents]") {
  Daemon d(config("", "",
                  "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"agent-token-0123456789\"\nmax_connections = 2\n"
                  "heartbeat_timeout_ms = 3600000\n"));
  d.start();
  const std::string agents = d.daemon.endpoints().agents;
  const int port = std::stoi(agents.substr(agents.rfind(':') + 1));
  std::vector<int> held{connect_from("127.0.0.1", port), connect_from("127.0.0.1", port)};
  int third = connect_from("127.0.0.1", port);
  CHECK(read_until_closed(third));
  ::close(third);
  for (int fd : held) ::close(fd);
}
