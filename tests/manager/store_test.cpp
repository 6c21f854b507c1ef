#include "hung_after.hpp"
#include "postgres_cluster.hpp"
#include "store_rows.hpp"
#include "store_writer.hpp"
#include "test_support.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

using namespace accelpool::manager;
using accelpool::Errc;
using namespace accelpool::manager::test;

namespace {

// A lease of tenant t's guest g as the store sees it.
Lease stored_lease(LeaseId id, LeaseState state, double ended_at) {
  Lease l;
  l.id = id;
  l.tenant = "t";
  l.guest = "g";
  l.kind = "fpga";
  l.state = state;
  l.ended_at = ended_at;
  return l;
}

// The store in `file`, which must open (the test stops there when it does not).
std::unique_ptr<Store> open_store(const std::filesystem::path& file, bool full_sync) {
  auto opened = open_sqlite_store(file, full_sync);
  INFO((opened.is_ok() ? "" : opened.error().message));
  REQUIRE(opened.is_ok());
  return std::move(*opened);
}

// Where one test's stores live. open(name) reaches the same store again for the same name, once the store opened
// before under that name is closed.
struct StoreKind {
  virtual ~StoreKind() = default;
  virtual std::unique_ptr<Store> open(const std::string& name) = 0;
  // Runs SQL on store `name` behind the store's back (to damage it).
  virtual void sql(const std::string& name, const std::string& statement) = 0;
};

// SQLite files in a temporary folder.
struct SqliteStores : StoreKind {
  TempDir dir;
  std::unique_ptr<Store> open(const std::string& name) override { return open_store(dir.path / (name + ".db"), false); }
  void sql(const std::string& name, const std::string& statement) override {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir.path / (name + ".db")).c_str(), &db) == SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, statement.c_str(), nullptr, nullptr, &err);
    INFO((err ? err : ""));
    sqlite3_free(err);
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_OK);
  }
};

// Databases of the test process's private PostgreSQL cluster; each store opened leads (it may write).
struct PostgresStores : StoreKind {
  std::map<std::string, std::string> databases;  // name -> database
  std::unique_ptr<Store> open(const std::string& name) override {
    static int created = 0;
    auto& cluster = accelpool::testing::PostgresCluster::shared();
    if (!databases.count(name)) {
      databases[name] = "t" + std::to_string(++created);
      cluster.create_database(databases[name]);
    }
    auto opened = open_postgres_store(cluster.url(databases[name]));
    INFO((opened.is_ok() ? "" : opened.error().message));
    REQUIRE(opened.is_ok());
    // The session of the store closed before under this name ends on the server a moment after it closed.
    REQUIRE(accelpool::testing::eventually([&] {
      auto led = (*opened)->try_lead({"test", "", "", ""}, 60);
      REQUIRE(led.is_ok());
      return *led;
    }));
    return std::move(*opened);
  }
  void sql(const std::string& name, const std::string& statement) override {
    accelpool::testing::PostgresCluster::shared().sql(databases.at(name), statement);
  }
};

// Makes store `name` of `kind` holding `leases`, and closes it.
void write_leases(StoreKind& kind, const std::string& name, std::vector<Lease> leases) {
  const auto store = kind.open(name);
  Batch b;
  b.leases = std::move(leases);
  REQUIRE(store->apply(b).is_ok());
}

}  // namespace

// A test case run on each store: "<title> (SQLite)" tagged [store], and "<title> (PostgreSQL)" tagged
// [store][postgres], in the test process's private cluster (ctest runs those under the label postgres).
#define STORE_TEST_CASE(title, body)                      \
  TEST_CASE(title " (SQLite)", "[store]") {               \
    SqliteStores kind;                                    \
    body(kind);                                           \
  }                                                       \
  TEST_CASE(title " (PostgreSQL)", "[store][postgres]") { \
    PostgresStores kind;                                  \
    body(kind);                                           \
  }

