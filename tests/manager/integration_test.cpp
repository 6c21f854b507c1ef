// End-to-end tests: the real accelpool-manager binary on loopback, driven over its sockets.
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

using namespace accelpool::manager::itest;
using namespace std::chrono_literals;

namespace {

std::string config(int devices, double ttl_s, double grace_s, const std::string& extra = "") {
  std::ostringstream o;
  o << "[leases]\nttl_s = " << ttl_s << "\nrevoke_grace_s = " << grace_s << "\n"
    << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"guest.sock\"\n"
    << "[admin]\nlisten = \"127.0.0.1:0\"\n"
    << "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
    << "[[hosts.devices]]\nkind = \"fpga\"\ncount = " << devices << "\n"
    << "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n"
    << extra;
  return o.str();
}

struct Running : ScratchDaemon {
  std::string admin, token_a, token_b;
  explicit Running(const std::string& cfg) : ScratchDaemon("apm-it-", cfg) {
    daemon.start();
    admin = daemon.token("admin token");
    token_a = daemon.token("guest token for tenant a");
    token_b = daemon.token("guest token for tenant b");
  }
  HttpResult get(const std::string& target) { return http(daemon.endpoints().admin_port, "GET", target, admin); }
  HttpResult post(const std::string& target, const std::string& body = "") {
    return http(daemon.endpoints().admin_port, "POST", target, admin, body);
  }
  GuestClient guest(const std::string& token, const std::string& id) {
    auto c = GuestClient::tcp(daemon.endpoints().guest_port);
    auto r = c.hello(token, id);
    REQUIRE(r.contains("result"));
    return c;
  }
  // Every lease the admin API lists with all=true, page by page (`limit` a page).
  boost::json::array all_leases(int limit = 1000) {
    boost::json::array out;
    std::string cursor;
    for (;;) {
      auto r = get("/v1/leases?all=true&limit=" + std::to_string(limit) + cursor);
      REQUIRE(r.status == 200);
      auto body = r.json();
      for (auto& l : body.at("leases").as_array()) out.push_back(l);
      const auto& next = body.at("next_cursor");
      if (next.is_null()) return out;
      cursor = "&cursor=" + std::to_string(next.to_number<std::uint64_t>());
    }
  }
  std::string admin_lease_state(std::uint64_t id) {
    auto r = get("/v1/leases/" + std::to_string(id));
    REQUIRE(r.status == 200);
    return std::string(r.json().at("state").as_string());
  }
};

}  // namespace

TEST_CASE("a grant tells the guest what each device of the in-process sim host is, and the admin API too",
          "[integration]") {
  Running m(
      "[leases]\nttl_s = 30\nrevoke_grace_s = 1\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n"
      "[admin]\nlisten = \"127.0.0.1:0\"\n[[hosts]]\nname = \"local\"\nbackend = \"sim\"\n"
      "[hosts.settings]\ndevices = \"fpga:sim-u250:2\"\nprogram_base_ms = 1\n"
      "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n");
  auto g = m.guest(m.token_a, "vm1");
  auto id = lease_id(g.call("acquire", {{"kind", "fpga"}, {"count", 2}}));
  auto granted = g.wait_notification("lease.granted", id);
  REQUIRE(granted);
  auto check_info = [&](const boost::json::object& lease) {
    const auto& devices = lease.at("devices").as_array();
    const auto& info = lease.at("device_info").as_array();
    REQUIRE(info.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto& d = info[i].as_object();
      CHECK(d.at("name") == devices[i]);  // aligned with devices
      CHECK(d.at("kind") == "fpga");
      CHECK(d.at("model") == "sim-u250");
      CHECK(d.at("vendor") == "accelpool simulator");
      CHECK(d.at("attach") == "in_process");  // the guest shares the manager's host
      CHECK(d.at("pci") == "");
      CHECK(d.at("loaded") == "");
    }
  };
  check_info(granted->at("params").at("lease").as_object());
  auto admin = m.get("/v1/leases/" + std::to_string(id));
  REQUIRE(admin.status == 200);
  check_info(admin.json().as_object());
}

TEST_CASE("full lease lifecycle over TCP: grant, queue when full, gang, release, notifications", "[integration]") {
  Running m(config(2, 30, 1));
  auto g1 = m.guest(m.token_a, "vm1");
  auto g2 = m.guest(m.token_a, "vm2");

  auto a = g1.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd"}});
  REQUIRE(lease_state(a) == "granted");
  auto id_a = lease_id(a);
  REQUIRE(g1.wait_notification("lease.granted", id_a));

  auto gang = g2.call("acquire", {{"kind", "fpga"}, {"count", 2}, {"estimate_s", 10}});
  REQUIRE(lease_state(gang) == "queued");
  auto id_gang = lease_id(gang);
  auto q = m.get("/v1/queue");
  REQUIRE(q.status == 200);
  REQUIRE(q.json().at("queue").as_array().size() == 1);

  auto hb = g1.call("heartbeat", {});
  REQUIRE(hb.at("result").at("renewed").to_number<std::uint64_t>() == 1);

  auto rel = g1.call("release", {{"lease", id_a}});
  REQUIRE(lease_state(rel) == "released");
  REQUIRE(g1.wait_notification("lease.ended", id_a));
  auto granted = g2.wait_notification("lease.granted", id_gang);
  REQUIRE(granted);
  CHECK(granted->at("params").at("lease").at("devices").as_array().size() == 2);
  CHECK(granted->at("params").at("lease").at("ready").as_bool());

  auto dev = m.get("/v1/devices/local/fpga0");
  REQUIRE(dev.status == 200);
  CHECK(dev.json().at("lease").to_number<std::uint64_t>() == id_gang);
  auto cancel_granted = g2.call("cancel", {{"lease", id_gang}});
  CHECK(error_word(cancel_granted) == "invalid_state");
  REQUIRE(lease_state(g2.call("release", {{"lease", id_gang}})) == "released");
  auto stats = m.get("/v1/stats?window=3600");
  REQUIRE(stats.status == 200);
  CHECK(stats.json().at("windows").at(0).at("all").at("jct_s").at("count").to_number<int>() == 2);
  auto metrics = http(m.daemon.endpoints().admin_port, "GET", "/metrics", "");
  REQUIRE(metrics.status == 200);
  CHECK(metrics.body.find("accelpool_grants_total 2") != std::string::npos);
  CHECK(metrics.body.find("accelpool_jct_seconds_count{bitstream=\"\",tenant=\"a\"} 1") != std::string::npos);
  CHECK(metrics.body.find("accelpool_jct_seconds_count{bitstream=\"vadd\",tenant=\"a\"} 1") != std::string::npos);
}

