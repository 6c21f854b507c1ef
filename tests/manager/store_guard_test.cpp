// The store of a data folder that held a pool, lost: the real accelpool-manager refuses to start on a missing or
// empty pool.db (or one whose schema went with its write-ahead log) instead of starting a brand-new pool, until
// the operator asks for one with --new-store. A first start in a new folder just works.
#include "hung_after.hpp"
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

using namespace accelpool::manager::itest;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  std::random_device rd;
  auto p = fs::temp_directory_path() / ("apm-store-" + std::to_string(rd()) + std::to_string(rd()));
  fs::create_directories(p);
  return p;
}

std::string config() {
  return "[leases]\nttl_s = 60\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
         "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"asic\"\ncount = 1\n"
         "[[tenants]]\nname = \"t\"\n";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A data folder holding a pool: `leases` acquires acknowledged (the first granted), then the manager stopped
// with `stop_signal`: SIGTERM checkpoints the write-ahead log into pool.db, SIGKILL leaves the commits in it.
struct UsedFolder {
  fs::path dir = temp_dir();
  DaemonProcess daemon{dir, config()};
  explicit UsedFolder(int stop_signal = SIGTERM, int leases = 1) {
    daemon.start();
    auto g = GuestClient::tcp(daemon.endpoints().guest_port);
    REQUIRE(g.hello(daemon.token("guest token for tenant t"), "vm-1").contains("result"));
    for (int i = 0; i < leases; ++i) REQUIRE(g.call("acquire", {{"kind", "asic"}}).contains("result"));
    daemon.stop(stop_signal);
    if (stop_signal == SIGTERM) REQUIRE(daemon.exit_code() == 0);
    CHECK(fs::exists(dir / "pool.db.created"));
  }
  int lease_status(int id) {
    return http(daemon.endpoints().admin_port, "GET", "/v1/leases/" + std::to_string(id), daemon.token("admin token"))
        .status;
  }
  ~UsedFolder() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // The manager's start output when it refuses to start.
  std::string refused_start() {
    try {
      daemon.start();
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    FAIL("the manager started on a lost store:\n" << daemon.output());
    return "";
  }
};

// Runs accelpool-manager with --new-store on `dir` until it has started (its endpoints.json names it), then stops
// it with SIGTERM. Returns its output; fails the test when it exits first.
std::string run_with_new_store(const fs::path& dir) {
  fs::remove(dir / "endpoints.json");
  fs::path log = dir / "new-store.log";
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::string cfg = (dir / "manager.toml").string(), dd = dir.string();
    ::execl(ACCELPOOL_MANAGER_BIN, ACCELPOOL_MANAGER_BIN, "--config", cfg.c_str(), "--data-dir", dd.c_str(),
            "--new-store", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string pid_text = "\"pid\":" + std::to_string(pid);
  bool exited = false;
  const bool up = accelpool::testing::eventually([&] {
    std::string ep = slurp(dir / "endpoints.json");
    ep.erase(std::remove(ep.begin(), ep.end(), ' '), ep.end());
    if (ep.find(pid_text) != std::string::npos) return true;
    exited = ::waitpid(pid, nullptr, WNOHANG) == pid;
    return exited;
  });
  if (exited) FAIL("accelpool-manager --new-store exited:\n" << slurp(log));
  if (!up) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FAIL("accelpool-manager --new-store did not start:\n" << slurp(log));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return slurp(log);
}

void remove_wal(const fs::path& dir) {
  fs::remove(dir / "pool.db-wal");
  fs::remove(dir / "pool.db-shm");
}

}  // namespace

TEST_CASE("a missing or empty store in a folder that held a pool is refused, and --new-store starts a new pool",
          "[integration][store]") {
  UsedFolder f;
  std::string expect;
  SECTION("missing") {
    fs::remove(f.dir / "pool.db");
    remove_wal(f.dir);
    expect = "pool.db is missing";
  }
  SECTION("empty") {
    std::ofstream(f.dir / "pool.db", std::ios::trunc).flush();
    remove_wal(f.dir);
    expect = "pool.db is empty";
  }
  SECTION("missing, its write-ahead log left, no marker (a folder from before the marker)") {
    // A stopped manager leaves no -wal; one killed does. Plant one as a kill would have.
    std::ofstream(f.dir / "pool.db-wal") << std::string(4096, 'w');
    fs::remove(f.dir / "pool.db");
    fs::remove(f.dir / "pool.db.created");
    expect = "write-ahead log";
  }
  std::string refused = f.refused_start();
  CHECK_THAT(refused, Catch::Contains(expect) && Catch::Contains("--new-store") &&
                          Catch::Contains("Restore the store from a backup"));
  // No new tokens: the output after the first run's shutdown line is the refused start's.
  CHECK_THAT(refused.substr(refused.rfind("shutting down")), !Catch::Contains("admin token"));
  // Refusing created nothing: the store is as the operator left it.
  CHECK((!fs::exists(f.dir / "pool.db") || fs::file_size(f.dir / "pool.db") == 0));

  // Asked explicitly: a new pool, with new tokens; later starts open it as usual.
  std::string out = run_with_new_store(f.dir);
  CHECK_THAT(out, Catch::Contains("admin token (shown once)") && Catch::Contains("guest token for tenant t"));
  CHECK(fs::file_size(f.dir / "pool.db") > 0);
  f.daemon.start();
  f.daemon.stop(SIGTERM);
  CHECK(f.daemon.exit_code() == 0);
}

TEST_CASE("a first start in a new data folder creates the store and its marker", "[integration][store]") {
  fs::path dir = temp_dir() / "fresh";  // does not exist yet
  {
    DaemonProcess d(dir, config());
    d.start();
    CHECK_THAT(d.output(), Catch::Contains("admin token (shown once)"));
    d.stop(SIGTERM);
    CHECK(d.exit_code() == 0);
  }
  CHECK(fs::file_size(dir / "pool.db") > 0);
  CHECK(fs::exists(dir / "pool.db.created"));
  std::error_code ec;
  fs::remove_all(dir.parent_path(), ec);
}

TEST_CASE(
    "a damaged write-ahead log: the commits from the damage on are dropped without an error, a log lost "
    "whole leaves no pool and is refused",
    "[integration][store]") {
  UsedFolder f(SIGKILL, 3);  // killed: the three acquires are in pool.db-wal, nothing checkpointed yet
  fs::path wal = f.dir / "pool.db-wal";
  REQUIRE(fs::file_size(wal) > 0);
  SECTION("its last frame cut short: the last acknowledged acquire is gone, the manager says nothing") {
    fs::resize_file(wal, fs::file_size(wal) - 100);
    f.daemon.start();
    CHECK(f.lease_status(1) == 200);
    CHECK(f.lease_status(2) == 200);
    CHECK(f.lease_status(3) == 404);
  }
  SECTION("emptied: the schema went with it, and the start is refused as for a lost store") {
    fs::resize_file(wal, 0);
    CHECK_THAT(f.refused_start(), Catch::Contains("the database holds no pool") && Catch::Contains("--new-store"));
  }
}
