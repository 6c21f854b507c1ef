// A private PostgreSQL cluster for tests: initdb + pg_ctl (Debian's `postgresql` package) in a temporary folder,
// listening only on a Unix socket there, stopped when the test process ends. Header-only.
//
// The server refuses to run as root: a test run as root (CI) runs initdb, pg_ctl and the server as the user
// `nobody` (or ACCELPOOL_TEST_PG_USER) through setpriv, in a folder given to that user. The tests connect as the
// cluster's superuser `accelpool` (trust authentication: only this socket, in a folder only its owner reaches).
#pragma once

#include "run_command.hpp"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

namespace accelpool::testing {

class PostgresCluster {
 public:
  // The cluster of this test process, started at its first use (a few seconds) and stopped at exit. Throws,
  // saying what is missing, when the server's binaries are not installed or the cluster does not start.
  static PostgresCluster& shared() {
    static std::unique_ptr<PostgresCluster> cluster(new PostgresCluster());
    return *cluster;
  }

  ~PostgresCluster() {
    (void)run_command(as_owner(bin_ / "pg_ctl") + " -D " + quoted(dir_ / "data") + " -m immediate -w stop 2>&1");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PostgresCluster(const PostgresCluster&) = delete;
  PostgresCluster& operator=(const PostgresCluster&) = delete;

  // Creates an empty database `name` (letters, digits, '_') and returns the libpq URL that reaches it.
  std::string create_database(const std::string& name) {
    auto out = run_command(quoted(bin_ / "createdb") + " -h " + quoted(dir_) + " -U accelpool " + name + " 2>&1");
    if (out.code != 0) throw std::runtime_error("createdb " + name + " failed: " + out.text);
    return url(name);
  }

  // The libpq URL of database `name` over the cluster's Unix socket.
  std::string url(const std::string& name) const {
    return "postgresql:///" + name + "?host=" + dir_.string() + "&user=accelpool";
  }

  // Runs SQL in database `name` with psql; its output (unaligned, tuples only). Throws on an error.
  std::string sql(const std::string& name, const std::string& statement) const {
    auto out = run_command(quoted(bin_ / "psql") + " -X -At -v ON_ERROR_STOP=1 -h " + quoted(dir_) +
                           " -U accelpool -d " + name + " -c " + quoted(statement) + " 2>&1");
    if (out.code != 0) throw std::runtime_error("psql: " + statement + ": " + out.text);
    while (!out.text.empty() && out.text.back() == '\n') out.text.pop_back();
    return out.text;
  }

  const std::filesystem::path& socket_dir() const { return dir_; }

 private:
  PostgresCluster() {
    bin_ = find_bin();
    char tmpl[] = "/tmp/accelpool-pg-XXXXXX";  // short: a Unix socket path has at most 107 bytes
    if (!mkdtemp(tmpl)) throw std::runtime_error("cannot create a folder for the PostgreSQL cluster");
    dir_ = tmpl;
    if (geteuid() == 0) {
      const char* env = std::getenv("ACCELPOOL_TEST_PG_USER");
      user_ = env && *env ? env : "nobody";
      const passwd* pw = getpwnam(user_.c_str());
      if (!pw) throw std::runtime_error("running as root, the PostgreSQL test cluster needs the user " + user_);
      if (chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) throw std::runtime_error("cannot chown " + dir_.string());
    }
    auto init = run_command(as_owner(bin_ / "initdb") + " -D " + quoted(dir_ / "data") +
                            " -A trust -U accelpool -E UTF8 --locale=C --no-sync --no-instructions 2>&1");
    if (init.code != 0) throw std::runtime_error("initdb failed: " + init.text);
    auto start = run_command(as_owner(bin_ / "pg_ctl") + " -D " + quoted(dir_ / "data") + " -l " +
                             quoted(dir_ / "server.log") + " -w -t 300 -o " +
                             quoted("-c listen_addresses='' -c unix_socket_directories='" + dir_.string() + "'") +
                             " start 2>&1");
    if (start.code != 0) {
      auto log = run_command("cat " + quoted(dir_ / "server.log") + " 2>&1");
      throw std::runtime_error("pg_ctl start failed: " + start.text + log.text);
    }
  }

  // The folder of initdb and pg_ctl: ACCELPOOL_TEST_PG_BIN, or Debian's /usr/lib/postgresql/<newest>/bin.
  static std::filesystem::path find_bin() {
    if (const char* env = std::getenv("ACCELPOOL_TEST_PG_BIN"); env && *env) return env;
    std::filesystem::path best;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
      auto bin = e.path() / "bin";
      if (std::filesystem::exists(bin / "initdb") && std::filesystem::exists(bin / "pg_ctl") &&
          (best.empty() || std::stoi(e.path().filename().string()) > std::stoi(best.parent_path().filename().string())))
        best = bin;
    }
    if (best.empty()) {
      throw std::runtime_error(
          "PostgreSQL's server programs (initdb, pg_ctl) are not installed: no "
          "/usr/lib/postgresql/<version>/bin; install the Debian package postgresql "
          "(scripts/setup.sh) or set ACCELPOOL_TEST_PG_BIN");
    }
    return best;
  }

  static std::string quoted(const std::filesystem::path& p) { return quoted(p.string()); }
  static std::string quoted(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }
  // A command line that runs `program` as the cluster's owner.
  std::string as_owner(const std::filesystem::path& program) const {
    if (user_.empty()) return quoted(program);
    return "setpriv --reuid=" + user_ + " --regid=" + std::to_string(getpwnam(user_.c_str())->pw_gid) +
           " --clear-groups " + quoted(program);
  }

  std::filesystem::path bin_;
  std::filesystem::path dir_;
  std::string user_;  // "" when not root: the test's own user owns the cluster
};

}  // namespace accelpool::testing
