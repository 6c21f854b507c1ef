// What only the PostgreSQL store does: its schema versions, and leadership among managers sharing one database
// (one leader, fenced writes, takeover). In the test process's private cluster (tests/support/postgres_cluster.hpp).
#include "hung_after.hpp"
#include "postgres_cluster.hpp"
#include "test_support.hpp"

using namespace accelpool::manager;
using accelpool::Errc;
using accelpool::testing::eventually;
using accelpool::testing::PostgresCluster;

namespace {

// A fresh database of the cluster; returns its name.
std::string fresh_database() {
  static int created = 0;
  std::string name = "ha" + std::to_string(++created);
  PostgresCluster::shared().create_database(name);
  return name;
}

std::unique_ptr<SharedStore> open_shared(const std::string& database) {
  auto opened = open_postgres_store(PostgresCluster::shared().url(database));
  INFO((opened.is_ok() ? "" : opened.error().message));
  REQUIRE(opened.is_ok());
  return std::move(*opened);
}

ManagerInfo manager(const std::string& name) { return {name, "http://" + name + ":7080", name + ":7070", ""}; }

// A fresh database, and a store on it that leads it as manager "a" (timeout 60 s).
std::pair<std::string, std::unique_ptr<SharedStore>> fresh_leader() {
  auto db = fresh_database();
  auto store = open_shared(db);
  REQUIRE(*store->try_lead(manager("a"), 60));
  return {db, std::move(store)};
}

Batch one_lease(LeaseId id) {
  Batch b;
  Lease l;
  l.id = id;
  l.tenant = "t";
  l.guest = "g";
  l.kind = "fpga";
  b.leases.push_back(l);
  return b;
}

std::size_t stored_leases(Store& store) {
  auto snap = store.load(100);
  REQUIRE(snap.is_ok());
  return snap->leases.size();
}

}  // namespace

TEST_CASE("a PostgreSQL database gets the current schema once, and a newer one is refused", "[store][postgres]") {
  const auto db = fresh_database();
  auto& cluster = PostgresCluster::shared();
  open_shared(db).reset();
  open_shared(db).reset();  // a second open finds the schema there and changes nothing
  CHECK(cluster.sql(db, "SELECT version FROM accelpool_schema") == "3");
  CHECK(cluster.sql(db, "SELECT count(*) FROM leader") == "1");
  // Device rows keyed by their scheduler id (version 3), no second index by name.
  const std::string device_indexes =
      "SELECT string_agg(indexdef, ' | ' ORDER BY indexname) FROM pg_indexes WHERE "
      "tablename = 'devices'";
  CHECK(cluster.sql(db, device_indexes) == "CREATE UNIQUE INDEX devices_pkey ON public.devices USING btree (sched_id)");
  // Versions 1 and 2 kept device rows by name, with the scheduler id unique beside it.
  const std::string devices_by_name =
      "ALTER TABLE devices DROP CONSTRAINT devices_pkey; ALTER TABLE devices ADD PRIMARY KEY (name); "
      "ALTER TABLE devices ADD CONSTRAINT devices_sched_id_key UNIQUE (sched_id); "
      "INSERT INTO devices VALUES ('h/d0', 'h', 'd0', 'fpga', 'u250', 0, '', 0, 1, 7)";
  // A version 1 database (leases without their label) is upgraded in place.
  cluster.sql(db, devices_by_name);
  cluster.sql(db, "ALTER TABLE leases DROP COLUMN label");
  cluster.sql(db, "UPDATE accelpool_schema SET version = 1");
  open_shared(db).reset();
  CHECK(cluster.sql(db, "SELECT version FROM accelpool_schema") == "3");
  CHECK(cluster.sql(db,
                    "SELECT count(*) FROM information_schema.columns WHERE table_name = 'leases' AND "
                    "column_name = 'label'") == "1");
  CHECK(cluster.sql(db, device_indexes) == "CREATE UNIQUE INDEX devices_pkey ON public.devices USING btree (sched_id)");
  CHECK(cluster.sql(db, "SELECT name || ' ' || sched_id FROM devices") == "h/d0 7");
  // A version 2 database is upgraded in place: its device rows stay, and a later write of one updates it.
  cluster.sql(db, "DELETE FROM devices");
  cluster.sql(db, devices_by_name);
  cluster.sql(db, "UPDATE accelpool_schema SET version = 2");
  {
    auto store = open_shared(db);
    CHECK(cluster.sql(db, "SELECT version FROM accelpool_schema") == "3");
    CHECK(cluster.sql(db, device_indexes) ==
          "CREATE UNIQUE INDEX devices_pkey ON public.devices USING btree (sched_id)");
    auto snap = store->load(10);
    REQUIRE(snap.is_ok());
    REQUIRE(snap->devices.size() == 1);
    CHECK(snap->devices[0].name == "h/d0");
    CHECK(snap->devices[0].sched_id == 7);
  }
  cluster.sql(db, "UPDATE accelpool_schema SET version = 99");
  auto opened = open_postgres_store(cluster.url(db));
  REQUIRE_FALSE(opened.is_ok());
  CHECK(opened.error().code == Errc::store);
  CHECK(opened.error().message.find("schema version 99, newer than this manager understands (3)") != std::string::npos);
}