namespace {

void round_trip(StoreKind& kind) {
  const auto owned = kind.open("s");
  Store& store = *owned;
  Batch b;
  Lease l = stored_lease(7, LeaseState::granted, 0);
  l.devices = {"h/d0", "h/d1"};
  l.estimate_s = 3.5;
  l.label = "train.py";
  l.grants.resize(2);
  l.grants[0].loaded = "vadd";
  l.grants[0].attach = accelpool::host::AttachMode::pci_hostdev;
  l.grants[0].guest_pci = "0000:00:0a.0";
  l.grants[0].details = {"fpga", "m", "Xilinx", 0x10ee, 0x5005, 1ull << 36, "0000:65:00.1"};
  l.grants[1].attach = accelpool::host::AttachMode::network;
  l.grants[1].endpoint = "10.0.0.7:5000";
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
  CHECK(snap->leases[0].label == "train.py");
  CHECK(snap->leases[0].state == LeaseState::granted);
  // What the hosts did comes back whole, aligned with the devices.
  const auto& grants = snap->leases[0].grants;
  REQUIRE(grants.size() == 2);
  CHECK(grants[0].loaded == "vadd");
  CHECK(grants[0].attach == accelpool::host::AttachMode::pci_hostdev);
  CHECK(grants[0].guest_pci == "0000:00:0a.0");
  CHECK(grants[0].details.vendor == "Xilinx");
  CHECK(grants[0].details.pci_vendor_id == 0x10ee);
  CHECK(grants[0].details.pci_device_id == 0x5005);
  CHECK(grants[0].details.memory_bytes == (1ull << 36));
  CHECK(grants[0].details.host_pci == "0000:65:00.1");
  CHECK(grants[1].attach == accelpool::host::AttachMode::network);
  CHECK(grants[1].endpoint == "10.0.0.7:5000");
  CHECK(snap->devices.at(0).loaded == "vadd");
  CHECK(snap->tenants.at(0).weight == 2.0);
  CHECK(snap->meta.at("k") == "v");
  CHECK(snap->max_lease_id == 7);

  // A batch that fails halfway leaves nothing behind. The store keys device rows by scheduler id and leaves
  // names to the pool; a unique index added behind its back makes a second row named h/d0 fail.
  kind.sql("s", "CREATE UNIQUE INDEX devices_by_name ON devices(name)");
  Batch bad;
  bad.leases.push_back(l);
  bad.leases.back().id = 8;
  bad.meta.emplace_back("k", "changed");  // written before the devices
  bad.devices.push_back({"h/d0", "h", "d0", "fpga", "m", true, "", false, true, 1});
  CHECK_FALSE(store.apply(bad).is_ok());
  auto snap2 = store.load(100);
  REQUIRE(snap2.is_ok());
  CHECK(snap2->leases.size() == 1);
  CHECK(snap2->devices.size() == 1);
  CHECK(snap2->meta.at("k") == "v");
}

}  // namespace

STORE_TEST_CASE("a store round-trips a batch atomically", round_trip)

