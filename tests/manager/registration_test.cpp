// Agent registration end to end: the real accelpool-manager with its agent listener on loopback, agents played
// by a plain JSON-lines client. A registration the pool refuses gets an error reply and changes nothing: the
// host that holds the name keeps its devices and leases, before and after the refused agent disconnects.
#include "hung_after.hpp"
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include "skip.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

using namespace accelpool::manager::itest;

namespace {

#ifdef ACCELPOOL_AGENT_BIN

const std::string kAgentToken = "agent-token-0123456789";

// A manager whose own host "local" has one network-attached asic, and an agent listener.
struct Manager : ScratchDaemon {
  std::string admin, token;
  Manager() : ScratchDaemon("apm-register-", agent_manager_config(kAgentToken)) {
    daemon.start();
    admin = daemon.token("admin token");
    token = daemon.token("guest token for tenant t");
  }
  GuestClient agent_connection() {
    const auto& a = daemon.endpoints().agents;
    return GuestClient::tcp(std::stoi(a.substr(a.rfind(':') + 1)));
  }
  GuestClient guest(const std::string& id) {
    auto c = GuestClient::tcp(daemon.endpoints().guest_port);
    REQUIRE(c.hello(token, id).contains("result"));
    return c;
  }
  json::object device(const std::string& name) {
    auto r = http(daemon.endpoints().admin_port, "GET", "/v1/devices", admin);
    REQUIRE(r.status == 200);
    auto body = r.json();
    for (const auto& d : body.at("devices").as_array())
      if (d.at("name").as_string() == name) return d.as_object();
    return {};
  }
  std::string lease_state(std::uint64_t id) {
    auto r = http(daemon.endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(id), admin);
    REQUIRE(r.status == 200);
    return std::string(r.json().at("state").as_string());
  }
};

json::object register_params(const std::string& host, const std::string& device_id, const std::string& kind = "asic") {
  return {{"token", kAgentToken},
          {"host", host},
          {"protocol", 1},
          {"devices",
           json::array{json::object{{"id", device_id}, {"kind", kind}, {"model", "m"}, {"passthrough", false}}}}};
}

std::string error_message(const json::object& reply) {
  return std::string(reply.at("error").at("message").as_string());
}

#endif

}  // namespace

TEST_CASE(
    "an agent registering under the name of the manager's own host is refused: that host keeps its devices "
    "and leases",
    "[integration][agents][registration]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  Manager m;
  auto g = m.guest("vm-1");
  auto held = g.call("acquire", {{"kind", "asic"}});
  REQUIRE(lease_state(held) == "granted");
  auto lease = lease_id(held);

  auto impostor = m.agent_connection();
  auto reply = impostor.call("agent.register", register_params("local", "sim:0"));
  REQUIRE(reply.contains("error"));
  CHECK(error_word(reply) == "conflict");
  CHECK_THAT(error_message(reply), Catch::Contains("agent.register: host 'local' refused"));
  // Refused: nothing else is served on that connection.
  auto after = impostor.call("agent.heartbeat", {});
  CHECK(error_word(after) == "unauthorized");
  impostor.close();

  // A later agent's registration is answered after the listener has seen the refused one go (the close came
  // first) and after the pool took everything that followed from it.
  auto other = m.agent_connection();
  REQUIRE(other.call("agent.register", register_params("hv-1", "d0", "gpu")).contains("result"));
  CHECK(other.call("agent.heartbeat", {}).contains("result"));

  auto local = m.device("local/asic0");
  REQUIRE_FALSE(local.empty());
  CHECK(local.at("available").as_bool());
  CHECK(local.at("state").as_string() == "leased");
  CHECK(m.lease_state(lease) == "granted");
  // The device serves the next guest as soon as the first lets it go (hv-1 has no asic to offer instead).
  REQUIRE(g.call("release", {{"lease", lease}}).contains("result"));
  auto g2 = m.guest("vm-2");
  CHECK(lease_state(g2.call("acquire", {{"kind", "asic"}})) == "granted");
#endif
}

