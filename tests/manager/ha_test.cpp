// High availability on PostgreSQL (docs/ha.md): two real accelpool-manager processes on one database of a private
// cluster (tests/support/postgres_cluster.hpp). The leader is killed or paused; the standby takes over from the
// store; what the old leader acknowledged is there, and a fenced leader writes nothing.
#include "agent_process.hpp"
#include "postgres_cluster.hpp"
#include "skip.hpp"
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

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

// A TCP port on 127.0.0.1 that was free a moment ago (for managers whose addresses clients must know before they
// start: a client lists every manager of the pool).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The fixed ports of one manager: its guest, agent and admin listeners.
struct Ports {
  int guest = free_port(), agents = free_port(), admin = free_port();
  std::string guest_uri() const { return "tcp://127.0.0.1:" + std::to_string(guest); }
  std::string agents_address() const { return "127.0.0.1:" + std::to_string(agents); }
  std::string admin_url() const { return "http://127.0.0.1:" + std::to_string(admin); }
};

// ha_config on fixed ports `p`, taking host agents, leases of `ttl_s`.
std::string fixed_config(const std::string& url, const std::string& name, const Ports& p, int ttl_s) {
  std::ostringstream o;
  o << "[store]\nurl = \"" << url << "\"\n[ha]\nname = \"" << name
    << "\"\nleader_timeout_s = 5\nstandby_poll_s = 0.02\n"
    << "[leases]\nttl_s = " << ttl_s << "\n[guest]\ntcp = \"127.0.0.1:" << p.guest << "\"\nunix = \"\"\n"
    << "[admin]\nlisten = \"127.0.0.1:" << p.admin << "\"\n[agents]\nlisten = [\"" << p.agents_address()
    << "\"]\ntoken = \"" << kAgentToken << "\"\nheartbeat_timeout_ms = 2000\n"
    << "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\ncount = 4\n"
    << "[[tenants]]\nname = \"t\"\n";
  return o.str();
}

// The state of device `name` as the manager on admin port `port` reports it, "" when it has none such.
std::string device_state(int port, const std::string& admin, const std::string& name) {
  auto r = http(port, "GET", "/v1/devices", admin);
  if (r.status != 200) return "";
  const auto devices = r.json();  // kept: a range-for over a part of a temporary would outlive it
  for (const auto& d : devices.at("devices").as_array())
    if (d.at("name").as_string() == name) return std::string(d.at("state").as_string());
  return "";
}

std::string file_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
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

// Managers a and b on fixed ports (pa, pb: clients list both before they start) on a fresh database `db`, taking
// host agents, leases of `ttl_s`: a leads (the pool's tokens printed), b is its standby.
struct FixedPair {
  FixedPair(const std::string& db, int ttl_s)
      : db(db),
        url(PostgresCluster::shared().create_database(db)),
        a(root.path / "a", fixed_config(url, "a", pa, ttl_s)),
        b(root.path / "b", fixed_config(url, "b", pb, ttl_s)) {
    a.start();
    token = a.token("guest token for tenant t");
    admin = a.token("admin token");
    launch_standby(b, "b");
  }
  std::string db, url;
  Folder root;
  const Ports pa, pb;
  DaemonProcess a, b;
  std::string token, admin;
};

