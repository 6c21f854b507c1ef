#include "test_support.hpp"

#include <algorithm>
#include <fstream>

using namespace accelpool::manager;
using namespace accelpool::manager::test;

TEST_CASE("the SQLite store round-trips a batch atomically", "[store]") {
  TempDir dir;
  auto opened = open_sqlite_store(dir.path / "s.db", true);
  REQUIRE(opened.is_ok());
  auto& store = **opened;
  Batch b;
  Lease l;
  l.id = 7;
  l.tenant = "t";
  l.guest = "g";
  l.kind = "fpga";
  l.state = LeaseState::granted;
  l.devices = {"h/d0", "h/d1"};
  l.estimate_s = 3.5;
  b.leases.push_back(l);
  b.devices.push_back({"h/d0", "h", "d0", "fpga", "m", true, "vadd", false, true, 0});
  b.tenants.push_back({"t", 2.0, 4, "abc"});
  b.meta.emplace_back("k", "v");
  REQUIRE(store.apply(b).is_ok());
  auto snap = store.load(100);
  REQUIRE(snap.is_ok());
  REQUIRE(snap->leases.size() == 1);
  CHECK(snap->leases[0].devices == l.devices);
  CHECK(snap->leases[0].estimate_s == 3.5);
  CHECK(snap->leases[0].state == LeaseState::granted);
  CHECK(snap->devices.at(0).loaded == "vadd");
  CHECK(snap->tenants.at(0).weight == 2.0);
  CHECK(snap->meta.at("k") == "v");
  CHECK(snap->max_lease_id == 7);

  // A batch that fails halfway leaves nothing behind: two devices with the same scheduler id.
  Batch bad;
  bad.leases.push_back(l);
  bad.leases.back().id = 8;
  bad.devices.push_back({"h/d1", "h", "d1", "fpga", "m", true, "", false, true, 0});
  CHECK_FALSE(store.apply(bad).is_ok());
  auto snap2 = store.load(100);
  REQUIRE(snap2.is_ok());
  CHECK(snap2->leases.size() == 1);
  CHECK(snap2->devices.size() == 1);

  TempDir other;
  REQUIRE(store.backup(other.path / "copy.db").is_ok());
  auto copy = open_sqlite_store(other.path / "copy.db", false);
  REQUIRE(copy.is_ok());
  CHECK((*copy)->load(10)->leases.size() == 1);
}

TEST_CASE("a file that is not a database gives a clear error", "[store]") {
  TempDir dir;
  std::ofstream(dir.path / "junk.db") << "this is not sqlite, just some text that is long enough to matter............";
  auto opened = open_sqlite_store(dir.path / "junk.db", false);
  REQUIRE_FALSE(opened.is_ok());
  CHECK(opened.error().code == "store");
  CHECK(opened.error().message.find("junk.db") != std::string::npos);
}

TEST_CASE("old ended leases are pruned from the store; live ones and the newest id stay", "[store]") {
  TempDir dir;
  auto opened = open_sqlite_store(dir.path / "s.db", false);
  REQUIRE(opened.is_ok());
  auto& store = **opened;
  Batch b;
  auto lease = [](LeaseId id, LeaseState state, double ended_at) {
    Lease l;
    l.id = id;
    l.tenant = "t";
    l.guest = "g";
    l.kind = "fpga";
    l.state = state;
    l.ended_at = ended_at;
    return l;
  };
  b.leases.push_back(lease(1, LeaseState::released, 100));  // old: pruned
  b.leases.push_back(lease(2, LeaseState::granted, 0));     // live: kept whatever its age
  b.leases.push_back(lease(3, LeaseState::expired, 900));   // recent: kept
  b.leases.push_back(lease(4, LeaseState::cancelled, 50));  // old but the newest id: kept
  REQUIRE(store.apply(b).is_ok());
  Batch prune;
  prune.prune_ended_before = 500;
  REQUIRE_FALSE(prune.empty());
  REQUIRE(store.apply(prune).is_ok());
  auto snap = store.load(100);
  REQUIRE(snap.is_ok());
  std::vector<LeaseId> ids;
  for (const auto& l : snap->leases) ids.push_back(l.id);
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<LeaseId>{2, 3, 4});
  CHECK(snap->max_lease_id == 4);
}