TEST_CASE("a dropped connection keeps its leases, the Unix socket speaks the same protocol", "[integration]") {
  // One guest connection at a time: the next is served only once the manager has closed the dropped one.
  Running m(config(1, 30, 1, "[limits]\nmax_connections = 1\n"));
  std::uint64_t id = 0;
  {
    auto c = GuestClient::unix_socket(m.daemon.endpoints().guest_unix);
    REQUIRE(c.hello(m.token_a, "vm1").contains("result"));
    auto r = c.call("acquire", {{"kind", "fpga"}});
    REQUIRE(lease_state(r) == "granted");
    id = lease_id(r);
  }  // connection dropped
  auto reconnect = [&]() -> std::pair<GuestClient, json::object> {
    for (auto deadline = std::chrono::steady_clock::now() + kHungAfter;;) {
      auto c = GuestClient::tcp(m.daemon.endpoints().guest_port);
      try {
        auto hello = c.hello(m.token_a, "vm1");
        return {std::move(c), std::move(hello)};
      } catch (const std::runtime_error&) {
        // closed at accept: the dropped connection still counts
      }
      if (std::chrono::steady_clock::now() > deadline) FAIL("the manager never closed the dropped connection");
    }
  };
  auto [c2, hello] = reconnect();
  CHECK(m.admin_lease_state(id) == "granted");
  REQUIRE(hello.at("result").at("leases").as_array().size() == 1);
  CHECK(hello.at("result").at("leases").at(0).at("id").to_number<std::uint64_t>() == id);
  CHECK(lease_state(c2.call("release", {{"lease", id}})) == "released");
}

TEST_CASE("a guest that stops heartbeating loses its lease to the next in line", "[integration]") {
  Running m(config(1, 2.0, 1));
  auto g1 = m.guest(m.token_a, "vm1");
  auto g2 = m.guest(m.token_b, "vm2");
  auto a = g1.call("acquire", {{"kind", "fpga"}});
  auto b = g2.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(b) == "queued");
  auto id_a = lease_id(a), id_b = lease_id(b);
  // g2 keeps heartbeating (several times per TTL); g1 does not.
  std::optional<boost::json::object> granted;
  for (auto deadline = std::chrono::steady_clock::now() + kHungAfter;
       !granted && std::chrono::steady_clock::now() < deadline;) {
    g2.call("heartbeat", {});
    granted = g2.wait_notification("lease.granted", id_b, 300ms);
  }
  REQUIRE(granted);
  auto ended = g1.wait_notification("lease.ended", id_a);
  REQUIRE(ended);
  CHECK(ended->at("params").at("lease").at("state").as_string() == "expired");
  CHECK(m.admin_lease_state(id_a) == "expired");
}

TEST_CASE("an admin revocation warns the guest, then ends the lease after the grace period", "[integration]") {
  Running m(config(1, 30, 0.5));
  auto g = m.guest(m.token_a, "vm1");
  auto id = lease_id(g.call("acquire", {{"kind", "fpga"}}));
  auto r = m.post("/v1/leases/" + std::to_string(id) + "/revoke", R"({"reason":"maintenance"})");
  REQUIRE(r.status == 200);
  CHECK(r.json().at("state").as_string() == "revoking");
  auto warn = g.wait_notification("lease.revoking", id);
  REQUIRE(warn);
  CHECK(warn->at("params").at("lease").at("revoke_deadline").is_number());
  auto ended = g.wait_notification("lease.ended", id);
  REQUIRE(ended);
  CHECK(ended->at("params").at("lease").at("state").as_string() == "revoked");
  CHECK(ended->at("params").at("lease").at("end_reason").as_string() == "maintenance");
}

TEST_CASE("tenants are isolated: other tenants' leases are invisible, guest tokens cannot use the admin API",
          "[integration]") {
  Running m(config(1, 30, 1));
  auto ga = m.guest(m.token_a, "vm1");
  auto gb = m.guest(m.token_b, "vm1");  // same guest id, other tenant
  auto id = lease_id(ga.call("acquire", {{"kind", "fpga"}}));
  CHECK(error_word(gb.call("get", {{"lease", id}})) == "not_found");
  CHECK(error_word(gb.call("release", {{"lease", id}})) == "not_found");
  CHECK(gb.call("list", {}).at("result").at("leases").as_array().empty());
  CHECK(m.admin_lease_state(id) == "granted");
  auto port = m.daemon.endpoints().admin_port;
  CHECK(http(port, "GET", "/v1/leases", m.token_a).status == 403);
  CHECK(http(port, "GET", "/v1/leases", "").status == 401);
  CHECK(http(port, "GET", "/v1/leases", "apa_wrong").status == 401);
  auto bad = GuestClient::tcp(m.daemon.endpoints().guest_port);
  CHECK(error_word(bad.hello("apt_wrong", "vm9")) == "unauthorized");
  CHECK(error_word(bad.call("acquire", {{"kind", "fpga"}})) == "unauthorized");
  // Rotating a token locks the old one out.
  auto rot = m.post("/v1/tenants/a/rotate-token");
  REQUIRE(rot.status == 200);
  auto fresh = GuestClient::tcp(m.daemon.endpoints().guest_port);
  CHECK(error_word(fresh.hello(m.token_a, "vm1")) == "unauthorized");
  std::string new_token(rot.json().at("token").as_string());
  CHECK(fresh.hello(new_token, "vm1").contains("result"));
}

TEST_CASE("the policy switches at runtime through the admin API", "[integration]") {
  Running m(config(1, 30, 1));
  auto port = m.daemon.endpoints().admin_port;
  auto put = http(port, "PUT", "/v1/policy", m.admin, R"({"policy":"sjf+affinity"})");
  REQUIRE(put.status == 200);
  CHECK(std::string(put.json().at("policy").as_string()).rfind("sjf+affinity", 0) == 0);
  auto bad = http(port, "PUT", "/v1/policy", m.admin, R"({"policy":"nope"})");
  CHECK(bad.status == 400);
  CHECK(bad.json().at("error").at("code").as_string() == "invalid_argument");
  CHECK(std::string(m.get("/v1/policy").json().at("policy").as_string()).rfind("sjf+affinity", 0) == 0);
  // sjf serves the shortest estimate first.
  auto g = m.guest(m.token_a, "vm1");
  auto hold = lease_id(g.call("acquire", {{"kind", "fpga"}}));
  auto slow = lease_id(g.call("acquire", {{"kind", "fpga"}, {"estimate_s", 100}}));
  auto fast = lease_id(g.call("acquire", {{"kind", "fpga"}, {"estimate_s", 1}}));
  auto q = m.get("/v1/queue").json().at("queue").as_array();
  REQUIRE(q.size() == 2);
  CHECK(q[0].at("id").to_number<std::uint64_t>() == fast);
  CHECK(q[1].at("id").to_number<std::uint64_t>() == slow);
  g.call("release", {{"lease", hold}});
  CHECK(m.admin_lease_state(fast) == "granted");
}

