// Slot leases in the core: a static host's device with slots, a real SQLite store.
#include "test_support.hpp"

using namespace accelpool::manager;
using accelpool::Errc;
using namespace accelpool::manager::test;

namespace {

// One fpga device "local/fpga0" with `slots` slots.
std::vector<HostDevice> device_with_slots(std::uint32_t slots) {
  auto devices = make_devices("fpga", 1);
  devices[0].slots = slots;
  return devices;
}

accelpool::Result<Lease> try_acquire(Pool& pool, const std::string& guest, const std::string& kind,
                                     const std::string& bitstream) {
  AcquireParams p = acquire_params("a", guest, kind);
  p.bitstream = bitstream;
  return pool.core->acquire(p);
}

Lease acquire_kind(Pool& pool, const std::string& guest, const std::string& kind, const std::string& bitstream = "") {
  auto r = try_acquire(pool, guest, kind, bitstream);
  if (!r) FAIL(accelpool::describe(r.error()));
  return *r;
}

}  // namespace

TEST_CASE("slot leases share a device, the whole device waits until every slot is free", "[core][slots]") {
  Pool pool(device_with_slots(2));
  Lease a = acquire_kind(pool, "vm1", "fpga:slot", "kernel-a");
  Lease b = acquire_kind(pool, "vm2", "fpga:slot", "kernel-b");
  REQUIRE(a.state == LeaseState::granted);
  REQUIRE(b.state == LeaseState::granted);
  CHECK(a.devices == std::vector<std::string>{"local/fpga0:slot0"});
  CHECK(b.devices == std::vector<std::string>{"local/fpga0:slot1"});
  Lease c = acquire_kind(pool, "vm3", "fpga:slot");
  Lease whole = acquire_kind(pool, "vm4", "fpga");
  CHECK(c.state == LeaseState::queued);
  CHECK(whole.state == LeaseState::queued);
  pool.posts.drain();  // the host programs both slots
  CHECK(pool.get(a.id).ready);
  CHECK(pool.get(b.id).ready);

  auto device = pool.core->device("local/fpga0");
  REQUIRE(device.is_ok());
  CHECK(device->state == "shared");
  REQUIRE(device->slots.size() == 2);
  CHECK(device->slots[0].name == "local/fpga0:slot0");
  CHECK(device->slots[0].state == "leased");
  CHECK(device->slots[0].lease == a.id);
  CHECK(device->slots[0].loaded == "kernel-a");
  CHECK(device->slots[1].lease == b.id);
  CHECK(device->slots[1].loaded == "kernel-b");
  // The device gauge counts the shared device and each leased slot (a slot counts as a device).
  CHECK(pool.core->devices_by_state().at("shared") == 1);
  CHECK(pool.core->devices_by_state().at("leased") == 2);
  auto slot = pool.core->device("local/fpga0:slot1");
  REQUIRE(slot.is_ok());
  CHECK(slot->record.parent == "local/fpga0");
  CHECK(slot->record.kind == "fpga:slot");
  // Listings show whole devices only, each with its slots.
  REQUIRE(pool.core->devices().size() == 1);
  CHECK(pool.core->devices()[0].slots.size() == 2);
  CHECK(pool.core->device_page({}, {}).devices.size() == 1);
  // A device with a leased slot is not reset under it.
  CHECK(pool.core->reset_device("local/fpga0").error().code == Errc::invalid_state);

  REQUIRE(pool.core->release(Pool::owner(a), a.id).is_ok());
  CHECK(pool.get(c.id).state == LeaseState::granted);
  CHECK(pool.get(c.id).devices == std::vector<std::string>{"local/fpga0:slot0"});
  CHECK(pool.get(whole.id).state == LeaseState::queued);
  REQUIRE(pool.core->release(Pool::owner(b), b.id).is_ok());
  REQUIRE(pool.core->release(Pool::owner(c), c.id).is_ok());
  CHECK(pool.get(whole.id).state == LeaseState::granted);
  CHECK(pool.get(whole.id).devices == std::vector<std::string>{"local/fpga0"});
  CHECK(pool.core->device("local/fpga0:slot0")->state == "shared");
}