namespace {

// The daemon's pipelined group commit: batches applied on the writer's thread while this one reads the store.
// With a threshold of 0 every write counts as slow, so every batch after the first goes to the writer thread.
void written_beside_reads(StoreKind& kind) {
  const auto owned = kind.open("w");
  Store& store = *owned;
  StoreWriter writer(store, std::chrono::microseconds(0));
  constexpr LeaseId kBatches = 40;
  std::atomic<LeaseId> written{0}, on_caller_thread{0};
  std::atomic<bool> all_ok{true};
  const auto caller = std::this_thread::get_id();
  for (LeaseId id = 1; id <= kBatches; ++id) {
    Batch b;
    b.leases.push_back(stored_lease(id, LeaseState::released, static_cast<double>(id)));
    b.meta.emplace_back("last", std::to_string(id));
    writer.write(std::move(b), [&, id](accelpool::Status s) {  // no assertion here: another thread
      if (!s) all_ok = false;
      if (std::this_thread::get_id() == caller) ++on_caller_thread;
      written = id;
    });
    // Reads meanwhile: each sees the store before or after the batch in flight, never a part of it.
    auto found = store.lease(id);
    REQUIRE(found.is_ok());
    LeasePageSpec spec;
    spec.limit = 1000;
    auto ended = store.ended_leases(LeaseFilter{}, spec);
    REQUIRE(ended.is_ok());
    CHECK((ended->size() == static_cast<std::size_t>(id) || ended->size() == static_cast<std::size_t>(id - 1)));
    writer.wait_idle();
    CHECK(written == id);
  }
  CHECK(all_ok);
  CHECK(on_caller_thread == 1);  // the first: nothing was slow before it
  auto snap = store.load(1000);
  REQUIRE(snap.is_ok());
  CHECK(snap->leases.size() == kBatches);
  CHECK(snap->meta.at("last") == std::to_string(kBatches));
}

}  // namespace

STORE_TEST_CASE("the store writer applies batches on its own thread while the store is read", written_beside_reads)

TEST_CASE("the store writer writes quick transactions on the caller's thread, before write returns", "[store]") {
  SqliteStores kind;
  const auto owned = kind.open("q");
  StoreWriter writer(*owned, std::chrono::hours(1));  // nothing is slow
  for (LeaseId id = 1; id <= 5; ++id) {
    Batch b;
    b.leases.push_back(stored_lease(id, LeaseState::released, static_cast<double>(id)));
    std::optional<std::thread::id> ran_on;
    writer.write(std::move(b), [&](accelpool::Status s) {
      CHECK(s.is_ok());
      ran_on = std::this_thread::get_id();
    });
    REQUIRE(ran_on);
    CHECK(*ran_on == std::this_thread::get_id());
    auto found = owned->lease(id);
    REQUIRE(found.is_ok());
    CHECK(found->has_value());
  }
}

TEST_CASE("a histogram's numbers read back exactly as they were written", "[store]") {
  const std::vector<double> values{0.0,
                                   -0.0,
                                   0.1,
                                   1.0 / 3.0,
                                   1e-300,
                                   5e-324,
                                   1.7976931348623157e308,
                                   -2.5,
                                   600.125,
                                   std::numeric_limits<double>::infinity()};
  const std::string text = accelpool::manager::store_rows::format_numbers(values);
  CHECK(text.starts_with("0 -0 0.1 0.3333333333333333 1e-300 5e-324 1.7976931348623157e+308 -2.5 600.125 inf"));
  auto back = accelpool::manager::store_rows::parse_numbers(text);
  REQUIRE(back);
  REQUIRE(back->size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("value " << i);
    CHECK(std::memcmp(&(*back)[i], &values[i], sizeof(double)) == 0);  // bit for bit, the sign of zero too
  }
  CHECK(accelpool::manager::store_rows::format_numbers({}).empty());
  CHECK_FALSE(accelpool::manager::store_rows::parse_numbers("1 x 2"));
}

TEST_CASE("the SQLite store writes a consistent backup while in use", "[store]") {
  TempDir dir;
  const auto store = open_store(dir.path / "s.db", true);
  Batch b;
  b.leases.push_back(stored_lease(7, LeaseState::granted, 0));
  REQUIRE(store->apply(b).is_ok());
  TempDir other;
  REQUIRE(store->backup(other.path / "copy.db").is_ok());
  auto copy = open_sqlite_store(other.path / "copy.db", false);
  REQUIRE(copy.is_ok());
  CHECK((*copy)->load(10)->leases.size() == 1);
}

TEST_CASE("the PostgreSQL store refuses a backup and names PostgreSQL's tools", "[store][postgres]") {
  PostgresStores kind;
  const auto store = kind.open("s");
  TempDir other;
  auto s = store->backup(other.path / "copy.db");
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.error().code == Errc::store);
  CHECK(s.error().message.find("pg_dump") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(other.path / "copy.db"));
}