TEST_CASE("an agent whose device ids are invalid gets an error reply and nothing of it joins",
          "[integration][agents][registration]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  Manager m;
  auto a = m.agent_connection();
  for (const std::string& bad : {std::string("a/b"), std::string("has space"), std::string("nul\0id", 6)}) {
    auto reply = a.call("agent.register", register_params("hv-bad", bad));
    REQUIRE(reply.contains("error"));
    CHECK(error_word(reply) == "invalid_argument");
    CHECK_THAT(error_message(reply), Catch::Contains("agent.register: host 'hv-bad' refused"));
  }
  auto r = http(m.daemon.endpoints().admin_port, "GET", "/v1/devices", m.admin);
  REQUIRE(r.status == 200);
  auto body = r.json();
  for (const auto& d : body.at("devices").as_array()) CHECK(d.at("host").as_string() == "local");
  // The name is free again: the same connection registers it with valid ids.
  REQUIRE(a.call("agent.register", register_params("hv-bad", "d0")).contains("result"));
  CHECK(m.device("hv-bad/d0").at("available").as_bool());
#endif
}

TEST_CASE("accelpool-agent configured with the name of the manager's own host exits with status 2, saying why",
          "[integration][agents][registration]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  Manager m;
  auto config = m.dir / "agent.toml", log = m.dir / "agent.log";
  std::ofstream(config) << "[agent]\nmanager = \"" << m.daemon.endpoints().agents << "\"\ntoken = \"" << kAgentToken
                        << "\"\nhost = \"local\"\n[backends.sim]\ndevices = \"asic:sim-m:1\"\nattach = \"network\"\n";
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::execl(ACCELPOOL_AGENT_BIN, ACCELPOOL_AGENT_BIN, "--config", config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // It exits by itself; the bound only ends a hung test.
  int status = 0;
  if (!accelpool::testing::eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; })) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL("accelpool-agent did not exit");
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK_THAT(text, Catch::Contains("registration refused") && Catch::Contains("host 'local' refused"));
  CHECK(m.device("local/asic0").at("available").as_bool());
#endif
}

TEST_CASE("an agent declares slots of a device: they join the pool, and a bad slot count is refused",
          "[integration][agents][registration][slots]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  Manager m;
  auto a = m.agent_connection();
  for (const json::value& bad : {json::value(-1), json::value("two"), json::value(65)}) {
    auto params = register_params("hv-slots", "d0");
    params["devices"].as_array()[0].as_object()["slots"] = bad;
    auto reply = a.call("agent.register", params);
    REQUIRE(reply.contains("error"));
    CHECK(error_word(reply) == "invalid_argument");
    CHECK_THAT(error_message(reply), Catch::Contains("field 'slots' must be an integer in 0..64"));
  }
  auto params = register_params("hv-slots", "d0");
  params["devices"].as_array()[0].as_object()["slots"] = 2;
  REQUIRE(a.call("agent.register", params).contains("result"));
  const auto device = m.device("hv-slots/d0");
  const auto& slots = device.at("slots").as_array();
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].at("name") == "hv-slots/d0:slot0");
  CHECK(slots[1].at("name") == "hv-slots/d0:slot1");
  CHECK(slots[1].at("state") == "free");
  auto slot = http(m.daemon.endpoints().admin_port, "GET", "/v1/devices/hv-slots/d0:slot1", m.admin);
  REQUIRE(slot.status == 200);
  CHECK(slot.json().at("kind") == "asic:slot");
  // A device registered without the field has no slots (older agents).
  CHECK(m.device("local/asic0").at("slots").as_array().empty());
#endif
}

TEST_CASE("an agent may give its slots' shapes: a list of another length is refused naming the host and device",
          "[integration][agents][registration][slots]") {
  Manager m;
  auto a = m.agent_connection();
  auto params = register_params("hv-shapes", "d0");
  auto& device = params["devices"].as_array()[0].as_object();
  device["slots"] = 2;
  device["slot_shapes"] = "cu1";
  auto not_list = a.call("agent.register", params);
  REQUIRE(not_list.contains("error"));
  CHECK_THAT(error_message(not_list), Catch::Contains("field 'slot_shapes' must be an array of strings"));
  device["slot_shapes"] = json::array{"cu2", "cu1", "cu1"};
  auto too_many = a.call("agent.register", params);
  REQUIRE(too_many.contains("error"));
  CHECK(error_word(too_many) == "invalid_argument");
  CHECK_THAT(error_message(too_many),
             Catch::Contains("host hv-shapes reports 3 slot shapes for device 'd0', which has 2 slots"));
  device["slot_shapes"] = json::array{"cu2", "cu1"};
  REQUIRE(a.call("agent.register", params).contains("result"));
  CHECK(m.device("hv-shapes/d0").at("slots").as_array().size() == 2);
}
