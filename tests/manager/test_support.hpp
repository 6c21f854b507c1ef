// Builders for core tests: a temporary data folder, a store, a core over a static host, a poster to drain.
#pragma once

#include <accelpool/manager/core.hpp>

#include <catch2/catch.hpp>

#include <deque>
#include <filesystem>
#include <functional>
#include <random>
#include <string>

namespace accelpool::manager::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path =
        std::filesystem::temp_directory_path() / ("accelpool-mgr-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Completions from hosts queue here; the test runs them when it wants (it plays the owner thread).
struct PostQueue {
  std::deque<std::function<void()>> jobs;
  Poster poster() {
    return [this](std::function<void()> f) { jobs.push_back(std::move(f)); };
  }
  void drain() {
    while (!jobs.empty()) {
      auto f = std::move(jobs.front());
      jobs.pop_front();
      f();
    }
  }
};

struct EventLog : CoreListener {
  std::vector<std::pair<LeaseId, LeaseEvent>> events;
  void lease_event(const Lease& lease, LeaseEvent event) override { events.emplace_back(lease.id, event); }
  std::size_t count(LeaseId id, LeaseEvent e) const {
    std::size_t n = 0;
    for (const auto& [i, ev] : events) n += (i == id && ev == e);
    return n;
  }
};

// "fpga:4" -> four fpga devices named fpga0.. on the host.
// An acquire by guest `guest` of tenant `tenant` for `count` devices of `kind`; a test sets the other fields.
inline AcquireParams acquire_params(const std::string& tenant, const std::string& guest,
                                    const std::string& kind = "fpga", std::uint32_t count = 1) {
  return AcquireParams{tenant, guest, /*guest_host=*/"", kind, /*bitstream=*/"", count, /*estimate_s=*/std::nullopt};
}

inline std::vector<HostDevice> make_devices(const std::string& kind, int n, bool passthrough = false) {
  std::vector<HostDevice> out;
  for (int i = 0; i < n; ++i) out.push_back({kind + std::to_string(i), kind, "test-" + kind, passthrough, ""});
  return out;
}

// A real store that counts what the core writes through it.
struct CountingStore : Store {
  std::unique_ptr<Store> inner;
  std::size_t device_rows = 0;  // device records written
  std::size_t meta_rows = 0;    // meta entries written
  std::size_t lease_rows = 0;   // lease rows written
  explicit CountingStore(std::unique_ptr<Store> s) : inner(std::move(s)) {}
  Result<Snapshot> load(std::size_t recent_ended) override { return inner->load(recent_ended); }
  Status apply(const Batch& batch) override {
    device_rows += batch.devices.size();
    meta_rows += batch.meta.size();
    lease_rows += batch.leases.size();
    return inner->apply(batch);
  }
  Result<std::optional<Lease>> lease(LeaseId id) override { return inner->lease(id); }
  Result<std::vector<Lease>> ended_leases(const LeaseFilter& filter, const LeasePageSpec& spec) override {
    return inner->ended_leases(filter, spec);
  }
  Status backup(const std::filesystem::path& dest) override { return inner->backup(dest); }
};

// Writes `batch` into a new SQLite store (a damaged store, say), opens it again and starts a core on it: the
// error the core refuses to start with (the test fails if it starts).
inline accelpool::Error start_refused(const Batch& batch) {
  TempDir dir;
  ManualClock clock;
  {
    auto store = open_sqlite_store(dir.path / "pool.db", false);
    REQUIRE(store.is_ok());
    REQUIRE((*store)->apply(batch).is_ok());
  }
  auto store = open_sqlite_store(dir.path / "pool.db", false);
  REQUIRE(store.is_ok());
  auto core = PoolCore::create(CoreOptions{}, clock, **store);
  REQUIRE_FALSE(core.is_ok());
  return core.error();
}

struct Pool {
  TempDir dir;
  ManualClock clock;
  PostQueue posts;
  EventLog log;
  std::unique_ptr<CountingStore> store;
  std::unique_ptr<PoolCore> core;
  CoreOptions options;
  std::string token;    // tenant "a"
  std::string token_b;  // tenant "b"

  explicit Pool(std::vector<HostDevice> devices = make_devices("fpga", 2), CoreOptions opts = {}) : options(opts) {
    open();
    REQUIRE(core->attach_host(make_static_host("local", devices, posts.poster())).is_ok());
    auto t = core->create_tenant("a", 1, 0);
    REQUIRE(t.is_ok());
    token = *t;
    auto tb = core->create_tenant("b", 1, 0);
    REQUIRE(tb.is_ok());
    token_b = *tb;
  }
  void open() {
    auto s = open_sqlite_store(dir.path / "pool.db", false);
    REQUIRE(s.is_ok());
    store = std::make_unique<CountingStore>(std::move(*s));
    auto c = PoolCore::create(options, clock, *store);
    if (!c) FAIL(c.error().message);
    core = std::move(*c);
    core->add_listener(&log);
  }
  // Simulates a crash and restart: drops the core without any shutdown step, reopens the same file.
  void restart(std::vector<HostDevice> devices) {
    posts.jobs.clear();
    core.reset();
    store.reset();
    open();
    REQUIRE(core->attach_host(make_static_host("local", devices, posts.poster())).is_ok());
  }
  Lease acquire(const std::string& tenant, const std::string& guest, std::uint32_t count = 1,
                const std::string& bitstream = "") {
    AcquireParams p = acquire_params(tenant, guest, "fpga", count);
    p.bitstream = bitstream;
    auto r = core->acquire(p);
    if (!r) FAIL(accelpool::describe(r.error()));
    return *r;
  }
  // Advances the clock by `seconds` and lets the core act on what fell due (expiries, deadlines, grace periods).
  void elapse(double seconds) {
    clock.advance(seconds);
    core->tick();
  }
  // The caller that owns `l`: its guest on a direct connection.
  static Caller owner(const Lease& l) { return Caller::direct(l.tenant, l.guest); }
  Lease get(LeaseId id) {
    auto r = core->get(Caller::admin(), id);
    REQUIRE(r.is_ok());
    return *r;
  }
};

}  // namespace accelpool::manager::test
