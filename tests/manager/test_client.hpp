// Drives a real accelpool-manager process: starts it on loopback with free ports, talks to it over plain
// sockets (newline-delimited JSON for guests, hand-written HTTP/1.1 for the admin API).
#pragma once

#include "hung_after.hpp"

#include <boost/json.hpp>

#include <chrono>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accelpool::manager::itest {

namespace json = boost::json;

using accelpool::testing::kHungAfter;

struct Endpoints {
  int admin_port = 0;
  int guest_port = 0;
  std::string guest_unix;
  std::string agents;  // the host-agent listener ("IP:PORT"), "" when none
};

class DaemonProcess {
 public:
  // `config` is written to DATA/manager.toml (it should listen on 127.0.0.1 port 0 everywhere); an empty
  // `config` runs the embedded default with free ports.
  DaemonProcess(std::filesystem::path data_dir, std::string config);
  ~DaemonProcess();
  void start();  // returns once endpoints.json of this process exists
  // start() in two steps: launch() starts the process and returns at once (a standby, which writes endpoints.json
  // only when it leads); wait_started() waits for its endpoints.json.
  void launch();
  void wait_started();
  // Whether the process has exited (reaped now if so; exit_code() then tells how).
  bool exited();
  void stop(int signal);  // SIGTERM for a graceful stop, SIGKILL for a crash; waits for the exit
  // The file descriptor limit (RLIMIT_NOFILE) the process starts with from the next start() on.
  void set_fd_limit(std::uint64_t soft, std::uint64_t hard) { fd_limit_ = {soft, hard}; }
  // The largest file the process may write (RLIMIT_FSIZE; writes past it fail with EFBIG, as on a full disk)
  // from the next start() on; 0: no limit.
  void set_file_size_limit(std::uint64_t bytes) { file_size_limit_ = bytes; }
  int pid() const { return pid_; }
  int exit_code() const { return exit_code_; }
  bool running() const { return pid_ > 0; }
  std::string output() const;  // stdout and stderr so far
  const Endpoints& endpoints() const { return ep_; }
  const std::filesystem::path& data_dir() const { return dir_; }
  // Token lines from the first start: "guest token for tenant NAME", "admin token".
  std::string token(const std::string& what) const;

 private:
  std::filesystem::path dir_;
  std::string config_;
  int pid_ = -1;
  int exit_code_ = -1;
  Endpoints ep_;
  std::string first_output_;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> fd_limit_;
  std::uint64_t file_size_limit_ = 0;
};

// Runs the shell command `command` (stderr joined to stdout); returns its exit code (-1 if it did not exit) and its
// output.
std::pair<int, std::string> run_command(const std::string& command);

// A fresh empty folder under the system temp folder, named `prefix` followed by random digits.
std::filesystem::path temp_dir(const std::string& prefix);

// A DaemonProcess (not started) in a fresh temp folder of its own; on destruction the process is killed
// (SIGKILL) and the folder removed.
struct ScratchDaemon {
  ScratchDaemon(const std::string& prefix, std::string config);
  ~ScratchDaemon();
  ScratchDaemon(const ScratchDaemon&) = delete;
  ScratchDaemon& operator=(const ScratchDaemon&) = delete;

  std::filesystem::path dir;
  DaemonProcess daemon;
};

// The config of a manager that takes remote host agents: an agent listener on 127.0.0.1 with `agent_token`, its
// own host "local" with one network-attached asic, tenant "t", guests on TCP only. `leases` and `agents` are
// added to those tables ("key = value\n" lines).
std::string agent_manager_config(const std::string& agent_token, const std::string& leases = "",
                                 const std::string& agents = "");

struct HttpResult {
  int status = 0;
  std::string body;
  json::value json() const;
};

HttpResult http(int port, const std::string& method, const std::string& target, const std::string& token,
                const std::string& body = "");
// Sends raw bytes and returns the status line's code: 0 if the server closed without answering, -1 if it did
// neither within kHungAfter.
int http_raw(int port, const std::string& request);

class GuestClient {
 public:
  static GuestClient tcp(int port);
  static GuestClient unix_socket(const std::string& path);
  GuestClient(GuestClient&& o) noexcept;
  ~GuestClient();

  void send_line(const std::string& line);
  // The next line, or nullopt on timeout / close.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = kHungAfter);
  // Whether the server closes the connection within `timeout` (lines it sends meanwhile are dropped).
  bool wait_closed(std::chrono::milliseconds timeout = kHungAfter);
  // A call: sends it with a fresh id, returns the reply (notifications seen meanwhile are kept).
  json::object call(const std::string& method, json::object params);
  json::object hello(const std::string& token, const std::string& guest);
  // Waits for a notification with `method` for `lease` (or any lease when 0).
  std::optional<json::object> wait_notification(const std::string& method, std::uint64_t lease,
                                                std::chrono::milliseconds timeout = kHungAfter);
  void close();

 private:
  friend class PortListener;
  explicit GuestClient(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string buffer_;
  std::uint64_t next_id_ = 1;
  std::deque<json::object> notifications_;
};

// A Unix socket the test listens on, as QEMU listens on a VM's virtio-serial channel for the host agent's relay to
// connect to: each connection accepted is the VM's port, on which the test speaks as the guest.
class PortListener {
 public:
  // Listens at `path` (a file already there is replaced). Throws when it cannot.
  explicit PortListener(const std::filesystem::path& path);
  ~PortListener();
  PortListener(const PortListener&) = delete;
  PortListener& operator=(const PortListener&) = delete;
  // The next connection, or nullopt when none comes within `timeout`.
  std::optional<GuestClient> accept(std::chrono::milliseconds timeout = kHungAfter);

 private:
  int fd_ = -1;
};

// Result of a call, or the error code word (error.data.code).
std::string error_word(const json::object& reply);
std::uint64_t lease_id(const json::object& reply);
std::string lease_state(const json::object& reply);

}  // namespace accelpool::manager::itest