TEST_CASE("slot leases outlive a restart: the store keeps how many slots each device has", "[core][slots]") {
  Pool pool(device_with_slots(2));
  pool.posts.drain();
  const auto rows_before = pool.store->device_rows;
  Lease a = acquire_kind(pool, "vm1", "fpga:slot", "kernel-a");
  Lease b = acquire_kind(pool, "vm2", "fpga:slot", "kernel-b");
  Lease waiting = acquire_kind(pool, "vm3", "fpga:slot");
  pool.posts.drain();
  CHECK(pool.store->device_rows == rows_before);  // what a slot holds is never written
  REQUIRE(waiting.state == LeaseState::queued);

  pool.restart(device_with_slots(2));
  CHECK(pool.core->device("local/fpga0")->slots.size() == 2);
  CHECK(pool.get(a.id).state == LeaseState::granted);
  CHECK(pool.get(a.id).devices == std::vector<std::string>{"local/fpga0:slot0"});
  CHECK(pool.get(b.id).state == LeaseState::granted);
  CHECK(pool.get(b.id).devices == std::vector<std::string>{"local/fpga0:slot1"});
  CHECK(pool.get(waiting.id).state == LeaseState::queued);
  CHECK(pool.core->device("local/fpga0:slot0")->lease == a.id);
  REQUIRE(pool.core->release(Pool::owner(a), a.id).is_ok());
  CHECK(pool.get(waiting.id).state == LeaseState::granted);
  CHECK(pool.get(waiting.id).devices == std::vector<std::string>{"local/fpga0:slot0"});

  // A host that declares more slots after a restart adds them; the next restart knows all of them.
  pool.restart(device_with_slots(3));
  CHECK(pool.core->device("local/fpga0")->slots.size() == 3);
  pool.restart(device_with_slots(3));
  CHECK(pool.get(waiting.id).devices == std::vector<std::string>{"local/fpga0:slot0"});
  CHECK(pool.get(b.id).devices == std::vector<std::string>{"local/fpga0:slot1"});
  CHECK(acquire_kind(pool, "vm4", "fpga:slot").devices == std::vector<std::string>{"local/fpga0:slot2"});
  CHECK(acquire_kind(pool, "vm5", "fpga:slot").state == LeaseState::queued);
}

TEST_CASE("a store whose slot count names no stored device is refused at start", "[core][slots]") {
  Batch batch;
  batch.meta.emplace_back("slots:local/nowhere", "2");
  const auto refused = start_refused(batch);
  CHECK(refused.code == Errc::corrupt);
  CHECK(refused.message.find("slots:local/nowhere") != std::string::npos);
}

TEST_CASE("a device out of service takes its slots' leases with it", "[core][slots]") {
  Pool pool(device_with_slots(2));
  Lease a = acquire_kind(pool, "vm1", "fpga:slot");
  pool.posts.drain();
  REQUIRE(pool.core->set_device_usable("local/fpga0", false).is_ok());
  CHECK(pool.get(a.id).state == LeaseState::queued);  // preempted (device_failed) and requeued
  CHECK(pool.core->device("local/fpga0:slot0")->state != "free");
  REQUIRE(pool.core->set_device_usable("local/fpga0", true).is_ok());
  CHECK(pool.get(a.id).state == LeaseState::granted);
}

TEST_CASE("a host may not declare too many slots, nor a device named as a slot", "[core][slots]") {
  Pool pool(make_devices("fpga", 1));
  auto many = make_devices("gpu", 1);
  many[0].slots = kMaxSlotsPerDevice + 1;
  auto r = pool.core->attach_host(make_static_host("h2", many, pool.posts.poster()));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::invalid_argument);
  auto clash = make_devices("gpu", 1);
  clash[0].slots = 1;
  clash.push_back({"gpu0:slot0", "gpu", "", false, ""});
  auto r2 = pool.core->attach_host(make_static_host("h3", clash, pool.posts.poster()));
  REQUIRE_FALSE(r2);
  CHECK(r2.error().message.find("gpu0:slot0") != std::string::npos);
  CHECK_FALSE(pool.core->host_known("h2"));
}