TEST_CASE("a file that is not a database gives a clear error", "[store]") {
  TempDir dir;
  std::ofstream(dir.path / "junk.db") << "this is not sqlite, just some text that is long enough to matter............";
  auto opened = open_sqlite_store(dir.path / "junk.db", false);
  REQUIRE_FALSE(opened.is_ok());
  CHECK(opened.error().code == Errc::store);
  CHECK(opened.error().message.find("junk.db") != std::string::npos);
}

namespace {

void prune(StoreKind& kind) {
  const auto owned = kind.open("s");
  Store& store = *owned;
  Batch b;
  b.leases.push_back(stored_lease(1, LeaseState::released, 100));  // old: pruned
  b.leases.push_back(stored_lease(2, LeaseState::granted, 0));     // live: kept whatever its age
  b.leases.push_back(stored_lease(3, LeaseState::expired, 900));   // recent: kept
  b.leases.push_back(stored_lease(4, LeaseState::cancelled, 50));  // old but the newest id: kept
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

}  // namespace

STORE_TEST_CASE("old ended leases are pruned from the store, live ones and the newest id stay", prune)

TEST_CASE("under a steady stream of commits the WAL is checkpointed and stays bounded", "[store]") {
  TempDir dir;
  auto file = dir.path / "s.db";
  const auto owned = open_store(file, false);
  Store& store = *owned;
  // Each commit writes at least one 4 KiB page to the WAL: 50,000 commits put more than 200 MB through it, past
  // the point (128 MiB) where the WAL starts over.
  const int commits = 50000;
  for (int i = 1; i <= commits; ++i) {
    Batch b;
    b.leases.push_back(
        stored_lease(static_cast<LeaseId>(i), i % 2 ? LeaseState::granted : LeaseState::released, i % 2 ? 0 : i));
    REQUIRE(store.apply(b).is_ok());
  }
  // Checkpoints run on the store's own thread, and a WAL starts over at the first commit after one completed:
  // go on committing at a gentler pace for a moment, as a daemon between bursts would.
  auto wal = std::filesystem::path(file.string() + "-wal");
  auto wal_bytes = [&] { return std::filesystem::exists(wal) ? std::filesystem::file_size(wal) : 0; };
  const std::uintmax_t bound = 170u * 1024 * 1024;  // 128 MiB, plus one checkpoint's 32 MiB, plus slack
  LeaseId next = commits + 1;
  for (auto deadline = std::chrono::steady_clock::now() + accelpool::testing::kHungAfter;
       std::chrono::steady_clock::now() < deadline &&
       (wal_bytes() >= bound || std::filesystem::file_size(file) < 1024 * 1024);) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Batch b;
    b.leases.push_back(stored_lease(next++, LeaseState::queued, 0));
    REQUIRE(store.apply(b).is_ok());
  }
  CHECK(std::filesystem::file_size(file) >= 1024 * 1024);  // the pages reached the database file
  INFO("WAL bytes: " << wal_bytes());
  CHECK(wal_bytes() < bound);  // started over instead of holding every frame
  auto snap = store.load(10);
  REQUIRE(snap.is_ok());
  CHECK(snap->max_lease_id == next - 1);
}