TEST_CASE("a PostgreSQL server that cannot be reached gives a clear error", "[store][postgres]") {
  auto opened = open_postgres_store("postgresql:///nowhere?host=/nonexistent-accelpool-folder&user=accelpool");
  REQUIRE_FALSE(opened.is_ok());
  CHECK(opened.error().code == Errc::store);
  CHECK(opened.error().message.find("connecting to PostgreSQL") != std::string::npos);
  CHECK(opened.error().message.find("nonexistent-accelpool-folder") != std::string::npos);
}

TEST_CASE("of two managers on one database one leads, and the other may not write until it takes over",
          "[store][postgres]") {
  const auto db = fresh_database();
  auto a = open_shared(db);
  auto b = open_shared(db);
  // Before leading, nobody writes.
  auto before = a->apply(one_lease(1));
  REQUIRE_FALSE(before.is_ok());
  CHECK(before.error().code == Errc::fenced);

  REQUIRE(*a->try_lead(manager("a"), 60));
  CHECK(a->epoch() == 1);
  REQUIRE_FALSE(*b->try_lead(manager("b"), 60));  // a renews within its timeout: b stays a standby
  CHECK(b->epoch() == 0);
  REQUIRE(a->apply(one_lease(1)).is_ok());
  auto refused = b->apply(one_lease(2));
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::fenced);

  REQUIRE(b->announce(manager("b"), 60).is_ok());
  auto view = b->leadership();
  REQUIRE(view.is_ok());
  CHECK(view->epoch == 1);
  CHECK(view->leader.name == "a");
  CHECK(view->leader.admin_url == "http://a:7080");
  CHECK(view->leader.guest_tcp == "a:7070");
  CHECK(view->since > 0);
  REQUIRE(view->standbys.size() == 1);
  CHECK(view->standbys[0].name == "b");

  // The leader's process ends (its session with it): the standby takes over at its next attempt, with the next
  // epoch, and finds everything the old leader committed.
  a.reset();
  REQUIRE(eventually([&] { return *b->try_lead(manager("b"), 60); }));
  CHECK(b->epoch() == 2);
  CHECK(stored_leases(*b) == 1);
  REQUIRE(b->apply(one_lease(2)).is_ok());
  CHECK(stored_leases(*b) == 2);
  view = b->leadership();
  REQUIRE(view.is_ok());
  CHECK(view->leader.name == "b");
  CHECK(view->standbys.empty());  // the leader is not its own standby
}

TEST_CASE("a leader that stops renewing past its timeout is fenced: it can never write again", "[store][postgres]") {
  const auto db = fresh_database();
  auto a = open_shared(db);
  auto b = open_shared(db);
  // A short timeout, as a paused or cut-off leader would let pass: a does not renew, b waits for it to lapse.
  REQUIRE(*a->try_lead(manager("a"), 0.2));
  REQUIRE(a->apply(one_lease(1)).is_ok());
  REQUIRE(eventually([&] { return *b->try_lead(manager("b"), 60); }));
  CHECK(b->epoch() == 2);

  // The old leader comes back: its writes and renewals fail, naming both epochs, and leave nothing behind.
  auto late = a->apply(one_lease(2));
  REQUIRE_FALSE(late.is_ok());
  CHECK(late.error().code == Errc::fenced);
  CHECK(late.error().message.find("led with epoch 1, the store is at epoch 2") != std::string::npos);
  auto renewed = a->renew();
  REQUIRE_FALSE(renewed.is_ok());
  CHECK(renewed.error().code == Errc::fenced);
  CHECK(stored_leases(*b) == 1);
  REQUIRE(b->renew().is_ok());
  REQUIRE(b->apply(one_lease(3)).is_ok());
  CHECK(stored_leases(*b) == 2);
}

