// accelpool-guestd (a real process) between programs and the real accelpool-manager, and the manager's side of
// the host agent's port relay (`relay` on a guest connection).
#include "manager_fixture.hpp"

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using json = nlohmann::json;
using accelpool::shim::test::Child;
using accelpool::shim::test::eventually;
using accelpool::shim::test::fpga_pool;
using accelpool::shim::test::ManagerOptions;
using accelpool::shim::test::ManagerProcess;
using accelpool::shim::test::read_file;
using accelpool::shim::test::spawn;
using Clock = std::chrono::steady_clock;

namespace {

// How long a reply or a notification that must come is waited for (only a hung component takes this long).
const double kHungAfterS = std::chrono::duration<double>(accelpool::testing::kHungAfter).count();

int connect_unix(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int connect_tcp(const std::string& uri) {  // tcp://127.0.0.1:PORT
  std::string rest = uri.substr(6);
  auto colon = rest.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(rest.substr(colon + 1))));
  inet_pton(AF_INET, rest.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A program speaking raw JSON lines, to see exactly what reaches it.
class LineClient {
 public:
  explicit LineClient(int fd) : fd_(fd) {}
  ~LineClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void send(const json& j) {
    std::string s = j.dump() + "\n";
    REQUIRE(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()));
  }
  // The next line within `seconds`, or a discarded json on timeout; `closed` is set at end of stream.
  json next(double seconds) {
    auto end = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return json::parse(line, nullptr, false);
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) return json::value_t::discarded;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char b[65536];
      ssize_t n = ::recv(fd_, b, sizeof b, 0);
      if (n <= 0) {
        closed = true;
        return json::value_t::discarded;
      }
      buf_.append(b, static_cast<std::size_t>(n));
    }
  }
  // The next message with this id (notifications before it are kept in `seen`).
  json reply(const json& id, double seconds = kHungAfterS) {
    auto end = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    while (Clock::now() < end) {
      json j = next(std::chrono::duration<double>(end - Clock::now()).count());
      if (j.is_discarded()) break;
      if (j.contains("id") && j["id"] == id) return j;
      seen.push_back(j);
    }
    return json::value_t::discarded;
  }
  // Waits for a notification `method` about lease `lease` (looking at `seen` first).
  bool notified(const std::string& method, std::uint64_t lease, double seconds = kHungAfterS) {
    auto match = [&](const json& j) {
      return j.value("method", "") == method && j["params"]["lease"]["id"].get<std::uint64_t>() == lease;
    };
    for (const auto& j : seen)
      if (match(j)) return true;
    auto end = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    while (Clock::now() < end) {
      json j = next(std::chrono::duration<double>(end - Clock::now()).count());
      if (j.is_discarded()) return false;
      seen.push_back(j);
      if (match(j)) return true;
    }
    return false;
  }
  std::vector<json> seen;
  bool closed = false;

 private:
  int fd_;
  std::string buf_;
};

json call(const json& id, const std::string& method, json params) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
}

json hello(const ManagerProcess& m, const std::string& guest) {
  return call(0, "hello", {{"protocol", 1}, {"token", m.guest_token()}, {"guest", guest}});
}

std::string guestd_bin() { return ACCELPOOL_GUESTD_BIN; }

// accelpool-guestd as a child process; SIGTERM on destruction.
struct Guestd {
  pid_t pid = -1;
  std::string socket;
  Guestd(const std::string& port_uri, const std::string& dir) {
    socket = dir + "/guestd.sock";
    std::string log = dir + "/guestd.log";
    pid = fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      execl(guestd_bin().c_str(), guestd_bin().c_str(), "--port", port_uri.c_str(), "--listen", socket.c_str(),
            "--verbose", static_cast<char*>(nullptr));
      _exit(127);
    }
    eventually([&] {
      struct stat st {};
      return ::stat(socket.c_str(), &st) == 0;
    });
  }
  ~Guestd() {
    ::kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
  }
};

