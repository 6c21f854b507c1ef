// The core's host index: a host joining, leaving, returning or draining visits its own devices only, listings of
// hosts do not visit devices, and device and host listings come in pages.
#include "test_support.hpp"

#include <map>
#include <set>

using namespace accelpool::manager;
using accelpool::Errc;
using namespace accelpool::manager::test;

namespace {

constexpr int kHosts = 40;
constexpr int kPerHost = 5;

std::string host_name(int i) { return "hv" + std::to_string(100 + i); }

// A pool of kHosts static hosts of kPerHost fpgas each, plus the fixture's local host with two.
struct ManyHosts : Pool {
  ManyHosts() {
    for (int i = 0; i < kHosts; ++i) {
      REQUIRE(
          core->attach_host(make_static_host(host_name(i), make_devices("fpga", kPerHost), posts.poster())).is_ok());
    }
  }
  std::uint64_t visits() const { return core->host_device_visits(); }
  std::size_t count_state(const std::string& host, const std::string& state) {
    std::size_t n = 0;
    for (const auto& d : core->host_devices(host)) n += d.state == state ? 1 : 0;
    return n;
  }
};

}  // namespace

TEST_CASE("a host's join, loss, return and drain visit only that host's devices", "[core][hosts][index]") {
  ManyHosts pool;
  const std::uint64_t pool_size = kHosts * kPerHost + 2;
  const std::uint64_t at_start = pool.visits();

  // A new host joins: each reported device is looked up once (nothing known is missing: no second walk).
  auto before = pool.visits();
  REQUIRE(pool.core->attach_host(make_static_host("newcomer", make_devices("fpga", 3), pool.posts.poster())).is_ok());
  CHECK(pool.visits() - before == 3);
  CHECK(pool.core->host_devices("newcomer").size() == 3);

  // It is lost: its three devices, no other.
  before = pool.visits();
  REQUIRE(pool.core->host_lost("newcomer").is_ok());
  CHECK(pool.visits() - before == 3);
  CHECK(pool.count_state("newcomer", "unavailable") == 3);
  CHECK(pool.count_state(host_name(0), "free") == kPerHost);

  // It returns with one device fewer: the missing one stays unavailable, the others are free again (its devices
  // are walked once more to find the missing one).
  std::vector<HostDevice> two = make_devices("fpga", 2);
  before = pool.visits();
  REQUIRE(pool.core->attach_host(make_static_host("newcomer", two, pool.posts.poster())).is_ok());
  CHECK(pool.visits() - before == 2 + 3);
  CHECK(pool.count_state("newcomer", "free") == 2);
  CHECK(pool.core->device("newcomer/fpga2")->state == "unavailable");

  // A host drain and undrain: that host's devices.
  before = pool.visits();
  REQUIRE(pool.core->set_host_draining(host_name(7), true).is_ok());
  CHECK(pool.visits() - before == kPerHost);
  CHECK(pool.count_state(host_name(7), "draining") == kPerHost);
  CHECK(pool.count_state(host_name(8), "free") == kPerHost);
  REQUIRE(pool.core->set_host_draining(host_name(7), false).is_ok());
  CHECK(pool.count_state(host_name(7), "free") == kPerHost);

  // Listing hosts and looking one up visit no device at all.
  before = pool.visits();
  auto hosts = pool.core->hosts();
  CHECK(hosts.size() == kHosts + 2);  // local, the kHosts, newcomer
  CHECK(std::is_sorted(hosts.begin(), hosts.end()));
  CHECK(pool.core->host_known("newcomer"));
  CHECK_FALSE(pool.core->host_known("nowhere"));
  auto page = pool.core->host_page({}, PageSpec{.after = {}, .limit = 10});
  CHECK(page.hosts.size() == 10);
  CHECK(pool.core->host(host_name(3))->device_count == kPerHost);
  CHECK(pool.visits() == before);

  // Whatever happened, the whole pool was never walked: every step stayed far below its size.
  CHECK(pool.visits() - at_start < pool_size);

  // The device gauges (counted as states change, not by a walk) agree with every device's state.
  std::map<std::string, std::size_t> walked{{"free", 0},        {"leased", 0}, {"draining", 0},
                                            {"unavailable", 0}, {"shared", 0}, {"holding", 0}};
  for (const auto& d : pool.core->devices()) ++walked[d.state];
  CHECK(walked["unavailable"] == 1);  // newcomer's missing device
  CHECK(pool.core->devices_by_state() == walked);

  // A host that lists a device twice is refused, and nothing of it joins.
  std::vector<HostDevice> twice = make_devices("fpga", 1);
  twice.push_back(twice.front());
  auto refused = pool.core->attach_host(make_static_host("doubled", twice, pool.posts.poster()));
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::invalid_argument);
  CHECK_FALSE(pool.core->host_known("doubled"));
}

