// The PostgreSQL store: one libpq connection used on the owner thread, one transaction per Batch (a pipeline
// ended by one Sync), every write fenced by the leader's epoch. docs/ha.md tells the design.
#include "store_rows.hpp"

#include <accelpool/manager/store.hpp>

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace accelpool::manager {

namespace {

using namespace store_rows;

// The schema's versions, each reached from the one before by the step at its index - 1 (kMigrations[0] creates
// version 1 in an empty database). A new version appends a step; a step never changes once released.
// 1: the tables of SQLite's schema version 5 (same columns; REAL as DOUBLE PRECISION, ids BIGINT), plus the
//    leadership: the `leader` row with its fencing epoch, the `managers` that announce themselves, and
//    accelpool_fence(epoch), which every write transaction of the leader runs first.
// 2: leases carry the job label their guest gave (`label`, as SQLite's schema version 6).
// 3: a device row is keyed by its scheduler id, which never changes (as SQLite's schema version 7): one index to
//    keep per row instead of two (the pool keeps names unique).
constexpr const char* kMigrations[] = {
    R"sql(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tenants (
  name TEXT PRIMARY KEY, weight DOUBLE PRECISION NOT NULL, max_devices BIGINT NOT NULL, token_hash TEXT NOT NULL);
CREATE TABLE devices (
  name TEXT PRIMARY KEY, host TEXT NOT NULL, local_id TEXT NOT NULL, kind TEXT NOT NULL, model TEXT NOT NULL,
  passthrough INTEGER NOT NULL, loaded TEXT NOT NULL, draining INTEGER NOT NULL, available INTEGER NOT NULL,
  sched_id BIGINT NOT NULL UNIQUE);
CREATE TABLE leases (
  id BIGINT PRIMARY KEY, tenant TEXT NOT NULL, guest TEXT NOT NULL, guest_host TEXT NOT NULL,
  kind TEXT NOT NULL, bitstream TEXT NOT NULL, count BIGINT NOT NULL, estimate_s DOUBLE PRECISION,
  state TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, granted_at DOUBLE PRECISION NOT NULL,
  first_granted_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION NOT NULL,
  expires_at DOUBLE PRECISION NOT NULL, revoke_deadline DOUBLE PRECISION NOT NULL,
  requeue_on_deadline INTEGER NOT NULL, ready INTEGER NOT NULL, devices TEXT NOT NULL,
  reprogrammed BIGINT NOT NULL, preemptions BIGINT NOT NULL, end_reason TEXT NOT NULL,
  relayed INTEGER NOT NULL DEFAULT 0, grants TEXT NOT NULL DEFAULT '');
CREATE TABLE estimates (
  kind TEXT NOT NULL, whole_kind INTEGER NOT NULL, tenant TEXT NOT NULL, bitstream TEXT NOT NULL,
  count BIGINT NOT NULL, label TEXT NOT NULL, observations BIGINT NOT NULL, weights TEXT NOT NULL,
  sums TEXT NOT NULL, PRIMARY KEY (kind, whole_kind, tenant, bitstream, count, label));
)sql"
    "CREATE INDEX leases_live_by_id ON leases(id) WHERE " ACCELPOOL_LIVE_LEASE
    ";\n"
    "CREATE INDEX leases_ended_by_time ON leases(ended_at) WHERE NOT " ACCELPOOL_LIVE_LEASE
    ";\n"
    R"sql(
CREATE TABLE leader (
  id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, name TEXT NOT NULL, admin_url TEXT NOT NULL,
  guest_tcp TEXT NOT NULL, agents TEXT NOT NULL, backend_pid INTEGER NOT NULL, since TIMESTAMPTZ NOT NULL,
  renewed_at TIMESTAMPTZ NOT NULL, timeout_s DOUBLE PRECISION NOT NULL);
INSERT INTO leader VALUES (1, 0, '', '', '', '', 0, 'epoch', 'epoch', 0);
CREATE TABLE managers (
  name TEXT PRIMARY KEY, admin_url TEXT NOT NULL, guest_tcp TEXT NOT NULL, agents TEXT NOT NULL,
  seen_at TIMESTAMPTZ NOT NULL, timeout_s DOUBLE PRECISION NOT NULL);
CREATE FUNCTION accelpool_fence(mine BIGINT) RETURNS void LANGUAGE plpgsql AS $fence$
DECLARE current BIGINT;
BEGIN
  UPDATE leader SET renewed_at = clock_timestamp() WHERE id = 1 AND epoch = mine;
  IF NOT FOUND THEN
    SELECT epoch INTO current FROM leader WHERE id = 1;
    RAISE EXCEPTION 'fenced: this manager led with epoch %, the store is at epoch % (another manager took over)',
      mine, current USING ERRCODE = 'AP001';
  END IF;
END $fence$;
)sql",
    "ALTER TABLE leases ADD COLUMN label TEXT NOT NULL DEFAULT '';",
    "ALTER TABLE devices DROP CONSTRAINT devices_pkey; ALTER TABLE devices DROP CONSTRAINT devices_sched_id_key; "
    "ALTER TABLE devices ADD PRIMARY KEY (sched_id);",
};
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