// A Unix-socket proxy standing in for the host side of the port: it can cut the stream, and be absent for a while
// (no socket to connect to, as a port whose host side is not connected).
class Proxy {
 public:
  Proxy(std::string listen, std::string target) : listen_(std::move(listen)), target_(std::move(target)) {
    set_present(true);
    thread_ = std::thread([this] { run(); });
  }
  ~Proxy() {
    stop_ = true;
    thread_.join();
    set_present(false);
    cut();
  }
  void set_present(bool present) {
    std::lock_guard lock(mu_);
    if (!present) {
      if (lfd_ >= 0) ::close(lfd_);
      lfd_ = -1;
      ::unlink(listen_.c_str());
      return;
    }
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, listen_.c_str(), sizeof a.sun_path - 1);
    lfd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(lfd_, 8) == 0);
  }
  void cut() {
    std::lock_guard lock(mu_);
    if (a_ >= 0) ::close(a_);
    if (b_ >= 0) ::close(b_);
    a_ = b_ = -1;
  }
  std::atomic<int> streams{0};

 private:
  void run() {
    while (!stop_) {
      std::vector<pollfd> fds;
      {
        std::lock_guard lock(mu_);
        fds.push_back({lfd_, POLLIN, 0});  // -1 while absent: poll ignores it
        if (a_ >= 0) fds.push_back({a_, POLLIN, 0}), fds.push_back({b_, POLLIN, 0});
      }
      ::poll(fds.data(), fds.size(), 20);
      std::lock_guard lock(mu_);
      if ((fds[0].revents & POLLIN) && fds[0].fd == lfd_) {
        int c = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          if (a_ >= 0) ::close(a_);
          if (b_ >= 0) ::close(b_);
          a_ = c;
          b_ = connect_unix(target_);
          ++streams;
        }
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP)) || a_ < 0) continue;
        int from = fds[i].fd, to = from == a_ ? b_ : a_;
        if (from != a_ && from != b_) continue;
        char buf[65536];
        ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) {
          ::close(a_);
          ::close(b_);
          a_ = b_ = -1;
          break;
        }
        [[maybe_unused]] auto w = ::send(to, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
      }
    }
  }
  std::string listen_, target_;
  int lfd_ = -1;
  std::mutex mu_;
  int a_ = -1, b_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string unix_path(const ManagerProcess& m) { return m.unix_uri().substr(7); }

}  // namespace

TEST_CASE("guestd multiplexes two programs over one stream and routes each reply and notification",
          "[integration][guestd]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  Guestd g(m.unix_uri(), m.dir());
  LineClient a(connect_unix(g.socket)), b(connect_unix(g.socket));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  a.send(hello(m, "vm-mux"));
  b.send(hello(m, "vm-mux"));
  REQUIRE(a.reply(0)["result"]["guest"] == "vm-mux");
  REQUIRE(b.reply(0)["result"]["guest"] == "vm-mux");
  // Both use the same id for their calls: guestd keeps them apart.
  a.send(call(7, "acquire", {{"kind", "fpga"}}));
  json ra = a.reply(7);
  REQUIRE(ra.contains("result"));
  std::uint64_t la = ra["result"]["lease"]["id"];
  CHECK(ra["result"]["lease"]["state"] == "granted");
  b.send(call(7, "acquire", {{"kind", "fpga"}}));
  json rb = b.reply(7);
  REQUIRE(rb.contains("result"));
  std::uint64_t lb = rb["result"]["lease"]["id"];
  CHECK(lb != la);
  CHECK(rb["result"]["lease"]["state"] == "queued");
  a.send(call("rel", "release", {{"lease", la}}));
  json rel = a.reply("rel");
  REQUIRE(rel.contains("result"));
  CHECK(rel["result"]["lease"]["state"] == "released");
  CHECK(a.notified("lease.ended", la));
  CHECK(b.notified("lease.granted", lb));
  // B's grant did not go to A, A's end did not go to B.
  CHECK_FALSE(a.notified("lease.granted", lb, 0.3));
  CHECK_FALSE(b.notified("lease.ended", la, 0.1));
  // A bad line is answered by guestd itself and changes nothing.
  LineClient c(connect_unix(g.socket));
  std::string bad = "not json\n";
  REQUIRE(::send(c.fd(), bad.data(), bad.size(), MSG_NOSIGNAL) > 0);
  json pe = c.next(5);
  REQUIRE(pe.contains("error"));
  CHECK(pe["error"]["data"]["code"] == "parse_error");
  c.send(json::array({1, 2}));
  json e = c.next(5);
  REQUIRE(e.contains("error"));
  CHECK(e["error"]["data"]["code"] == "invalid_request");
  b.send(call(8, "list", json::object()));
  json l = b.reply(8);
  REQUIRE(l["result"]["leases"].size() == 1);  // the guest's live leases: B's only
  CHECK(l["result"]["leases"][0]["id"] == lb);
}