TEST_CASE("a leader's batch that fails halfway leaves nothing, and the leader keeps leading", "[store][postgres]") {
  auto [db, a] = fresh_leader();
  // Device rows are keyed by scheduler id, names left to the pool: a unique index on names added behind the
  // store's back makes the second row named h/d0 fail.
  PostgresCluster::shared().sql(db, "CREATE UNIQUE INDEX devices_by_name ON devices(name)");
  Batch bad = one_lease(1);
  bad.devices.push_back({"h/d0", "h", "d0", "fpga", "m", true, "", false, true, 0});
  bad.devices.push_back({"h/d0", "h", "d0", "fpga", "m", true, "", false, true, 1});  // the same name
  auto failed = a->apply(bad);
  REQUIRE_FALSE(failed.is_ok());
  CHECK(failed.error().code == Errc::store);
  CHECK(failed.error().message.find("writing devices h/d0, h/d0") != std::string::npos);
  CHECK(stored_leases(*a) == 0);
  REQUIRE(a->apply(one_lease(2)).is_ok());
  CHECK(stored_leases(*a) == 1);
}

TEST_CASE(
    "a leader whose database session is ended finds its connection gone, not a failed store, and wrote "
    "nothing",
    "[store][postgres]") {
  auto [db, a] = fresh_leader();
  REQUIRE(a->apply(one_lease(1)).is_ok());
  // The server ends the leader's session, as a database restart or a broken connection would.
  REQUIRE(PostgresCluster::shared().sql(db, "SELECT pg_terminate_backend(backend_pid) FROM leader") == "t");
  auto lost = a->apply(one_lease(2));
  REQUIRE_FALSE(lost.is_ok());
  CHECK(lost.error().code == Errc::disconnected);
  INFO(lost.error().message);
  CHECK(lost.error().message.find("checking the leader's epoch") != std::string::npos);
  auto renewed = a->renew();
  REQUIRE_FALSE(renewed.is_ok());
  CHECK(renewed.error().code == Errc::disconnected);
  // The session is gone: another manager takes over at once, from what was committed.
  auto b = open_shared(db);
  REQUIRE(*b->try_lead(manager("b"), 60));
  CHECK(stored_leases(*b) == 1);
}

TEST_CASE(
    "a batch of 1,000 leases is written whole, and a row that comes twice in a batch is written as it was "
    "last",
    "[store][postgres]") {
  auto [db, a] = fresh_leader();
  Batch big;
  for (LeaseId id = 1; id <= 1000; ++id) big.leases.push_back(one_lease(id).leases.front());
  REQUIRE(a->apply(big).is_ok());
  auto snap = a->load(0);
  REQUIRE(snap.is_ok());
  CHECK(snap->leases.size() == 1000);  // all live
  CHECK(snap->max_lease_id == 1000);

  // One upsert per table writes a lease, a device and a tenant that each come twice: the last of each counts.
  Batch twice = one_lease(7);
  twice.leases.front().guest = "first";
  twice.leases.push_back(twice.leases.front());
  twice.leases.back().guest = "last \"quoted\", {braced}";
  twice.devices.push_back({"h/d0", "h", "d0", "fpga", "m", true, "", false, true, 0});
  twice.devices.push_back({"h/d0", "h", "d0", "fpga", "m", true, "image", true, true, 0});
  twice.tenants.push_back({"t", 1.0, 2, "hash-1"});
  twice.tenants.push_back({"t", 3.0, 4, "hash-2"});
  REQUIRE(a->apply(twice).is_ok());
  auto lease = a->lease(7);
  REQUIRE(lease.is_ok());
  REQUIRE(lease->has_value());
  CHECK((*lease)->guest == "last \"quoted\", {braced}");
  CHECK(PostgresCluster::shared().sql(db, "SELECT loaded || draining FROM devices") == "image1");
  CHECK(PostgresCluster::shared().sql(db, "SELECT weight || '/' || max_devices || '/' || token_hash FROM tenants") ==
        "3/4/hash-2");
}
