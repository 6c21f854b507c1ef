// Guest security over the real protocol: a guest sees only its own leases (a relayed VM's leases belong to its
// relay), a rotated token ends the sessions opened with it, guest ids are checked at hello, and the reply to a
// heartbeat of every lease stays small. The real accelpool-manager binary on loopback.
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <signal.h>

#include <random>
#include <sstream>

using namespace accelpool::manager::itest;
using namespace std::chrono_literals;

namespace {

constexpr const char* kAgentToken = "agent-token-for-relays-0123";

// One manager with `devices` fpga devices, tenants "a" and "b", and the agent token that relays carry.
struct Manager {
  std::filesystem::path dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::string admin, token_a, token_b;

  explicit Manager(int devices, double ttl_s = 30) {
    std::random_device rd;
    dir = std::filesystem::temp_directory_path() / ("apm-guestsec-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(dir);
    std::ostringstream cfg;
    cfg << "[leases]\nttl_s = " << ttl_s << "\n"
        << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"guest.sock\"\n"
        << "[admin]\nlisten = \"127.0.0.1:0\"\n"
        << "[agents]\ntoken = \"" << kAgentToken << "\"\n"
        << "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
        << "[[hosts.devices]]\nkind = \"fpga\"\ncount = " << devices << "\n"
        << "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n";
    daemon = std::make_unique<DaemonProcess>(dir, cfg.str());
    daemon->start();
    admin = daemon->token("admin token");
    token_a = daemon->token("guest token for tenant a");
    token_b = daemon->token("guest token for tenant b");
  }
  ~Manager() {
    daemon->stop(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  // A direct connection that said hello as `guest`.
  GuestClient direct(const std::string& token, const std::string& guest) {
    auto c = GuestClient::tcp(daemon->endpoints().guest_port);
    REQUIRE(c.hello(token, guest).contains("result"));
    return c;
  }
  // A connection as a host agent relays it for VM `vm` on `host`, after the VM's hello.
  GuestClient relayed(const std::string& token, const std::string& host, const std::string& vm) {
    auto c = GuestClient::tcp(daemon->endpoints().guest_port);
    REQUIRE(c.call("relay", {{"token", kAgentToken}, {"host", host}, {"vm", vm}}).contains("result"));
    REQUIRE(c.hello(token, vm).contains("result"));
    return c;
  }
  json::object admin_lease(std::uint64_t id) {
    auto r = http(daemon->endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(id), admin);
    REQUIRE(r.status == 200);
    return r.json().as_object();
  }
};

json::object lease_param(std::uint64_t id) { return {{"lease", id}}; }

// What a caller that does not own lease `id` is told, for each call on a lease: exactly what it is told about an
// id that does not exist.
void require_not_found_everywhere(GuestClient& c, std::uint64_t id) {
  for (const char* method : {"get", "heartbeat", "release", "cancel"}) {
    INFO(method);
    auto r = c.call(method, lease_param(id));
    REQUIRE(error_word(r) == "not_found");
    CHECK(r.at("error").at("message").as_string() == "no lease " + std::to_string(id));
  }
}

}  // namespace

TEST_CASE("a guest cannot get, heartbeat, release or cancel another guest's lease of its tenant", "[guestsec]") {
  Manager m(1);
  auto owner = m.direct(m.token_a, "vm1");
  auto other = m.direct(m.token_a, "vm2");
  auto granted = owner.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(granted) == "granted");
  auto queued = owner.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(queued) == "queued");

  require_not_found_everywhere(other, lease_id(granted));
  require_not_found_everywhere(other, lease_id(queued));
  // The same words as for an id that was never given out.
  auto none = other.call("get", lease_param(lease_id(queued) + 1000));
  CHECK(error_word(none) == "not_found");
  // A heartbeat of every lease renews only the caller's own.
  auto all = other.call("heartbeat", {});
  REQUIRE(all.contains("result"));
  CHECK(all.at("result").at("renewed").to_number<std::uint64_t>() == 0);
  CHECK(other.call("list", {}).at("result").at("leases").as_array().empty());

  // Nothing changed; the owner still has both, and an admin sees them.
  CHECK(m.admin_lease(lease_id(granted)).at("state").as_string() == "granted");
  CHECK(m.admin_lease(lease_id(queued)).at("state").as_string() == "queued");
  CHECK(lease_state(owner.call("get", lease_param(lease_id(granted)))) == "granted");
  CHECK(lease_state(owner.call("cancel", lease_param(lease_id(queued)))) == "cancelled");
  CHECK(lease_state(owner.call("release", lease_param(lease_id(granted)))) == "released");
}

TEST_CASE("a relayed VM's lease belongs to that VM's relayed port, not to a direct connection using its name",
          "[guestsec]") {
  Manager m(2);
  auto vm = m.relayed(m.token_a, "local", "web-1");
  auto lease = vm.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(lease) == "granted");
  const auto id = lease_id(lease);
  CHECK(lease.at("result").at("lease").at("relayed").as_bool());

  // A direct connection claiming the VM's name, and another VM's port, own nothing of it.
  auto impostor = m.direct(m.token_a, "web-1");
  require_not_found_everywhere(impostor, id);
  auto neighbour = m.relayed(m.token_a, "local", "web-2");
  require_not_found_everywhere(neighbour, id);
  // The same VM name on another host is another VM.
  auto elsewhere = m.relayed(m.token_a, "hv-02", "web-1");
  require_not_found_everywhere(elsewhere, id);
  CHECK(m.admin_lease(id).at("state").as_string() == "granted");