TEST_CASE("guestd survives the host side going away and resumes each program's session", "[integration][guestd]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  Proxy proxy(m.dir() + "/port.sock", unix_path(m));
  Guestd g("unix://" + m.dir() + "/port.sock", m.dir());
  LineClient a(connect_unix(g.socket));
  REQUIRE(a.ok());
  a.send(hello(m, "vm-resume"));
  REQUIRE(a.reply(0).contains("result"));
  a.send(call(1, "acquire", {{"kind", "fpga"}}));
  json r = a.reply(1);
  REQUIRE(r.contains("result"));
  std::uint64_t lease = r["result"]["lease"]["id"];
  REQUIRE(proxy.streams == 1);

  // The host side goes away and refuses to come back for a while; a call made meanwhile waits for it.
  proxy.set_present(false);
  proxy.cut();
  REQUIRE(eventually([&] { return read_file(m.dir() + "/guestd.log").find("went away") != std::string::npos; }));
  a.send(call(2, "heartbeat", {{"lease", lease}}));
  json early = a.reply(2, 0.5);
  INFO(early.dump());
  CHECK(early.is_discarded());  // no answer while the stream is down
  CHECK_FALSE(a.closed);
  proxy.set_present(true);
  json hb = a.reply(2);
  INFO(read_file(m.dir() + "/guestd.log"));
  REQUIRE(hb.contains("result"));  // authenticated again: guestd re-sent the program's hello first
  CHECK(hb["result"]["leases"][0]["id"] == lease);
  CHECK(proxy.streams == 2);
  // Notifications of the lease reach the program again.
  a.send(call(3, "release", {{"lease", lease}}));
  CHECK(a.reply(3)["result"]["lease"]["state"] == "released");
  CHECK(a.notified("lease.ended", lease));
}

TEST_CASE("accelpool-run jobs share one stream through guestd", "[integration][guestd]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  Guestd g(m.unix_uri(), m.dir());
  const std::map<std::string, std::string> env = {
      {"ACCELPOOL_POOL", "unix://" + g.socket}, {"ACCELPOOL_TOKEN", m.guest_token()}, {"ACCELPOOL_GUEST", "vm-jobs"}};
  std::vector<Child> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(spawn({ACCELPOOL_RUN_BIN, "--", "/bin/sh", "-c", "echo lease=$ACCELPOOL_LEASE; sleep 0.3"}, env,
                         m.dir() + "/job" + std::to_string(i) + ".out"));
  }
  std::set<std::string> leases;
  for (auto& job : jobs) {
    const bool done = job.wait();
    if (!done) job.kill_group();
    REQUIRE(done);
    const std::string out = job.output();
    INFO(out);
    CHECK(job.exit_code() == 0);
    leases.insert(out.substr(0, out.find('\n')));
  }
  CHECK(leases.size() == 3);  // three leases, one after the other on the one device
}

TEST_CASE("a relayed connection is pinned to its VM, a wrong agent token is refused", "[integration][relay]") {
  ManagerOptions o = fpga_pool(1);
  o.agent_token = "agent-secret-0123456789";
  ManagerProcess m(o);
  REQUIRE_MANAGER(m);

  SECTION("wrong agent token: a clear error, the connection is closed") {
    LineClient c(connect_tcp(m.tcp_uri()));
    c.send(call(1, "relay", {{"token", "wrong"}, {"host", "local"}, {"vm", "vm-a"}}));
    json r = c.reply(1);
    INFO(r.dump());
    REQUIRE(r.contains("error"));
    CHECK(r["error"]["data"]["code"] == "unauthorized");
    CHECK(r["error"]["message"].get<std::string>().find("wrong agent token") != std::string::npos);
    CHECK(c.next(3).is_discarded());
    CHECK(c.closed);
  }
  SECTION("right token: hello for the VM works, hello for another guest is refused") {
    LineClient c(connect_tcp(m.tcp_uri()));
    c.send(call(1, "relay", {{"token", "agent-secret-0123456789"}, {"host", "local"}, {"vm", "vm-a"}}));
    json r = c.reply(1);
    REQUIRE(r.contains("result"));
    CHECK(r["result"]["guest"] == "vm-a");
    c.send(hello(m, "vm-b"));
    json h = c.reply(0);
    REQUIRE(h.contains("error"));
    CHECK(h["error"]["data"]["code"] == "forbidden");
    CHECK(h["error"]["message"].get<std::string>().find("cannot speak for guest 'vm-b'") != std::string::npos);
    c.send(call(2, "acquire", {{"kind", "fpga"}}));
    CHECK(c.reply(2)["error"]["data"]["code"] == "unauthorized");  // the refused hello authenticated nothing
    c.send(hello(m, "vm-a"));
    REQUIRE(c.reply(0).contains("result"));
    c.send(call(3, "acquire", {{"kind", "fpga"}}));
    json a = c.reply(3);
    REQUIRE(a.contains("result"));
    CHECK(a["result"]["lease"]["guest"] == "vm-a");
    CHECK(a["result"]["lease"]["guest_host"] == "local");
    c.send(call(4, "relay", {{"token", "agent-secret-0123456789"}, {"host", "local"}, {"vm", "vm-b"}}));
    CHECK(c.reply(4)["error"]["data"]["code"] == "invalid_state");  // pinned once, for good
  }
}
