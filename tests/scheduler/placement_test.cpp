// Placement policies: which devices a grant gets.
#include "fixtures.hpp"

#include <algorithm>

using namespace accelpool::scheduler;
using namespace accelpool::scheduler::testing;

namespace {

Device dev(DeviceId id, HostId host, BitstreamId loaded = kNoBitstream, AttachMode attach = AttachMode::network) {
  Device d;
  d.id = id;
  d.host = host;
  d.loaded = loaded;
  d.attach = attach;
  return d;
}

std::unique_ptr<Scheduler> with_devices(const std::string& policy, const std::vector<Device>& devices) {
  auto s = make_scheduler(policy, "");
  Decisions ignored;
  for (const auto& d : devices) REQUIRE_FALSE(s->add_device(d, 0, ignored));
  return s;
}

std::vector<DeviceId> sorted_devices(const Grant& g) {
  std::vector<DeviceId> ids;
  for (const auto& d : g.devices) ids.push_back(d.device);
  std::sort(ids.begin(), ids.end());
  return ids;
}

Request with_bitstream(Request r, BitstreamId b) {
  r.bitstream = b;
  return r;
}

}  // namespace

TEST_CASE("first-fit takes the lowest ids and marks devices that need programming", "[placement]") {
  auto s = with_devices("fifo+first-fit", {dev(0, 0, 7), dev(1, 0, 5), dev(2, 0)});
  auto d = submit(*s, with_bitstream(req(1, 0), 5), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(d.grants[0].devices == std::vector<DeviceGrant>{{0, true}});
  CHECK(s->device(0)->loaded == 5);  // now holds the new image
}

TEST_CASE("affinity prefers devices that already hold the bitstream", "[placement][affinity]") {
  auto s = with_devices("fifo+affinity", {dev(0, 0, 7), dev(1, 0, 5), dev(2, 0)});
  auto d = submit(*s, with_bitstream(req(1, 0), 5), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(d.grants[0].devices == std::vector<DeviceGrant>{{1, false}});
  // Next: no device holds 9; an empty device is taken before evicting image 7.
  d = submit(*s, with_bitstream(req(2, 0), 9), 0);
  CHECK(d.grants[0].devices == std::vector<DeviceGrant>{{2, true}});
}

TEST_CASE("affinity keeps a gang on the hosts of its matching devices", "[placement][affinity]") {
  // Host 1 holds one matching device and two blank ones; host 0 has three blank ones with lower ids.
  auto s = with_devices("fifo+affinity", {dev(0, 0), dev(1, 0), dev(2, 0), dev(3, 1, 5), dev(4, 1), dev(5, 1)});
  auto d = submit(*s, with_bitstream(req(1, 0, 3), 5), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(sorted_devices(d.grants[0]) == std::vector<DeviceId>{3, 4, 5});
}

TEST_CASE("pack puts a gang on the host whose free devices fit it most tightly", "[placement][pack]") {
  auto s = with_devices("fifo+pack", {dev(0, 0), dev(1, 0), dev(2, 0), dev(3, 0), dev(4, 1), dev(5, 1)});
  auto d = submit(*s, req(1, 0, 2), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(sorted_devices(d.grants[0]) == std::vector<DeviceId>{4, 5});
  // The 4-wide hole on host 0 is still whole for a 4-wide gang.
  d = submit(*s, req(2, 0, 4), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(sorted_devices(d.grants[0]) == std::vector<DeviceId>{0, 1, 2, 3});
}

TEST_CASE("pack spreads a gang over the fewest hosts when no host fits it", "[placement][pack]") {
  auto s = with_devices("fifo+pack", {dev(0, 0), dev(1, 1), dev(2, 1), dev(3, 2), dev(4, 2), dev(5, 2)});
  auto d = submit(*s, req(1, 0, 5), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(sorted_devices(d.grants[0]) == std::vector<DeviceId>{1, 2, 3, 4, 5});
}

TEST_CASE("every placement uses the guest's passthrough devices before network ones", "[placement]") {
  for (const char* policy : {"fifo+first-fit", "fifo+pack", "fifo+affinity"}) {
    INFO(policy);
    auto s = with_devices(policy, {dev(0, 0), dev(1, 3, kNoBitstream, AttachMode::passthrough)});
    Request r = req(1, 0);
    r.guest_host = 3;
    auto d = submit(*s, r, 0);
    REQUIRE(d.grants.size() == 1);
    CHECK(d.grants[0].devices[0].device == 1);
  }
}

TEST_CASE("the free index follows grants, releases and reprogramming", "[placement][index]") {
  FreeIndex index({.by_bitstream = true, .by_host = true});
  index.insert(dev(0, 0, 5));
  index.insert(dev(1, 1));
  index.insert(dev(2, 1));
  auto e = index.eligible(0, 0);
  REQUIRE(e.network);
  CHECK(e.free() == 3);
  CHECK(e.network->holding(5).contains(0));
  CHECK(e.network->tightest_host(1) == HostId{0});
  CHECK(e.network->tightest_host(2) == HostId{1});
  CHECK_FALSE(e.network->tightest_host(3));
  index.erase(dev(0, 0, 5));
  e = index.eligible(0, 0);
  CHECK(e.free() == 2);
  CHECK(e.network->holding(5).empty());
  CHECK(e.network->on_host(0).empty());
  CHECK(e.network->tightest_host(1) == HostId{1});
  CHECK(index.free_of_kind(0) == 2);
  CHECK(index.free_of_kind(1) == 0);
}

TEST_CASE("IdSet finds ids in order across words and summary blocks", "[placement][index]") {
  IdSet set;
  for (std::uint32_t id : {5u, 64u, 4095u, 4096u, 70000u}) CHECK(set.insert(id));
  CHECK_FALSE(set.insert(64));
  CHECK(set.size() == 5);
  std::vector<std::uint32_t> seen(set.begin(), set.end());
  CHECK(seen == std::vector<std::uint32_t>{5, 64, 4095, 4096, 70000});
  CHECK(set.next(6) == 64);
  CHECK(set.next(4097) == 70000);
  CHECK(set.next(70001) == IdSet::npos);
  CHECK(set.erase(4095));
  CHECK_FALSE(set.erase(4095));
  CHECK(set.next(65) == 4096);
  CHECK_FALSE(set.contains(4095));
  CHECK(set.contains(70000));
}
