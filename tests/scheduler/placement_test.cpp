// Placement policies: which devices a grant gets.
#include "fixtures.hpp"

#include <algorithm>

using namespace accelpool::scheduler;
using namespace accelpool::scheduler::testing;

namespace {

Device dev(DeviceId id, HostId host, BitstreamId loaded = kNoBitstream, AttachMode attach = AttachMode::network) {
  return {.id = id, .host = host, .attach = attach, .loaded = loaded};
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

Device of_model(Device d, ModelId model) {
  d.model = model;
  return d;
}

Request for_models(Request r, ModelSet models) {
  r.models = models;
  return r;
}

constexpr ModelSet kModel0 = 0b01;
constexpr ModelSet kModel1 = 0b10;

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
  REQUIRE(e.network.size() == 1);
  CHECK(e.free() == 3);
  CHECK(e.network[0].holding(5).contains(0));
  CHECK(e.network[0].tightest_host(1) == HostId{0});
  CHECK(e.network[0].tightest_host(2) == HostId{1});
  CHECK_FALSE(e.network[0].tightest_host(3));
  index.erase(dev(0, 0, 5));
  e = index.eligible(0, 0);
  CHECK(e.free() == 2);
  CHECK(e.network[0].holding(5).empty());
  CHECK(e.network[0].on_host(0).empty());
  CHECK(e.network[0].tightest_host(1) == HostId{1});
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

// --- device models ---------------------------------------------------------------------------------------------

TEST_CASE("every placement grants only devices of the models the request fits", "[placement][models]") {
  // Devices 0 and 2 are model 0, 1 and 3 model 1; the lowest ids and the loaded image point at model 0.
  for (const char* policy : {"fifo+first-fit", "fifo+pack", "fifo+affinity"}) {
    INFO(policy);
    auto s = with_devices(
        policy, {of_model(dev(0, 0, 5), 0), of_model(dev(1, 1), 1), of_model(dev(2, 0), 0), of_model(dev(3, 1), 1)});
    auto d = submit(*s, for_models(with_bitstream(req(1, 0, 2), 5), kModel1), 0);
    REQUIRE(d.grants.size() == 1);
    CHECK(sorted_devices(d.grants[0]) == std::vector<DeviceId>{1, 3});
    // Model 1 is all taken: the next model-1 request waits although two model-0 devices are free.
    d = submit(*s, for_models(req(2, 0), kModel1), 0);
    CHECK(d.grants.empty());
    CHECK(s->phase(2) == RequestPhase::waiting);
    CHECK(s->free_count() == 2);
    // A request for any model takes a free model-0 device past the waiting one (its bucket fits).
    d = submit(*s, req(3, 0), 0);
    REQUIRE(d.grants.size() == 1);
    CHECK(s->device(d.grants[0].devices[0].device)->model == 0);
    // Request 1 ends: the waiting model-1 request gets the lowest model-1 device.
    d = release(*s, 1, 1);
    REQUIRE(granted(d) == std::vector<RequestId>{2});
    CHECK(d.grants[0].devices[0].device == 1);
  }
}

TEST_CASE("affinity takes a device of any fitting model that holds the image before programming another",
          "[placement][models][affinity]") {
  auto s = with_devices("fifo+affinity", {of_model(dev(0, 0), 0), of_model(dev(1, 0), 0), of_model(dev(2, 0, 5), 1)});
  auto d = submit(*s, with_bitstream(req(1, 0), 5), 0);
  REQUIRE(d.grants.size() == 1);
  CHECK(d.grants[0].devices == std::vector<DeviceGrant>{{2, false}});
  // Restricted to model 0, it must program one.
  d = submit(*s, for_models(with_bitstream(req(2, 0), 5), kModel0), 0);
  CHECK(d.grants[0].devices == std::vector<DeviceGrant>{{0, true}});
}

TEST_CASE("a request no device model it fits can serve is refused up front", "[placement][models]") {
  auto s = with_devices("fifo+first-fit", {of_model(dev(0, 0), 0), of_model(dev(1, 0), 0), of_model(dev(2, 0), 1)});
  Decisions out;
  auto rejected = s->submit(for_models(req(1, 0), 0b100), 0, out);  // model 2: no such device
  REQUIRE(rejected);
  CHECK(rejected->error.find("only 0 of its kind and of a model its bitstream fits") != std::string::npos);
  rejected = s->submit(for_models(req(2, 0, 2), kModel1), 0, out);  // one model-1 device for a gang of 2
  REQUIRE(rejected);
  CHECK(rejected->error.find("only 1 of its kind and of a model its bitstream fits") != std::string::npos);
  CHECK(out.empty());
  CHECK(s->waiting_count() == 0);
  // Models 0 and 1 together hold three.
  CHECK(submit(*s, for_models(req(3, 0, 3), kModel0 | kModel1), 0).grants.size() == 1);
  // A device's model must be below kMaxModelsPerKind.
  rejected = s->add_device(of_model(dev(9, 0), kMaxModelsPerKind), 0, out);
  REQUIRE(rejected);
  CHECK(rejected->error.find("at most 64 models") != std::string::npos);
}

TEST_CASE("a waiting request whose model set widens is placed on the newly fitting devices", "[placement][models]") {
  auto s = with_devices("fifo+first-fit", {of_model(dev(0, 0), 0), of_model(dev(1, 0), 1)});
  CHECK(granted(submit(*s, for_models(req(1, 0), kModel1), 0)) == std::vector<RequestId>{1});
  CHECK(submit(*s, for_models(req(2, 1), kModel1), 1).grants.empty());
  Decisions out;
  REQUIRE_FALSE(s->set_models(2, kModel0 | kModel1, 2, out));
  REQUIRE(granted(out) == std::vector<RequestId>{2});
  CHECK(out.grants[0].devices[0].device == 0);
  CHECK(s->set_models(99, kModel0, 2, out));  // no such request
}

TEST_CASE("preemption frees only devices of a model the waiting request fits", "[placement][models][preemption]") {
  // srpt preempts the lease with the most remaining time first: that is lease 1 (90 s left), but it runs on a
  // model-0 device, of no use to the model-1 newcomer; lease 2 (40 s left) on model 1 is preempted instead.
  auto s = with_devices("srpt+first-fit", {of_model(dev(0, 0), 0), of_model(dev(1, 0), 1)});
  CHECK(granted(submit(*s, for_models(req(1, 0, 1, 100), kModel0), 0)) == std::vector<RequestId>{1});
  CHECK(granted(submit(*s, for_models(req(2, 0, 1, 50), kModel1), 0)) == std::vector<RequestId>{2});
  auto d = submit(*s, for_models(req(3, 10, 1, 10), kModel1), 10);
  CHECK(preempted(d) == std::vector<RequestId>{2});
}

TEST_CASE("a lease restored after a restart must sit on devices of its models", "[placement][models]") {
  auto s = with_devices("fifo+first-fit", {of_model(dev(0, 0), 0), of_model(dev(1, 0), 1)});
  const std::vector<DeviceId> on_model0{0};
  auto rejected = s->restore(for_models(req(1, 0), kModel1), on_model0, 0);
  REQUIRE(rejected);
  CHECK(rejected->error.find("of a model it does not fit") != std::string::npos);
  CHECK_FALSE(s->restore(for_models(req(1, 0), kModel0), on_model0, 0));
}