TEST_CASE("the queue is listed in pages in the policy's order", "[integration]") {
  Running m(config(1, 30, 1));
  auto port = m.daemon.endpoints().admin_port;
  REQUIRE(http(port, "PUT", "/v1/policy", m.admin, R"({"policy":"sjf+first-fit"})").status == 200);
  auto g = m.guest(m.token_a, "vm1");
  auto hold = lease_id(g.call("acquire", {{"kind", "fpga"}}));
  auto slow = lease_id(g.call("acquire", {{"kind", "fpga"}, {"estimate_s", 100}}));
  auto fast = lease_id(g.call("acquire", {{"kind", "fpga"}, {"estimate_s", 1}}));
  auto mid = lease_id(g.call("acquire", {{"kind", "fpga"}, {"estimate_s", 50}}));
  auto ids = [](const boost::json::value& page) {
    std::vector<std::uint64_t> out;
    for (const auto& l : page.at("queue").as_array()) out.push_back(l.at("id").to_number<std::uint64_t>());
    return out;
  };
  auto first = m.get("/v1/queue?limit=2");
  REQUIRE(first.status == 200);
  CHECK(ids(first.json()) == std::vector<std::uint64_t>{fast, mid});
  CHECK(first.json().at("total").to_number<std::uint64_t>() == 3);
  REQUIRE(first.json().at("next_cursor").to_number<std::uint64_t>() == 2);
  auto second = m.get("/v1/queue?limit=2&cursor=2");
  REQUIRE(second.status == 200);
  CHECK(ids(second.json()) == std::vector<std::uint64_t>{slow});
  CHECK(second.json().at("next_cursor").is_null());
  // Without a limit, a page of the default size: the whole queue here.
  CHECK(ids(m.get("/v1/queue").json()) == std::vector<std::uint64_t>{fast, mid, slow});
  // Past the end: an empty last page, not an error.
  auto beyond = m.get("/v1/queue?cursor=99");
  REQUIRE(beyond.status == 200);
  CHECK(beyond.json().at("queue").as_array().empty());
  CHECK(beyond.json().at("next_cursor").is_null());
  // Bad paging parameters are refused and name the parameter.
  for (const char* bad : {"/v1/queue?limit=0", "/v1/queue?limit=10001", "/v1/queue?cursor=-1", "/v1/queue?cursor=x",
                          "/v1/queue?order=desc"}) {
    INFO(bad);
    auto r = m.get(bad);
    CHECK(r.status == 400);
    CHECK(r.json().at("error").at("code").as_string() == "invalid_argument");
  }
  // The queue moves on between pages: after the holder releases, the first entry is granted and leaves it.
  g.call("release", {{"lease", hold}});
  CHECK(m.admin_lease_state(fast) == "granted");
  CHECK(ids(m.get("/v1/queue?limit=2").json()) == std::vector<std::uint64_t>{mid, slow});
}

TEST_CASE("a tenant's token pages its own queue entries at their positions in the whole queue", "[integration]") {
  Running m(config(1, 30, 1));
  auto port = m.daemon.endpoints().admin_port;
  auto ga = m.guest(m.token_a, "vm1");
  auto gb = m.guest(m.token_b, "vm1");
  lease_id(gb.call("acquire", {{"kind", "fpga"}}));  // holds the only device: the rest wait, first come first served
  std::vector<std::uint64_t> a, b;
  for (int i = 0; i < 3; ++i) {
    a.push_back(lease_id(ga.call("acquire", {{"kind", "fpga"}})));
    if (i < 2) b.push_back(lease_id(gb.call("acquire", {{"kind", "fpga"}})));
  }
  // The whole queue: a0 b0 a1 b1 a2.
  using Entries = std::vector<std::pair<std::uint64_t, std::uint64_t>>;  // (position, id)
  auto entries = [](const HttpResult& r) {
    Entries out;
    const auto body = r.json();
    for (const auto& e : body.at("queue").as_array()) {
      out.emplace_back(e.at("position").to_number<std::uint64_t>(), e.at("id").to_number<std::uint64_t>());
    }
    return out;
  };
  auto first = http(port, "GET", "/v1/queue?limit=2", m.token_a);
  REQUIRE(first.status == 200);
  CHECK(entries(first) == Entries{{1, a[0]}, {3, a[1]}});
  CHECK(first.json().at("total").to_number<std::uint64_t>() == 3);
  REQUIRE(first.json().at("next_cursor").to_number<std::uint64_t>() == 2);
  auto second = http(port, "GET", "/v1/queue?limit=2&cursor=2", m.token_a);
  CHECK(entries(second) == Entries{{5, a[2]}});
  CHECK(second.json().at("next_cursor").is_null());
  auto other = http(port, "GET", "/v1/queue", m.token_b);
  CHECK(entries(other) == Entries{{2, b[0]}, {4, b[1]}});
  CHECK(other.json().at("total").to_number<std::uint64_t>() == 2);
  // The admin pages the whole queue, by the same positions; every entry says when it is expected to start (null:
  // no estimate).
  auto admin = m.get("/v1/queue?limit=2&cursor=2");
  CHECK(entries(admin) == Entries{{3, a[1]}, {4, b[1]}});
  CHECK(admin.json().at("total").to_number<std::uint64_t>() == 5);
  CHECK(admin.json().at("queue").at(0).at("expected_start").is_null());
  // A tenant's token still opens nothing else of the admin API, and a wrong token not even the queue; bad paging
  // parameters are refused for a tenant too.
  CHECK(http(port, "GET", "/v1/leases", m.token_a).status == 403);
  CHECK(http(port, "GET", "/v1/queue", "apt_wrong").status == 401);
  CHECK(http(port, "GET", "/v1/queue", "").status == 401);
  auto bad = http(port, "GET", "/v1/queue?cursor=x", m.token_a);
  CHECK(bad.status == 400);
  CHECK(bad.json().at("error").at("code").as_string() == "invalid_argument");
  CHECK(http(port, "POST", "/v1/queue", m.token_a).status == 405);
}

