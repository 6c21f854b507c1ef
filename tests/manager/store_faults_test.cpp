// The store's promise under a fault of the disk: nothing is acknowledged that is not durable, and a manager that
// cannot write stops rather than serve on from memory. The real daemon on loopback, SQLite on disk.
#include "hung_after.hpp"
#include "test_client.hpp"

#include "../support/scratch_dir.hpp"

#include <catch2/catch.hpp>

#include <signal.h>

#include <map>
#include <thread>

using namespace accelpool::manager::itest;
using namespace std::chrono_literals;

namespace {

// Waits (the shared eventually(): until the line shows, failing only a hung run) for `text` in the output.
bool output_shows(const DaemonProcess& d, const std::string& text) {
  return accelpool::testing::eventually([&] { return d.output().find(text) != std::string::npos; });
}

}  // namespace

TEST_CASE("a full disk stops the manager before it acknowledges what it cannot store, and nothing acknowledged is lost",
          "[integration][store][faults]") {
  const accelpool::testing::ScratchDir scratch("faults");
  const auto& dir = scratch.path();
  DaemonProcess d(dir,
                  "[leases]\nttl_s = 600\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n"
                  "[admin]\nlisten = \"127.0.0.1:0\"\n"
                  "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\ncount = 2\n"
                  "[[tenants]]\nname = \"a\"\n");
  d.start();  // the first start writes the schema, the tokens and the sample bitstreams
  const std::string token = d.token("guest token for tenant a");
  const std::string admin = d.token("admin token");
  d.stop(SIGTERM);
  // Room for a few dozen commits: the WAL then grows past what the disk holds.
  d.set_file_size_limit(512 * 1024);
  d.start();

  std::map<std::uint64_t, std::string> acknowledged;  // lease -> the state its last answered call reported
  std::uint64_t held = 0;
  int cycles = 0;
  try {
    auto g = GuestClient::tcp(d.endpoints().guest_port);
    REQUIRE(g.hello(token, "vm-held").contains("result"));
    auto h = g.call("acquire", {{"kind", "fpga"}});
    REQUIRE(lease_state(h) == "granted");
    held = lease_id(h);
    acknowledged[held] = "granted";
    for (; cycles < 100000; ++cycles) {
      auto a = g.call("acquire", {{"kind", "fpga"}});
      if (!a.contains("result")) break;
      acknowledged[lease_id(a)] = lease_state(a);
      auto r = g.call("release", {{"lease", lease_id(a)}});
      if (!r.contains("result")) break;
      acknowledged[lease_id(r)] = lease_state(r);
    }
  } catch (const std::exception&) {
    // the manager stopped under the call: expected
  }
  INFO("after " << cycles << " cycles");
  REQUIRE(held != 0);
  REQUIRE(cycles < 100000);
  CHECK(output_shows(d, "fatal: cannot write the store"));
  d.stop(SIGKILL);  // reaps the stopped process

  // The disk has room again: every acknowledged state is there, and the held lease still holds its device.
  d.set_file_size_limit(0);
  d.start();
  for (const auto& [id, state] : acknowledged) {
    auto r = http(d.endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(id), admin);
    INFO("lease " << id << " acknowledged as " << state << ": " << r.body);
    REQUIRE(r.status == 200);
    CHECK(std::string(r.json().at("state").as_string()) == state);
  }
  auto dev = http(d.endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(held), admin).json();
  REQUIRE(dev.at("devices").as_array().size() == 1);
  CHECK(acknowledged.size() > 3);
  d.stop(SIGKILL);
}