TEST_CASE("a partial image goes on a slot, a full image takes the whole device", "[core][slots]") {
  CoreOptions options;
  options.image_partial = [](const std::string& bitstream) -> std::optional<bool> {
    if (bitstream == "partial-a" || bitstream == "partial-b") return true;
    if (bitstream == "full") return false;
    return std::nullopt;  // not in the registry: the kind asked for decides
  };
  Pool pool(device_with_slots(2), options);
  Lease a = acquire_kind(pool, "vm1", "fpga", "partial-a");
  CHECK(a.kind == "fpga:slot");
  CHECK(a.devices == std::vector<std::string>{"local/fpga0:slot0"});
  Lease b = acquire_kind(pool, "vm2", "fpga:slot", "partial-b");
  CHECK(b.devices == std::vector<std::string>{"local/fpga0:slot1"});
  Lease full = acquire_kind(pool, "vm3", "fpga", "full");
  CHECK(full.kind == "fpga");
  CHECK(full.state == LeaseState::queued);  // the device is shared by the two slot leases
  auto refused = try_acquire(pool, "vm4", "fpga:slot", "full");
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::incompatible);
  Lease unknown = acquire_kind(pool, "vm5", "fpga", "not-registered");
  CHECK(unknown.kind == "fpga");
}

namespace {

// One fpga device "local/fpga0" whose slots have `shapes`, one slot each.
std::vector<HostDevice> device_with_shapes(std::vector<std::string> shapes) {
  auto devices = device_with_slots(static_cast<std::uint32_t>(shapes.size()));
  devices[0].slot_shapes = std::move(shapes);
  return devices;
}

// A registry of partial images: "big-*" fit slots of shape cu2, "small-*" cu1, "huge" cu4.
CoreOptions shaped_images() {
  CoreOptions options;
  options.image_partial = [](const std::string&) -> std::optional<bool> { return true; };
  options.image_slot_shape = [](const std::string& bitstream) -> std::string {
    if (bitstream.starts_with("big-")) return "cu2";
    if (bitstream.starts_with("small-")) return "cu1";
    return bitstream == "huge" ? "cu4" : "";
  };
  return options;
}

}  // namespace

TEST_CASE("a partial image goes only on slots of its shape", "[core][slots]") {
  Pool pool(device_with_shapes({"cu2", "cu1", "cu1"}), shaped_images());
  Lease big = acquire_kind(pool, "vm1", "fpga", "big-a");
  CHECK(big.devices == std::vector<std::string>{"local/fpga0:slot0"});
  Lease second_big = acquire_kind(pool, "vm2", "fpga", "big-b");
  CHECK(second_big.state == LeaseState::queued);  // slots 1 and 2 are free, but of shape cu1
  CHECK(pool.core->device("local/fpga0:slot1")->state == "free");
  CHECK(pool.core->device("local/fpga0:slot2")->state == "free");
  Lease small = acquire_kind(pool, "vm3", "fpga", "small-a");
  CHECK(small.devices == std::vector<std::string>{"local/fpga0:slot1"});
  CHECK(pool.core->device("local/fpga0:slot0")->record.slot_shape == "cu2");

  auto none = try_acquire(pool, "vm4", "fpga", "huge");
  REQUIRE_FALSE(none);
  CHECK(none.error().code == Errc::incompatible);
  CHECK(none.error().message.find("slots of shape 'cu4'") != std::string::npos);
  CHECK(none.error().message.find("(slot shape 'cu2')") != std::string::npos);

  REQUIRE(pool.core->release(Pool::owner(big), big.id).is_ok());
  CHECK(pool.get(second_big.id).state == LeaseState::granted);
  CHECK(pool.get(second_big.id).devices == std::vector<std::string>{"local/fpga0:slot0"});
  // A lease whose bitstream has no shape (or none at all) takes any slot.
  CHECK(acquire_kind(pool, "vm5", "fpga:slot", "unshaped").devices == std::vector<std::string>{"local/fpga0:slot2"});
}

