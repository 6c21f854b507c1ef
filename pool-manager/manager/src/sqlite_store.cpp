// The SQLite store: one connection, WAL journal, one transaction per Batch.
#include "store_rows.hpp"

#include <accelpool/common/log.hpp>
#include <accelpool/manager/store.hpp>

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

namespace accelpool::manager {

namespace {

using namespace store_rows;

// 2: the lease indexes are partial (live leases by id, ended leases by end time), so a lease that changes
// state touches only the index it enters or leaves.
// 3: leases record whether a relay vouched for their guest (`relayed`).
// 4: leases record what each device's host did to prepare it (`grants`).
// 5: the scheduler's learned run times (`estimates`, one row per group; from 4 the table is simply created).
// 6: leases carry the job label their guest gave (`label`).
// 7: a device row is keyed by its scheduler id (the table's rowid), which never changes: a host joining appends
// its rows at the end of one B-tree, with no second index by name to keep (the pool keeps names unique).
constexpr int kSchemaVersion = 7;

constexpr const char* kSchema =
    R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (
  name TEXT PRIMARY KEY, weight REAL NOT NULL, max_devices INTEGER NOT NULL, token_hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
  sched_id INTEGER PRIMARY KEY, name TEXT NOT NULL, host TEXT NOT NULL, local_id TEXT NOT NULL, kind TEXT NOT NULL,
  model TEXT NOT NULL, passthrough INTEGER NOT NULL, loaded TEXT NOT NULL, draining INTEGER NOT NULL,
  available INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
  id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, guest TEXT NOT NULL, guest_host TEXT NOT NULL,
  kind TEXT NOT NULL, bitstream TEXT NOT NULL, count INTEGER NOT NULL, estimate_s REAL,
  state TEXT NOT NULL, created_at REAL NOT NULL, granted_at REAL NOT NULL, first_granted_at REAL NOT NULL,
  ended_at REAL NOT NULL, expires_at REAL NOT NULL, revoke_deadline REAL NOT NULL,
  requeue_on_deadline INTEGER NOT NULL, ready INTEGER NOT NULL, devices TEXT NOT NULL,
  reprogrammed INTEGER NOT NULL, preemptions INTEGER NOT NULL, end_reason TEXT NOT NULL,
  relayed INTEGER NOT NULL DEFAULT 0, grants TEXT NOT NULL DEFAULT '', label TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS estimates (
  kind TEXT NOT NULL, whole_kind INTEGER NOT NULL, tenant TEXT NOT NULL, bitstream TEXT NOT NULL,
  count INTEGER NOT NULL, label TEXT NOT NULL, observations INTEGER NOT NULL, weights TEXT NOT NULL,
  sums TEXT NOT NULL, PRIMARY KEY (kind, whole_kind, tenant, bitstream, count, label));
)sql"
    "CREATE INDEX IF NOT EXISTS leases_live_by_id ON leases(id) WHERE " ACCELPOOL_LIVE_LEASE
    ";\n"
    "CREATE INDEX IF NOT EXISTS leases_ended_by_time ON leases(ended_at) WHERE NOT " ACCELPOOL_LIVE_LEASE ";\n";

// From schema version 1: its full indexes give way to the partial ones.
constexpr const char* kMigrateFrom1 = "DROP INDEX IF EXISTS leases_live; DROP INDEX IF EXISTS leases_ended;";
// From schema versions 1 and 2: leases learn whether a host agent's relay vouched for their guest.
constexpr const char* kMigrateFrom2 = "ALTER TABLE leases ADD COLUMN relayed INTEGER NOT NULL DEFAULT 0;";
// From schema versions 1 to 3: leases learn what each device's host did to prepare it.
constexpr const char* kMigrateFrom3 = "ALTER TABLE leases ADD COLUMN grants TEXT NOT NULL DEFAULT '';";
// From schema versions 1 to 5: leases carry the job label their guest gave. (Version 5 added the estimates
// table, which kSchema creates where it is missing.)
constexpr const char* kMigrateFrom5 = "ALTER TABLE leases ADD COLUMN label TEXT NOT NULL DEFAULT '';";
// From schema versions 1 to 6: device rows keyed by their scheduler id instead of their name.
constexpr const char* kMigrateFrom6 = R"sql(
CREATE TABLE devices_v7 (
  sched_id INTEGER PRIMARY KEY, name TEXT NOT NULL, host TEXT NOT NULL, local_id TEXT NOT NULL, kind TEXT NOT NULL,
  model TEXT NOT NULL, passthrough INTEGER NOT NULL, loaded TEXT NOT NULL, draining INTEGER NOT NULL,
  available INTEGER NOT NULL);
INSERT INTO devices_v7(sched_id, name, host, local_id, kind, model, passthrough, loaded, draining, available)
  SELECT sched_id, name, host, local_id, kind, model, passthrough, loaded, draining, available FROM devices;
DROP TABLE devices;
ALTER TABLE devices_v7 RENAME TO devices;
)sql";

Error db_error(sqlite3* db, const std::string& what) {
  return make_error(Errc::store, what + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
}

// How long a connection waits for a lock another connection of the store holds (the checkpointer's RESTART, a
// backup) before its statement fails with "database is locked".
constexpr auto kBusyTimeout = std::chrono::seconds(5);
constexpr auto kBusyStep = std::chrono::microseconds(100);

// Waits for such a lock in steps of 0.1 ms. SQLite's own busy_timeout sleeps 1, 2, 5, 10, 15, 20, 25 ms... between
// attempts, so a commit that met a checkpoint's lock slept on for up to 25 ms after the lock was free (the p99 of
// grants under a long queue was 30 ms); now it goes on within 0.1 ms of it.
void wait_for_locks(sqlite3* db) {
  sqlite3_busy_handler(
      db,
      [](void*, int attempts) -> int {
        if (attempts >= kBusyTimeout / kBusyStep) return 0;
        std::this_thread::sleep_for(kBusyStep);
        return 1;
      },
      nullptr);
}

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  void bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  template <std::integral Int>  // bool and unsigned counts too, stored as INTEGER
  void bind(int i, Int v) {
    sqlite3_bind_int64(stmt_, i, static_cast<std::int64_t>(v));
  }
  void bind(int i, const std::optional<double>& v) { v ? bind(i, *v) : bind_null(i); }
  void bind_null(int i) { sqlite3_bind_null(stmt_, i); }
  // Runs a statement that returns no rows with `values` bound to ?1, ?2, ... in order. False on error (the
  // connection's error then says why).
  template <typename... Values>
  bool execute(const Values&... values) {
    reset();
    int i = 0;
    (bind(++i, values), ...);
    return sqlite3_step(stmt_) == SQLITE_DONE;
  }
  std::string text(int i) {
    auto* p = sqlite3_column_text(stmt_, i);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(sqlite3_column_bytes(stmt_, i)))
             : std::string();
  }
  double real(int i) { return sqlite3_column_double(stmt_, i); }
  std::int64_t integer(int i) { return sqlite3_column_int64(stmt_, i); }
  bool is_null(int i) { return sqlite3_column_type(stmt_, i) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

// Steps through every row of `s` into `out`. Errors: "store", "corrupt".
Status read_lease_rows(sqlite3* db, Stmt& s, std::vector<Lease>& out) {
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    auto l = lease_from_row(s);
    if (!l) return l.error();
    out.push_back(std::move(*l));
  }
  if (rc != SQLITE_DONE) return db_error(db, "reading leases");
  return Status::ok();
}

// Copies the WAL back into the database file on a thread and connections of its own, so the fsyncs a checkpoint
// needs never stall a commit on the owner thread. The owner's connection reports the WAL's size after each
// commit (wake()); every kPages new pages this thread checkpoints PASSIVE, which never blocks the writer. Still,
// each checkpoint syncs the WAL and the database file, and on this kind of disk a sync slows the writes beside it:
// at 1,000 pages a single guest's cycles checkpointed about 17 times a second and one grant in a hundred took
// over 1 ms; at 8,000 pages, twice a second (docs/benchmarks.md, "Fewer checkpoints").
//
// Starting the WAL over costs the writer an fsync of the WAL header (several milliseconds on a virtual disk, and
// every call waits for it). SQLite starts over at the first commit after a checkpoint that caught up, which at
// light load is after nearly every checkpoint. So a second connection, `pin_`, holds a read transaction whose
// snapshot keeps the WAL from starting over: each checkpoint first moves the snapshot to the WAL's current end
// (pin()) and then copies up to it. Past kRestartPages the thread lets go of the snapshot and checkpoints
// RESTART: it takes the write lock for as long as copying the last frames and one sync take, and the next
// commit starts the WAL over. One such pause per kRestartPages pages (128 MiB), and the WAL stays under that
// size plus one checkpoint's pages (160 MiB) instead of growing with the load.
class Checkpointer {
 public:
  static constexpr int kPages = 8000;
  static constexpr int kRestartPages = 32000;