TEST_CASE("bad input gets a clear error, changes nothing, and the daemon keeps serving", "[integration]") {
  Running m(config(1, 30, 1));
  auto g = m.guest(m.token_a, "vm1");
  auto expect_error = [&](const std::string& line, int code) {
    g.send_line(line);
    auto reply = g.read_line();
    REQUIRE(reply);
    auto v = boost::json::parse(*reply).as_object();
    INFO(line << " -> " << *reply);
    REQUIRE(v.contains("error"));
    CHECK(v.at("error").at("code").to_number<int>() == code);
    CHECK(!v.at("error").at("message").as_string().empty());
  };
  expect_error("{not json", -32700);
  expect_error("[1,2]", -32600);
  expect_error(R"({"jsonrpc":"2.0","id":1,"method":"fly"})", -32601);
  expect_error(R"({"jsonrpc":"2.0","id":2,"method":"acquire","params":{"kind":3}})", -32602);
  expect_error(R"({"jsonrpc":"2.0","id":3,"method":"acquire","params":{"kind":"fpga","count":1e300}})", -32602);
  expect_error(R"({"jsonrpc":"2.0","id":4,"method":"acquire","params":{"kind":"fpga","colour":"red"}})", -32602);
  expect_error(R"({"jsonrpc":"2.0","id":5,"method":"release","params":{"lease":184467440737095516150}})", -32602);
  expect_error(R"({"jsonrpc":"2.0","id":6,"method":"release","params":{"lease":-1}})", -32602);
  expect_error(R"({"jsonrpc":"2.0","id":7,"method":"release","params":{"lease":99999}})", -32004);
  expect_error(R"({"jsonrpc":"2.0","id":{"x":1},"method":"list"})", -32600);
  expect_error(R"({"jsonrpc":"2.0","id":8,"method":"acquire","params":{"kind":"fpga","count":0}})", -32602);
  expect_error(R"({"jsonrpc":"2.0","id":9,"method":"hello","params":{"protocol":2,"token":"x","guest":"g"}})", -32602);
  CHECK(m.get("/v1/leases?all=true").json().at("leases").as_array().empty());

  auto port = m.daemon.endpoints().admin_port;
  auto r = http(port, "POST", "/v1/tenants", m.admin, "{\"name\":");
  CHECK(r.status == 400);
  CHECK(r.json().at("error").at("code").as_string() == "invalid_argument");
  CHECK(http(port, "POST", "/v1/tenants", m.admin, R"({"name":"c","weight":"heavy"})").status == 400);
  CHECK(http(port, "POST", "/v1/tenants", m.admin, R"({"name":"c","colour":1})").status == 400);
  CHECK(http(port, "POST", "/v1/tenants", m.admin, R"({"name":"c","max_devices":1e30})").status == 400);
  CHECK(http(port, "POST", "/v1/tenants", m.admin, R"({"name":"bad name"})").status == 400);
  CHECK(http(port, "GET", "/v1/leases/abc", m.admin).status == 400);
  CHECK(http(port, "GET", "/v1/leases?state=sleeping", m.admin).status == 400);
  CHECK(http(port, "GET", "/v1/nothing", m.admin).status == 404);
  CHECK(http(port, "DELETE", "/v1/policy", m.admin).status == 405);
  CHECK(http(port, "POST", "/v1/tenants", m.admin, R"({"name":"a"})").status == 409);
  CHECK(m.get("/v1/tenants").json().at("tenants").as_array().size() == 2);
  // A body over the limit is refused from its Content-Length, before it is read.
  CHECK(http_raw(port, "POST /v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + m.admin +
                           "\r\nContent-Type: application/json\r\nContent-Length: 2097152\r\n\r\n{\"name\":") == 413);
  CHECK(http_raw(port, "GET /v1/leases HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(64 * 1024, 'h') + "\r\n\r\n") ==
        431);
  CHECK(http_raw(port, "GARBAGE\r\n\r\n") == 400);
  // A guest line over the limit ends that connection with an error; others are unaffected.
  {
    auto big = GuestClient::tcp(m.daemon.endpoints().guest_port);
    big.send_line(std::string(100 * 1024, 'y'));
    auto reply = big.read_line();
    REQUIRE(reply);
    CHECK(reply->find("-32600") != std::string::npos);
  }
  CHECK(http(port, "GET", "/healthz", "").status == 200);
  CHECK(lease_state(g.call("acquire", {{"kind", "fpga"}})) == "granted");
}

TEST_CASE("every route in docs/api/openapi.yaml answers as documented", "[integration][openapi]") {
  Running m(config(1, 30, 1));
  auto g = m.guest(m.token_a, "vm1");
  auto id = lease_id(g.call("acquire", {{"kind", "fpga"}}));
  auto port = m.daemon.endpoints().admin_port;
  auto doc = http(port, "GET", "/v1/openapi.yaml", "");
  REQUIRE(doc.status == 200);
  // Walk the paths section: "  /path:" then "    method:" then "        \"NNN\":" response codes.
  std::istringstream in(doc.body);
  std::string line, path, method;
  bool in_paths = false;
  std::map<std::pair<std::string, std::string>, std::set<int>> routes;
  std::regex path_re(R"(^  (/[^:]*):\s*$)"), method_re(R"(^    (get|post|put|patch|delete):\s*$)"),
      code_re(R"re(^        "(\d{3})":)re");
  std::smatch sm;
  while (std::getline(in, line)) {
    if (line == "paths:") in_paths = true;
    if (!in_paths) continue;
    if (std::regex_match(line, sm, path_re))
      path = sm[1], method.clear();
    else if (std::regex_match(line, sm, method_re))
      method = sm[1];
    else if (!method.empty() && std::regex_search(line, sm, code_re))
      routes[{path, method}].insert(std::stoi(sm[1]));
  }
  REQUIRE(routes.size() >= 20);
  const std::map<std::string, std::string> params = {{"{host}", "local"},          {"{local_id}", "fpga0"},
                                                     {"{id}", std::to_string(id)}, {"{name}", "a"},
                                                     {"{bitstream}", "vadd"},      {"{version}", "1.0.0"}};
  const std::map<std::string, std::string> bodies = {{"post /v1/tenants", R"({"name":"t2","weight":2})"},
                                                     {"patch /v1/tenants/{name}", R"({"max_devices":3})"},
                                                     {"put /v1/policy", R"({"policy":"fifo+first-fit"})"},
                                                     {"post /v1/leases/{id}/revoke", R"({"reason":"openapi test"})"}};
  for (const auto& [route, codes] : routes) {
    std::string target = route.first;
    for (const auto& [k, v] : params) {
      for (auto pos = target.find(k); pos != std::string::npos; pos = target.find(k)) target.replace(pos, k.size(), v);
    }
    std::string upper = route.second;
    for (auto& c : upper) c = static_cast<char>(std::toupper(c));
    auto b = bodies.find(route.second + " " + route.first);
    auto r = http(port, upper, target, m.admin, b == bodies.end() ? "" : b->second);
    INFO(upper << " " << target << " -> " << r.status << " " << r.body.substr(0, 200));
    CHECK(codes.count(r.status) == 1);
    CHECK((r.status / 100 == 2 || r.json().at("error").at("message").as_string().size() > 0));
  }
}

TEST_CASE("SIGTERM shuts down cleanly and a restart restores leases and the queue", "[integration][restart]") {
  Running m(config(1, 30, 1));
  std::uint64_t held, waiting;
  {
    auto g = m.guest(m.token_a, "vm1");
    held = lease_id(g.call("acquire", {{"kind", "fpga"}, {"bitstream", "conv"}}));
    waiting = lease_id(g.call("acquire", {{"kind", "fpga"}}));
  }
  m.daemon.stop(SIGTERM);
  CHECK(m.daemon.exit_code() == 0);
  m.daemon.start();
  CHECK(m.admin_lease_state(held) == "granted");
  CHECK(m.admin_lease_state(waiting) == "queued");
  CHECK(m.get("/v1/devices/local/fpga0").json().at("loaded").as_string() == "conv");
  auto g = m.guest(m.token_a, "vm1");
  g.call("release", {{"lease", held}});
  CHECK(m.admin_lease_state(waiting) == "granted");
}

TEST_CASE("the learned run times survive a restart and the admin API shows them", "[integration][restart]") {
  Running m(config(2, 30, 1));
  CHECK(m.get("/v1/estimates").json().at("groups").as_array().empty());  // nothing learned yet
  // Three leases of tenant a with bitstream aes run and are released; one lease that never ran is cancelled.
  auto g = m.guest(m.token_a, "vm1");
  for (int i = 0; i < 3; ++i) {
    auto a = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "aes"}});
    REQUIRE(lease_state(a) == "granted");
    REQUIRE(lease_state(g.call("release", {{"lease", lease_id(a)}})) == "released");
  }
  auto learned = [&] {
    auto r = m.get("/v1/estimates");
    REQUIRE(r.status == 200);
    return r;
  };
  auto before = learned();
  auto body = before.json();
  CHECK(body.at("warmup").to_number<int>() == 3);
  const auto& groups = body.at("groups").as_array();
  REQUIRE(groups.size() == 2);
  // The whole kind first, then the group of tenant a, bitstream aes, one device, no label.
  CHECK(groups.at(0).at("kind").as_string() == "fpga");
  CHECK(groups.at(0).at("whole_kind").as_bool());
  CHECK(groups.at(0).at("tenant").is_null());
  CHECK(groups.at(0).at("observations").to_number<int>() == 3);
  CHECK(groups.at(1).at("whole_kind").as_bool() == false);
  CHECK(groups.at(1).at("tenant").as_string() == "a");
  CHECK(groups.at(1).at("bitstream").as_string() == "aes");
  CHECK(groups.at(1).at("count").to_number<int>() == 1);
  CHECK(groups.at(1).at("label").is_null());
  CHECK(groups.at(1).at("observations").to_number<int>() == 3);
  CHECK(groups.at(1).at("warm").as_bool());
  CHECK(groups.at(1).at("mean_device_s").to_number<double>() >= 0);

  // A crash right after: the store has it all, the restarted manager shows exactly the same.
  m.daemon.stop(SIGKILL);
  m.daemon.start();
  auto after = learned();
  CHECK(after.body == before.body);
  // And goes on learning from there, not afresh.
  auto g2 = m.guest(m.token_a, "vm1");
  auto a = g2.call("acquire", {{"kind", "fpga"}, {"bitstream", "aes"}});
  REQUIRE(lease_state(a) == "granted");
  REQUIRE(lease_state(g2.call("release", {{"lease", lease_id(a)}})) == "released");
  auto more = learned().json();
  CHECK(more.at("groups").at(0).at("observations").to_number<int>() == 4);
  CHECK(more.at("groups").at(1).at("observations").to_number<int>() == 4);
  auto bad = m.get("/v1/estimates?kind=fpga");
  CHECK(bad.status == 400);
}

