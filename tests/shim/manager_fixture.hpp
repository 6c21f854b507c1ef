// Starts the real accelpool-manager on loopback with a temporary data folder, for the shim's integration tests.
#pragma once

#include "hung_after.hpp"
#include "skip.hpp"

#include <sys/types.h>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace accelpool::shim::test {

struct ManagerOptions {
  int fpgas = 2;              // static host "local" with this many network-attached fpga devices
  double ttl_s = 30;          // [leases] ttl_s
  double revoke_grace_s = 2;  // [leases] revoke_grace_s
  // Non-empty: the host uses this device backend (e.g. "opencl") instead of static fpga devices.
  std::string backend;
  std::string pocl_cache_dir;       // opencl: the backend's cache_dir
  std::string agent_token;          // non-empty: [agents] token, and an agent listener on 127.0.0.1 (agents())
  std::string local_kind = "fpga";  // kind of the static host's devices
};

// Builder: a static pool of `fpgas` devices with the given TTL and grace period.
inline ManagerOptions fpga_pool(int fpgas, double ttl_s = 30, double revoke_grace_s = 2) {
  ManagerOptions o;
  o.fpgas = fpgas;
  o.ttl_s = ttl_s;
  o.revoke_grace_s = revoke_grace_s;
  return o;
}

// Builder: the host "local" with the OpenCL backend (PoCL's CPU device here), its compiled-kernel cache in a folder
// per user under the temporary directory, made here and kept across tests (a cold kernel build takes seconds).
ManagerOptions pocl_pool();

// One manager process. Stopped (SIGTERM, then SIGKILL) and its folder removed on destruction.
class ManagerProcess {
 public:
  // Path of the manager binary, or "" when this build has none (integration tests then skip).
  static std::string binary();

  explicit ManagerProcess(ManagerOptions options = {});
  ~ManagerProcess();
  ManagerProcess(const ManagerProcess&) = delete;
  ManagerProcess& operator=(const ManagerProcess&) = delete;

  // Starts (again, with the same data folder). Returns false and sets error() when it did not come up.
  bool start();
  void stop();
  bool running() const { return pid_ > 0; }
  const std::string& error() const { return error_; }

  const std::string& dir() const { return dir_; }
  const std::string& guest_token() const { return guest_token_; }
  const std::string& admin_token() const { return admin_token_; }
  std::string tcp_uri() const { return "tcp://" + tcp_; }
  std::string unix_uri() const { return "unix://" + unix_; }
  const std::string& admin_url() const { return admin_; }
  const std::string& agents() const { return agents_; }  // "127.0.0.1:PORT" when agent_token was set

  // Admin REST call (plain HTTP/1.1 on loopback). Returns the status code and fills `body`.
  int admin_request(const std::string& method, const std::string& path, const std::string& json_body,
                    std::string& body) const;

 private:
  ManagerOptions options_;
  std::string dir_, error_, guest_token_, admin_token_, tcp_, unix_, admin_, agents_;
  pid_t pid_ = -1;
};

// In a test case: skips it when this build has no manager, else starts `m` or fails.
#define REQUIRE_MANAGER(m)                                                                             \
  if (::accelpool::shim::test::ManagerProcess::binary().empty())                                       \
    ACCELPOOL_SKIP("this build has no accelpool-manager target, so there is no pool to test against"); \
  if (!(m).start()) FAIL("accelpool-manager did not start: " << (m).error())

// A unique temporary folder (removed by the caller).
std::string make_temp_dir(const std::string& prefix);
void remove_tree(const std::string& dir);
std::string read_file(const std::string& path);

// A stand-in for /sys/class/virtio-ports under `sys_dir`: a folder per port (e.g. "vport0p2") holding its `name`
// file ("" for a port without a name).
void make_virtio_ports(const std::string& sys_dir, const std::map<std::string, std::string>& names);

// A child process with its own process group, its output in a file.
struct Child {
  pid_t pid = -1;
  std::string out;
  int status = -1;

  // Waits for it to exit (up to kHungAfter); returns false if it is still running.
  bool wait();
  void kill_group();
  int exit_code() const;
  std::string output() const { return read_file(out); }
};

// Starts `args` (args[0] a path) in its own process group with stdout and stderr in the file `out` and `env` set
// on top of this process's environment; an empty value removes that variable.
Child spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
            const std::string& out);

using ::accelpool::testing::eventually;

// Waits until heartbeats have renewed lease `id` (queued or granted) at or after the expiry it had when this was
// called, which proves by the manager's own clock that it outlived one TTL (`ttl_s`) without being ended.
// Returns false when that did not happen within kHungAfter (the lease ended, or heartbeats stopped). `client`
// is a shim Client (a template so that this header needs no link to the shim library).
template <typename ShimClient>
bool renewed_past_ttl(ShimClient& client, std::uint64_t id, double ttl_s) {
  auto first = client.get(id);
  if (!first) return false;
  // expires_at is the last heartbeat's time plus the TTL.
  const double renewed_at_or_after = first->expires_at + ttl_s;
  return eventually([&] {
    auto l = client.get(id);
    return l && l->expires_at >= renewed_at_or_after;
  });
}

}  // namespace accelpool::shim::test