TEST_CASE("a host known only from the store is listed, drained and returns through its index", "[core][hosts][index]") {
  ManyHosts pool;
  // The manager restarts; the static "local" comes back with it, the others have not reconnected yet.
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.core->hosts().size() == kHosts + 1);
  CHECK(pool.core->host_known(host_name(5)));
  CHECK_FALSE(pool.core->host_live(host_name(5)));
  auto before = pool.visits();
  REQUIRE(pool.core->set_host_draining(host_name(5), true).is_ok());
  CHECK(pool.visits() - before == kPerHost);
  CHECK(pool.core->host(host_name(5))->draining);
  // It reconnects with the devices the store knows, unchanged: no device row is written again.
  before = pool.visits();
  const auto rows_before = pool.store->device_rows;
  REQUIRE(pool.core->attach_host(make_static_host(host_name(5), make_devices("fpga", kPerHost), pool.posts.poster()))
              .is_ok());
  CHECK(pool.visits() - before == kPerHost);
  CHECK(pool.store->device_rows == rows_before);
  CHECK(pool.count_state(host_name(5), "draining") == kPerHost);  // the drain outlived the restart
  CHECK(pool.core->host(host_name(5))->connected);
  CHECK_FALSE(pool.core->host(host_name(6))->connected);
  CHECK(pool.core->host("nowhere").error().code == Errc::not_found);
  CHECK(pool.core->set_host_draining("nowhere", true).error().code == Errc::not_found);
}

TEST_CASE("a host's loss and return are stored once for the host, not per device, and a restart keeps them",
          "[core][hosts][index][restart]") {
  ManyHosts pool;
  const std::string lost = host_name(5);
  auto rows = [&] { return std::pair{pool.store->device_rows, pool.store->meta_rows}; };
  // One of its devices fails by itself first: that is the device's own state, written in its record.
  auto before = rows();
  REQUIRE(pool.core->set_device_usable(lost + "/fpga1", false).is_ok());
  CHECK(pool.store->device_rows - before.first == 1);

  // The host is lost: one meta row, no device row; its devices show unavailable.
  before = rows();
  REQUIRE(pool.core->host_lost(lost).is_ok());
  CHECK(pool.store->device_rows - before.first == 0);
  CHECK(pool.store->meta_rows - before.second == 1);
  CHECK(pool.count_state(lost, "unavailable") == kPerHost);
  CHECK_FALSE(pool.core->device(lost + "/fpga0")->record.available);

  // A restart while it is away: its devices are still unavailable, nothing is granted there, and others are free.
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.count_state(lost, "unavailable") == kPerHost);
  CHECK(pool.count_state(host_name(6), "free") == kPerHost);
  CHECK_FALSE(pool.core->host_live(lost));
  std::vector<LeaseId> granted;
  for (int i = 0; i < kHosts * kPerHost; ++i) {
    Lease l = pool.acquire("a", "vm" + std::to_string(i));
    if (l.state != LeaseState::granted) {
      REQUIRE(pool.core->release(Caller::admin(), l.id).is_ok());  // nothing left but the lost host's devices
      break;
    }
    for (const auto& d : l.devices) CHECK(d.rfind(lost + "/", 0) == std::string::npos);
    granted.push_back(l.id);
  }
  CHECK(granted.size() == (kHosts - 1) * kPerHost + 2);  // every device but the lost host's
  for (LeaseId id : granted) REQUIRE(pool.core->release(Caller::admin(), id).is_ok());

  // It returns, reporting fpga1 still unusable: one meta row, no device row; fpga1 stays unavailable.
  before = rows();
  PoolCore::HostReport report;
  report.unusable.insert("fpga1");
  REQUIRE(pool.core->attach_host(make_static_host(lost, make_devices("fpga", kPerHost), pool.posts.poster()), report)
              .is_ok());
  CHECK(pool.store->device_rows - before.first == 0);
  CHECK(pool.store->meta_rows - before.second == 1);
  CHECK(pool.count_state(lost, "free") == kPerHost - 1);
  CHECK(pool.core->device(lost + "/fpga1")->state == "unavailable");

  // Restarted again before it reconnects: its return was stored (its devices come back as they were).
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.count_state(lost, "free") == kPerHost - 1);
  CHECK(pool.core->device(lost + "/fpga1")->state == "unavailable");

  // Lost and back with fpga1 healthy: only fpga1's record changes.
  REQUIRE(pool.core->attach_host(make_static_host(lost, make_devices("fpga", kPerHost), pool.posts.poster()), report)
              .is_ok());
  REQUIRE(pool.core->host_lost(lost).is_ok());
  before = rows();
  REQUIRE(pool.core->attach_host(make_static_host(lost, make_devices("fpga", kPerHost), pool.posts.poster())).is_ok());
  CHECK(pool.store->device_rows - before.first == 1);
  CHECK(pool.count_state(lost, "free") == kPerHost);
}