TEST_CASE("SIGKILL at random moments under load loses no lease and grants none twice", "[integration][crash]") {
  Running m(config(4, 60, 1));
  std::mutex mu;
  std::map<std::uint64_t, std::string> acknowledged;  // lease -> last state a reply reported
  std::set<std::uint64_t> release_sent;
  std::mt19937 rng(12345);
  for (int round = 0; round < 4; ++round) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c) {
      clients.emplace_back([&, c, round] {
        try {
          auto g = GuestClient::tcp(m.daemon.endpoints().guest_port);
          g.hello(c % 2 ? m.token_b : m.token_a, "vm" + std::to_string(c));
          std::vector<std::uint64_t> mine;
          for (int i = 0; !stop; ++i) {
            if (mine.size() < 2) {
              auto r = g.call("acquire", {{"kind", "fpga"}});
              if (!r.contains("result")) continue;
              std::lock_guard lock(mu);
              acknowledged[lease_id(r)] = lease_state(r);
              mine.push_back(lease_id(r));
            } else {
              auto id = mine.front();
              {
                std::lock_guard lock(mu);
                release_sent.insert(id);  // from here a lost reply may hide a release that happened
              }
              auto r = g.call("release", {{"lease", id}});
              mine.erase(mine.begin());
              if (!r.contains("result")) continue;
              std::lock_guard lock(mu);
              acknowledged[id] = lease_state(r);
            }
          }
        } catch (const std::exception&) {
          // the daemon died under us: expected
        }
        (void)round;
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 300));
    m.daemon.stop(SIGKILL);
    stop = true;
    for (auto& t : clients) t.join();
    m.daemon.start();

    std::map<std::uint64_t, boost::json::object> found;
    std::map<std::string, std::uint64_t> holder;
    for (const auto& v : m.all_leases()) {
      const auto& l = v.as_object();
      auto id = l.at("id").to_number<std::uint64_t>();
      found[id] = l;
      std::string st(l.at("state").as_string());
      if (st == "granted" || st == "revoking") {
        for (const auto& d : l.at("devices").as_array()) {
          std::string dev(d.as_string());
          auto other = holder.find(dev);
          INFO("device " << dev << " held by " << id << " and " << (other == holder.end() ? 0 : other->second));
          CHECK(other == holder.end());
          holder[dev] = id;
        }
      }
    }
    std::lock_guard lock(mu);
    for (const auto& [id, state] : acknowledged) {
      INFO("lease " << id << " acknowledged as " << state);
      REQUIRE(found.count(id) == 1);
      std::string now(found[id].at("state").as_string());
      if (state == "released" || state == "cancelled")
        CHECK(now == state);
      else if (release_sent.count(id))
        CHECK((now == "queued" || now == "granted" || now == "released" || now == "cancelled"));
      else
        CHECK((now == "queued" || now == "granted"));
    }
    auto devs = m.get("/v1/devices").json().at("devices").as_array();
    for (const auto& d : devs) {
      if (d.at("lease").is_null()) continue;
      auto h = holder.find(std::string(d.at("name").as_string()));
      REQUIRE(h != holder.end());
      CHECK(h->second == d.at("lease").to_number<std::uint64_t>());
    }
  }
  CHECK(acknowledged.size() > 8);
}

