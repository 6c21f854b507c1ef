// High availability on PostgreSQL (docs/ha.md): two real accelpool-manager processes on one database of a private
// cluster (tests/support/postgres_cluster.hpp). The leader is killed or paused; the standby takes over from the
// store; what the old leader acknowledged is there, and a fenced leader writes nothing.
#include "postgres_cluster.hpp"
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <signal.h>

#include <map>
#include <random>
#include <set>
#include <sstream>

using namespace accelpool::manager::itest;
using accelpool::testing::eventually;
using accelpool::testing::PostgresCluster;

namespace {

// A manager named `name` on database `url`: four static FPGAs on host "local" (the same host for every manager,
// as one machine's devices would be), tenant t, free ports, a short leader timeout and a quick standby.
std::string ha_config(const std::string& url, const std::string& name, double leader_timeout_s) {
  std::ostringstream o;
  o << "[store]\nurl = \"" << url << "\"\n[ha]\nname = \"" << name << "\"\nleader_timeout_s = " << leader_timeout_s
    << "\nstandby_poll_s = 0.02\n[leases]\nttl_s = 600\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n"
    << "[admin]\nlisten = \"127.0.0.1:0\"\n[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
    << "[[hosts.devices]]\nkind = \"fpga\"\ncount = 4\n[[tenants]]\nname = \"t\"\n";
  return o.str();
}

// A folder removed with everything in it at the end of the test (after the managers in it are gone).
struct Folder {
  std::filesystem::path path = temp_dir("accelpool-ha-");
  ~Folder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Managers a and b on a fresh database `db` of the cluster, with leader timeout `leader_timeout_s`; a started
// (leading, the pool's tokens printed), b not yet.
struct Pair {
  Pair(const std::string& db, double leader_timeout_s)
      : db(db),
        url(PostgresCluster::shared().create_database(db)),
        a(root.path / "a", ha_config(url, "a", leader_timeout_s)),
        b(root.path / "b", ha_config(url, "b", leader_timeout_s)) {
    a.start();
    token = a.token("guest token for tenant t");
    admin = a.token("admin token");
  }
  std::string db, url;
  Folder root;
  DaemonProcess a, b;
  std::string token, admin;
};

std::size_t occurrences(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Launches `d` and waits until it says it is a standby (its count of such lines grows).
void launch_standby(DaemonProcess& d, const std::string& name) {
  const std::string line = "taking over when it is gone manager=" + name + " ";
  const auto before = occurrences(d.output(), line);
  d.launch();
  REQUIRE(eventually([&] { return occurrences(d.output(), line) > before || d.exited(); }));
  INFO(d.output());
  REQUIRE(d.running());
}

// The store's row of lease `id`: "state|devices", "" when there is none.
std::string stored(const std::string& db, std::uint64_t id) {
  return PostgresCluster::shared().sql(db, "SELECT state || '|' || devices FROM leases WHERE id = " + std::to_string(id));
}

// Every device held by a live lease of the store, each once: fails when a device is in two live leases.
void check_no_device_held_twice(const std::string& db) {
  std::istringstream rows(PostgresCluster::shared().sql(
      db, "SELECT devices FROM leases WHERE state IN ('granted', 'revoking') AND devices <> ''"));
  std::set<std::string> held;
  std::string row, device;
  while (std::getline(rows, row)) {
    std::istringstream list(row);
    while (std::getline(list, device, ',')) {
      INFO("device " << device);
      CHECK(held.insert(device).second);
    }
  }
}

}  // namespace

TEST_CASE("ten times the leader is killed and the standby takes over: every acknowledged grant and release is in "
          "the store, no device is held twice",
          "[ha][postgres]") {
  Pair pair("failover", 5);
  const std::string& db = pair.db;
  DaemonProcess &a = pair.a, &b = pair.b;
  const std::string &token = pair.token, &admin = pair.admin;
  launch_standby(b, "b");

  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  DaemonProcess* leader = &a;
  DaemonProcess* standby = &b;
  std::string standby_name = "b", leader_name = "a";
  std::map<std::uint64_t, std::string> acknowledged;  // lease -> the state its last acknowledged reply reported
  std::vector<std::uint64_t> granted;                 // acknowledged granted and not released, oldest first
  for (int round = 0; round < 10; ++round) {
    INFO("round " << round << ", leader " << leader_name);
    GuestClient g = GuestClient::tcp(leader->endpoints().guest_port);
    REQUIRE(g.hello(token, "g").contains("result"));
    // A random number of acknowledged calls, then one more whose reply the kill may or may not let out.
    auto next_call = [&]() -> std::pair<std::string, json::object> {
      if (granted.size() >= 3 || (!granted.empty() && rng() % 2)) {
        return {"release", {{"lease", granted.front()}}};
      }
      return {"acquire", {{"kind", "fpga"}}};
    };
    auto record = [&](const std::string& method, const json::object& params, const json::object& reply) {
      INFO(json::serialize(reply));
      REQUIRE(reply.contains("result"));
      const auto id = lease_id(reply);
      acknowledged[id] = lease_state(reply);
      if (method == "acquire") {
        REQUIRE(lease_state(reply) == "granted");
        granted.push_back(id);
      } else {
        REQUIRE(lease_state(reply) == "released");
        granted.erase(std::find(granted.begin(), granted.end(), params.at("lease").to_number<std::uint64_t>()));
      }
    };
    for (auto n = rng() % 6; n > 0; --n) {
      auto [method, params] = next_call();
      record(method, params, g.call(method, params));
    }
    auto [method, params] = next_call();
    g.send_line(json::serialize(json::object{{"jsonrpc", "2.0"}, {"id", 1000}, {"method", method}, {"params", params}}));
    leader->stop(SIGKILL);
    // A reply that got out before the kill is an acknowledgement like any other; none is fine too.
    bool answered = false;
    while (auto line = g.read_line()) {
      auto v = json::parse(*line).as_object();
      if (v.contains("id") && v.at("id").to_number<int>() == 1000) {
        record(method, params, v);
        answered = true;
      }
    }

    standby->wait_started();  // it leads: restored from the store
    INFO(standby->output());
    if (!answered) {
      // The call without a reply may or may not have been committed: the guest learns which from the new leader,
      // as a client would (its lease back, or gone), and goes on from there.
      std::set<std::uint64_t> live;
      std::istringstream ids(PostgresCluster::shared().sql(db, "SELECT id FROM leases WHERE state = 'granted'"));
      for (std::string id; std::getline(ids, id);) live.insert(std::stoull(id));
      if (method == "release") {
        const auto id = params.at("lease").to_number<std::uint64_t>();
        if (!live.count(id)) {
          acknowledged.erase(id);
          granted.erase(std::find(granted.begin(), granted.end(), id));
        }
      } else {
        for (auto id : live)
          if (std::find(granted.begin(), granted.end(), id) == granted.end()) granted.push_back(id);
      }
    }
    for (const auto& [id, state] : acknowledged) {
      INFO("lease " << id);
      const auto row = stored(db, id);
      CHECK(row.substr(0, row.find('|')) == state);
    }
    check_no_device_held_twice(db);
    // The guest's leases are back on the new leader, granted, on the same devices.
    for (auto id : granted) {
      auto r = http(standby->endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(id), admin);
      REQUIRE(r.status == 200);
      CHECK(r.json().at("state").as_string() == "granted");
    }
    std::swap(leader, standby);
    std::swap(leader_name, standby_name);
    launch_standby(*standby, standby_name);
  }
  CHECK(PostgresCluster::shared().sql(db, "SELECT epoch FROM leader") == "11");

  // Operators see who leads, since when, and the standby.
  const int port = leader->endpoints().admin_port;
  auto view = http(port, "GET", "/v1/leadership", admin);
  REQUIRE(view.status == 200);
  const auto v = view.json().as_object();
  CHECK(v.at("shared").as_bool());
  CHECK(v.at("epoch").to_number<int>() == 11);
  CHECK(v.at("leader").at("name").as_string() == leader_name);
  CHECK(v.at("leader").at("admin_url").as_string() == "http://127.0.0.1:" + std::to_string(port));
  CHECK(v.at("since").to_number<double>() > 0);
  REQUIRE(v.at("standbys").as_array().size() == 1);
  CHECK(v.at("standbys").at(0).at("name").as_string() == standby_name);
  auto [code, text] = run_command(std::string(ACCELPOOLCTL_BIN) + " --url http://127.0.0.1:" + std::to_string(port) +
                                  " --token " + admin + " status");
  INFO(text);
  CHECK(code == 0);
  CHECK(text.find("leader   " + leader_name) != std::string::npos);
  CHECK(text.find("epoch 11 since ") != std::string::npos);
  CHECK(text.find("standby  " + standby_name) != std::string::npos);
}

TEST_CASE("a leader paused past its timeout is fenced: once resumed it writes nothing and steps down",
          "[ha][postgres]") {
  auto& cluster = PostgresCluster::shared();
  Pair pair("paused", 3);
  const std::string& db = pair.db;
  DaemonProcess &a = pair.a, &b = pair.b;
  const std::string& token = pair.token;
  {
    GuestClient g = GuestClient::tcp(a.endpoints().guest_port);
    REQUIRE(g.hello(token, "g").contains("result"));
    REQUIRE(lease_state(g.call("acquire", {{"kind", "fpga"}})) == "granted");
  }
  launch_standby(b, "b");

  // The leader stops (SIGSTOP) with a guest connected; the standby takes over once its term lapses.
  GuestClient g = GuestClient::tcp(a.endpoints().guest_port);
  REQUIRE(::kill(a.pid(), SIGSTOP) == 0);
  b.wait_started();
  const std::string leases_before = cluster.sql(db, "SELECT id || state || devices FROM leases ORDER BY id");
  const std::string leader_before = cluster.sql(db, "SELECT epoch || name || admin_url FROM leader");
  CHECK(cluster.sql(db, "SELECT epoch FROM leader") == "2");

  // While stopped, the guest asks for a device; then the old leader resumes.
  g.send_line(R"({"jsonrpc":"2.0","id":1,"method":"hello","params":{"protocol":1,"token":")" + token +
              R"(","guest":"late"}})");
  g.send_line(R"({"jsonrpc":"2.0","id":2,"method":"acquire","params":{"kind":"fpga"}})");
  REQUIRE(::kill(a.pid(), SIGCONT) == 0);
  REQUIRE(eventually([&] { return a.exited(); }));
  INFO(a.output());
  CHECK(a.output().find("fenced: this manager led with epoch 1, the store is at epoch 2") != std::string::npos);
  // No grant was acknowledged, and the store is as the new leader found it.
  while (auto line = g.read_line()) {
    auto v = json::parse(*line).as_object();
    if (v.contains("id") && v.at("id").to_number<int>() == 2) CHECK_FALSE(v.contains("result"));
  }
  CHECK(cluster.sql(db, "SELECT id || state || devices FROM leases ORDER BY id") == leases_before);
  CHECK(cluster.sql(db, "SELECT epoch || name || admin_url FROM leader") == leader_before);
  CHECK(b.running());
  CHECK_FALSE(b.exited());
}