namespace {

// The devices table of schema versions 1 to 6 (rows keyed by name, the scheduler id unique), with one row.
constexpr const char* kDevicesByName =
    "DROP TABLE devices; CREATE TABLE devices (name TEXT PRIMARY KEY, host TEXT NOT NULL, local_id TEXT NOT NULL, "
    "kind TEXT NOT NULL, model TEXT NOT NULL, passthrough INTEGER NOT NULL, loaded TEXT NOT NULL, "
    "draining INTEGER NOT NULL, available INTEGER NOT NULL, sched_id INTEGER NOT NULL UNIQUE); "
    "INSERT INTO devices VALUES ('h/d0', 'h', 'd0', 'fpga', 'u250', 0, '', 0, 1, 7); ";

// Runs `sql` on the database `file` directly (as an older manager would have left it).
void run_sql(const std::filesystem::path& file, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(file.c_str(), &db) == SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  INFO((err ? err : ""));
  sqlite3_free(err);
  sqlite3_close(db);
  REQUIRE(rc == SQLITE_OK);
}

// How the devices table of `file` is kept: its indexes (automatic ones included), and whether its rowid is
// the scheduler id.
std::string device_table_shape(const std::filesystem::path& file) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(file.c_str(), &db) == SQLITE_OK);
  auto number = [&](const char* sql) {
    sqlite3_stmt* st = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK);
    std::int64_t n = -1;
    if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
  };
  const auto indexes = number("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'devices'");
  const auto same = number("SELECT count(*) = (SELECT count(*) FROM devices WHERE rowid = sched_id) FROM devices");
  sqlite3_close(db);
  return "indexes=" + std::to_string(indexes) + " rowid_is_sched_id=" + std::to_string(same);
}

}  // namespace

TEST_CASE("a database of schema version 1 is upgraded in place", "[store]") {
  SqliteStores kind;
  auto file = kind.dir.path / "v1.db";
  // Version 1 had the same tables with full indexes, no `relayed`, `grants` or `label` column, and device rows
  // keyed by name: make one from a store of today, with two leases and a device in it.
  write_leases(kind, "v1", {stored_lease(5, LeaseState::granted, 0), stored_lease(6, LeaseState::released, 3)});
  run_sql(file,
          "DROP INDEX leases_live_by_id; DROP INDEX leases_ended_by_time; CREATE INDEX leases_live ON leases(state); "
          "CREATE INDEX leases_ended ON leases(ended_at); ALTER TABLE leases DROP COLUMN relayed; "
          "ALTER TABLE leases DROP COLUMN grants; ALTER TABLE leases DROP COLUMN label; DROP TABLE estimates; " +
              std::string(kDevicesByName) + "PRAGMA user_version=1;");
  {
    auto snap = open_store(file, false)->load(10);
    REQUIRE(snap.is_ok());
    REQUIRE(snap->leases.size() == 2);
    CHECK(snap->leases[0].id == 5);
    CHECK(snap->leases[0].state == LeaseState::granted);
    CHECK_FALSE(snap->leases[0].relayed);
    CHECK(snap->leases[0].grants.empty());
    CHECK(snap->leases[0].label.empty());
    CHECK(snap->leases[1].state == LeaseState::released);
    CHECK(snap->max_lease_id == 6);
    CHECK(snap->estimates.empty());  // the table of learned run times exists, empty
    REQUIRE(snap->devices.size() == 1);
    CHECK(snap->devices[0].name == "h/d0");
    CHECK(snap->devices[0].sched_id == 7);
  }
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(file.c_str(), &db) == SQLITE_OK);
  std::vector<std::string> indexes;
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(db,
                             "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='leases' ORDER BY name",
                             -1, &st, nullptr) == SQLITE_OK);
  while (sqlite3_step(st) == SQLITE_ROW)
    indexes.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
  sqlite3_finalize(st);
  int version = 0;
  REQUIRE(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr) == SQLITE_OK);
  if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  CHECK(indexes == std::vector<std::string>{"leases_ended_by_time", "leases_live_by_id"});
  CHECK(version == 7);
  CHECK(device_table_shape(file) == "indexes=0 rowid_is_sched_id=1");
}