// The store's row of lease `id`: "state|devices", "" when there is none.
std::string stored(const std::string& db, std::uint64_t id) {
  return PostgresCluster::shared().sql(db,
                                       "SELECT state || '|' || devices FROM leases WHERE id = " + std::to_string(id));
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

TEST_CASE(
    "ten times the leader is killed and the standby takes over: every acknowledged grant and release is in "
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
    g.send_line(
        json::serialize(json::object{{"jsonrpc", "2.0"}, {"id", 1000}, {"method", method}, {"params", params}}));
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
  CHECK(a.exit_code() == 3);  // stepped down, whether its renewal or a commit found the new epoch first
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

TEST_CASE(
    "clients given every manager follow the leader: a standby names it, and after the leader is killed the "
    "guest keeps its lease and the agent's devices come back under the new leader",
    "[ha][postgres]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built");
#elif !defined(ACCELPOOL_RUN_BIN)
  ACCELPOOL_SKIP("accelpool-run is not built");
#else
  FixedPair pair("clients", 6);
  const std::string &db = pair.db, &token = pair.token, &admin = pair.admin;
  const Ports &pa = pair.pa, &pb = pair.pb;
  DaemonProcess &a = pair.a, &b = pair.b;
  const Folder& root = pair.root;

  // The standby answers every client, naming the leader's address for that listener.
  {
    GuestClient g = GuestClient::tcp(pb.guest);
    auto reply = g.hello(token, "probe");
    INFO(json::serialize(reply));
    CHECK(error_word(reply) == "not_leader");
    CHECK(reply.at("error").at("data").at("leader").as_string() == pa.guest_uri());
    CHECK(std::string(reply.at("error").at("message").as_string()).find("manager a leads") != std::string::npos);
    CHECK(g.wait_closed());
  }
  // Its admin API serves reads from the store (with the admin token the store holds) and points writes at the
  // leader.
  CHECK(http(pb.admin, "GET", "/healthz", "").status == 200);
  CHECK(http(pb.admin, "GET", "/readyz", "").status == 503);
  CHECK(http(pb.admin, "GET", "/v1/devices", "wrong-token").status == 401);
  {
    auto r = http(pb.admin, "GET", "/v1/leadership", admin);
    INFO(r.body);
    REQUIRE(r.status == 200);
    CHECK(r.json().at("leader").at("name").as_string() == "a");
    CHECK(r.json().at("standbys").at(0).at("name").as_string() == "b");
  }
  {
    auto r = http(pb.admin, "POST", "/v1/hosts/local/drain", admin);
    INFO(r.body);
    CHECK(r.status == 503);
    CHECK(r.json().at("error").at("code").as_string() == "not_leader");
    CHECK(r.json().at("leader").as_string() == pa.admin_url());
  }
  CHECK(device_state(pa.admin, admin, "local/fpga0") == "free");
  // accelpoolctl pointed at the standby follows a write to the leader.
  {
    auto [code, text] = run_command(std::string(ACCELPOOLCTL_BIN) + " --url " + pb.admin_url() + " --token " + admin +
                                    " drain local/fpga0");
    INFO(text);
    CHECK(code == 0);
    CHECK(text.find("is a standby; asking the leader at " + pa.admin_url()) != std::string::npos);
    CHECK(device_state(pa.admin, admin, "local/fpga0") == "draining");
    // The standby's view follows the store: devices as the leader last committed them, and no host connected
    // to it.
    CHECK(eventually([&] {
      auto r = http(pb.admin, "GET", "/v1/devices/local/fpga0", admin);
      return r.status == 200 && r.json().at("draining").as_bool();
    }));
    CHECK(device_state(pb.admin, admin, "local/fpga0") == "draining");
    CHECK(device_state(pb.admin, admin, "local/fpga1") == "free");
    auto hosts = http(pb.admin, "GET", "/v1/hosts", admin);
    INFO(hosts.body);
    REQUIRE(hosts.status == 200);
    CHECK(hosts.json().at("hosts").at(0).at("name").as_string() == "local");
    CHECK_FALSE(hosts.json().at("hosts").at(0).at("connected").as_bool());
  }

  // An agent and a guest, each given both managers, the standby first: they end up on the leader.
  Agent agent(root.path, "h1", "[\"" + pb.agents_address() + "\", \"" + pa.agents_address() + "\"]", "asic:sim-asic:1");
  REQUIRE(eventually([&] { return device_state(pa.admin, admin, "h1/sim:0") == "free"; }));
  // (The agent's log is written by a thread of its own, in batches: the line may come a little later.)
  CHECK(eventually([&] { return agent.log().find("the manager is a standby") != std::string::npos; }));
  const auto started = root.path / "started", go = root.path / "go", rc = root.path / "rc", log = root.path / "run.log";
  const std::string run = std::string(ACCELPOOL_RUN_BIN) + " --pool " + pb.guest_uri() + "," + pa.guest_uri() +
                          " --token " + token + " --guest g1 --kind fpga -- sh -c 'echo $ACCELPOOL_LEASE > " +
                          started.string() + "; while [ ! -e " + go.string() + " ]; do sleep 0.05; done'";
  REQUIRE(std::system(("(" + run + " > " + log.string() + " 2>&1; echo $? > " + rc.string() + ") &").c_str()) == 0);
  REQUIRE(eventually([&] { return !file_text(started).empty(); }));
  const auto lease = std::stoull(file_text(started));
  CHECK(stored(db, lease).rfind("granted|", 0) == 0);

  // The leader dies; the standby takes over from the store.
  a.stop(SIGKILL);
  b.wait_started();
  INFO(b.output());
  auto expires = [&] {
    auto r = http(pb.admin, "GET", "/v1/leases/" + std::to_string(lease), admin);
    return r.status == 200 && r.json().at("state").as_string() == "granted"
               ? r.json().at("expires_at").to_number<double>()
               : 0.0;
  };
  const double restored = expires();
  REQUIRE(restored > 0);
  // The guest is back: its heartbeats (every third of the TTL) reach the new leader and extend its lease.
  REQUIRE(eventually([&] { return expires() > restored; }));
  // The agent registered with the new leader: its device is free again there.
  REQUIRE(eventually([&] { return device_state(pb.admin, admin, "h1/sim:0") == "free"; }));

  // The command ends; accelpool-run releases the lease on the new leader.
  std::ofstream(go) << "go";
  REQUIRE(eventually([&] { return !file_text(rc).empty(); }));
  INFO(file_text(log));
  CHECK(file_text(rc) == "0\n");
  CHECK(file_text(log).find("releasing lease") == std::string::npos);
  CHECK(stored(db, lease).rfind("released|", 0) == 0);
#endif
}

TEST_CASE(
    "a leader that loses its database connection steps down (exit status 3) and writes nothing; the standby "
    "leads",
    "[ha][postgres]") {
  auto& cluster = PostgresCluster::shared();
  Pair pair("lost_db", 3);
  const std::string& db = pair.db;
  DaemonProcess &a = pair.a, &b = pair.b;
  {
    GuestClient g = GuestClient::tcp(a.endpoints().guest_port);
    REQUIRE(g.hello(pair.token, "g").contains("result"));
    REQUIRE(lease_state(g.call("acquire", {{"kind", "fpga"}})) == "granted");
  }
  launch_standby(b, "b");
  const std::string leases_before = cluster.sql(db, "SELECT id || state || devices FROM leases ORDER BY id");

  // The server ends the leader's session (as a database restart or a broken connection would).
  REQUIRE(cluster.sql(db, "SELECT pg_terminate_backend(backend_pid) FROM leader") == "t");
  REQUIRE(eventually([&] { return a.exited(); }));
  INFO(a.output());
  CHECK(a.exit_code() == 3);
  CHECK(a.output().find("stepping down") != std::string::npos);
  b.wait_started();
  CHECK(cluster.sql(db, "SELECT epoch || name FROM leader") == "2b");
  CHECK(cluster.sql(db, "SELECT id || state || devices FROM leases ORDER BY id") == leases_before);

  // Restarted (as a supervisor would), the old leader is a standby of the new one.
  launch_standby(a, "a");
  CHECK(b.running());
}

TEST_CASE(
    "a VM's port relayed by an agent given every manager follows the leader: through the standby's answer "
    "its guest gets a lease, and after the leader is killed the port is relayed to the new leader",
    "[ha][postgres][relay]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built");
#elif !defined(ACCELPOOL_AGENT_HAS_LIBVIRT)
  ACCELPOOL_SKIP("accelpool-agent is built without libvirt: it has no guest relay");
#else
  // Leases of 10 minutes: the guest played here sends no heartbeats.
  FixedPair pair("relay", 600);
  const std::string &db = pair.db, &token = pair.token;
  const auto& root = pair.root.path;

  // One running VM, vm1, listed by libvirt's test driver (in the agent's process, no daemon): its guest channel is
  // a Unix socket that the test listens on, as QEMU would.
  const auto channel = root / "vm1.sock";
  PortListener vm_port(channel);
  const auto node = root / "node.xml";
  std::ofstream(node) << "<node><domain type='test'><name>vm1</name><memory>65536</memory><os><type>hvm</type></os>"
                      << "<devices><channel type='unix'><source mode='bind' path='" << channel.string() << "'/>"
                      << "<target type='virtio' name='org.accelpool.guest.0'/></channel></devices></domain></node>";
  // The agent and its relay are given both managers, the standby first.
  const std::string guest_a = "127.0.0.1:" + std::to_string(pair.pa.guest);
  const std::string guest_b = "127.0.0.1:" + std::to_string(pair.pb.guest);
  const std::string agent_managers = "[\"" + pair.pb.agents_address() + "\", \"" + pair.pa.agents_address() + "\"]";
  const std::string relay = "[libvirt]\nuri = \"test://" + node.string() + "\"\n[relay]\nmanager = [\"" + guest_b +
                            "\", \"" + guest_a + "\"]\nscan_interval_ms = 50\n";
  Agent agent(root, "h1", agent_managers, "asic:sim-asic:1", kAgentToken, "", relay);

  // The standby names the leader; the relay connects the VM's port once the leader accepted it.
  auto port = vm_port.accept();
  INFO(agent.log());
  REQUIRE(port);
  // (The agent's log is written by a thread of its own, in batches: a line may come a little later.)
  const auto logged = [&](const std::string& line) {
    return eventually([&] { return agent.log().find(line) != std::string::npos; });
  };
  CHECK(logged("relay: VM 'vm1': the manager at " + guest_b + " is a standby; the leader is at " + guest_a));
  CHECK(logged("relay: VM 'vm1' connected to the manager at " + guest_a));
  REQUIRE(port->hello(token, "vm1").contains("result"));
  const auto acquired = port->call("acquire", {{"kind", "fpga"}});
  INFO(json::serialize(acquired));
  REQUIRE(lease_state(acquired) == "granted");
  const auto lease = lease_id(acquired);
  {
    auto r = http(pair.pa.admin, "GET", "/v1/leases/" + std::to_string(lease), pair.admin);
    REQUIRE(r.status == 200);
    CHECK(r.json().at("relayed").as_bool());
    CHECK(r.json().at("guest").as_string() == "vm1");
    CHECK(r.json().at("guest_host").as_string() == "h1");
  }
  CHECK(stored(db, lease).rfind("granted|", 0) == 0);

  // The leader dies: the relay closes the VM's side with the manager's, the standby takes over, and the relay
  // connects the same port again, to the new leader.
  pair.a.stop(SIGKILL);
  CHECK(port->wait_closed());
  pair.b.wait_started();
  auto again = vm_port.accept();
  INFO(agent.log());
  REQUIRE(again);
  CHECK(logged("relay: VM 'vm1' connected to the manager at " + guest_b));
  // The guest's next calls work there: its hello finds its lease, restored from the store, and it releases it.
  const auto hello = again->hello(token, "vm1");
  INFO(json::serialize(hello));
  REQUIRE(hello.contains("result"));
  const auto& leases = hello.at("result").at("leases").as_array();
  REQUIRE(leases.size() == 1);
  CHECK(leases.at(0).at("id").to_number<std::uint64_t>() == lease);
  CHECK(leases.at(0).at("state").as_string() == "granted");
  const auto released = again->call("release", {{"lease", lease}});
  INFO(json::serialize(released));
  CHECK(lease_state(released) == "released");
  CHECK(stored(db, lease).rfind("released|", 0) == 0);
#endif
}