constexpr const char* kFencedState = "AP001";            // raised by accelpool_fence
constexpr const char* kLockTimeoutState = "55P03";       // lock_not_available
constexpr const char* kConnectionExceptionClass = "08";  // connection_exception, connection_failure, ...
constexpr const char* kServerShutdownClass = "57P";      // admin_shutdown (pg_terminate_backend), crash_shutdown, ...
// Held (for its transaction) while a manager reads or changes the schema, so managers starting together
// migrate once.
constexpr const char* kSchemaLockKey = "7165001";
// Statements sent before their results are read, at most: a pipeline must not fill both directions of the
// socket (libpq's pipeline mode warns of that deadlock), so a long batch reads results every so many.
constexpr std::size_t kPipelineChunk = 256;

// One query's result, cleared on scope exit.
class PgResult {
 public:
  explicit PgResult(PGresult* r = nullptr) : r_(r) {}
  ~PgResult() { PQclear(r_); }
  PgResult(PgResult&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
  PgResult& operator=(PgResult&& o) noexcept {
    std::swap(r_, o.r_);
    return *this;
  }
  PGresult* get() const { return r_; }
  ExecStatusType status() const { return PQresultStatus(r_); }
  int rows() const { return PQntuples(r_); }
  std::string sqlstate() const {
    const char* s = r_ ? PQresultErrorField(r_, PG_DIAG_SQLSTATE) : nullptr;
    return s ? s : "";
  }
  // The server's primary message ("ERROR:" and the PL/pgSQL context left out), else libpq's whole message.
  std::string message() const {
    const char* primary = r_ ? PQresultErrorField(r_, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    if (primary && *primary) return primary;
    const char* m = r_ ? PQresultErrorMessage(r_) : nullptr;
    std::string out = m && *m ? m : "no result";
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  }

 private:
  PGresult* r_;
};

// Row `row` of a result, read the way store_rows::lease_from_row reads (the text format of every type).
struct PgRow {
  PGresult* r;
  int row;
  std::string text(int c) const {
    return std::string(PQgetvalue(r, row, c), static_cast<std::size_t>(PQgetlength(r, row, c)));
  }
  double real(int c) const { return std::strtod(PQgetvalue(r, row, c), nullptr); }
  std::int64_t integer(int c) const { return std::strtoll(PQgetvalue(r, row, c), nullptr, 10); }
  bool is_null(int c) const { return PQgetisnull(r, row, c) != 0; }
};

// Parameters of one statement, in the text format; nullopt is SQL NULL.
using Params = std::vector<std::optional<std::string>>;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
std::string num(std::int64_t v) { return std::to_string(v); }
std::string num(bool v) { return v ? "1" : "0"; }

// One statement to run: a prepared one by name, and what to call it in an error.
struct Statement {
  const char* prepared;
  Params params;
  std::string what;
};

// The rows one statement writes, as one array literal per column (the text format: {"a","b",NULL}), for the
// parameters of a statement over unnest. Rows are keyed by their first `key_columns` values: a row whose key came
// before replaces that one, in its place.
class ColumnArrays {
 public:
  explicit ColumnArrays(std::size_t key_columns) : key_columns_(key_columns) {}

  // Adds `row`; `name` names it in an error ("writing leases 7, 9: ...").
  void add(Params row, const std::string& name) {
    std::string key;
    for (std::size_t c = 0; c < key_columns_; ++c) key += row[c].value_or("") + '\x1f';
    auto [at, fresh] = index_.try_emplace(std::move(key), rows_.size());
    if (fresh) {
      rows_.push_back(std::move(row));
      names_.push_back(name);
    } else {
      rows_[at->second] = std::move(row);
    }
  }

  // Appends the statement `prepared` over these rows to `out` (nothing when there are none); its error names
  // `what` and the first rows.
  void write(const char* prepared, const std::string& what, std::vector<Statement>& out) const {
    if (rows_.empty()) return;
    Params arrays(rows_.front().size(), std::string());
    for (const auto& row : rows_) {
      for (std::size_t c = 0; c < row.size(); ++c) append_element(*arrays[c], row[c]);
    }
    for (auto& a : arrays) *a = "{" + *a + "}";
    std::string named = what;
    for (std::size_t i = 0; i < names_.size() && i < kNamed; ++i) named += (i ? ", " : " ") + names_[i];
    if (names_.size() > kNamed) named += " and " + std::to_string(names_.size() - kNamed) + " more";
    out.push_back({prepared, std::move(arrays), std::move(named)});
  }

 private:
  static constexpr std::size_t kNamed = 5;

  static void append_element(std::string& array, const std::optional<std::string>& value) {
    if (!array.empty()) array += ',';
    if (!value) {
      array += "NULL";
      return;
    }
    array += '"';
    for (char ch : *value) {
      if (ch == '"' || ch == '\\') array += '\\';
      array += ch;
    }
    array += '"';
  }

  std::size_t key_columns_;
  std::vector<Params> rows_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, std::size_t> index_;
};

class PostgresStore final : public SharedStore {
 public:
  explicit PostgresStore(PGconn* conn) : conn_(conn) {}
  ~PostgresStore() override { PQfinish(conn_); }

  Status init() {
    // Durable at commit whatever the server's default; the server's notices (CREATE ... IF NOT EXISTS) unprinted.
    for (const char* setting : {"SET synchronous_commit TO on", "SET client_min_messages TO warning"}) {
      if (auto s = command(setting, {}, "setting up the session"); !s) return s;
    }
    if (auto s = migrate(); !s) return s;
    return prepare();
  }

  Result<Snapshot> load(std::size_t recent_ended) override {
    std::lock_guard lock(mu_);
    // One snapshot of the whole database: what a concurrent leader commits meanwhile is all in or all out.
    if (auto s = command("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}, "reading the store"); !s)
      return s.error();
    auto snap = read_snapshot(recent_ended);
    (void)command("COMMIT", {}, "reading the store");
    return snap;
  }

  Result<std::optional<Lease>> lease(LeaseId id) override {
    std::lock_guard lock(mu_);
    auto r = query(std::string("SELECT ") + kLeaseColumns + " FROM leases WHERE id = $1::bigint",
                   {num(static_cast<std::int64_t>(id))}, "reading lease " + std::to_string(id));
    if (!r) return r.error();
    std::vector<Lease> found;
    if (auto s = read_leases(*r, found); !s) return s.error();
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
        " AND ($1::text IS NULL OR tenant = $1::text) AND ($2::text IS NULL OR guest = $2::text)"
        " AND ($3::text IS NULL OR state = $3::text)"
        " AND ($4::text IS NULL OR strpos(',' || devices || ',', ',' || $4::text || ',') > 0)"
        // Caller::owns: the owner's tenant, guest and voucher (and host, when relayed)
        " AND ($7::text IS NULL OR (tenant = $7::text AND guest = $8::text AND relayed = $9::integer"
        " AND ($9::integer = 0 OR guest_host = $10::text)))" +
        (spec.newest_first ? " AND id < $5::bigint ORDER BY id DESC" : " AND id > $5::bigint ORDER BY id") +
        " LIMIT $6::bigint";
    const std::int64_t cursor = spec.after ? static_cast<std::int64_t>(std::min<LeaseId>(*spec.after, INT64_MAX))
                                           : (spec.newest_first ? INT64_MAX : -1);
    Params p(10);
    p[0] = f.tenant;
    p[1] = f.guest;
    if (f.state) p[2] = std::string(to_string(*f.state));
    p[3] = f.device;
    p[4] = num(cursor);
    p[5] = num(static_cast<std::int64_t>(std::min<std::size_t>(spec.limit, INT64_MAX)));
    if (f.owner && !f.owner->tenant.empty()) {  // an admin owns every lease: no condition
      p[6] = f.owner->tenant;
      p[7] = f.owner->guest;
      p[8] = num(f.owner->relayed);
      p[9] = f.owner->guest_host;
    }
    auto r = query(sql, p, "listing ended leases");
    if (!r) return r.error();
    if (auto s = read_leases(*r, out); !s) return s.error();
    return out;
  }

  Status apply(const Batch& batch) override {
    std::lock_guard lock(mu_);
    if (batch.empty()) return Status::ok();
    if (epoch_ == 0) return make_error(Errc::fenced, "fenced: this manager does not lead, it may not write the store");
    std::vector<Statement> statements;
    statements.push_back({"fence", {num(static_cast<std::int64_t>(epoch_.load()))}, "checking the leader's epoch"});
    write_statements(batch, statements);
    return run_transaction(statements);
  }

  Status backup(const std::filesystem::path& dest) override {
    std::lock_guard lock(mu_);
    return make_error(Errc::store, "cannot back up a PostgreSQL store to " + dest.string() +
                                       ": back it up with PostgreSQL's own tools (pg_dump, or pg_basebackup with WAL "
                                       "archiving; docs/ha.md)");
  }

  Result<bool> try_lead(const ManagerInfo& me, double timeout_s) override {
    std::lock_guard lock(mu_);
    if (epoch_ != 0) return true;
    if (auto s = command("BEGIN", {}, "taking the lead"); !s) return s.error();
    // A leader that stopped renewing may still hold its session (a paused process). When that session is inside
    // a transaction, end it: that rolls back what it has in flight and frees the leader row. An idle one is left
    // alone; its next write finds the new epoch (fenced). A live leader is never waited on for long.
    const char* steps[] = {
        "SET LOCAL lock_timeout = '1s'",
        "SELECT pg_terminate_backend(backend_pid, 5000) FROM leader WHERE id = 1 AND backend_pid <> 0 AND "
        "backend_pid <> pg_backend_pid() AND renewed_at + timeout_s * interval '1 second' < clock_timestamp() AND "
        "EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = leader.backend_pid AND a.state <> 'idle')",
    };
    for (const char* sql : steps) {
      auto r = query(sql, {}, "taking the lead");
      if (!r) return abandon(r.error());
    }
    auto r = query(
        "UPDATE leader SET epoch = epoch + 1, name = $1, admin_url = $2, guest_tcp = $3, agents = $4, "
        "backend_pid = pg_backend_pid(), since = clock_timestamp(), renewed_at = clock_timestamp(), "
        "timeout_s = $5::double precision WHERE id = 1 AND (renewed_at + timeout_s * interval '1 second' < "
        "clock_timestamp() OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = leader.backend_pid)) "
        "RETURNING epoch",
        {me.name, me.admin_url, me.guest_tcp, me.agents, num(timeout_s)}, "taking the lead");
    if (!r) return abandon(r.error());
    if (auto s = command("COMMIT", {}, "taking the lead"); !s) return s.error();
    if (r->rows() == 0) return false;
    epoch_.store(static_cast<std::uint64_t>(PgRow{r->get(), 0}.integer(0)));
    return true;
  }

  Status renew() override {
    std::lock_guard lock(mu_);
    if (epoch_ == 0) return make_error(Errc::fenced, "fenced: this manager does not lead");
    return run_transaction({{"fence", {num(static_cast<std::int64_t>(epoch_.load()))}, "renewing the lead"}});
  }

  Status publish(const ManagerInfo& me) override {
    std::lock_guard lock(mu_);
    auto r = query(
        "UPDATE leader SET name = $1, admin_url = $2, guest_tcp = $3, agents = $4 WHERE id = 1 AND "
        "epoch = $5::bigint",
        {me.name, me.admin_url, me.guest_tcp, me.agents, num(static_cast<std::int64_t>(epoch_.load()))},
        "publishing the leader's addresses");
    if (!r) return r.error();
    if (std::strcmp(PQcmdTuples(r->get()), "1") != 0) {
      return make_error(Errc::fenced, "fenced: another manager took over before this one published its addresses");
    }
    return Status::ok();
  }

  Status announce(const ManagerInfo& me, double timeout_s) override {
    std::lock_guard lock(mu_);
    return command(
        "INSERT INTO managers VALUES ($1, $2, $3, $4, clock_timestamp(), $5::double precision) ON CONFLICT (name) "
        "DO UPDATE SET admin_url = excluded.admin_url, guest_tcp = excluded.guest_tcp, agents = excluded.agents, "
        "seen_at = excluded.seen_at, timeout_s = excluded.timeout_s",
        {me.name, me.admin_url, me.guest_tcp, me.agents, num(timeout_s)}, "announcing a standby");
  }

  Result<Leadership> leadership() override {
    std::lock_guard lock(mu_);
    auto r = query(
        "SELECT epoch, name, admin_url, guest_tcp, agents, extract(epoch FROM since), extract(epoch FROM renewed_at) "
        "FROM leader WHERE id = 1",
        {}, "reading the leader");
    if (!r) return r.error();
    Leadership out;
    if (r->rows() == 1) {
      PgRow row{r->get(), 0};
      out.epoch = static_cast<std::uint64_t>(row.integer(0));
      out.leader = {row.text(1), row.text(2), row.text(3), row.text(4)};
      out.since = row.real(5);
      out.renewed_at = row.real(6);
    }
    auto s = query(
        "SELECT m.name, m.admin_url, m.guest_tcp, m.agents FROM managers m, leader l WHERE l.id = 1 AND "
        "m.name <> l.name AND m.seen_at + m.timeout_s * interval '1 second' >= clock_timestamp() ORDER BY m.name",
        {}, "reading the standbys");
    if (!s) return s.error();
    for (int i = 0; i < s->rows(); ++i) {
      PgRow row{s->get(), i};
      out.standbys.push_back({row.text(0), row.text(1), row.text(2), row.text(3)});
    }
    return out;
  }

  std::uint64_t epoch() const override { return epoch_.load(); }

 private:
  // The code of a failure whose result carried `sqlstate` ("" for none): "fenced" when this manager lost the
  // lead, "disconnected" when the connection to the server is gone (the session was ended, the server stopped, the
  // network broke: whether a commit in flight was committed is unknown), "busy" for a lock not granted in time,
  // else "store".
  Errc failure_code(const std::string& sqlstate) const {
    if (sqlstate == kFencedState) return Errc::fenced;
    if (sqlstate == kLockTimeoutState) return Errc::busy;
    if (PQstatus(conn_) == CONNECTION_BAD || sqlstate.starts_with(kConnectionExceptionClass) ||
        sqlstate.starts_with(kServerShutdownClass)) {
      return Errc::disconnected;
    }
    return Errc::store;
  }
  // A failure without a result: libpq's message.
  Error connection_error(const std::string& what) const {
    std::string m = PQerrorMessage(conn_);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return make_error(failure_code(""), what + ": " + (m.empty() ? "connection lost" : m));
  }

  // Runs `sql` with `params` outside any pipeline; the result of a command or a query.
  Result<PgResult> query(const std::string& sql, const Params& params, const std::string& what) {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
    PgResult r(
        PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0));
    if (!r.get()) return connection_error(what);
    if (r.status() != PGRES_COMMAND_OK && r.status() != PGRES_TUPLES_OK) {
      return make_error(failure_code(r.sqlstate()), what + ": " + r.message());
    }
    return r;
  }
  Status command(const std::string& sql, const Params& params, const std::string& what) {
    auto r = query(sql, params, what);
    return r ? Status::ok() : Status(r.error());
  }
  // Rolls back the open transaction and returns `e`; a lock held by a live leader past lock_timeout is not an
  // error but "somebody else leads".
  Result<bool> abandon(const Error& e) {
    (void)command("ROLLBACK", {}, "taking the lead");
    if (e.code == Errc::busy) return false;
    return e;
  }

  Status migrate() {
    if (auto s = command("BEGIN", {}, "upgrading the schema"); !s) return s;
    auto fail = [&](const Error& e) -> Status {
      (void)command("ROLLBACK", {}, "upgrading the schema");
      return e;
    };
    for (const std::string& sql :
         {"SELECT pg_advisory_xact_lock(" + std::string(kSchemaLockKey) + ")",
          std::string("CREATE TABLE IF NOT EXISTS accelpool_schema (version INTEGER NOT NULL)")}) {
      if (auto s = command(sql, {}, "reading the schema version"); !s) return fail(s.error());
    }
    auto v = query("SELECT COALESCE(MAX(version), 0) FROM accelpool_schema", {}, "reading the schema version");
    if (!v) return fail(v.error());
    const auto version = static_cast<int>(PgRow{v->get(), 0}.integer(0));
    if (version > kSchemaVersion) {
      return fail(make_error(Errc::store, "the database has schema version " + std::to_string(version) +
                                              ", newer than this manager understands (" +
                                              std::to_string(kSchemaVersion) + ")"));
    }
    for (int from = version; from < kSchemaVersion; ++from) {
      // Several statements in one string: the simple query protocol (PQexec), inside this transaction.
      PgResult r(PQexec(conn_, kMigrations[from]));
      if (!r.get() || r.status() != PGRES_COMMAND_OK) {
        return fail(make_error(Errc::store, "upgrading the schema from version " + std::to_string(from) + ": " +
                                                (r.get() ? r.message() : "connection lost")));
      }
    }
    for (const std::string& sql :
         {std::string("DELETE FROM accelpool_schema"),
          "INSERT INTO accelpool_schema VALUES (" + std::to_string(kSchemaVersion) + ")", std::string("COMMIT")}) {
      if (auto s = command(sql, {}, "setting the schema version"); !s) return fail(s.error());
    }
    return Status::ok();
  }

  // The write statements, prepared once per connection. Each upsert writes every row of its table in the batch
  // at once: its parameters are one array per column (ColumnArrays), read back as rows by unnest.
  Status prepare() {
    const std::string lease_sql = std::string("INSERT INTO leases(") + kLeaseColumns + ") SELECT * FROM " +
                                  unnest({"bigint",
                                          "text",
                                          "text",
                                          "text",
                                          "text",
                                          "text",
                                          "bigint",
                                          "double precision",
                                          "text",
                                          "double precision",
                                          "double precision",
                                          "double precision",
                                          "double precision",
                                          "double precision",
                                          "double precision",
                                          "integer",
                                          "integer",
                                          "text",
                                          "bigint",
                                          "bigint",
                                          "text",
                                          "integer",
                                          "text",
                                          "text"}) +
                                  " ON CONFLICT(id) DO UPDATE SET " + lease_update_set();
    const std::pair<const char*, std::string> statements[] = {
        {"fence", "SELECT accelpool_fence($1::bigint)"},
        {"meta", "INSERT INTO meta(key, value) SELECT * FROM " + unnest({"text", "text"}) +
                     " ON CONFLICT(key) DO UPDATE SET value = excluded.value"},
        {"tenant", "INSERT INTO tenants(name, weight, max_devices, token_hash) SELECT * FROM " +
                       unnest({"text", "double precision", "bigint", "text"}) +
                       " ON CONFLICT(name) DO UPDATE SET weight = excluded.weight, max_devices = excluded.max_devices, "
                       "token_hash = excluded.token_hash"},
        {"delete_tenant", "DELETE FROM tenants WHERE name = ANY($1::text[])"},
        {"device",
         "INSERT INTO devices(sched_id, name, host, local_id, kind, model, passthrough, loaded, draining, available) "
         "SELECT * FROM " +
             unnest({"bigint", "text", "text", "text", "text", "text", "integer", "text", "integer", "integer"}) +
             " ON CONFLICT(sched_id) DO UPDATE SET name=excluded.name, host=excluded.host, "
             "local_id=excluded.local_id, kind=excluded.kind, model=excluded.model, passthrough=excluded.passthrough, "
             "loaded=excluded.loaded, draining=excluded.draining, available=excluded.available"},
        {"lease", lease_sql},
        {"estimate",
         "INSERT INTO estimates(kind, whole_kind, tenant, bitstream, count, label, observations, weights, sums) "
         "SELECT * FROM " +
             unnest({"text", "integer", "text", "text", "bigint", "text", "bigint", "text", "text"}) +
             " ON CONFLICT(kind, whole_kind, tenant, bitstream, count, label) DO UPDATE SET "
             "observations = excluded.observations, weights = excluded.weights, sums = excluded.sums"},
        {"prune", "DELETE FROM leases WHERE NOT " ACCELPOOL_LIVE_LEASE " AND ended_at < $1::double precision AND "
                  "id < (SELECT MAX(id) FROM leases)"},
    };
    for (const auto& [name, sql] : statements) {
      PgResult r(PQprepare(conn_, name, sql.c_str(), 0, nullptr));
      if (!r.get() || r.status() != PGRES_COMMAND_OK) {
        return make_error(Errc::store, std::string("preparing statement ") + name + ": " +
                                           (r.get() ? r.message() : "connection lost"));
      }
    }
    return Status::ok();
  }

  // "unnest($1::T1[], $2::T2[], ...)": rows whose columns come from one array parameter each, of `types`.
  static std::string unnest(std::initializer_list<const char*> types) {
    std::string out = "unnest(";
    int n = 0;
    for (const char* t : types) {
      out += n == 0 ? "$" : ", $";
      out += std::to_string(++n) + "::" + t + "[]";
    }
    return out + ")";
  }

  // The batch as prepared statements, one per table, in the order the SQLite store writes it. A row whose key
  // comes again in the batch is written once, as it was last (an upsert may not touch a row twice).
  static void write_statements(const Batch& batch, std::vector<Statement>& out) {
    ColumnArrays estimates(6);
    for (const auto& e : batch.estimates) {
      estimates.add({e.kind, num(e.whole_kind), e.tenant, e.bitstream, num(static_cast<std::int64_t>(e.count)), e.label,
                     num(static_cast<std::int64_t>(e.observations)), format_numbers(e.weights), format_numbers(e.sums)},
                    e.kind);
    }
    estimates.write("estimate", "writing estimates of kind", out);
    ColumnArrays meta(1);
    for (const auto& [k, v] : batch.meta) meta.add({k, v}, k);
    meta.write("meta", "writing meta", out);
    ColumnArrays tenants(1);
    for (const auto& t : batch.tenants) {
      tenants.add({t.name, num(t.weight), num(static_cast<std::int64_t>(t.max_devices)), t.token_hash}, t.name);
    }
    tenants.write("tenant", "writing tenants", out);
    ColumnArrays deleted(1);
    for (const auto& name : batch.deleted_tenants) deleted.add({name}, name);
    deleted.write("delete_tenant", "deleting tenants", out);
    ColumnArrays devices(1);
    for (const auto& d : batch.devices) {
      devices.add({num(static_cast<std::int64_t>(d.sched_id)), d.name, d.host, d.local_id, d.kind, d.model,
                   num(d.passthrough), d.loaded, num(d.draining), num(d.available)},
                  d.name);
    }
    devices.write("device", "writing devices", out);
    ColumnArrays leases(1);
    for (const auto& l : batch.leases) {
      Params p = {num(static_cast<std::int64_t>(l.id)),   l.tenant, l.guest, l.guest_host, l.kind, l.bitstream,
                  num(static_cast<std::int64_t>(l.count))};
      p.push_back(l.estimate_s ? std::optional<std::string>(num(*l.estimate_s)) : std::nullopt);
      for (auto v : {std::string(to_string(l.state)), num(l.created_at), num(l.granted_at), num(l.first_granted_at),
                     num(l.ended_at), num(l.expires_at), num(l.revoke_deadline), num(l.requeue_on_deadline),
                     num(l.ready), join_devices(l.devices), num(static_cast<std::int64_t>(l.reprogrammed)),
                     num(static_cast<std::int64_t>(l.preemptions)), l.end_reason, num(l.relayed), grants_text(l.grants),
                     l.label}) {
        p.push_back(std::move(v));
      }
      leases.add(std::move(p), std::to_string(l.id));
    }
    leases.write("lease", "writing leases", out);
    if (batch.prune_ended_before > 0) {
      out.push_back({"prune", {num(batch.prune_ended_before)}, "deleting old ended leases"});
    }
  }

  // Sends `statements` in one pipeline ended by one Sync: the server runs them as one transaction, committed at
  // the Sync (synchronous_commit on: durable when the Sync's answer arrives), or rolled back whole at the first
  // error, whose statement the error names.
  Status run_transaction(const std::vector<Statement>& statements) {
    if (PQenterPipelineMode(conn_) != 1) return connection_error("starting a transaction");
    std::optional<Error> failed;
    std::size_t answered = 0;
    // Reads the results of the statements sent so far (each: its result, then a null).
    auto read_results = [&](std::size_t upto) {
      for (; answered < upto; ++answered) {
        PgResult r(PQgetResult(conn_));
        if (!r.get()) {  // the connection broke: no more results will come
          if (!failed) failed = connection_error(statements[answered].what);
          return false;
        }
        const auto st = r.status();
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && st != PGRES_PIPELINE_ABORTED && !failed) {
          failed = make_error(failure_code(r.sqlstate()), statements[answered].what + ": " + r.message());
        }
        while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);  // up to the null that ends this statement
      }
      return true;
    };
    bool connected = true;
    for (std::size_t i = 0; i < statements.size() && connected; ++i) {
      const auto& s = statements[i];
      std::vector<const char*> values;
      for (const auto& p : s.params) values.push_back(p ? p->c_str() : nullptr);
      if (PQsendQueryPrepared(conn_, s.prepared, static_cast<int>(values.size()), values.data(), nullptr, nullptr, 0) !=
          1) {
        failed = connection_error(s.what);
        connected = false;
        break;
      }
      if ((i + 1) % kPipelineChunk == 0) {
        if (PQsendFlushRequest(conn_) != 1 || PQflush(conn_) != 0) {
          failed = connection_error(s.what);
          connected = false;
          break;
        }
        connected = read_results(i + 1);
      }
    }
    if (connected && PQpipelineSync(conn_) != 1) {
      failed = connection_error("committing");
      connected = false;
    }
    if (connected && read_results(statements.size())) {
      PgResult sync(PQgetResult(conn_));
      if (!sync.get() || sync.status() != PGRES_PIPELINE_SYNC) {
        if (!failed)
          failed =
              sync.get() ? make_error(Errc::store, "committing: " + sync.message()) : connection_error("committing");
      }
    }
    if (PQexitPipelineMode(conn_) != 1 && !failed) failed = connection_error("ending the transaction");
    if (failed) {
      // The server's error may arrive before libpq sees the connection close: a statement that failed as the
      // session ended is a lost connection too.
      if (failed->code == Errc::store && PQstatus(conn_) == CONNECTION_BAD) failed->code = Errc::disconnected;
      return *failed;
    }
    return Status::ok();
  }

  Status read_leases(const PgResult& r, std::vector<Lease>& out) {
    for (int i = 0; i < r.rows(); ++i) {
      PgRow row{r.get(), i};
      auto l = lease_from_row(row);
      if (!l) return l.error();
      out.push_back(std::move(*l));
    }
    return Status::ok();
  }

  Result<Snapshot> read_snapshot(std::size_t recent_ended) {
    Snapshot snap;
    auto r = query(std::string("SELECT ") + kEstimateColumns +
                       " FROM estimates ORDER BY kind, whole_kind, tenant, bitstream, count, label",
                   {}, "reading estimates");
    if (!r) return r.error();
    for (int i = 0; i < r->rows(); ++i) {
      PgRow s{r->get(), i};
      auto e = estimate_from_row(s);
      if (!e) return e.error();
      snap.estimates.push_back(std::move(*e));
    }
    r = query("SELECT key, value FROM meta", {}, "reading meta");
    if (!r) return r.error();
    for (int i = 0; i < r->rows(); ++i) snap.meta[PgRow{r->get(), i}.text(0)] = PgRow{r->get(), i}.text(1);
    r = query("SELECT name, weight, max_devices, token_hash FROM tenants ORDER BY name", {}, "reading tenants");
    if (!r) return r.error();
    for (int i = 0; i < r->rows(); ++i) {
      PgRow s{r->get(), i};
      snap.tenants.push_back({s.text(0), s.real(1), static_cast<std::uint32_t>(s.integer(2)), s.text(3)});
    }
    r = query(
        "SELECT name, host, local_id, kind, model, passthrough, loaded, draining, available, sched_id FROM "
        "devices ORDER BY sched_id",
        {}, "reading devices");
    if (!r) return r.error();
    for (int i = 0; i < r->rows(); ++i) {
      PgRow s{r->get(), i};
      snap.devices.push_back(device_from_row(s));
    }
    const std::string cols = kLeaseColumns;
    r = query("SELECT " + cols + " FROM leases WHERE " ACCELPOOL_LIVE_LEASE " UNION ALL SELECT * FROM (SELECT " + cols +
                  " FROM leases WHERE NOT " ACCELPOOL_LIVE_LEASE
                  " ORDER BY ended_at DESC LIMIT $1::bigint) "
                  "recent ORDER BY id",
              {num(static_cast<std::int64_t>(std::min<std::size_t>(recent_ended, INT64_MAX)))}, "reading leases");
    if (!r) return r.error();
    if (auto s = read_leases(*r, snap.leases); !s) return s.error();
    r = query("SELECT COALESCE(MAX(id), 0) FROM leases", {}, "reading the largest lease id");
    if (!r) return r.error();
    snap.max_lease_id = static_cast<LeaseId>(PgRow{r->get(), 0}.integer(0));
    return snap;
  }

  std::mutex mu_;  // every call holds it: the Store contract lets calls come from several threads
  PGconn* conn_;
  // The epoch this manager leads with; 0 while it does not. Written under mu_ (try_lead), read by epoch() too.
  std::atomic<std::uint64_t> epoch_ = 0;
};

}  // namespace

Result<std::unique_ptr<SharedStore>> open_postgres_store(const std::string& url) {
  PGconn* conn = PQconnectdb(url.c_str());
  if (!conn) return make_error(Errc::store, "connecting to PostgreSQL: out of memory");
  auto store = std::make_unique<PostgresStore>(conn);  // closes the connection whatever happens next
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string m = PQerrorMessage(conn);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return make_error(Errc::store, "connecting to PostgreSQL: " + m);  // libpq names the server, never the password
  }
  if (auto s = store->init(); !s) return make_error(s.error().code, "PostgreSQL store: " + s.error().message);
  return std::unique_ptr<SharedStore>(std::move(store));
}

}  // namespace accelpool::manager