  // The VM's port again (the agent reconnected it) still owns it.
  vm.close();
  auto again = m.relayed(m.token_a, "local", "web-1");
  auto hello_leases = again.hello(m.token_a, "web-1").at("result").at("leases").as_array();
  REQUIRE(hello_leases.size() == 1);
  CHECK(lease_state(again.call("release", lease_param(id))) == "released");
}

TEST_CASE("hello refuses an empty guest id, a NUL byte in it and characters outside the syntax", "[guestsec]") {
  Manager m(1);
  auto c = GuestClient::tcp(m.daemon->endpoints().guest_port);
  for (std::string bad : {std::string(), std::string("vm\0one", 6), std::string("vm one"), std::string(129, 'x')}) {
    INFO("guest id of " << bad.size() << " bytes");
    auto r = c.hello(m.token_a, bad);
    REQUIRE(error_word(r) == "invalid_argument");
    CHECK(std::string(r.at("error").at("message").as_string()).find("'guest'") != std::string::npos);
    // Nothing was authenticated.
    CHECK(error_word(c.call("list", {})) == "unauthorized");
  }
  // The connection still serves a good hello.
  CHECK(c.hello(m.token_a, std::string(128, 'x')).contains("result"));
}

TEST_CASE("a heartbeat of every lease answers in one short line however many leases the guest holds", "[guestsec]") {
  Manager m(1);
  auto c = m.direct(m.token_a, "vm1");
  // As many leases as one guest may hold ([leases] max_per_guest, 1,000 by default; one granted, the rest queued),
  // acquired in pipelined batches.
  constexpr int kLeases = 1000, kBatch = 500;
  for (int sent = 0; sent < kLeases; sent += kBatch) {
    for (int i = 0; i < kBatch; ++i) {
      c.send_line(R"({"jsonrpc":"2.0","id":"acq","method":"acquire","params":{"kind":"fpga"}})");
    }
    for (int replies = 0; replies < kBatch;) {
      auto line = c.read_line(60s);
      REQUIRE(line);
      if (line->find("\"method\"") != std::string::npos) continue;  // lease.granted of the first one
      REQUIRE(line->find("\"result\"") != std::string::npos);
      ++replies;
    }
  }
  c.send_line(R"({"jsonrpc":"2.0","id":"hb","method":"heartbeat","params":{}})");
  auto line = c.read_line(60s);
  REQUIRE(line);  // before: every lease in one line (about 4 MiB at 9,000 leases, where the connection is dropped)
  CHECK(line->size() < 1024);
  auto r = json::parse(*line).as_object();
  CHECK(r.at("result").at("renewed").to_number<std::uint64_t>() == kLeases);
  CHECK(r.at("result").at("expires_at").is_double());
  CHECK(c.call("get", lease_param(1)).contains("result"));  // the connection stays

  // One more is refused, so `list` and `hello` list at most max_per_guest leases.
  auto refused = c.call("acquire", {{"kind", "fpga"}});
  REQUIRE(error_word(refused) == "quota_exceeded");
  CHECK_THAT(std::string(refused.at("error").at("message").as_string()), Catch::Contains("max_per_guest"));
  auto listed = c.call("list", {});
  CHECK(listed.at("result").at("leases").as_array().size() == kLeases);
}

TEST_CASE("rotating a tenant token ends the sessions opened with the old one, saying why", "[guestsec]") {
  Manager m(2);
  auto a1 = m.direct(m.token_a, "vm1");
  auto a2 = m.relayed(m.token_a, "local", "web-1");
  auto b = m.direct(m.token_b, "vm3");
  auto lease = a1.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(lease) == "granted");

  auto r = http(m.daemon->endpoints().admin_port, "POST", "/v1/tenants/a/rotate-token", m.admin, "{}");
  REQUIRE(r.status == 200);
  const std::string new_token(r.json().at("token").as_string());

  for (auto* c : {&a1, &a2}) {
    std::optional<std::string> line;
    do {
      line = c->read_line(30s);
      REQUIRE(line);
    } while (line->find("\"method\"") != std::string::npos);  // lease notifications that came first
    auto err = json::parse(*line).as_object();
    CHECK(error_word(err) == "unauthorized");
    CHECK(std::string(err.at("error").at("message").as_string()).find("rotated") != std::string::npos);
    CHECK_FALSE(c->read_line(30s));  // then the connection closes
  }
  // Tenant b's session goes on; the old token opens nothing, the new one does.
  CHECK(b.call("list", {}).contains("result"));
  auto old = GuestClient::tcp(m.daemon->endpoints().guest_port);
  CHECK(error_word(old.hello(m.token_a, "vm1")) == "unauthorized");
  auto fresh = m.direct(new_token, "vm1");
  CHECK(lease_state(fresh.call("release", lease_param(lease_id(lease)))) == "released");
}

TEST_CASE("a queued request is granted with the expiry of its guest's last heartbeat, not a fresh TTL", "[guestsec]") {
  Manager m(1);
  auto holder = m.direct(m.token_a, "vm1");
  auto held = holder.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(held) == "granted");
  auto waiting = [&] {
    auto gone = m.direct(m.token_a, "vm2");
    auto r = gone.call("acquire", {{"kind", "fpga"}});
    REQUIRE(lease_state(r) == "queued");
    return r.at("result").at("lease").as_object();
  }();  // its guest disconnects and never heartbeats again
  REQUIRE(lease_state(holder.call("release", lease_param(lease_id(held)))) == "released");

  auto now = m.admin_lease(waiting.at("id").to_number<std::uint64_t>());
  REQUIRE(now.at("state").as_string() == "granted");
  // Before: granted_at + TTL, so a dead guest's request held the device for up to two TTLs.
  CHECK(now.at("expires_at").as_double() == waiting.at("expires_at").as_double());
}
