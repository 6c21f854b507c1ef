// Durable pool state behind an interface: SQLite (embedded, the default) or PostgreSQL (shared by managers).
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/manager/types.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accelpool::manager {

// Everything the manager needs to come back after a restart.
struct Snapshot {
  std::vector<TenantRecord> tenants;
  std::vector<DeviceRecord> devices;
  std::vector<Lease> leases;  // every live lease, plus the most recent ended ones (for stats), by id
  std::map<std::string, std::string> meta;
  std::vector<EstimateRecord> estimates;  // the scheduler's learned run times, every group
  LeaseId max_lease_id = 0;               // the largest id ever used (ended leases included)
};

// One atomic set of changes: either all of it is durable or none.
struct Batch {
  std::vector<Lease> leases;                 // upserts by id
  std::vector<DeviceRecord> devices;         // upserts by name
  std::vector<TenantRecord> tenants;         // upserts by name
  std::vector<std::string> deleted_tenants;  // deleted by name (none of them also in `tenants`)
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<EstimateRecord> estimates;  // upserts by group (kind, whole_kind, tenant, bitstream, count, label)
  // Deletes the ended leases that ended before this time (the newest lease id is always kept, so ids are never
  // reused). 0: nothing.
  double prune_ended_before = 0;
  bool empty() const {
    return leases.empty() && devices.empty() && tenants.empty() && deleted_tenants.empty() && meta.empty() &&
           estimates.empty() && prune_ended_before == 0;
  }
};

// Calls may come from several threads (the daemon writes batches on a thread of its own, StoreWriter, while its
// owner thread reads): they are serialized, one at a time on the store's one connection.
class Store {
 public:
  virtual ~Store() = default;

  // Reads the whole state. Called once at start, before any apply. `recent_ended` bounds how many ended
  // leases come back. Errors: "store" with the database's message.
  virtual Result<Snapshot> load(std::size_t recent_ended) = 0;

  // Makes the batch durable before returning (a process crash right after loses nothing). Called before every
  // reply that reports the change is sent. Errors: "store"; then nothing of the batch was applied.
  virtual Status apply(const Batch& batch) = 0;

  // One lease by id, live or ended; empty when the store has none. Errors: "store", "corrupt".
  virtual Result<std::optional<Lease>> lease(LeaseId id) = 0;

  // Ended leases (released, cancelled, expired, revoked) matching `filter` (its include_ended is ignored; a live
  // `state` matches none), in `spec`'s order after its cursor, at most spec.limit. Errors: "store", "corrupt".
  virtual Result<std::vector<Lease>> ended_leases(const LeaseFilter& filter, const LeasePageSpec& spec) = 0;

  // Writes a consistent copy of the store to `dest` while the manager runs. Errors: "store".
  virtual Status backup(const std::filesystem::path& dest) = 0;
};

// Whether opening may create a store where one existed before.
enum class StoreCreation {
  first_only,  // a new store only where none was ever made (no marker beside it, see open_sqlite_store)
  allow_new,   // also where one was lost: the operator asked for a new, empty pool (accelpool-manager --new-store)
};

// SQLite in WAL mode. `full_sync` makes every commit survive power loss too (fsync per commit); without it a
// commit survives a crash of the process (kill -9) and the disk is synced at checkpoints.
// A store that opens leaves a marker beside it, `<file>.created`. With StoreCreation::first_only, a `file` that
// is missing or empty (0 bytes) while that marker, or a non-empty `<file>-wal`, is there is refused: error
// "store_missing" saying so, and nothing is created; so is a database without a schema (as after its
// write-ahead log was lost) where the marker is. An existing store is opened whatever `creation` says.
// Errors: "store_missing", "store".
Result<std::unique_ptr<Store>> open_sqlite_store(const std::filesystem::path& file, bool full_sync,
                                                 StoreCreation creation = StoreCreation::first_only);

// One manager as the others see it in a shared store: its name and where clients reach it.
struct ManagerInfo {
  std::string name;       // unique among the managers of one store ([ha] name)
  std::string admin_url;  // "http://host:port"
  std::string guest_tcp;  // "host:port", "" for none
  std::string agents;     // "host:port" of the agent listener, "" for none
};

// Who leads the managers of a shared store (docs/ha.md).
struct Leadership {
  std::uint64_t epoch = 0;  // 0: nobody ever led
  ManagerInfo leader;
  double since = 0;                   // when the leader took over (Unix seconds, the database's clock)
  double renewed_at = 0;              // the leader's last renewal (same clock)
  std::vector<ManagerInfo> standbys;  // managers that announced themselves within their timeout, the leader left out
};

// A store several managers share, of which one at a time leads and writes. Every write transaction (apply)
// first checks that this manager's epoch is still the store's: a manager that lost the leadership (paused past
// its timeout, cut off) can never write again; its apply fails with "fenced" and changes nothing.
// A call that finds the connection to the database gone fails with "disconnected" (for an apply: whether its
// batch was committed is unknown); the connection is not made again, so every later call fails too.
// Calls are serialized (one connection), as for every Store.
class SharedStore : public Store {
 public:
  // One attempt to lead: succeeds when nobody leads, when the leader's database session is gone (its process
  // died or its connection broke), or when the leader did not renew within its timeout (then its session is
  // ended, which rolls back what it had in flight). On success the epoch goes up by one and is this store's from
  // now: true. false: another manager leads. Never blocks on a live leader. Errors: "store".
  virtual Result<bool> try_lead(const ManagerInfo& me, double timeout_s) = 0;

  // The leader renews its term (call well within its timeout, e.g. every third of it; every apply renews too).
  // Errors: "fenced" when another manager took over (this one must stop writing and step down), "store".
  virtual Status renew() = 0;

  // The leader publishes where clients reach it (its addresses as bound, after it took over). Errors: "fenced",
  // "store".
  virtual Status publish(const ManagerInfo& me) = 0;

  // A standby says it is there (shown to operators as a standby until `timeout_s` after its last call).
  // Errors: "store".
  virtual Status announce(const ManagerInfo& me, double timeout_s) = 0;

  // Who leads now, and the standbys. Errors: "store".
  virtual Result<Leadership> leadership() = 0;

  // This store's epoch: the one its writes are fenced with; 0 before it leads.
  virtual std::uint64_t epoch() const = 0;
};

// PostgreSQL through libpq. `url` is a libpq connection string: "postgresql://user@host:5432/db", or over a Unix
// socket "postgresql:///db?host=/run/postgresql" (the folder holding the socket). Creates the schema where the
// database has none, upgrades an older one (versioned, in one transaction); refuses a newer one. Every apply is
// one transaction committed with synchronous_commit on: durable on the server before it returns. backup() is
// refused (use pg_dump, docs/ha.md). Writes only while leading (try_lead): before that every apply fails with
// "fenced". Errors: "store" with the server's message, "fenced", "disconnected" (the SharedStore calls above).
Result<std::unique_ptr<SharedStore>> open_postgres_store(const std::string& url);

}  // namespace accelpool::manager