  ~Checkpointer() { stop(); }

  Status start(const std::filesystem::path& file) {
    if (sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
      return db_error(db_, "opening the checkpoint connection");
    }
    wait_for_locks(db_);
    // A connection learns that the database is in WAL mode only by reading it; until then a checkpoint on it
    // does nothing at all.
    if (sqlite3_exec(db_, "PRAGMA journal_mode", nullptr, nullptr, nullptr) != SQLITE_OK) {
      return db_error(db_, "opening the checkpoint connection");
    }
    if (sqlite3_open_v2(file.c_str(), &pin_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
      return db_error(pin_, "opening the snapshot connection");
    }
    if (auto s = pin(); !s) return s;
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  // Called on the owner thread after a commit with the number of pages in the WAL.
  void wake(int pages) {
    if (pages < last_pages_) due_at_ = kPages;  // the WAL started over
    last_pages_ = pages;
    if (pages < due_at_) return;
    due_at_ = pages + kPages;
    {
      std::lock_guard lock(mu_);
      due_ = true;
    }
    cv_.notify_one();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    if (pin_) {
      unpin();
      sqlite3_close(pin_);
    }
    pin_ = nullptr;
    if (db_) sqlite3_close(db_);
    db_ = nullptr;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || due_; });
      if (stopping_) return;
      due_ = false;
      lock.unlock();
      int log_pages = 0;
      (void)pin();  // without it the checkpoint still runs; the WAL may just start over sooner
      int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log_pages, nullptr);
      if (rc == SQLITE_OK && log_pages >= kRestartPages) {
        unpin();
        rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_RESTART, nullptr, nullptr);
      }
      if (rc != SQLITE_OK && rc != SQLITE_BUSY && rc != last_error_) {  // BUSY: another one runs; try next time
        log::warn("store checkpoint failed", {{"error", sqlite3_errmsg(db_)}});
      }
      last_error_ = rc;
      lock.lock();
    }
  }

  // Moves the snapshot of `pin_` to the WAL's current end (see the class comment).
  Status pin() {
    unpin();
    if (sqlite3_exec(pin_, "BEGIN; SELECT COUNT(*) FROM meta;", nullptr, nullptr, nullptr) != SQLITE_OK) {
      Error e = db_error(pin_, "holding a snapshot");
      unpin();
      return e;
    }
    return Status::ok();
  }
  void unpin() {
    if (!sqlite3_get_autocommit(pin_)) (void)sqlite3_exec(pin_, "COMMIT", nullptr, nullptr, nullptr);
  }

  sqlite3* db_ = nullptr;
  sqlite3* pin_ = nullptr;
  int last_error_ = SQLITE_OK;  // reported once, not on every attempt
  int last_pages_ = 0;          // owner thread: the WAL's size at the last commit
  int due_at_ = kPages;         // owner thread: the WAL size that wakes the next checkpoint
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool due_ = false;
  bool stopping_ = false;
};

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override {
    checkpointer_.stop();
    meta_.reset();
    tenant_.reset();
    delete_tenant_.reset();
    device_.reset();
    lease_.reset();
    prune_.reset();
    begin_.reset();
    commit_.reset();
    rollback_.reset();
    estimate_.reset();
    sqlite3_close(db_);  // fails (and leaks the connection) while any statement is still prepared
  }

  // `lost_if_empty`: why a store without a schema is a lost pool (the marker says one was made), or "" when an
  // empty database may become a new pool.
  Status init(const std::filesystem::path& file, bool full_sync, const std::string& lost_if_empty) {
    // journal_size_limit: after a checkpoint starts the WAL over, a file larger than this is cut back to it;
    // one at most this size is kept and overwritten, which costs less than growing a file.
    std::string pragmas = std::string("PRAGMA journal_mode=WAL; PRAGMA synchronous=") +
                          (full_sync ? "FULL" : "NORMAL") + "; PRAGMA foreign_keys=ON; PRAGMA journal_size_limit=" +
                          std::to_string(std::int64_t{Checkpointer::kRestartPages + Checkpointer::kPages} * 4096) + ";";
    if (auto s = exec(pragmas.c_str(), "setting pragmas"); !s) return s;
    std::int64_t version = 0;
    {
      Stmt v(db_, "PRAGMA user_version");
      if (!v.ok() || sqlite3_step(v.get()) != SQLITE_ROW) return db_error(db_, "reading the schema version");
      version = v.integer(0);
    }  // finished before the schema changes: an open statement would lock the tables
    if (version == 0 && !lost_if_empty.empty()) {
      return make_error(Errc::store_missing,
                        "the database holds no pool (no schema, as after losing its write-ahead "
                        "log), but " +
                            lost_if_empty);
    }
    if (version > kSchemaVersion) {
      return make_error(Errc::store, "the database has schema version " + std::to_string(version) +
                                         ", newer than this manager understands (" + std::to_string(kSchemaVersion) +
                                         ")");
    }
    // Every step and the new version in one transaction: a failure halfway leaves the old schema whole.
    if (auto s = exec("BEGIN IMMEDIATE", "upgrading the schema"); !s) return s;
    if (auto s = migrate(version); !s) {
      (void)exec("ROLLBACK", "rolling back the schema upgrade");
      return s;
    }
    if (auto s = exec("COMMIT", "upgrading the schema"); !s) return s;
    // Checkpoints move to their own thread: this hook replaces SQLite's automatic checkpoint.
    if (auto s = checkpointer_.start(file); !s) return s;
    sqlite3_wal_hook(
        db_,
        [](void* self, sqlite3*, const char*, int pages) {
          static_cast<Checkpointer*>(self)->wake(pages);
          return SQLITE_OK;
        },
        &checkpointer_);
    return Status::ok();
  }

  Result<Snapshot> load(std::size_t recent_ended) override {
    std::lock_guard lock(mu_);
    Snapshot snap;
    {
      const std::string sql = std::string("SELECT ") + kEstimateColumns +
                              " FROM estimates ORDER BY kind, whole_kind, tenant, bitstream, count, label";
      Stmt s(db_, sql.c_str());
      if (!s.ok()) return db_error(db_, "reading estimates");
      while (sqlite3_step(s.get()) == SQLITE_ROW) {
        auto e = estimate_from_row(s);
        if (!e) return e.error();
        snap.estimates.push_back(std::move(*e));
      }
    }
    {
      Stmt s(db_, "SELECT key, value FROM meta");
      if (!s.ok()) return db_error(db_, "reading meta");
      while (sqlite3_step(s.get()) == SQLITE_ROW) snap.meta[s.text(0)] = s.text(1);
    }
    {
      Stmt s(db_, "SELECT name, weight, max_devices, token_hash FROM tenants ORDER BY name");
      if (!s.ok()) return db_error(db_, "reading tenants");
      while (sqlite3_step(s.get()) == SQLITE_ROW) {
        snap.tenants.push_back({s.text(0), s.real(1), static_cast<std::uint32_t>(s.integer(2)), s.text(3)});
      }
    }
    {
      Stmt s(db_,
             "SELECT name, host, local_id, kind, model, passthrough, loaded, draining, available, sched_id "
             "FROM devices ORDER BY sched_id");
      if (!s.ok()) return db_error(db_, "reading devices");
      while (sqlite3_step(s.get()) == SQLITE_ROW) snap.devices.push_back(device_from_row(s));
    }
    auto read_leases = [&](const std::string& sql) -> Status {
      Stmt s(db_, sql.c_str());
      if (!s.ok()) return db_error(db_, "reading leases");
      s.bind(1, static_cast<std::int64_t>(recent_ended));
      return read_lease_rows(db_, s, snap.leases);
    };
    std::string cols = kLeaseColumns;
    if (auto st = read_leases("SELECT " + cols + " FROM leases WHERE " ACCELPOOL_LIVE_LEASE " AND ?1 >= 0 ORDER BY id");
        !st) {
      return st.error();
    }
    if (auto st = read_leases("SELECT * FROM (SELECT " + cols +
                              " FROM leases WHERE NOT " ACCELPOOL_LIVE_LEASE " ORDER BY ended_at DESC "
                              "LIMIT ?1) ORDER BY id");
        !st) {
      return st.error();
    }
    std::sort(snap.leases.begin(), snap.leases.end(), [](const Lease& a, const Lease& b) { return a.id < b.id; });
    {
      Stmt s(db_, "SELECT COALESCE(MAX(id), 0) FROM leases");
      if (!s.ok() || sqlite3_step(s.get()) != SQLITE_ROW) return db_error(db_, "reading the largest lease id");
      snap.max_lease_id = static_cast<LeaseId>(s.integer(0));
    }
    return snap;
  }

  Result<std::optional<Lease>> lease(LeaseId id) override {
    std::lock_guard lock(mu_);
    const std::string sql = std::string("SELECT ") + kLeaseColumns + " FROM leases WHERE id = ?1";
    Stmt s(db_, sql.c_str());
    if (!s.ok()) return db_error(db_, "reading lease " + std::to_string(id));
    s.bind(1, static_cast<std::int64_t>(id));
    std::vector<Lease> found;
    if (auto st = read_lease_rows(db_, s, found); !st) return st.error();
    if (found.empty()) return std::optional<Lease>();
    return std::optional<Lease>(std::move(found.front()));
  }

  Result<std::vector<Lease>> ended_leases(const LeaseFilter& f, const LeasePageSpec& spec) override {
    std::lock_guard lock(mu_);
    std::vector<Lease> out;
    if (f.state && !is_terminal(*f.state)) return out;
    // Walks the primary key from the cursor; each filter is a no-op when its parameter is NULL. A device matches
    // as a whole item of the comma-separated list.
    const std::string sql =
        std::string("SELECT ") + kLeaseColumns +
        " FROM leases WHERE NOT " ACCELPOOL_LIVE_LEASE
        " AND (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR guest = ?2)"
        " AND (?3 IS NULL OR state = ?3)"
        " AND (?4 IS NULL OR instr(',' || devices || ',', ',' || ?4 || ',') > 0)"
        // Caller::owns: the owner's tenant, guest and voucher (and host, when relayed)
        " AND (?7 IS NULL OR (tenant = ?7 AND guest = ?8 AND relayed = ?9 AND (?9 = 0 OR guest_host = ?10)))" +
        (spec.newest_first ? " AND id < ?5 ORDER BY id DESC" : " AND id > ?5 ORDER BY id") + " LIMIT ?6";
    Stmt s(db_, sql.c_str());
    if (!s.ok()) return db_error(db_, "listing ended leases");
    auto bind_opt = [&](int i, const std::optional<std::string>& v) { v ? s.bind(i, *v) : s.bind_null(i); };
    bind_opt(1, f.tenant);
    bind_opt(2, f.guest);
    bind_opt(3, f.state ? std::optional<std::string>(std::string(to_string(*f.state))) : std::nullopt);
    bind_opt(4, f.device);
    const std::int64_t cursor = spec.after ? static_cast<std::int64_t>(std::min<LeaseId>(*spec.after, INT64_MAX))
                                           : (spec.newest_first ? INT64_MAX : -1);
    s.bind(5, cursor);
    s.bind(6, static_cast<std::int64_t>(std::min<std::size_t>(spec.limit, INT64_MAX)));
    if (f.owner && !f.owner->tenant.empty()) {  // an admin owns every lease: no condition
      s.bind(7, f.owner->tenant);
      s.bind(8, f.owner->guest);
      s.bind(9, static_cast<std::int64_t>(f.owner->relayed));
      s.bind(10, f.owner->guest_host);
    } else {
      s.bind_null(7);
    }
    if (auto st = read_lease_rows(db_, s, out); !st) return st.error();
    return out;
  }

  Status apply(const Batch& batch) override {
    std::lock_guard lock(mu_);
    if (batch.empty()) return Status::ok();
    if (!prepared_) {
      if (auto s = prepare(); !s) return s;
    }
    if (auto s = step(*begin_, "beginning a transaction"); !s) return s;
    Status st = write(batch);
    if (!st) {
      (void)step(*rollback_, "rolling back");
      return st;
    }
    return step(*commit_, "committing");
  }

  Status backup(const std::filesystem::path& dest) override {
    std::lock_guard lock(mu_);
    sqlite3* out = nullptr;
    if (sqlite3_open(dest.c_str(), &out) != SQLITE_OK) {
      Error e = db_error(out, "opening backup file " + dest.string());
      sqlite3_close(out);
      return e;
    }
    sqlite3_backup* b = sqlite3_backup_init(out, "main", db_, "main");
    if (!b) {
      Error e = db_error(out, "starting the backup");
      sqlite3_close(out);
      return e;
    }
    int rc = sqlite3_backup_step(b, -1);
    sqlite3_backup_finish(b);
    Status result = rc == SQLITE_DONE ? Status::ok() : Status(db_error(out, "copying to " + dest.string()));
    sqlite3_close(out);
    return result;
  }

 private:
  Status exec(const char* sql, const std::string& what) {
    char* msg = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
      std::string m = msg ? msg : "unknown error";
      sqlite3_free(msg);
      return make_error(Errc::store, what + ": " + m);
    }
    return Status::ok();
  }

  // Brings a schema of `version` (0: none) to kSchemaVersion, inside the caller's transaction.
  Status migrate(std::int64_t version) {
    if (version == 1) {
      if (auto s = exec(kMigrateFrom1, "upgrading the schema from version 1"); !s) return s;
    }
    if (version == 1 || version == 2) {
      if (auto s = exec(kMigrateFrom2, "upgrading the schema from version 2"); !s) return s;
    }
    if (version >= 1 && version <= 3) {
      if (auto s = exec(kMigrateFrom3, "upgrading the schema from version 3"); !s) return s;
    }
    if (version >= 1 && version <= 5) {
      if (auto s = exec(kMigrateFrom5, "upgrading the schema from version 5"); !s) return s;
    }
    if (version >= 1 && version <= 6) {
      if (auto s = exec(kMigrateFrom6, "upgrading the schema from version 6"); !s) return s;
    }
    if (auto s = exec(kSchema, "creating the schema"); !s) return s;
    return exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str(), "setting the schema version");
  }

  // Runs a prepared statement that returns no rows.
  Status step(Stmt& st, const std::string& what) {
    st.reset();
    if (sqlite3_step(st.get()) != SQLITE_DONE) {
      Error e = db_error(db_, what);
      sqlite3_reset(st.get());
      return e;
    }
    return Status::ok();
  }

  Status write(const Batch& batch) {
    for (const auto& e : batch.estimates) {
      if (!estimate_->execute(e.kind, e.whole_kind, e.tenant, e.bitstream, e.count, e.label, e.observations,
                              format_numbers(e.weights), format_numbers(e.sums)))
        return db_error(db_, "writing estimates of kind " + e.kind);
    }
    for (const auto& [k, v] : batch.meta) {
      if (!meta_->execute(k, v)) return db_error(db_, "writing meta " + k);
    }
    for (const auto& t : batch.tenants) {
      if (!tenant_->execute(t.name, t.weight, t.max_devices, t.token_hash))
        return db_error(db_, "writing tenant " + t.name);
    }
    for (const auto& name : batch.deleted_tenants) {
      if (!delete_tenant_->execute(name)) return db_error(db_, "deleting tenant " + name);
    }
    for (const auto& d : batch.devices) {
      if (!device_->execute(d.name, d.host, d.local_id, d.kind, d.model, d.passthrough, d.loaded, d.draining,
                            d.available, d.sched_id))
        return db_error(db_, "writing device " + d.name);
    }
    for (const auto& l : batch.leases) {
      if (!lease_->execute(l.id, l.tenant, l.guest, l.guest_host, l.kind, l.bitstream, l.count, l.estimate_s,
                           std::string(to_string(l.state)), l.created_at, l.granted_at, l.first_granted_at, l.ended_at,
                           l.expires_at, l.revoke_deadline, l.requeue_on_deadline, l.ready, join_devices(l.devices),
                           l.reprogrammed, l.preemptions, l.end_reason, l.relayed, grants_text(l.grants), l.label))
        return db_error(db_, "writing lease " + std::to_string(l.id));
    }
    if (batch.prune_ended_before > 0 && !prune_->execute(batch.prune_ended_before))
      return db_error(db_, "deleting old ended leases");
    return Status::ok();
  }

  // The write statements, prepared once (after the schema exists).
  Status prepare() {
    meta_ = std::make_unique<Stmt>(
        db_, "INSERT INTO meta(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO UPDATE SET value=excluded.value");
    tenant_ = std::make_unique<Stmt>(
        db_, "INSERT OR REPLACE INTO tenants(name, weight, max_devices, token_hash) VALUES(?1, ?2, ?3, ?4)");
    delete_tenant_ = std::make_unique<Stmt>(db_, "DELETE FROM tenants WHERE name = ?1");
    device_ = std::make_unique<Stmt>(
        db_,
        "INSERT INTO devices(name, host, local_id, kind, model, passthrough, loaded, draining, "
        "available, sched_id) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT(sched_id) DO UPDATE SET "
        "name=excluded.name, host=excluded.host, local_id=excluded.local_id, kind=excluded.kind, "
        "model=excluded.model, passthrough=excluded.passthrough, loaded=excluded.loaded, draining=excluded.draining, "
        "available=excluded.available");
    // An upsert, not INSERT OR REPLACE (see lease_update_set).
    std::string sql =
        std::string("INSERT INTO leases(") + kLeaseColumns +
        ") VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24) "
        "ON CONFLICT(id) DO UPDATE SET " +
        lease_update_set();
    lease_ = std::make_unique<Stmt>(db_, sql.c_str());
    estimate_ = std::make_unique<Stmt>(
        db_,
        "INSERT OR REPLACE INTO estimates(kind, whole_kind, tenant, bitstream, count, label, observations, weights, "
        "sums) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    begin_ = std::make_unique<Stmt>(db_, "BEGIN IMMEDIATE");
    commit_ = std::make_unique<Stmt>(db_, "COMMIT");
    rollback_ = std::make_unique<Stmt>(db_, "ROLLBACK");
    prune_ = std::make_unique<Stmt>(db_, "DELETE FROM leases WHERE NOT " ACCELPOOL_LIVE_LEASE
                                         " AND ended_at < ?1 AND id < (SELECT MAX(id) FROM leases)");
    for (Stmt* st : {meta_.get(), tenant_.get(), delete_tenant_.get(), device_.get(), lease_.get(), prune_.get(),
                     begin_.get(), commit_.get(), rollback_.get(), estimate_.get()}) {
      if (!st->ok()) return db_error(db_, "preparing the write statements");
    }
    prepared_ = true;
    return Status::ok();
  }

  sqlite3* db_;
  Checkpointer checkpointer_;
  std::mutex mu_;  // every call holds it: the Store contract lets calls come from several threads
  bool prepared_ = false;
  std::unique_ptr<Stmt> meta_, tenant_, delete_tenant_, device_, lease_, prune_, begin_, commit_, rollback_, estimate_;
};

}  // namespace

