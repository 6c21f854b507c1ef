// Tokens with the real accelpool-manager: created only once the listeners are bound (a start that fails on a busy
// port creates none, and the next start prints them); `accelpool-manager token ...` on a stopped manager's store;
// named admin tokens and tenants through the admin API.
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

using namespace accelpool::manager::itest;
namespace fs = std::filesystem;

namespace {

std::string config(const std::string& admin_listen) {
  return "[leases]\nttl_s = 60\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"" + admin_listen +
         "\"\n[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"asic\"\ncount = 1\n"
         "[[tenants]]\nname = \"t\"\n";
}

// A TCP socket listening on 127.0.0.1 (any free port) for as long as it lives: the port is busy.
struct BusyPort {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  BusyPort() {
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~BusyPort() { ::close(fd); }
};

// The output (stdout and stderr) of `accelpool-manager ARGS --data-dir DIR`, which must exit with `code` (0 done,
// 1 refused).
std::string output_of(const fs::path& dir, const std::string& args, int code) {
  auto [rc, out] = run_command(std::string(ACCELPOOL_MANAGER_BIN) + " " + args + " --data-dir '" + dir.string() + "'");
  INFO(args << ": " << out);
  CHECK(rc == code);
  return out;
}

// The token of a "... (shown once): TOKEN" line.
std::string shown_token(const std::string& out) {
  auto at = out.find("(shown once): ");
  REQUIRE(at != std::string::npos);
  return out.substr(at + 14, out.find('\n', at) - at - 14);
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

int status(const DaemonProcess& d, const std::string& method, const std::string& target, const std::string& token,
           const std::string& body = "") {
  return http(d.endpoints().admin_port, method, target, token, body).status;
}

}  // namespace

TEST_CASE("A start that fails on a busy admin port creates no token, and the next start prints them",
          "[integration][tokens]") {
  ScratchDaemon m("apm-tok-", "");
  {
    BusyPort busy;
    DaemonProcess first(m.dir, config("127.0.0.1:" + std::to_string(busy.port)));
    REQUIRE_THROWS(first.start());
    CHECK(first.output().find("admin API on 127.0.0.1:" + std::to_string(busy.port)) != std::string::npos);
    CHECK(first.output().find("shown once") == std::string::npos);
  }
  // The store the failed start opened holds no tenant and no admin token.
  CHECK(output_of(m.dir, "token list", 0).empty());

  DaemonProcess second(m.dir, config("127.0.0.1:0"));
  second.start();
  std::string admin = second.token("admin token");
  std::string guest = second.token("guest token for tenant t");
  CHECK(status(second, "GET", "/v1/tenants", admin) == 200);
  auto g = GuestClient::tcp(second.endpoints().guest_port);
  CHECK(g.hello(guest, "vm-1").contains("result"));
  second.stop(SIGTERM);
}

TEST_CASE("accelpool-manager token creates, lists, rotates and revokes tokens of a stopped manager's store",
          "[integration][tokens]") {
  ScratchDaemon m("apm-tok-", config("127.0.0.1:0"));
  m.daemon.start();
  const std::string admin = m.daemon.token("admin token");
  const std::string guest = m.daemon.token("guest token for tenant t");

  // Refused while the manager runs: it would not see the change, and could overwrite it.
  CHECK_THAT(output_of(m.dir, "token list", 1),
             Catch::Contains("in use by accelpool-manager (pid " + std::to_string(m.daemon.pid()) + ","));
  m.daemon.stop(SIGTERM);

  const std::string alice = shown_token(output_of(m.dir, "token create alice", 0));
  CHECK(alice.rfind("apa_", 0) == 0);
  CHECK_THAT(output_of(m.dir, "token create alice", 1), Catch::Contains("admin token alice exists"));
  CHECK_THAT(output_of(m.dir, "token create 'no spaces'", 1), Catch::Contains("must be 1-64 characters"));
  CHECK(output_of(m.dir, "token list", 0) == "admin  admin\nadmin  alice\ntenant t\n");

  const std::string admin2 = shown_token(output_of(m.dir, "token rotate admin", 0));
  const std::string rotated_guest = output_of(m.dir, "token rotate --tenant t", 0);
  CHECK(rotated_guest.find("guest token for tenant t (shown once): ") == 0);
  const std::string guest2 = shown_token(rotated_guest);
  output_of(m.dir, "token revoke alice", 0);
  CHECK_THAT(output_of(m.dir, "token revoke nobody", 1), Catch::Contains("no admin token named nobody"));
  CHECK_THAT(output_of(m.dir, "token rotate --tenant nobody", 1), Catch::Contains("no tenant nobody"));

  m.daemon.start();
  CHECK(count(m.daemon.output(), "admin token (shown once)") == 1);  // the first start's only: tokens exist
  CHECK(status(m.daemon, "GET", "/v1/tenants", admin) == 401);
  CHECK(status(m.daemon, "GET", "/v1/tenants", alice) == 401);
  CHECK(status(m.daemon, "GET", "/v1/tenants", admin2) == 200);
  auto old_guest = GuestClient::tcp(m.daemon.endpoints().guest_port);
  CHECK(error_word(old_guest.hello(guest, "vm-1")) == "unauthorized");
  auto new_guest = GuestClient::tcp(m.daemon.endpoints().guest_port);
  CHECK(new_guest.hello(guest2, "vm-1").contains("result"));

  // No store, no command: nothing is created.
  auto empty = temp_dir("apm-tok-empty-");
  CHECK_THAT(output_of(empty, "token list", 1), Catch::Contains("no store at"));
  CHECK_FALSE(fs::exists(empty / "pool.db"));
  fs::remove_all(empty);
}

TEST_CASE("Named admin tokens and tenants through the admin API", "[integration][tokens]") {
  ScratchDaemon m("apm-tok-", config("127.0.0.1:0"));
  m.daemon.start();
  const std::string admin = m.daemon.token("admin token");
  const int port = m.daemon.endpoints().admin_port;

  SECTION("admin tokens: one per operator, each rotatable and revocable") {
    auto made = http(port, "POST", "/v1/admin-tokens", admin, R"({"name":"bob"})");
    REQUIRE(made.status == 201);
    std::string bob(made.json().at("token").as_string());
    CHECK(status(m.daemon, "GET", "/v1/tenants", bob) == 200);
    CHECK(http(port, "GET", "/v1/admin-tokens", bob).json() ==
          boost::json::parse(R"({"admin_tokens":[{"name":"admin"},{"name":"bob"}]})"));
    CHECK(status(m.daemon, "POST", "/v1/admin-tokens", admin, R"({"name":"bob"})") == 409);
    CHECK(status(m.daemon, "POST", "/v1/admin-tokens", admin, R"({"name":"no spaces"})") == 400);
    CHECK(status(m.daemon, "POST", "/v1/admin-tokens", admin, R"({"name":"x","extra":1})") == 400);

    auto rotated = http(port, "POST", "/v1/admin-tokens/bob/rotate", admin);
    REQUIRE(rotated.status == 200);
    std::string bob2(rotated.json().at("token").as_string());
    CHECK(status(m.daemon, "GET", "/v1/tenants", bob) == 401);
    CHECK(status(m.daemon, "GET", "/v1/tenants", bob2) == 200);

    CHECK(status(m.daemon, "DELETE", "/v1/admin-tokens/bob", admin) == 200);
    CHECK(status(m.daemon, "GET", "/v1/tenants", bob2) == 401);
    CHECK(status(m.daemon, "DELETE", "/v1/admin-tokens/bob", admin) == 404);
    auto last = http(port, "DELETE", "/v1/admin-tokens/admin", admin);
    CHECK(last.status == 409);
    CHECK(last.body.find("the only one") != std::string::npos);
    CHECK(status(m.daemon, "GET", "/v1/tenants", admin) == 200);
  }

  SECTION("tenants: GET one, DELETE one without live leases; the deletion survives a restart") {
    auto made = http(port, "POST", "/v1/tenants", admin, R"({"name":"u","weight":2})");
    REQUIRE(made.status == 201);
    std::string u(made.json().at("token").as_string());
    auto one = http(port, "GET", "/v1/tenants/u", admin);
    REQUIRE(one.status == 200);
    CHECK(one.json() == boost::json::parse(R"({"name":"u","weight":2,"max_devices":0})"));
    CHECK(status(m.daemon, "GET", "/v1/tenants/nobody", admin) == 404);
    CHECK(status(m.daemon, "DELETE", "/v1/tenants/nobody", admin) == 404);

    auto g = GuestClient::tcp(m.daemon.endpoints().guest_port);
    REQUIRE(g.hello(u, "vm-1").contains("result"));
    auto id = lease_id(g.call("acquire", {{"kind", "asic"}}));
    auto refused = http(port, "DELETE", "/v1/tenants/u", admin);
    CHECK(refused.status == 409);
    CHECK(refused.body.find("has live leases " + std::to_string(id)) != std::string::npos);
    REQUIRE(lease_state(g.call("release", {{"lease", id}})) == "released");

    CHECK(http(port, "DELETE", "/v1/tenants/u", admin).json() == boost::json::parse(R"({"deleted":"u"})"));
    CHECK(g.wait_closed());  // its session ended with its token
    CHECK(status(m.daemon, "GET", "/v1/tenants/u", admin) == 404);
    auto again = GuestClient::tcp(m.daemon.endpoints().guest_port);
    CHECK(error_word(again.hello(u, "vm-2")) == "unauthorized");
    CHECK(status(m.daemon, "GET", "/v1/leases/" + std::to_string(id), admin) == 200);  // its history stays

    m.daemon.stop(SIGTERM);
    m.daemon.start();
    CHECK(status(m.daemon, "GET", "/v1/tenants/u", admin) == 404);
    CHECK(status(m.daemon, "GET", "/v1/tenants/t", admin) == 200);
  }
}

TEST_CASE("Numbers in answers and error messages read as people write them (1, not 1E0)", "[integration][api]") {
  ScratchDaemon m("apm-num-", config("127.0.0.1:0"));
  m.daemon.start();
  const std::string admin = m.daemon.token("admin token");
  const int port = m.daemon.endpoints().admin_port;
  auto bad = http(port, "POST", "/v1/hosts/local/drain", admin, R"({"deadline_s":-1})");
  CHECK(bad.status == 400);
  CHECK(bad.body.find("must be between 0 and 31536000") != std::string::npos);
  auto made = http(port, "POST", "/v1/tenants", admin, R"({"name":"w"})");
  CHECK(made.body.find(R"("weight":1,)") != std::string::npos);
  CHECK(http(port, "GET", "/v1/tenants/w", admin).body.find(R"("weight":1,)") != std::string::npos);
  CHECK(http(port, "GET", "/v1/stats?window=60", admin).body.find(R"("window_s":60,)") != std::string::npos);
  auto half = http(port, "PATCH", "/v1/tenants/w", admin, R"({"weight":0.5})");
  CHECK(half.json().at("weight").to_number<double>() == 0.5);  // a fraction stays a fraction
}