TEST_CASE("the embedded default starts with no config: simulated devices, tokens and the admin URL printed once",
          "[integration][default]") {
  ScratchDaemon scratch("apm-it-", "");
  DaemonProcess& d = scratch.daemon;
  d.start();
  auto out = d.output();
  CHECK(std::regex_search(out, std::regex(R"(admin API http://127\.0\.0\.1:\d+)")));
  std::string admin = d.token("admin token");
  std::string guest = d.token("guest token for tenant default");
  CHECK(admin.rfind("apa_", 0) == 0);
  auto devices = http(d.endpoints().admin_port, "GET", "/v1/devices", admin);
  REQUIRE(devices.status == 200);
  auto devs = devices.json().at("devices").as_array();
  REQUIRE_FALSE(devs.empty());
  bool sim_fpga = false;
  for (const auto& dev : devs) sim_fpga = sim_fpga || dev.at("kind").as_string() == "fpga";
  CHECK(sim_fpga);
  CHECK(http(d.endpoints().admin_port, "GET", "/readyz", "").status == 200);
  // The registry starts with the sample bitstreams.
  auto bitstreams = http(d.endpoints().admin_port, "GET", "/v1/bitstreams/vadd_u250", admin);
  REQUIRE(bitstreams.status == 200);
  // A lease with a sample xclbin on the simulated backend: programmed, then ready.
  auto g = GuestClient::unix_socket(d.endpoints().guest_unix);
  REQUIRE(g.hello(guest, "vm1").contains("result"));
  auto r = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  REQUIRE(lease_state(r) == "granted");
  auto ready = g.wait_notification("lease.granted", lease_id(r));
  REQUIRE(ready);
  CHECK(ready->at("params").at("lease").at("reprogrammed").to_number<int>() == 1);
  d.stop(SIGTERM);
  CHECK(d.exit_code() == 0);
  // A second start prints no tokens: they were shown once.
  d.start();
  CHECK(d.output().find("admin token", out.size()) == std::string::npos);
}

TEST_CASE("a connection that never says hello is closed after the request timeout", "[integration][robustness]") {
  Running m(config(1, 30, 1, "[limits]\nrequest_timeout_s = 0.3\n"));
  auto idle = GuestClient::tcp(m.daemon.endpoints().guest_port);
  auto line = idle.read_line();
  REQUIRE(line);
  CHECK(line->find("\"timeout\"") != std::string::npos);
  CHECK(idle.wait_closed());
  // An authenticated guest may stay quiet longer than that: here while a connection opened after its hello
  // is timed out.
  auto g = m.guest(m.token_a, "vm1");
  auto later = GuestClient::tcp(m.daemon.endpoints().guest_port);
  CHECK(later.wait_closed());
  CHECK(lease_state(g.call("acquire", {{"kind", "fpga"}})) == "granted");
  // A slow admin client is cut off too.
  CHECK(http_raw(m.daemon.endpoints().admin_port, "GET /healthz HTTP/1.1\r\nHost: x\r\n") == 0);
}

TEST_CASE("with a network thread, guests on TCP and the Unix socket are served concurrently",
          "[integration][robustness]") {
  std::string cfg = config(4, 30, 1, "[limits]\nrequest_timeout_s = 0.3\n");
  const std::string unix_line = "unix = \"guest.sock\"\n";
  cfg.replace(cfg.find(unix_line), unix_line.size(), unix_line + "network_thread = true\n");
  Running m(cfg);
  constexpr int kGuests = 6, kCycles = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> guests;
  for (int i = 0; i < kGuests; ++i) {
    guests.emplace_back([&, i] {
      auto c = i % 2 ? GuestClient::unix_socket(m.daemon.endpoints().guest_unix)
                     : GuestClient::tcp(m.daemon.endpoints().guest_port);
      if (!c.hello(i % 3 ? m.token_a : m.token_b, "vm" + std::to_string(i)).contains("result")) ++failures;
      for (int k = 0; k < kCycles; ++k) {
        auto a = c.call("acquire", {{"kind", "fpga"}});
        auto id = lease_id(a);
        // Six guests, four devices: a lease may wait, but it is granted and ready before the release.
        bool ready = a.at("result").at("lease").at("ready").as_bool();
        if (!ready) ready = c.wait_notification("lease.granted", id).has_value();
        auto r = c.call("release", {{"lease", id}});
        if (!ready || lease_state(r) != "released") ++failures;
      }
    });
  }
  for (auto& t : guests) t.join();
  CHECK(failures.load() == 0);
  auto stats = m.get("/v1/stats?window=3600");
  REQUIRE(stats.status == 200);
  CHECK(stats.json().at("windows").at(0).at("all").at("jct_s").at("count").to_number<int>() == kGuests * kCycles);
  // The network thread enforces the line limit and the hello deadline as the owner thread does.
  auto big = GuestClient::tcp(m.daemon.endpoints().guest_port);
  big.send_line(std::string(70 * 1024, 'x'));
  auto err = big.read_line();
  REQUIRE(err);
  CHECK(err->find("invalid_request") != std::string::npos);
  CHECK(big.wait_closed());
  auto idle = GuestClient::tcp(m.daemon.endpoints().guest_port);
  auto line = idle.read_line();
  REQUIRE(line);
  CHECK(line->find("\"timeout\"") != std::string::npos);
  CHECK(idle.wait_closed());
}

namespace {
// Runs accelpoolctl with `args`; returns its exit code and stdout+stderr.
std::pair<int, std::string> ctl(const std::string& url, const std::string& token, const std::string& args) {
  return run_command(std::string("ACCELPOOL_URL=") + url + " ACCELPOOL_TOKEN=" + token + " " + ACCELPOOLCTL_BIN + " " +
                     args);
}
}  // namespace

