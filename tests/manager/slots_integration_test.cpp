// Slot leases end to end: the real accelpool-manager binary with a host whose device declares slots (a static
// host, or the host runtime over the simulated backend, which programs each slot), guests over TCP, the admin API
// over HTTP.
#include "test_client.hpp"

#include <accelpool/bitstreams/sha256.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using namespace accelpool::manager::itest;

namespace {

const char* kDaemonSettings =
    "[leases]\nttl_s = 30\nrevoke_grace_s = 1\n"
    "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n"
    "[admin]\nlisten = \"127.0.0.1:0\"\n";

// One fpga device "local/fpga0" with `slots` slots, tenant "a".
std::string slots_config(int slots) {
  return std::string(kDaemonSettings) +
         "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
         "[[hosts.devices]]\nkind = \"fpga\"\ncount = 1\nslots = " +
         std::to_string(slots) + "\n[[tenants]]\nname = \"a\"\n";
}

// One simulated device "local/sim:0" with `slots` slots, network-attached, tenant "a".
std::string sim_slots_config(int slots) {
  return std::string(kDaemonSettings) +
         "[[hosts]]\nname = \"local\"\nbackend = \"sim\"\n[hosts.settings]\ndevices = \"fpga:sim-u250:1\"\n"
         "attach = \"network\"\nslots = " +
         std::to_string(slots) + "\npartial_program_base_ms = 5\n[[tenants]]\nname = \"a\"\n";
}

struct SlotPool : ScratchDaemon {
  std::string admin, token;
  explicit SlotPool(int slots) : SlotPool(slots_config(slots)) {}
  explicit SlotPool(const std::string& config) : ScratchDaemon("apm-slots-", config) {
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

// The lease an acquire's reply granted at once, as the lease.granted notification shows it once its host
// prepared it.
template <class Reply>
json::object prepared(GuestClient& g, const Reply& acquired) {
  REQUIRE(lease_state(acquired) == "granted");
  auto granted = g.wait_notification("lease.granted", lease_id(acquired));
  REQUIRE(granted);
  return granted->at("params").at("lease").as_object();
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
  const std::string slot_a = only_device(prepared(g1, a));
  const std::string slot_b = only_device(prepared(g2, b));
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

TEST_CASE("the simulated backend's slots serve two guests at once through the host runtime, a third waits",
          "[integration][slots]") {
  SlotPool m(sim_slots_config(2));
  auto device = m.device("local/sim:0");
  REQUIRE(device.at("slots").as_array().size() == 2);
  auto g1 = m.guest("vm1");
  auto g2 = m.guest("vm2");
  auto g3 = m.guest("vm3");
  auto a = g1.call("acquire", {{"kind", "fpga:slot"}});
  auto b = g2.call("acquire", {{"kind", "fpga:slot"}});
  const auto lease_a = prepared(g1, a);
  const std::string slot_a = only_device(lease_a);
  CHECK(slot_a != only_device(prepared(g2, b)));
  // What the host runtime prepared reaches the guest: a slot of the simulated device, over the network.
  const auto& info = lease_a.at("device_info").as_array().at(0).as_object();
  CHECK(info.at("kind") == "fpga:slot");
  CHECK(info.at("model") == "sim-u250");
  CHECK(info.at("attach") == "network");

  auto c = g3.call("acquire", {{"kind", "fpga:slot"}});
  REQUIRE(lease_state(c) == "queued");
  CHECK(m.device("local/sim:0").at("state") == "shared");
  REQUIRE(lease_state(g1.call("release", {{"lease", lease_id(a)}})) == "released");
  auto granted_c = g3.wait_notification("lease.granted", lease_id(c));
  REQUIRE(granted_c);
  CHECK(only_device(granted_c->at("params").at("lease").as_object()) == slot_a);
}

TEST_CASE("a static host's slots have the shapes its config declares, and a partial image goes only on its shape",
          "[integration][slots]") {
  namespace fs = std::filesystem;
  // Two partial images for the shapes of the one device's two slots, "big" and "small".
  const fs::path seed = temp_dir("apm-static-shapes-seed-");
  for (const auto& [name, shape] : {std::pair<std::string, std::string>{"wide", "big"}, {"narrow", "small"}}) {
    const std::string bytes = "image " + name + "\n";
    std::ofstream(seed / (name + ".bit")) << bytes;
    std::ofstream(seed / (name + ".toml"))
        << "name = \"" << name << "\"\nversion = \"1\"\nkind = \"fpga\"\nfile = \"" << name << ".bit\"\nsha256 = \""
        << accelpool::bitstreams::sha256_bytes(bytes) << "\"\nprogramming_seconds = 0.05\ncompatible = [\"*\"]\n"
        << "image = \"partial\"\n"
        << "slot_shape = \"" << shape << "\"\n";
  }
  SlotPool m(std::string(kDaemonSettings) + "[bitstreams]\nseed = \"" + seed.string() + "\"\n" +
             "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n"
             "[[hosts.devices]]\nkind = \"fpga\"\ncount = 1\nslots = 2\nslot_shapes = [\"big\", \"small\"]\n"
             "[[tenants]]\nname = \"a\"\n");
  fs::remove_all(seed);

  // The admin API shows each slot's shape as declared.
  const auto device = m.device("local/fpga0");
  const auto& slots = device.at("slots").as_array();
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].as_object().at("shape") == "big");
  CHECK(slots[1].as_object().at("shape") == "small");

  // "wide" fits only slot 0: a second "wide" waits while slot 1 is free; "narrow" takes slot 1.
  auto g1 = m.guest("vm1");
  auto g2 = m.guest("vm2");
  auto g3 = m.guest("vm3");
  auto first = g1.call("acquire", {{"kind", "fpga:slot"}, {"bitstream", "wide"}});
  CHECK(only_device(prepared(g1, first)) == "local/fpga0:slot0");
  auto second = g2.call("acquire", {{"kind", "fpga:slot"}, {"bitstream", "wide"}});
  CHECK(lease_state(second) == "queued");
  auto narrow = g3.call("acquire", {{"kind", "fpga:slot"}, {"bitstream", "narrow"}});
  CHECK(only_device(prepared(g3, narrow)) == "local/fpga0:slot1");
  // Slot 0 freed: the waiting "wide" gets it.
  REQUIRE(lease_state(g1.call("release", {{"lease", lease_id(first)}})) == "released");
  auto granted = g2.wait_notification("lease.granted", lease_id(second));
  REQUIRE(granted);
  CHECK(only_device(granted->at("params").at("lease").as_object()) == "local/fpga0:slot0");
}
