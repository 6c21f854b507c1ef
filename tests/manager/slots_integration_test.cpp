// Slot leases end to end: the real accelpool-manager binary with a static host whose device declares slots,
// guests over TCP, the admin API over HTTP.
#include "test_client.hpp"

#include <catch2/catch.hpp>

using namespace accelpool::manager::itest;

namespace {

// One fpga device "local/fpga0" with `slots` slots, tenant "a".
std::string slots_config(int slots) {
  return "[leases]\nttl_s = 30\nrevoke_grace_s = 1\n"
         "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n"
         "[admin]\nlisten = \"127.0.0.1:0\"\n"
         "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
         "[[hosts.devices]]\nkind = \"fpga\"\ncount = 1\nslots = " +
         std::to_string(slots) + "\n[[tenants]]\nname = \"a\"\n";
}

struct SlotPool : ScratchDaemon {
  std::string admin, token;
  explicit SlotPool(int slots) : ScratchDaemon("apm-slots-", slots_config(slots)) {
    daemon.start();
    admin = daemon.token("admin token");
    token = daemon.token("guest token for tenant a");
  }
  GuestClient guest(const std::string& id) {
    auto c = GuestClient::tcp(daemon.endpoints().guest_port);
    REQUIRE(c.hello(token, id).contains("result"));
    return c;
  }
  json::object device(const std::string& name) {
    auto r = http(daemon.endpoints().admin_port, "GET", "/v1/devices/" + name, admin);
    REQUIRE(r.status == 200);
    return r.json().as_object();
  }
};

std::string only_device(const json::object& lease) {
  const auto& devices = lease.at("devices").as_array();
  REQUIRE(devices.size() == 1);
  return std::string(devices[0].as_string());
}

}  // namespace

TEST_CASE("two guests hold two slots of one device at once, a third waits and gets the slot freed",
          "[integration][slots]") {
  SlotPool m(2);
  auto g1 = m.guest("vm1");
  auto g2 = m.guest("vm2");
  auto g3 = m.guest("vm3");

  auto a = g1.call("acquire", {{"kind", "fpga:slot"}, {"bitstream", "kernel-a"}});
  auto b = g2.call("acquire", {{"kind", "fpga:slot"}, {"bitstream", "kernel-b"}});
  REQUIRE(lease_state(a) == "granted");
  REQUIRE(lease_state(b) == "granted");
  auto granted_a = g1.wait_notification("lease.granted", lease_id(a));
  auto granted_b = g2.wait_notification("lease.granted", lease_id(b));
  REQUIRE(granted_a);
  REQUIRE(granted_b);
  const std::string slot_a = only_device(granted_a->at("params").at("lease").as_object());
  const std::string slot_b = only_device(granted_b->at("params").at("lease").as_object());
  CHECK(slot_a != slot_b);
  CHECK((slot_a == "local/fpga0:slot0" || slot_a == "local/fpga0:slot1"));
  CHECK((slot_b == "local/fpga0:slot0" || slot_b == "local/fpga0:slot1"));

  // Both slots are held: a third slot lease waits, and so does a lease of the whole device.
  auto c = g3.call("acquire", {{"kind", "fpga:slot"}});
  REQUIRE(lease_state(c) == "queued");
  auto whole = g3.call("acquire", {{"kind", "fpga"}});
  REQUIRE(lease_state(whole) == "queued");

  // The admin API shows the device shared and what each slot holds.
  auto device = m.device("local/fpga0");
  CHECK(device.at("state") == "shared");
  CHECK(device.at("lease").is_null());
  CHECK(device.at("parent").is_null());
  const auto& slots = device.at("slots").as_array();
  REQUIRE(slots.size() == 2);
  for (const auto& s : slots) {
    const auto& slot = s.as_object();
    const bool is_a = slot.at("name").as_string() == slot_a;
    CHECK(slot.at("state") == "leased");
    CHECK(slot.at("lease").to_number<std::uint64_t>() == (is_a ? lease_id(a) : lease_id(b)));
    CHECK(slot.at("loaded") == (is_a ? "kernel-a" : "kernel-b"));
  }
  auto slot = m.device(slot_a);
  CHECK(slot.at("kind") == "fpga:slot");
  CHECK(slot.at("parent") == "local/fpga0");
  CHECK(slot.at("lease").to_number<std::uint64_t>() == lease_id(a));

  // One guest releases: the waiting slot lease gets its slot; the whole device still waits for the other.
  REQUIRE(lease_state(g1.call("release", {{"lease", lease_id(a)}})) == "released");
  auto granted_c = g3.wait_notification("lease.granted", lease_id(c));
  REQUIRE(granted_c);
  CHECK(only_device(granted_c->at("params").at("lease").as_object()) == slot_a);
  CHECK(m.device("local/fpga0").at("state") == "shared");

  // Both slots free: the whole device goes to the lease that waited for it.
  REQUIRE(lease_state(g2.call("release", {{"lease", lease_id(b)}})) == "released");
  REQUIRE(lease_state(g3.call("release", {{"lease", lease_id(c)}})) == "released");
  auto granted_whole = g3.wait_notification("lease.granted", lease_id(whole));
  REQUIRE(granted_whole);
  CHECK(only_device(granted_whole->at("params").at("lease").as_object()) == "local/fpga0");
}

TEST_CASE("a host without slots offers whole devices only", "[integration][slots]") {
  SlotPool m(0);
  auto g = m.guest("vm1");
  auto r = g.call("acquire", {{"kind", "fpga:slot"}});
  CHECK(error_word(r) == "infeasible");
  auto device = m.device("local/fpga0");
  CHECK(device.at("slots").as_array().empty());
  CHECK(device.at("state") == "free");
}