TEST_CASE("slot shapes of the wrong number are refused naming the host and the device", "[core][slots]") {
  Pool pool(make_devices("fpga", 1));
  auto devices = make_devices("gpu", 1);
  devices[0].slots = 3;
  devices[0].slot_shapes = {"cu2", "cu1"};
  auto r = pool.core->attach_host(make_static_host("h2", devices, pool.posts.poster()));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::invalid_argument);
  CHECK(r.error().message ==
        "host h2 reports 2 slot shapes for device 'gpu0', which has 3 slots: give one shape per slot");
  CHECK_FALSE(pool.core->host_known("h2"));
  devices[0].slot_shapes = {"cu2", "c u1", "cu1"};
  auto bad = pool.core->attach_host(make_static_host("h2", devices, pool.posts.poster()));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("slot shape 'c u1' for device 'gpu0'") != std::string::npos);
  CHECK_FALSE(pool.core->host_known("h2"));
}

TEST_CASE("a device model holding a NUL character is refused naming the host and the device", "[core][slots]") {
  Pool pool(make_devices("fpga", 1));
  auto devices = make_devices("gpu", 1);
  devices[0].model = std::string("u250\0cu2", 8);
  auto r = pool.core->attach_host(make_static_host("h2", devices, pool.posts.poster()));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::invalid_argument);
  CHECK(r.error().message == "host h2 reports device 'gpu0' with a model that holds a NUL character");
  CHECK_FALSE(pool.core->host_known("h2"));
}

TEST_CASE("slot shapes outlive a restart, and a host that reports new shapes changes where images go",
          "[core][slots]") {
  Pool pool(device_with_shapes({"cu2", "cu1", "cu1"}), shaped_images());
  Lease big = acquire_kind(pool, "vm1", "fpga", "big-a");
  Lease second_big = acquire_kind(pool, "vm2", "fpga", "big-b");
  REQUIRE(second_big.state == LeaseState::queued);

  // Before the host is back, the restored slots have their stored shapes.
  pool.posts.jobs.clear();
  pool.core.reset();
  pool.store.reset();
  pool.open();
  CHECK(pool.core->device("local/fpga0:slot0")->record.slot_shape == "cu2");
  CHECK(pool.core->device("local/fpga0:slot2")->record.slot_shape == "cu1");
  REQUIRE(pool.core->release(Pool::owner(big), big.id).is_ok());
  CHECK(pool.get(second_big.id).devices != std::vector<std::string>{"local/fpga0:slot1"});
  CHECK(pool.get(second_big.id).devices != std::vector<std::string>{"local/fpga0:slot2"});
  REQUIRE(
      pool.core->attach_host(make_static_host("local", device_with_shapes({"cu2", "cu1", "cu1"}), pool.posts.poster()))
          .is_ok());
  CHECK(pool.get(second_big.id).devices == std::vector<std::string>{"local/fpga0:slot0"});
  Lease third_big = acquire_kind(pool, "vm3", "fpga", "big-c");
  CHECK(third_big.state == LeaseState::queued);

  // The host comes back with slot 2 grown to cu2: the waiting image goes there, slot 0 keeps its lease.
  pool.restart(device_with_shapes({"cu2", "cu1", "cu2"}));
  CHECK(pool.core->device("local/fpga0:slot2")->record.slot_shape == "cu2");
  CHECK(pool.get(third_big.id).devices == std::vector<std::string>{"local/fpga0:slot2"});
  CHECK(pool.get(second_big.id).devices == std::vector<std::string>{"local/fpga0:slot0"});
  // An agent that reports no shapes leaves its slots without any: every slot takes every partial image.
  pool.restart(device_with_slots(3));
  CHECK(pool.core->device("local/fpga0:slot1")->record.slot_shape.empty());
  CHECK(acquire_kind(pool, "vm4", "fpga", "big-d").devices == std::vector<std::string>{"local/fpga0:slot1"});
}
