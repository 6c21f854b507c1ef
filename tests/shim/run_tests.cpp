// accelpool-run and the C ABI program against the real accelpool-manager on loopback.
#include "client_options.hpp"
#include "manager_fixture.hpp"

#include <accelpool/shim/client.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace accelpool::shim;
using accelpool::shim::test::fpga_pool;
using accelpool::shim::test::ManagerProcess;
using accelpool::shim::test::eventually;
using accelpool::shim::test::renewed_past_ttl;
using Clock = std::chrono::steady_clock;
using accelpool::shim::test::read_file;
using accelpool::shim::test::Child;
using accelpool::shim::test::spawn;

namespace {

std::string run_bin() { return ACCELPOOL_RUN_BIN; }

std::map<std::string, std::string> pool_env(const ManagerProcess& m, const std::string& guest) {
  return {{"ACCELPOOL_POOL", m.tcp_uri()}, {"ACCELPOOL_TOKEN", m.guest_token()}, {"ACCELPOOL_GUEST", guest}};
}

// A second client of `guest`, to look at its leases: a lease is visible to its own guest only.
std::unique_ptr<Client> observer(const ManagerProcess& m, const std::string& guest) {
  auto c = Client::connect(test::connect_options(m.tcp_uri(), m.guest_token(), guest));
  REQUIRE(c);
  return std::move(*c);
}

std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> env;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

}  // namespace

