// Many hosts, end to end: the real accelpool-manager with its agent listener on loopback and real
// accelpool-agent processes (separate simulated pools) joining it, losing them by SIGKILL and taking them back.
#include "agent_process.hpp"
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include "child_exit.hpp"
#include "skip.hpp"
#include "test_pki.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

using namespace accelpool::manager::itest;
using namespace std::chrono_literals;

namespace {

#ifdef ACCELPOOL_AGENT_BIN

using SteadyClock = std::chrono::steady_clock;

constexpr int kHeartbeatTimeoutMs = 1500;

// A manager taking agents; `agents_keys` ("key = value\n" lines) are added to its [agents] table.
struct Pool : ScratchDaemon {
  std::string admin, token;
  explicit Pool(const std::string& agents_keys = "")
      : ScratchDaemon("apm-agents-",
                      agent_manager_config(
                          kAgentToken, "revoke_grace_s = 5\n",
                          "heartbeat_timeout_ms = " + std::to_string(kHeartbeatTimeoutMs) + "\n" + agents_keys)) {
    daemon.start();
    admin = daemon.token("admin token");
    token = daemon.token("guest token for tenant t");
  }
  // name -> {state, lease (0 for none)}
  std::map<std::string, std::pair<std::string, std::uint64_t>> devices() {
    auto r = http(daemon.endpoints().admin_port, "GET", "/v1/devices", admin);
    REQUIRE(r.status == 200);
    std::map<std::string, std::pair<std::string, std::uint64_t>> out;
    auto body = r.json();
    for (const auto& d : body.at("devices").as_array()) {
      const auto& o = d.as_object();
      std::uint64_t lease = o.at("lease").is_null() ? 0 : o.at("lease").to_number<std::uint64_t>();
      out[std::string(o.at("name").as_string())] = {std::string(o.at("state").as_string()), lease};
    }
    return out;
  }
  std::string lease_state(std::uint64_t id) {
    auto r = http(daemon.endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(id), admin);
    REQUIRE(r.status == 200);
    return std::string(r.json().at("state").as_string());
  }
  GuestClient guest(const std::string& id) {
    auto c = GuestClient::tcp(daemon.endpoints().guest_port);
    REQUIRE(c.hello(token, id).contains("result"));
    return c;
  }
};

// Polls `cond` every 20 ms for up to `timeout`; returns how long it took, or nullopt.
std::optional<std::chrono::milliseconds> wait_for(const std::function<bool()>& cond,
                                                  std::chrono::milliseconds timeout) {
  auto start = SteadyClock::now();
  while (SteadyClock::now() - start < timeout) {
    if (cond()) return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start);
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

#endif

}  // namespace

TEST_CASE("remote agents join, a SIGKILLed agent's devices become unavailable and come back on restart",
          "[integration][agents]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  Pool p;
  REQUIRE(!p.daemon.endpoints().agents.empty());
  const std::string mgr = p.daemon.endpoints().agents;
  Agent a(p.dir, "host-a", mgr, "fpga:sim-u250:2");
  Agent b(p.dir, "host-b", mgr, "gpu:sim-gpu:1");
  REQUIRE(wait_for([&] { return p.devices().size() == 4; }, kHungAfter));
  auto devs = p.devices();
  CHECK(devs.at("host-a/sim:0").first == "free");
  CHECK(devs.at("host-a/sim:1").first == "free");
  CHECK(devs.at("host-b/sim:0").first == "free");
  CHECK(devs.at("local/asic0").first == "free");

  // Guest g1 holds both of A's FPGAs; w1 holds B's GPU and w2 waits for a GPU.
  auto g1 = p.guest("vm-g1");
  auto l1 = lease_id(g1.call("acquire", {{"kind", "fpga"}, {"count", 2}, {"bitstream", "vadd"}}));
  auto granted = g1.wait_notification("lease.granted", l1);
  REQUIRE(granted);
  // The grant says what the agent did with each device: programmed vadd; the guest reaches these simulated
  // devices over the network.
  const auto& info = granted->at("params").at("lease").at("device_info").as_array();
  REQUIRE(info.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& d = info[i].as_object();
    CHECK(d.at("name") == granted->at("params").at("lease").at("devices").at(i));
    CHECK(d.at("model") == "sim-u250");
    CHECK(d.at("vendor") == "accelpool simulator");
    CHECK(d.at("loaded") == "vadd");
    CHECK(d.at("attach") == "network");
  }
  auto w1 = p.guest("vm-w1");
  auto lw1 = lease_id(w1.call("acquire", {{"kind", "gpu"}}));
  REQUIRE(w1.wait_notification("lease.granted", lw1));
  auto w2 = p.guest("vm-w2");
  auto lw2 = lease_id(w2.call("acquire", {{"kind", "gpu"}}));
  CHECK(p.lease_state(lw2) == "queued");
  CHECK(p.devices().at("host-a/sim:0").second == l1);

  // SIGKILL A: its devices become unavailable (the time it took is reported), g1's lease goes back to the queue.
  a.stop(SIGKILL);
  auto took = wait_for(
      [&] {
        auto d = p.devices();
        return d.at("host-a/sim:0").first == "unavailable" && d.at("host-a/sim:1").first == "unavailable";
      },
      kHungAfter);
  REQUIRE(took);
  WARN("agent SIGKILL -> devices unavailable in " << took->count() << " ms");
  CHECK(g1.wait_notification("lease.requeued", l1));
  CHECK(p.lease_state(l1) == "queued");
  CHECK(p.devices().at("host-a/sim:0").second == 0);
  // Nothing else changed: B's GPU still serves w1, w2 still waits, the local device is free.
  CHECK(p.lease_state(lw1) == "granted");
  CHECK(p.lease_state(lw2) == "queued");
  CHECK(p.devices().at("host-b/sim:0").second == lw1);
  CHECK(p.devices().at("local/asic0").first == "free");

  // A wrong agent token is refused and changes nothing.
  {
    Agent bad(p.dir, "host-z", mgr, "fpga:sim-u250:1", "not-the-agent-token");
    auto rc = bad.wait_exit(kHungAfter);
    REQUIRE(rc);
    CHECK(*rc != 0);
    CHECK(bad.log().find("wrong agent token") != std::string::npos);
    auto d = p.devices();
    CHECK(d.size() == 4);
    CHECK(d.count("host-z/sim:0") == 0);
    CHECK(d.at("host-a/sim:0").first == "unavailable");
  }

  // A comes back under the same name: its devices are available again and g1's lease is granted again there.
  a.start();
  auto back = wait_for([&] { return p.lease_state(l1) == "granted"; }, kHungAfter);
  REQUIRE(back);
  WARN("agent restart -> lease granted again in " << back->count() << " ms");
  CHECK(g1.wait_notification("lease.granted", l1));
  auto d = p.devices();
  CHECK(d.at("host-a/sim:0").second == l1);
  CHECK(d.at("host-a/sim:1").second == l1);
  CHECK(p.lease_state(lw2) == "queued");

  // Releasing g1 frees A's devices through the returned agent.
  g1.call("release", {{"lease", l1}});
  CHECK(wait_for([&] { return p.devices().at("host-a/sim:0").first == "free"; }, kHungAfter));

  // An agent that hangs (SIGSTOP: its connection stays open, no heartbeats) is lost after the heartbeat timeout.
  auto stopped_at = SteadyClock::now();
  b.signal(SIGSTOP);
  auto silent = wait_for([&] { return p.devices().at("host-b/sim:0").first == "unavailable"; }, kHungAfter);
  REQUIRE(silent);
  auto lost_after = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - stopped_at);
  WARN("agent SIGSTOP -> devices unavailable in " << lost_after.count() << " ms (heartbeat timeout "
                                                  << kHeartbeatTimeoutMs << " ms)");
  CHECK(w1.wait_notification("lease.requeued", lw1));
  CHECK(p.lease_state(lw1) == "queued");
  CHECK(p.lease_state(lw2) == "queued");
  // It wakes up, reconnects, and its GPU serves one of the two waiting guests.
  b.signal(SIGCONT);
  CHECK(wait_for([&] { return p.devices().at("host-b/sim:0").first == "leased"; }, kHungAfter));
#endif
}