namespace {

constexpr const char* kLostAdvice =
    ": the pool's leases and tokens are not there. Restore the store from a backup, "
    "or start with --new-store to begin a new, empty pool";

std::string created_here(const std::filesystem::path& marker) {
  return "a store was created here before (" + marker.string() + ")";
}

// Why a missing or empty store must not be replaced by a new one, or nullopt when it may (or is not missing).
std::optional<std::string> lost_store(const std::filesystem::path& file, const std::filesystem::path& marker) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto size = fs::file_size(file, ec);
  if (!ec && size > 0) return std::nullopt;
  std::string what = file.string() + (ec ? " is missing" : " is empty");
  if (fs::exists(marker, ec)) return what + ", but " + created_here(marker);
  fs::path wal = file;
  wal += "-wal";
  if (auto n = fs::file_size(wal, ec); !ec && n > 0)
    return what + ", but its write-ahead log " + wal.string() + " is left";
  return std::nullopt;
}

}  // namespace

Result<std::unique_ptr<Store>> open_sqlite_store(const std::filesystem::path& file, bool full_sync,
                                                 StoreCreation creation) {
  std::filesystem::path marker = file;
  marker += ".created";
  std::string lost_if_empty;
  if (creation == StoreCreation::first_only) {
    if (auto why = lost_store(file, marker)) return make_error(Errc::store_missing, *why + kLostAdvice);
    if (std::error_code ec; std::filesystem::exists(marker, ec)) lost_if_empty = created_here(marker) + kLostAdvice;
  }
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    Error e = db_error(db, "opening " + file.string());
    sqlite3_close(db);
    return e;
  }
  wait_for_locks(db);
  auto store = std::make_unique<SqliteStore>(db);
  if (auto s = store->init(file, full_sync, lost_if_empty); !s) {
    return make_error(s.error().code, file.string() + ": " + s.error().message);
  }
  if (std::error_code ec; !std::filesystem::exists(marker, ec)) {
    std::FILE* f = std::fopen(marker.c_str(), "w");
    bool written = f && std::fputs(
                            "accelpool: the store beside this file was created; while this file exists the "
                            "manager will not start on a missing or empty store (see --new-store)\n",
                            f) >= 0;
    if (f && std::fclose(f) != 0) written = false;
    if (!written) return make_error(Errc::store, "cannot write " + marker.string());
  }
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace accelpool::manager