TEST_CASE("accelpool-run exports the grant, exits with the command's status and releases the lease", "[integration][shim][run]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  std::string envfile = m.dir() + "/env.txt";
  auto c = spawn({run_bin(), "--kind", "fpga", "--estimate", "3", "--timeout", "5", "--", "/bin/sh", "-c",
                  "env | grep ^ACCELPOOL_ > " + envfile + "; exit 7"},
                 pool_env(m, "vm-run"), m.dir() + "/run.out");
  REQUIRE(c.wait());
  INFO(c.output());
  CHECK(c.exit_code() == 7);
  auto env = read_env_file(envfile);
  REQUIRE(env.count("ACCELPOOL_LEASE"));
  CHECK(env["ACCELPOOL_KIND"] == "fpga");
  CHECK(env["ACCELPOOL_COUNT"] == "1");
  CHECK(env["ACCELPOOL_DEVICES"].rfind("local/", 0) == 0);
  CHECK(env["ACCELPOOL_GUEST"] == "vm-run");
  CHECK(env["ACCELPOOL_POOL"] == m.tcp_uri());
  CHECK(env["ACCELPOOL_LEASE_JSON"].find("\"granted\"") != std::string::npos);
  // The device on its own, as the pool's host described it.
  CHECK(env["ACCELPOOL_DEVICE_0_NAME"] == env["ACCELPOOL_DEVICES"]);
  CHECK(env["ACCELPOOL_DEVICE_0_KIND"] == "fpga");
  CHECK(env["ACCELPOOL_DEVICE_0_MODEL"] == "u250");
  CHECK(env["ACCELPOOL_DEVICE_0_ATTACH"] == "none");  // the static host attaches nothing
  CHECK(env.count("ACCELPOOL_DEVICE_0_PCI") == 1);
  CHECK(env.count("ACCELPOOL_DEVICE_1_NAME") == 0);
  auto obs = observer(m, "vm-run");
  auto lease = obs->get(std::stoull(env["ACCELPOOL_LEASE"]));
  REQUIRE(lease);
  CHECK(lease->state == LeaseState::released);
  CHECK(lease->guest == "vm-run");
  CHECK(lease->label == "sh");  // the command's file name, by default

  // Killed by a signal: 128 + signal, and still released.
  auto k = spawn({run_bin(), "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + m.dir() + "/id; kill -KILL $$"},
                 pool_env(m, "vm-run"), m.dir() + "/run2.out");
  REQUIRE(k.wait());
  CHECK(k.exit_code() == 128 + SIGKILL);
  auto l2 = obs->get(std::stoull(read_file(m.dir() + "/id")));
  REQUIRE(l2);
  CHECK(l2->state == LeaseState::released);

  // --label names the job, --label '' sends none, and a label the pool refuses fails before the command runs.
  auto labelled = [&](const std::string& label) {
    auto r = spawn({run_bin(), "--label", label, "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + m.dir() + "/id"},
                   pool_env(m, "vm-run"), m.dir() + "/run3.out");
    REQUIRE(r.wait());
    INFO(r.output());
    REQUIRE(r.exit_code() == 0);
    auto l = obs->get(std::stoull(read_file(m.dir() + "/id")));
    REQUIRE(l);
    return l->label;
  };
  CHECK(labelled("train-step") == "train-step");
  CHECK(labelled("").empty());
  std::remove((m.dir() + "/id").c_str());
  auto refused = spawn({run_bin(), "--label", "two words", "--", "/bin/sh", "-c", "touch " + m.dir() + "/ran"},
                       pool_env(m, "vm-run"), m.dir() + "/run4.out");
  REQUIRE(refused.wait());
  INFO(refused.output());
  CHECK(refused.exit_code() != 0);
  CHECK(refused.output().find("label must be") != std::string::npos);
  CHECK(access((m.dir() + "/ran").c_str(), F_OK) != 0);
}

TEST_CASE("accelpool-run reports pool errors with distinct exit codes", "[integration][shim][run]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto env = pool_env(m, "vm-err");
  auto infeasible = spawn({run_bin(), "--kind", "gpu", "--", "/bin/true"}, env, m.dir() + "/a.out");
  REQUIRE(infeasible.wait());
  CHECK(infeasible.exit_code() == 5);
  CHECK(infeasible.output().find("gpu") != std::string::npos);

  auto bad_env = env;
  bad_env["ACCELPOOL_TOKEN"] = "apt_wrong";
  auto token = spawn({run_bin(), "--", "/bin/true"}, bad_env, m.dir() + "/b.out");
  REQUIRE(token.wait());
  CHECK(token.exit_code() == 4);

  auto missing = spawn({run_bin(), "--", "/nonexistent/command"}, env, m.dir() + "/c.out");
  REQUIRE(missing.wait());
  CHECK(missing.exit_code() == 127);
  CHECK(missing.output().find("/nonexistent/command") != std::string::npos);

  auto usage = spawn({run_bin(), "--count", "zero", "--", "/bin/true"}, env, m.dir() + "/d.out");
  REQUIRE(usage.wait());
  CHECK(usage.exit_code() == 2);
  CHECK(usage.output().find("--count") != std::string::npos);

  std::string tcp = m.tcp_uri();
  m.stop();
  auto unreachable = spawn({run_bin(), "--pool", tcp, "--", "/bin/true"}, env, m.dir() + "/e.out");
  REQUIRE(unreachable.wait());
  CHECK(unreachable.exit_code() == 3);
  CHECK(unreachable.output().find("unreachable") != std::string::npos);
}

TEST_CASE("accelpool-run waits for a busy pool and gives up after --timeout", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  auto env = pool_env(m, "vm-busy");
  // The holder runs with the only device until the test creates `go`.
  const std::string held = m.dir() + "/held", go = m.dir() + "/go";
  auto holder = spawn({run_bin(), "--", "/bin/sh", "-c",
                       "echo $ACCELPOOL_LEASE > " + held + "; while [ ! -e " + go + " ]; do sleep 0.05; done"},
                      env, m.dir() + "/h.out");
  REQUIRE(eventually([&] { return !read_file(held).empty(); }));
  auto late = spawn({run_bin(), "--timeout", "0.4", "--", "/bin/true"}, env, m.dir() + "/l.out");
  REQUIRE(late.wait());
  INFO(late.output());
  CHECK(late.exit_code() == 6);
  // Without --timeout the next one waits in the queue as long as the device is held...
  auto waiter = spawn({run_bin(), "--", "/bin/sh", "-c", "exit 0"}, env, m.dir() + "/w.out");
  REQUIRE(eventually([&] {
    std::string body;
    if (m.admin_request("GET", "/v1/leases?state=queued", "", body) != 200) return false;
    auto queued = nlohmann::json::parse(body, nullptr, false);
    return !queued.is_discarded() && queued["leases"].size() == 1;
  }));
  CHECK(waitpid(waiter.pid, &waiter.status, WNOHANG) == 0);
  // ...and runs once it is given back.
  std::ofstream(go).put('\n');
  REQUIRE(holder.wait());
  CHECK(holder.exit_code() == 0);
  REQUIRE(waiter.wait());
  INFO(waiter.output());
  CHECK(waiter.exit_code() == 0);
}

namespace {

// accelpool-run with a command that writes "TERM" to `termfile` on SIGTERM and then runs `after_term` ("exit 3", or
// "" to ignore the signal). Once the command runs, its lease is revoked through the admin API.
struct Revoked {
  Child child;
  std::uint64_t lease = 0;
  std::string termfile;
  Clock::time_point at;  // when the revocation was asked for

  // Waits for accelpool-run to end; returns the seconds since the revocation.
  double finish() {
    bool ended = child.wait();
    if (!ended) child.kill_group();
    REQUIRE(ended);
    return std::chrono::duration<double>(Clock::now() - at).count();
  }
};

Revoked run_and_revoke(const ManagerProcess& m, const std::string& guest, const std::string& after_term) {
  Revoked r;
  std::string idfile = m.dir() + "/" + guest + ".id";
  r.termfile = m.dir() + "/" + guest + ".term";
  r.child = spawn({run_bin(), "--", "/bin/sh", "-c",
                   "trap 'echo TERM > " + r.termfile + "; " + after_term + "' TERM; echo $ACCELPOOL_LEASE > " + idfile +
                       "; while :; do sleep 0.05; done"},
                  pool_env(m, guest), m.dir() + "/" + guest + ".out");
  REQUIRE(eventually([&] { return !read_file(idfile).empty(); }));
  r.lease = std::stoull(read_file(idfile));
  std::string body;
  r.at = Clock::now();
  REQUIRE(m.admin_request("POST", "/v1/leases/" + std::to_string(r.lease) + "/revoke", R"({"reason":"test"})", body) == 200);
  return r;
}

}  // namespace

TEST_CASE("a revoked lease's command gets SIGTERM within the grace period", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1, 30, 5));
  REQUIRE_MANAGER(m);
  Revoked r = run_and_revoke(m, "vm-revoke", "exit 3");
  r.finish();
  INFO(r.child.output());
  CHECK(r.child.exit_code() == 3);
  CHECK(read_file(r.termfile) == "TERM\n");
  auto lease = observer(m, "vm-revoke")->get(r.lease);
  REQUIRE(lease);
  CHECK(lease->state == LeaseState::released);  // given back before the deadline
}