TEST_CASE(
    "three agents pool their devices: a gang spans hosts, a drained host serves no one new, a killed one "
    "reconciles on restart",
    "[integration][agents][drain]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  Pool p;
  const std::string mgr = p.daemon.endpoints().agents;
  const int admin = p.daemon.endpoints().admin_port;
  Agent a(p.dir, "host-a", mgr, "fpga:sim-u250:2");
  Agent b(p.dir, "host-b", mgr, "fpga:sim-u250:1");
  Agent c(p.dir, "host-c", mgr, "fpga:sim-u250:1");
  REQUIRE(wait_for([&] { return p.devices().size() == 5; }, kHungAfter));
  auto hosts_of = [&](std::uint64_t lease) {
    std::set<std::string> h;
    for (const auto& [name, d] : p.devices()) {
      if (d.second == lease) h.insert(name.substr(0, name.find('/')));
    }
    return h;
  };

  // One gang of four FPGAs takes every FPGA of the three agents: network-attached devices pool across hosts.
  auto g1 = p.guest("vm-g1");
  auto l1 = lease_id(g1.call("acquire", {{"kind", "fpga"}, {"count", 4}}));
  REQUIRE(g1.wait_notification("lease.granted", l1));
  CHECK(hosts_of(l1) == std::set<std::string>{"host-a", "host-b", "host-c"});

  // Drain host-c with a 1 s deadline: the lease still on it is warned, the guest gives it back.
  auto bad = http(admin, "POST", "/v1/hosts/host-c/drain", p.admin, R"({"deadline_s":-3})");
  CHECK(bad.status == 400);
  CHECK(http(admin, "POST", "/v1/hosts/host-q/drain", p.admin).status == 404);
  CHECK(http(admin, "GET", "/v1/hosts/host-c", p.admin).json().at("draining").as_bool() == false);
  auto drained = http(admin, "POST", "/v1/hosts/host-c/drain", p.admin, R"({"deadline_s":1})");
  REQUIRE(drained.status == 200);
  CHECK(drained.json().at("draining").as_bool());
  CHECK(p.lease_state(l1) == "granted");
  auto warned = g1.wait_notification("lease.revoking", l1);
  REQUIRE(warned);
  g1.call("release", {{"lease", l1}});
  REQUIRE(wait_for([&] { return p.devices().at("host-a/sim:0").first == "free"; }, kHungAfter));
  CHECK(p.devices().at("host-c/sim:0").first == "draining");

  // Four FPGAs are no longer there to grant: the next gang waits, three do not.
  auto g2 = p.guest("vm-g2");
  auto l2 = lease_id(g2.call("acquire", {{"kind", "fpga"}, {"count", 3}}));
  REQUIRE(g2.wait_notification("lease.granted", l2));
  CHECK(hosts_of(l2) == std::set<std::string>{"host-a", "host-b"});
  auto g3 = p.guest("vm-g3");
  auto l3 = lease_id(g3.call("acquire", {{"kind", "fpga"}, {"count", 1}}));
  CHECK(p.lease_state(l3) == "queued");

  // SIGKILL host-b: its device becomes unavailable and g2's gang goes back to the queue; host-c stays drained.
  b.stop(SIGKILL);
  REQUIRE(wait_for([&] { return p.devices().at("host-b/sim:0").first == "unavailable"; }, kHungAfter));
  CHECK(g2.wait_notification("lease.requeued", l2));
  CHECK(p.devices().at("host-c/sim:0").first == "draining");
  CHECK(p.devices().at("host-c/sim:0").second == 0);

  // Undrain host-c and restart host-b: the manager's store is the source of truth, b's device is available again,
  // and the four FPGAs serve both waiting guests (g2's gang of three spans hosts again).
  REQUIRE(http(admin, "POST", "/v1/hosts/host-c/undrain", p.admin).status == 200);
  b.start();
  REQUIRE(wait_for([&] { return p.lease_state(l2) == "granted" && p.lease_state(l3) == "granted"; }, kHungAfter));
  CHECK(hosts_of(l2).size() >= 2);
  std::size_t leased = 0;
  for (const auto& [name, d] : p.devices()) leased += d.first == "leased" ? 1 : 0;
  CHECK(leased == 4);
  auto hosts = http(admin, "GET", "/v1/hosts", p.admin).json();
  std::size_t connected = 0, draining = 0;
  for (const auto& h : hosts.at("hosts").as_array()) {
    connected += h.at("connected").as_bool() ? 1 : 0;
    draining += h.at("draining").as_bool() ? 1 : 0;
  }
  CHECK(connected == 4);  // host-a, host-b, host-c and the local host
  CHECK(draining == 0);
#endif
}

