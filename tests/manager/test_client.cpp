#include "test_client.hpp"

#include <accelpool/common/connect.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace accelpool::manager::itest {

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int connect_tcp(int port) {
  int fd = common::connect_loopback_tcp(port);
  if (fd < 0) {
    throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno));
  }
  return fd;
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("send failed");
    off += static_cast<std::size_t>(n);
  }
}

// Reads until the peer closes, a complete response is in (for an event stream, which does not end: its headers
// and first event), or kHungAfter passes (then sets `timed_out`).
std::string read_all(int fd, bool* timed_out = nullptr) {
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + kHungAfter;
  char buf[65536];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready == 0 && timed_out) *timed_out = true;
    if (ready <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    // Stop once a complete response (headers + Content-Length body) is in.
    auto end = out.find("\r\n\r\n");
    if (end != std::string::npos) {
      auto cl = out.find("Content-Length: ");
      if (cl == std::string::npos) cl = out.find("content-length: ");
      if (cl != std::string::npos && cl < end) {
        std::size_t len = std::stoul(out.substr(cl + 16));
        if (out.size() >= end + 4 + len) break;
      }
      auto type = out.find("Content-Type: text/event-stream");
      if (type != std::string::npos && type < end && out.find("\n\n", end + 4) != std::string::npos) break;
    }
  }
  return out;
}

}  // namespace

// --- DaemonProcess ---------------------------------------------------------------------------------------------

std::pair<int, std::string> run_command(const std::string& command) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + command);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::filesystem::path temp_dir(const std::string& prefix) {
  std::random_device rd;
  auto p = std::filesystem::temp_directory_path() / (prefix + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(p);
  return p;
}

ScratchDaemon::ScratchDaemon(const std::string& prefix, std::string config)
    : dir(temp_dir(prefix)), daemon(dir, std::move(config)) {}

ScratchDaemon::~ScratchDaemon() {
  daemon.stop(SIGKILL);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

std::string agent_manager_config(const std::string& agent_token, const std::string& leases, const std::string& agents) {
  return "[leases]\nttl_s = 60\n" + leases +
         "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
         "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"" +
         agent_token + "\"\n" + agents +
         "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"asic\"\ncount = 1\n"
         "[[tenants]]\nname = \"t\"\n";
}

DaemonProcess::DaemonProcess(std::filesystem::path data_dir, std::string config)
    : dir_(std::move(data_dir)), config_(std::move(config)) {
  std::filesystem::create_directories(dir_);
  if (!config_.empty()) std::ofstream(dir_ / "manager.toml") << config_;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) stop(SIGKILL);
}

void DaemonProcess::start() {
  launch();
  wait_started();
}

bool DaemonProcess::exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  pid_ = -1;
  return true;
}

void DaemonProcess::launch() {
  std::filesystem::remove(dir_ / "endpoints.json");
  std::string out_file = (dir_ / "output.log").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (fd_limit_) {
      rlimit lim{static_cast<rlim_t>(fd_limit_->first), static_cast<rlim_t>(fd_limit_->second)};
      if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(126);
    }
    if (file_size_limit_ > 0) {
      ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing the process
      rlimit lim{static_cast<rlim_t>(file_size_limit_), static_cast<rlim_t>(file_size_limit_)};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(126);
    }
    std::string cfg = (dir_ / "manager.toml").string();
    std::string dd = dir_.string();
    if (config_.empty()) {  // the embedded default, on free ports
      ::execl(ACCELPOOL_MANAGER_BIN, ACCELPOOL_MANAGER_BIN, "--data-dir", dd.c_str(), "--admin", "127.0.0.1:0",
              "--guest-tcp", "127.0.0.1:0", static_cast<char*>(nullptr));
    } else {
      ::execl(ACCELPOOL_MANAGER_BIN, ACCELPOOL_MANAGER_BIN, "--config", cfg.c_str(), "--data-dir", dd.c_str(),
              static_cast<char*>(nullptr));
    }
    ::_exit(127);
  }
  pid_ = pid;
}

void DaemonProcess::wait_started() {
  for (auto deadline = std::chrono::steady_clock::now() + kHungAfter; std::chrono::steady_clock::now() < deadline;) {
    std::string text = slurp(dir_ / "endpoints.json");
    if (!text.empty()) {
      auto v = json::parse(text).as_object();
      if (v.at("pid").to_number<int>() == pid_) {
        std::string admin(v.at("admin").as_string());
        ep_.admin_port = std::stoi(admin.substr(admin.rfind(':') + 1));
        std::string tcp(v.at("guest_tcp").as_string());
        ep_.guest_port = std::stoi(tcp.substr(tcp.rfind(':') + 1));
        ep_.guest_unix = std::string(v.at("guest_unix").as_string());
        ep_.agents = v.contains("agents") ? std::string(v.at("agents").as_string()) : std::string();
        if (first_output_.empty()) first_output_ = output();
        return;
      }
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("accelpool-manager exited at start:\n" + output());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("accelpool-manager did not write endpoints.json in " +
                           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kHungAfter).count()) +
                           " s:\n" + output());
}