TEST_CASE("a command that ignores SIGTERM is killed at the revocation deadline", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1, 30, 1.5));
  REQUIRE_MANAGER(m);
  Revoked r = run_and_revoke(m, "vm-stubborn", "");
  double took = r.finish();
  INFO(r.child.output());
  CHECK(read_file(r.termfile) == "TERM\n");     // warned first
  CHECK(r.child.exit_code() == 128 + SIGKILL);  // then killed
  CHECK(r.child.output().find("revocation deadline; sending SIGKILL") != std::string::npos);
  CHECK(took >= 1.3);  // not before the grace period (1.5 s) ended
}

TEST_CASE("accelpool-run forwards SIGTERM and SIGHUP to the command and still releases", "[integration][shim][run]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  for (int sig : {SIGTERM, SIGHUP, SIGINT}) {
    std::string idfile = m.dir() + "/id" + std::to_string(sig);
    auto c = spawn({run_bin(), "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + idfile + "; exec sleep 30"},
                   pool_env(m, "vm-sig"), m.dir() + "/s.out");
    REQUIRE(eventually([&] { return !read_file(idfile).empty(); }));  // the command runs
    ::kill(c.pid, sig);  // to accelpool-run alone, as a supervisor would
    bool ended = c.wait();
    if (!ended) c.kill_group();
    REQUIRE(ended);
    CHECK(c.exit_code() == 128 + sig);
    auto lease = observer(m, "vm-sig")->get(std::stoull(read_file(idfile)));
    REQUIRE(lease);
    CHECK(lease->state == LeaseState::released);
  }
}

TEST_CASE("a crashed client's lease is reclaimed after its TTL", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1, 1.0));
  REQUIRE_MANAGER(m);
  std::string idfile = m.dir() + "/id";
  auto c = spawn({run_bin(), "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + idfile + "; exec sleep 30"},
                 pool_env(m, "vm-crash"), m.dir() + "/c.out");
  REQUIRE(eventually([&] { return !read_file(idfile).empty(); }));
  std::uint64_t id = std::stoull(read_file(idfile));
  auto obs = observer(m, "vm-crash");
  REQUIRE(renewed_past_ttl(*obs, id, 1.0));  // heartbeats keep it past one TTL
  CHECK(obs->get(id)->state == LeaseState::granted);
  c.kill_group();  // accelpool-run and its command die without releasing
  REQUIRE(eventually([&] { auto l = obs->get(id); return l && l->state == LeaseState::expired; }));
  // The device serves the next request.
  AcquireOptions a;
  a.kind = "fpga";
  a.timeout = accelpool::testing::kHungAfter;
  CHECK(obs->acquire(a));
}

TEST_CASE("the C ABI works from a C program", "[integration][shim][c]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  auto c = spawn({SHIM_C_CHECK_BIN, m.unix_uri(), m.guest_token(), "vm-c"}, {}, m.dir() + "/c.out");
  bool ended = c.wait();
  if (!ended) c.kill_group();
  REQUIRE(ended);
  std::string out = c.output();
  INFO(out);
  CHECK(c.exit_code() == 0);
  CHECK(out.find("0 failure(s)") != std::string::npos);
  CHECK(out.find("FAIL") == std::string::npos);
}