TEST_CASE("a store of schema version 6 keys its device rows by scheduler id after the upgrade, rows kept", "[store]") {
  SqliteStores kind;
  auto file = kind.dir.path / "v6.db";
  write_leases(kind, "v6", {stored_lease(5, LeaseState::granted, 0)});
  run_sql(file, std::string(kDevicesByName) + "PRAGMA user_version=6;");
  CHECK(device_table_shape(file) == "indexes=2 rowid_is_sched_id=0");  // the name's and the scheduler id's
  auto store = open_store(file, false);
  auto snap = store->load(10);
  REQUIRE(snap.is_ok());
  REQUIRE(snap->devices.size() == 1);
  CHECK(snap->devices[0].name == "h/d0");
  CHECK(snap->devices[0].model == "u250");
  CHECK(snap->devices[0].sched_id == 7);
  CHECK(snap->leases.size() == 1);
  // A later write of the device updates its row (keyed by the scheduler id), it adds none.
  Batch b;
  DeviceRecord d = snap->devices[0];
  d.available = false;
  b.devices.push_back(d);
  REQUIRE(store->apply(b).is_ok());
  auto again = store->load(10);
  REQUIRE(again.is_ok());
  REQUIRE(again->devices.size() == 1);
  CHECK_FALSE(again->devices[0].available);
  store.reset();
  CHECK(device_table_shape(file) == "indexes=0 rowid_is_sched_id=1");
}

namespace {

void learned_run_times(StoreKind& kind) {
  auto record = [](bool whole_kind, std::uint64_t observations) {
    EstimateRecord e;
    e.kind = "fpga";
    e.whole_kind = whole_kind;
    if (!whole_kind) {
      e.tenant = "t";
      e.bitstream = "aes";
      e.count = 2;
      e.label = "train.py";
    }
    e.observations = observations;
    e.weights.assign(33, 0.0);
    e.sums.assign(33, 0.0);
    e.weights[5] = 0.1 + static_cast<double>(observations);  // not a short decimal: must come back exactly
    e.sums[5] = 17.0 / 3 * static_cast<double>(observations);
    return e;
  };
  {
    const auto store = kind.open("s");
    Batch b;
    b.estimates = {record(false, 1), record(true, 1)};
    REQUIRE(store->apply(b).is_ok());
    Batch again;
    again.estimates = {record(false, 2)};
    REQUIRE(store->apply(again).is_ok());
  }
  const auto store = kind.open("s");
  auto snap = store->load(10);
  REQUIRE(snap.is_ok());
  REQUIRE(snap->estimates.size() == 2);
  // Ordered by kind, then the group of one tenant after the whole kind's (whole_kind sorts 0 before 1 in SQL).
  const auto& group = snap->estimates[0];
  const auto& kind_wide = snap->estimates[1];
  CHECK_FALSE(group.whole_kind);
  CHECK(group.tenant == "t");
  CHECK(group.bitstream == "aes");
  CHECK(group.count == 2);
  CHECK(group.label == "train.py");
  CHECK(group.observations == 2);
  CHECK(group.weights == record(false, 2).weights);
  CHECK(group.sums == record(false, 2).sums);
  CHECK(kind_wide.whole_kind);
  CHECK(kind_wide.observations == 1);
  CHECK(kind_wide.sums == record(true, 1).sums);
}

void corrupt_grants(StoreKind& kind) {
  write_leases(kind, "s", {stored_lease(5, LeaseState::granted, 0)});
  kind.sql("s", R"(UPDATE leases SET grants='[{"attach":"teleport"}]' WHERE id=5)");
  const auto store = kind.open("s");
  auto snap = store->load(10);
  REQUIRE_FALSE(snap.is_ok());
  CHECK(snap.error().code == Errc::corrupt);
  CHECK(snap.error().message == "lease 5 grants[0]: field 'attach' has unknown mode 'teleport'");
}

}  // namespace

STORE_TEST_CASE("the store keeps learned run times per group, a later row of a group replacing the earlier",
                learned_run_times)
STORE_TEST_CASE("a lease whose stored grants are not what the store writes is reported corrupt", corrupt_grants)