TEST_CASE(
    "agents over mutual TLS: a certified agent registers and serves a lease, one without a certificate of the "
    "pool's CA is refused at the handshake and the manager serves on",
    "[integration][agents][tls]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  const auto pki = temp_dir("apm-agent-pki-");
  struct RemoveAfter {
    std::filesystem::path dir;
    ~RemoveAfter() { std::filesystem::remove_all(dir); }
  } remove_pki{pki};
  accelpool::testing::TestCa ca(pki, "pool"), other(pki, "other");
  const auto server = ca.server("manager", "IP:127.0.0.1");
  auto keys = [](const accelpool::testing::CertFiles& f) {
    return "tls_cert = \"" + f.cert.string() + "\"\ntls_key = \"" + f.key.string() + "\"\n";
  };
  const std::string trust = "tls_ca = \"" + ca.cert().string() + "\"\n";
  Pool p(keys(server) + "tls_client_ca = \"" + ca.cert().string() + "\"\n");
  const std::string mgr = p.daemon.endpoints().agents;

  Agent a(p.dir, "host-a", mgr, "fpga:sim-u250:1", kAgentToken, trust + keys(ca.client("host-a", "host-a")));
  REQUIRE(wait_for([&] { return p.devices().size() == 2; }, kHungAfter));
  CHECK(wait_for([&] { return a.log().find("registered with the manager") != std::string::npos; }, kHungAfter));
  auto g = p.guest("vm-tls");
  auto lease = lease_id(g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd"}}));
  auto granted = g.wait_notification("lease.granted", lease);
  REQUIRE(granted);
  CHECK(granted->at("params").at("lease").at("devices").at(0) == "host-a/sim:0");
  CHECK(p.devices().at("host-a/sim:0").second == lease);

  // Refused at the handshake, each retrying meanwhile: no client certificate, one another CA signed, no TLS.
  {
    Agent bare(p.dir, "host-n", mgr, "fpga:sim-u250:1", kAgentToken, trust);
    Agent foreign(p.dir, "host-x", mgr, "fpga:sim-u250:1", kAgentToken, trust + keys(other.client("host-x", "host-x")));
    Agent plain(p.dir, "host-p", mgr, "fpga:sim-u250:1");
    for (auto* refused : {&bare, &foreign}) {
      CHECK(wait_for([&] { return refused->log().find("tls_error=") != std::string::npos; }, kHungAfter));
    }
    CHECK(
        wait_for([&] { return plain.log().find("connection to the manager lost") != std::string::npos; }, kHungAfter));
    CHECK(wait_for(
        [&] { return p.daemon.output().find("agent connection refused at the TLS handshake") != std::string::npos; },
        kHungAfter));
    auto d = p.devices();
    CHECK(d.size() == 2);
    CHECK(d.count("host-n/sim:0") + d.count("host-x/sim:0") + d.count("host-p/sim:0") == 0);
    for (const auto* refused : {&bare, &foreign, &plain}) {
      CHECK(refused->log().find("registered with the manager") == std::string::npos);
    }
  }

  // The manager serves on: the lease goes back through the certified agent.
  g.call("release", {{"lease", lease}});
  CHECK(wait_for([&] { return p.devices().at("host-a/sim:0").first == "free"; }, kHungAfter));
#endif
}

TEST_CASE("no token appears in the logs of the manager and its agents over a whole lease life cycle at debug level",
          "[integration][agents][log]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  ScratchDaemon m("apm-logs-", agent_manager_config(kAgentToken) + "[log]\nlevel = \"debug\"\nformat = \"json\"\n");
  m.daemon.start();
  const std::string first_start = m.daemon.output();
  const int admin_port = m.daemon.endpoints().admin_port;
  const std::string admin = m.daemon.token("admin token");
  std::map<std::string, std::string> tokens = {
      {"agent", kAgentToken}, {"first admin", admin}, {"first guest", m.daemon.token("guest token for tenant t")}};
  const std::string debug_log = "[log]\nlevel = \"debug\"\n";
  Agent agent(m.dir, "hv-logs", m.daemon.endpoints().agents, "fpga:sim-u250:2", kAgentToken, "", debug_log);
  auto devices_of_agent = [&] {
    auto r = http(admin_port, "GET", "/v1/hosts/hv-logs", admin);
    return r.status == 200 && r.json().at("devices").as_array().size() == 2;
  };
  REQUIRE(accelpool::testing::eventually(devices_of_agent));

  // Admin calls: a second admin token created, rotated and revoked; the tenant's token rotated; refused tokens.
  auto created = http(admin_port, "POST", "/v1/admin-tokens", admin, R"({"name":"ops-2"})");
  REQUIRE(created.status == 201);
  tokens["created admin"] = std::string(created.json().at("token").as_string());
  auto rotated_admin = http(admin_port, "POST", "/v1/admin-tokens/ops-2/rotate", admin);
  REQUIRE(rotated_admin.status == 200);
  tokens["rotated admin"] = std::string(rotated_admin.json().at("token").as_string());
  auto rotated_guest = http(admin_port, "POST", "/v1/tenants/t/rotate-token", admin);
  REQUIRE(rotated_guest.status == 200);
  const std::string guest_token = std::string(rotated_guest.json().at("token").as_string());
  tokens["rotated guest"] = guest_token;
  tokens["wrong admin"] = "apa_wrong-admin-token-0123456789abcdef";
  CHECK(http(admin_port, "GET", "/v1/leases", tokens["wrong admin"]).status == 401);
  CHECK(http(admin_port, "GET", "/v1/leases", tokens["first admin"] + "x").status == 401);
  CHECK(http(admin_port, "GET", "/v1/leases", guest_token).status == 403);
  CHECK(http(admin_port, "DELETE", "/v1/admin-tokens/ops-2", admin).status == 200);
  CHECK(http(admin_port, "GET", "/v1/leases", tokens["rotated admin"]).status == 401);

  // A guest: refused with the old and a wrong token, then a whole lease on the agent's devices (programmed).
  auto guest = GuestClient::tcp(m.daemon.endpoints().guest_port);
  tokens["wrong guest"] = "apt_wrong-guest-token-0123456789abcdef";
  CHECK(error_word(guest.hello(tokens["first guest"], "vm-logs")) == "unauthorized");
  CHECK(error_word(guest.hello(tokens["wrong guest"], "vm-logs")) == "unauthorized");
  REQUIRE(guest.hello(guest_token, "vm-logs").contains("result"));
  auto lease = lease_id(guest.call("acquire", {{"kind", "fpga"}, {"count", 2}, {"bitstream", "vadd"}}));
  REQUIRE(guest.wait_notification("lease.granted", lease));
  CHECK(lease_state(guest.call("release", {{"lease", lease}})) == "released");
  CHECK(http(admin_port, "GET", "/v1/leases/" + std::to_string(lease), admin).status == 200);

  // An agent with a wrong token is refused for good.
  tokens["wrong agent"] = "wrong-agent-token-0123456789";
  Agent bad(m.dir, "hv-bad", m.daemon.endpoints().agents, "fpga:sim-u250:1", tokens["wrong agent"], "", debug_log);
  CHECK(bad.wait_exit(kHungAfter) == 2);

  agent.stop(SIGTERM);
  REQUIRE(accelpool::testing::eventually([&] {
    auto r = http(admin_port, "GET", "/v1/hosts/hv-logs", admin);
    return r.status == 200 && !r.json().at("connected").as_bool();
  }));
  m.daemon.stop(SIGTERM);
  REQUIRE(m.daemon.exit_code() == 0);

  // The tokens a first start creates are shown once on stdout, on their own lines; no other line holds a token.
  std::string manager_log;
  std::size_t shown_once = 0, json_lines = 0;
  std::istringstream lines(m.daemon.output());
  for (std::string line; std::getline(lines, line);) {
    if (line.find("(shown once): ") != std::string::npos) {
      CHECK(first_start.find(line) != std::string::npos);
      ++shown_once;
      continue;
    }
    if (line.rfind("{", 0) == 0) {
      ++json_lines;
      CHECK_NOTHROW(json::parse(line));  // [log] format = "json": every log line is one JSON object
    }
    manager_log += line + "\n";
  }
  CHECK(shown_once == 2);
  CHECK(json_lines > 10);
  const std::string agent_log = agent.log() + bad.log();
  for (const auto& [what, token] : tokens) {
    INFO(what << " token");
    REQUIRE(token.size() >= 20);
    for (const std::string& part : {token, token.substr(token.size() / 2 - 6, 12)}) {
      CHECK(manager_log.find(part) == std::string::npos);
      CHECK(agent_log.find(part) == std::string::npos);
    }
  }
  // The logs did record the life cycle at debug level (so the check above looked at something).
  for (const char* event : {"\"host joined\"", "\"admin request\"", "\"admin token created\"",
                            "\"admin token rotated\"", "\"admin token revoked\"", "\"tenant token rotated\"",
                            "\"guest hello refused\"", "\"guest hello\"", "\"lease acquired\"", "\"lease granted\"",
                            "\"device reprogrammed\"", "\"lease ended\"", "\"host lost\"", "\"shutting down\""}) {
    CHECK_THAT(manager_log, Catch::Contains(event));
  }
  for (const char* event :
       {"registered with the manager", "device prepared", "device released", "registration refused"}) {
    CHECK_THAT(agent_log, Catch::Contains(event));
  }
#endif
}