void DaemonProcess::stop(int signal) {
  if (pid_ <= 0) return;
  ::kill(pid_, signal);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  pid_ = -1;
}

std::string DaemonProcess::output() const { return slurp(dir_ / "output.log"); }

std::string DaemonProcess::token(const std::string& what) const {
  std::istringstream in(first_output_);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(what, 0) == 0) return line.substr(line.rfind(' ') + 1);
  }
  throw std::runtime_error("no '" + what + "' line in the daemon's output:\n" + first_output_);
}

// --- HTTP ------------------------------------------------------------------------------------------------------

json::value HttpResult::json() const { return json::parse(body); }

HttpResult http(int port, const std::string& method, const std::string& target, const std::string& token,
                const std::string& body) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  int fd = connect_tcp(port);
  write_all(fd, req);
  std::string resp = read_all(fd);
  ::close(fd);
  HttpResult r;
  if (resp.size() < 12) return r;
  r.status = std::stoi(resp.substr(9, 3));
  auto end = resp.find("\r\n\r\n");
  if (end != std::string::npos) r.body = resp.substr(end + 4);
  return r;
}

int http_raw(int port, const std::string& request) {
  int fd = connect_tcp(port);
  try {
    write_all(fd, request);
  } catch (...) {
  }
  bool timed_out = false;
  std::string resp = read_all(fd, &timed_out);
  ::close(fd);
  if (timed_out) return -1;
  if (resp.size() < 12) return 0;
  return std::stoi(resp.substr(9, 3));
}

// --- GuestClient -----------------------------------------------------------------------------------------------

GuestClient GuestClient::tcp(int port) { return GuestClient(connect_tcp(port)); }

GuestClient GuestClient::unix_socket(const std::string& path) {
  int fd = common::connect_unix_stream(path);
  if (fd < 0) throw std::runtime_error("cannot connect to " + path + ": " + std::strerror(errno));
  return GuestClient(fd);
}

GuestClient::GuestClient(GuestClient&& o) noexcept
    : fd_(o.fd_), buffer_(std::move(o.buffer_)), next_id_(o.next_id_), notifications_(std::move(o.notifications_)) {
  o.fd_ = -1;
}

GuestClient::~GuestClient() { close(); }

void GuestClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void GuestClient::send_line(const std::string& line) { write_all(fd_, line + "\n"); }

std::optional<std::string> GuestClient::read_line(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return std::nullopt;
    buffer_.append(buf, static_cast<std::size_t>(n));
  }
}

bool GuestClient::wait_closed(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0) return false;
    char buf[65536];
    if (::recv(fd_, buf, sizeof buf, 0) <= 0) return true;
  }
}

json::object GuestClient::call(const std::string& method, json::object params) {
  std::uint64_t id = next_id_++;
  send_line(
      json::serialize(json::object{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}}));
  for (;;) {
    auto line = read_line();
    if (!line) throw std::runtime_error("no reply to " + method);
    auto v = json::parse(*line).as_object();
    if (v.contains("id") && v.at("id").is_number() && v.at("id").to_number<std::uint64_t>() == id) return v;
    if (v.contains("method")) notifications_.push_back(std::move(v));
  }
}

json::object GuestClient::hello(const std::string& token, const std::string& guest) {
  return call("hello", {{"protocol", 1}, {"token", token}, {"guest", guest}});
}

std::optional<json::object> GuestClient::wait_notification(const std::string& method, std::uint64_t lease,
                                                           std::chrono::milliseconds timeout) {
  auto matches = [&](const json::object& n) {
    return n.at("method").as_string() == method &&
           (lease == 0 || n.at("params").at("lease").at("id").to_number<std::uint64_t>() == lease);
  };
  for (auto it = notifications_.begin(); it != notifications_.end(); ++it) {
    if (matches(*it)) {
      auto n = *it;
      notifications_.erase(it);
      return n;
    }
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto line = read_line(left);
    if (!line) return std::nullopt;
    auto v = json::parse(*line).as_object();
    if (!v.contains("method")) continue;
    if (matches(v)) return v;
    notifications_.push_back(std::move(v));
  }
}

// --- PortListener ----------------------------------------------------------------------------------------------

PortListener::PortListener(const std::filesystem::path& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.string().size() >= sizeof(a.sun_path)) throw std::runtime_error("socket path too long: " + path.string());
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  std::filesystem::remove(path);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 4) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("cannot listen at " + path.string() + ": " + why);
  }
}

PortListener::~PortListener() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<GuestClient> PortListener::accept(std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
  int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return std::nullopt;
  return GuestClient(fd);
}

std::string error_word(const json::object& reply) {
  if (!reply.contains("error")) return "";
  return std::string(reply.at("error").at("data").at("code").as_string());
}

std::uint64_t lease_id(const json::object& reply) {
  return reply.at("result").at("lease").at("id").to_number<std::uint64_t>();
}

std::string lease_state(const json::object& reply) {
  return std::string(reply.at("result").at("lease").at("state").as_string());
}

}  // namespace accelpool::manager::itest
