// A partial image's bandwidth demand, from the manager's registry to the scheduler's placement of slot leases: the
// core wired to a real registry folder as the daemon wires it (answer_from_catalog), a real SQLite store.
#include "test_support.hpp"

#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>

#include <fstream>

using namespace accelpool;
using namespace accelpool::manager;
using namespace accelpool::manager::test;

namespace {

// A registry in `dir` holding the partial images "stream-a" and "stream-b" (opaque, for "test-fpga" slots), each
// stating `demand` as its `bandwidth_demand`.
std::shared_ptr<bitstreams::SharedRegistry> partial_images(const TempDir& dir, double demand) {
  auto reg = bitstreams::SharedRegistry::open(dir.path / "registry");
  REQUIRE(reg.is_ok());
  for (const std::string name : {"stream-a", "stream-b"}) {
    const auto src = dir.path / (name + ".bin");
    std::ofstream(src, std::ios::binary) << "partial image " << name;
    bitstreams::Manifest m;
    m.name = name;
    m.version = "1.0";
    m.kind = "fpga";
    m.file = name + ".bin";
    m.sha256 = *bitstreams::sha256_file(src);
    m.compatible = {"test-fpga"};
    m.partial = true;
    m.slot_shape = "half";
    m.bandwidth_demand = demand;
    REQUIRE((*reg)->add(m, src).is_ok());
  }
  return *reg;
}

// Two fpga devices "local/fpga0" and "local/fpga1" with two slots each.
std::vector<HostDevice> two_devices_with_two_slots() {
  auto devices = make_devices("fpga", 2);
  for (auto& d : devices) d.slots = 2;
  return devices;
}

// Where a lease of "stream-a" and then one of "stream-b" (both asked as kind "fpga") are granted, on a pool whose
// registry states `demand` for both images.
std::vector<std::string> placements(double demand) {
  TempDir dir;
  CoreOptions options;
  answer_from_catalog(options, std::make_shared<ImageCatalog>(partial_images(dir, demand)));
  Pool pool(two_devices_with_two_slots(), options);
  std::vector<std::string> out;
  for (const std::string bitstream : {"stream-a", "stream-b"}) {
    auto l = pool.core->acquire([&] {
      AcquireParams p = acquire_params("a", "vm-" + bitstream, "fpga");
      p.bitstream = bitstream;
      return p;
    }());
    if (!l) FAIL(describe(l.error()));
    CHECK(l->kind == "fpga:slot");  // partial images go on slots
    CHECK(l->state == LeaseState::granted);
    REQUIRE(l->devices.size() == 1);
    out.push_back(l->devices[0]);
  }
  return out;
}

}  // namespace

TEST_CASE("two partial images whose demands exceed a device's bandwidth together go on different devices' slots",
          "[core][slots][demand]") {
  // 0.6 + 0.6 = 1.2 > 1 on one device; 0.6 on each of two devices keeps both within their bandwidth. The first
  // lease takes the lowest free slot (every slot is empty, so each would be programmed): fpga0:slot0. For the
  // second, fpga0:slot1 would put 1.2 on fpga0 and the slots of fpga1 0.6: it goes to fpga1's lowest, slot0.
  CHECK(placements(0.6) == std::vector<std::string>{"local/fpga0:slot0", "local/fpga1:slot0"});
  // A manifest that states no demand (0) leaves placement to slot order alone: the same device.
  CHECK(placements(0) == std::vector<std::string>{"local/fpga0:slot0", "local/fpga0:slot1"});
}