TEST_CASE("accelpoolctl drives the admin API with tables, JSON and clear errors", "[integration][ctl]") {
  Running m(config(2, 30, 1));
  std::string url = "http://127.0.0.1:" + std::to_string(m.daemon.endpoints().admin_port);
  auto g = m.guest(m.token_a, "vm1");
  auto id = lease_id(g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd"}}));

  auto [rc, out] = ctl(url, m.admin, "devices");
  CHECK(rc == 0);
  CHECK(out.rfind("DEVICE", 0) == 0);
  CHECK(out.find("local/fpga0") != std::string::npos);
  CHECK(out.find("vadd") != std::string::npos);

  auto [rc2, js] = ctl(url, m.admin, "-o json leases");
  CHECK(rc2 == 0);
  auto v = boost::json::parse(js);
  CHECK(v.at("leases").at(0).at("id").to_number<std::uint64_t>() == id);

  // A lease of bitstream conv runs on the other device and is released: the scheduler learned from it.
  auto conv = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "conv"}});
  REQUIRE(lease_state(conv) == "granted");
  REQUIRE(lease_state(g.call("release", {{"lease", lease_id(conv)}})) == "released");
  auto [rc_learned, learned] = ctl(url, m.admin, "estimates");
  CHECK(rc_learned == 0);
  CHECK(learned.rfind("KIND", 0) == 0);
  CHECK(learned.find("(whole kind)") != std::string::npos);
  CHECK(learned.find("tenant a, bitstream conv, 1 device(s), label -") != std::string::npos);

  CHECK(ctl(url, m.admin, "drain local/fpga1").first == 0);
  CHECK(m.get("/v1/devices/local/fpga1").json().at("draining").as_bool());
  CHECK(ctl(url, m.admin, "policy set sjf+pack").first == 0);
  CHECK(ctl(url, m.admin, "policy").second.rfind("sjf+pack", 0) == 0);
  auto [rc3, created] = ctl(url, m.admin, "tenants create team-x --weight 2 --max-devices 3");
  CHECK(rc3 == 0);
  CHECK(created.find("apt_") != std::string::npos);
  CHECK(ctl(url, m.admin, "revoke " + std::to_string(id) + " --reason test").first == 0);
  CHECK(m.admin_lease_state(id) == "revoking");
  CHECK(ctl(url, m.admin, "stats").second.find("WINDOW") != std::string::npos);

  auto [bad_rc, bad_out] = ctl(url, "apa_wrong", "devices");
  CHECK(bad_rc == 4);
  CHECK(bad_out.find("token") != std::string::npos);
  CHECK(ctl(url, m.token_a, "devices").first == 4);
  auto [missing_rc, missing_out] = ctl(url, m.admin, "lease 99999");
  CHECK(missing_rc == 1);
  CHECK(missing_out.find("no lease 99999") != std::string::npos);
  auto [down_rc, down_out] = ctl("http://127.0.0.1:1", m.admin, "devices");
  CHECK(down_rc == 3);
  CHECK(down_out.find("cannot reach") != std::string::npos);
  CHECK(ctl(url, m.admin, "frobnicate").first == 2);
}

TEST_CASE("the admin API lists and finds ended leases long gone from memory, page by page", "[integration][history]") {
  std::string cfg = config(2, 30, 1);
  cfg.insert(cfg.find("[leases]\n") + 9, "history = 3\n");  // a memory window of three ended leases
  Running m(cfg);
  auto g = m.guest(m.token_a, "vm1");
  auto held = g.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(held) == "granted");
  std::vector<std::uint64_t> ended;
  for (int i = 0; i < 12; ++i) {
    auto r = g.call("acquire", {{"kind", "fpga"}});
    REQUIRE(lease_state(r) == "granted");
    REQUIRE(g.call("release", {{"lease", lease_id(r)}}).contains("result"));
    ended.push_back(lease_id(r));
  }
  // The first lease ends after twelve newer ones: the manager serves on and the release is final.
  auto rel = g.call("release", {{"lease", lease_id(held)}});
  REQUIRE(rel.contains("result"));
  CHECK(lease_state(rel) == "released");
  CHECK(m.admin_lease_state(ended.front()) == "released");
  CHECK(m.admin_lease_state(lease_id(held)) == "released");

  std::set<std::uint64_t> listed;
  for (const auto& l : m.all_leases(5)) listed.insert(l.at("id").to_number<std::uint64_t>());
  CHECK(listed.size() == ended.size() + 1);
  CHECK(listed.count(lease_id(held)) == 1);
  for (auto id : ended) CHECK(listed.count(id) == 1);
  auto newest = m.get("/v1/leases?all=true&order=desc&limit=2").json();
  REQUIRE(newest.at("leases").as_array().size() == 2);
  CHECK(newest.at("leases").as_array()[0].at("id").to_number<std::uint64_t>() == ended.back());

  // accelpoolctl follows the pages: every lease, or the newest few.
  const std::string url = "http://127.0.0.1:" + std::to_string(m.daemon.endpoints().admin_port);
  auto [rc_all, js_all] = ctl(url, m.admin, "-o json leases --all");
  REQUIRE(rc_all == 0);
  CHECK(boost::json::parse(js_all).at("leases").as_array().size() == ended.size() + 1);
  auto [rc_new, js_new] = ctl(url, m.admin, "-o json leases --all --newest --limit 4");
  REQUIRE(rc_new == 0);
  auto newest4 = boost::json::parse(js_new).at("leases").as_array();
  REQUIRE(newest4.size() == 4);
  CHECK(newest4[0].at("id").to_number<std::uint64_t>() == ended.back());
  CHECK(ctl(url, m.admin, "leases --limit 0").first == 2);

  // After a restart too (the store is the source).
  m.daemon.stop(SIGKILL);
  m.daemon.start();
  CHECK(m.admin_lease_state(ended.front()) == "released");
  CHECK(m.all_leases(7).size() == ended.size() + 1);

  // Bad paging input is refused with the parameter named.
  for (const std::string bad : {"limit=0", "limit=10001", "limit=x", "cursor=-1", "order=up"}) {
    auto r = m.get("/v1/leases?all=true&" + bad);
    INFO(bad << ": " << r.body);
    CHECK(r.status == 400);
    CHECK(r.body.find(bad.substr(0, bad.find('='))) != std::string::npos);
  }
}