TEST_CASE("device and host listings come in pages that cover everything once", "[core][hosts][paging]") {
  ManyHosts pool;
  REQUIRE(pool.core->set_host_draining(host_name(2), true).is_ok());
  REQUIRE(pool.core->host_lost(host_name(3)).is_ok());
  Lease l = pool.acquire("a", "vm1", 1);
  REQUIRE(l.state == LeaseState::granted);

  SECTION("every device once, in name order, pages of 7") {
    std::vector<std::string> seen;
    PageSpec spec{.after = {}, .limit = 7};
    std::size_t pages = 0;
    for (;;) {
      auto page = pool.core->device_page({}, spec);
      ++pages;
      REQUIRE(page.devices.size() <= 7);
      for (const auto& d : page.devices) seen.push_back(d.record.name);
      if (!page.next) break;
      REQUIRE(page.devices.size() == 7);
      CHECK(*page.next == page.devices.back().record.name);
      spec.after = page.next;
    }
    std::vector<std::string> all;
    for (const auto& d : pool.core->devices()) all.push_back(d.record.name);
    CHECK(seen == all);
    CHECK(all.size() == kHosts * kPerHost + 2);
    CHECK(pages == (all.size() + 6) / 7);
  }
  SECTION("filters: host, state, kind") {
    DeviceFilter by_host;
    by_host.host = host_name(2);
    auto before = pool.visits();
    auto page = pool.core->device_page(by_host, {});
    CHECK(pool.visits() - before == kPerHost);  // the index, not the pool
    REQUIRE(page.devices.size() == kPerHost);
    CHECK_FALSE(page.next);
    for (const auto& d : page.devices) CHECK(d.state == "draining");

    DeviceFilter lost;
    lost.state = "unavailable";
    page = pool.core->device_page(lost, {});
    REQUIRE(page.devices.size() == kPerHost);
    for (const auto& d : page.devices) CHECK(d.record.host == host_name(3));

    DeviceFilter leased;
    leased.state = "leased";
    page = pool.core->device_page(leased, {});
    REQUIRE(page.devices.size() == 1);
    CHECK(page.devices[0].lease == l.id);

    DeviceFilter gpus;
    gpus.kind = "gpu";
    CHECK(pool.core->device_page(gpus, {}).devices.empty());
    DeviceFilter nowhere;
    nowhere.host = "nowhere";
    CHECK(pool.core->device_page(nowhere, {}).devices.empty());

    // A host-filtered listing pages too.
    page = pool.core->device_page(by_host, PageSpec{.after = {}, .limit = 2});
    REQUIRE(page.devices.size() == 2);
    REQUIRE(page.next);
    auto rest = pool.core->device_page(by_host, PageSpec{.after = page.next, .limit = 10});
    CHECK(rest.devices.size() == kPerHost - 2);
    CHECK(rest.devices.front().record.name > page.devices.back().record.name);
  }
  SECTION("hosts in pages, filtered by connection and drain") {
    std::set<std::string> seen;
    PageSpec spec{.after = {}, .limit = 6};
    for (;;) {
      auto page = pool.core->host_page({}, spec);
      for (const auto& h : page.hosts) CHECK(seen.insert(h.name).second);
      if (!page.next) break;
      spec.after = page.next;
    }
    CHECK(seen.size() == kHosts + 1);
    HostFilter gone;
    gone.connected = false;
    auto page = pool.core->host_page(gone, {});
    REQUIRE(page.hosts.size() == 1);
    CHECK(page.hosts[0].name == host_name(3));
    CHECK(page.hosts[0].device_count == kPerHost);
    HostFilter drained;
    drained.draining = true;
    page = pool.core->host_page(drained, {});
    REQUIRE(page.hosts.size() == 1);
    CHECK(page.hosts[0].name == host_name(2));
  }
}

TEST_CASE("a store that holds one device name twice is reported corrupt at start", "[core][restart]") {
  // The store keys device rows by scheduler id and leaves names to the pool: two rows of one name can only come
  // from a damaged store.
  Batch b;
  b.devices.push_back({"h/d0", "h", "d0", "fpga", "m", false, "", false, true, 0});
  b.devices.push_back({"h/d0", "h", "d0", "fpga", "m", false, "", false, true, 1});
  const auto refused = start_refused(b);
  CHECK(refused.code == Errc::corrupt);
  CHECK(refused.message == "device h/d0 is stored twice");
}