TEST_CASE("a device the in-process host finds failed is never granted", "[integration][host]") {
  Running m(
      "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"guest.sock\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
      "[[hosts]]\nname = \"local\"\nbackend = \"sim\"\n[hosts.settings]\ndevices = \"fpga:sim-u250:3\"\n"
      "failed_devices = \"sim:1\"\n[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n");
  auto g1 = m.guest(m.token_a, "vm1");
  auto g2 = m.guest(m.token_b, "vm2");
  auto two = g1.call("acquire", {{"kind", "fpga"}, {"count", 2}});
  REQUIRE(lease_state(two) == "granted");
  std::set<std::string> granted;
  for (const auto& d : two.at("result").at("lease").at("devices").as_array())
    granted.insert(std::string(d.as_string()));
  CHECK(granted == std::set<std::string>{"local/sim:0", "local/sim:2"});
  // The only device left is the failed one: the next request waits instead of getting it.
  auto one = g2.call("acquire", {{"kind", "fpga"}});
  CHECK(lease_state(one) == "queued");
  auto dev = m.get("/v1/devices/local/sim:1");
  REQUIRE(dev.status == 200);
  CHECK(dev.json().at("lease").is_null());
  CHECK_FALSE(dev.json().at("available").as_bool());
  CHECK(m.get("/v1/queue").json().at("queue").as_array().size() == 1);
}

TEST_CASE("the admin API lists devices and hosts in filtered pages, and accelpoolctl follows them",
          "[integration][paging]") {
  // hv-a has more devices than one page of accelpoolctl holds.
  std::string hosts;
  for (auto [h, n] : {std::pair{"hv-a", 1100}, {"hv-b", 5}, {"hv-c", 5}}) {
    hosts += std::string("[[hosts]]\nname = \"") + h +
             "\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\ncount = " + std::to_string(n) + "\n";
  }
  hosts += "[[hosts.devices]]\nkind = \"gpu\"\ncount = 2\n";  // hv-c has gpus too
  std::string cfg = config(2, 30, 1);
  cfg.insert(cfg.find("[[tenants]]"), hosts);
  Running m(cfg);
  REQUIRE(m.post("/v1/hosts/hv-b/drain").status == 200);

  // Every device once, by name, in pages of 400: 2 local + 1100 + 5 + 5 fpgas + 2 gpus.
  const std::size_t total = 2 + 1100 + 5 + 5 + 2;
  std::vector<std::string> names;
  std::string cursor;
  int pages = 0;
  for (;;) {
    auto r = m.get("/v1/devices?limit=400" + cursor);
    REQUIRE(r.status == 200);
    auto v = r.json();
    ++pages;
    auto devs = v.at("devices").as_array();
    REQUIRE(devs.size() <= 400);
    for (const auto& d : devs) names.emplace_back(d.at("name").as_string());
    if (v.at("next_cursor").is_null()) break;
    CHECK(v.at("next_cursor").as_string() == devs.back().at("name").as_string());
    cursor = "&cursor=" + std::string(v.at("next_cursor").as_string());
    cursor.replace(cursor.find('/'), 1, "%2F");
  }
  CHECK(names.size() == total);
  CHECK(pages == 3);
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());

  // Filters.
  auto count = [&](const std::string& q) { return m.get("/v1/devices?" + q).json().at("devices").as_array().size(); };
  CHECK(count("host=hv-c") == 7);
  CHECK(count("host=hv-c&kind=gpu") == 2);
  CHECK(count("state=draining") == 5);
  CHECK(count("state=draining&host=hv-a") == 0);
  CHECK(count("host=nowhere") == 0);
  auto drained = m.get("/v1/devices?state=draining").json().at("devices").as_array();
  for (const auto& d : drained) CHECK(d.at("host").as_string() == "hv-b");
  // The default page is bounded (1,000) and says that more follow.
  auto first = m.get("/v1/devices").json();
  CHECK(first.at("devices").as_array().size() == 1000);
  CHECK_FALSE(first.at("next_cursor").is_null());

  // Hosts: summaries with device counts, in pages; one host with its devices.
  auto page1 = m.get("/v1/hosts?limit=3").json();
  REQUIRE(page1.at("hosts").as_array().size() == 3);
  CHECK(page1.at("hosts").at(0).at("name").as_string() == "hv-a");
  CHECK(page1.at("hosts").at(0).at("device_count").to_number<int>() == 1100);
  CHECK(page1.at("hosts").at(2).at("device_count").to_number<int>() == 7);
  REQUIRE(page1.at("next_cursor").as_string() == "hv-c");
  auto page2 = m.get("/v1/hosts?limit=3&cursor=hv-c").json();
  REQUIRE(page2.at("hosts").as_array().size() == 1);
  CHECK(page2.at("hosts").at(0).at("name").as_string() == "local");
  CHECK(page2.at("next_cursor").is_null());
  auto draining = m.get("/v1/hosts?draining=true").json().at("hosts").as_array();
  REQUIRE(draining.size() == 1);
  CHECK(draining[0].at("name").as_string() == "hv-b");
  CHECK(m.get("/v1/hosts?connected=false").json().at("hosts").as_array().empty());
  auto one = m.get("/v1/hosts/hv-c").json();
  CHECK(one.at("devices").as_array().size() == 7);
  CHECK(one.at("device_count").to_number<int>() == 7);
  CHECK(m.get("/v1/hosts/nowhere").status == 404);

  // Bad paging and filter input is refused with the parameter named.
  for (const std::string bad :
       {"/v1/devices?limit=0", "/v1/devices?limit=10001", "/v1/devices?cursor=", "/v1/devices?state=busy",
        "/v1/devices?colour=red", "/v1/hosts?limit=x", "/v1/hosts?connected=maybe", "/v1/hosts?kind=fpga"}) {
    auto r = m.get(bad);
    INFO(bad << ": " << r.body);
    CHECK(r.status == 400);
    std::string param = bad.substr(bad.find('?') + 1);
    CHECK(r.body.find(param.substr(0, param.find('='))) != std::string::npos);
  }

  // accelpoolctl reads every page.
  const std::string url = "http://127.0.0.1:" + std::to_string(m.daemon.endpoints().admin_port);
  auto [rc, js] = ctl(url, m.admin, "-o json devices");
  REQUIRE(rc == 0);
  CHECK(boost::json::parse(js).at("devices").as_array().size() == total);
  auto [rc_h, js_h] = ctl(url, m.admin, "-o json devices --host hv-c --kind gpu");
  REQUIRE(rc_h == 0);
  CHECK(boost::json::parse(js_h).at("devices").as_array().size() == 2);
  auto [rc_t, table] = ctl(url, m.admin, "hosts");
  REQUIRE(rc_t == 0);
  CHECK(table.find("hv-c") != std::string::npos);
  CHECK(table.find(" 7 ") != std::string::npos);
}
