#include "manager_fixture.hpp"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace accelpool::shim::test {

std::string make_temp_dir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) return {};
  return buf.data();
}

void remove_tree(const std::string& dir) {
  std::error_code ec;
  if (!dir.empty()) std::filesystem::remove_all(dir, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void make_virtio_ports(const std::string& sys_dir, const std::map<std::string, std::string>& names) {
  for (const auto& [port, name] : names) {
    std::filesystem::create_directories(sys_dir + "/" + port);
    std::ofstream(sys_dir + "/" + port + "/name") << name << "\n";
  }
}

ManagerOptions pocl_pool() {
  ManagerOptions o;
  o.backend = "opencl";
  o.pocl_cache_dir =
      std::filesystem::temp_directory_path().string() + "/accelpool-shim-pocl-" + std::to_string(getuid());
  std::filesystem::create_directories(o.pocl_cache_dir);
  return o;
}

std::string ManagerProcess::binary() {
#ifdef ACCELPOOL_MANAGER_BIN
  return ACCELPOOL_MANAGER_BIN;
#else
  return {};
#endif
}

ManagerProcess::ManagerProcess(ManagerOptions options) : options_(options) {
  dir_ = make_temp_dir("accelpool-shim-");
  std::ofstream cfg(dir_ + "/manager.toml");
  cfg << "data_dir = \"" << dir_ << "/data\"\n"
      << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"guest.sock\"\n"
      << "[admin]\nlisten = \"127.0.0.1:0\"\n"
      << "[leases]\nttl_s = " << options_.ttl_s << "\nrevoke_grace_s = " << options_.revoke_grace_s << "\n";
  if (!options_.agent_token.empty()) {
    cfg << "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"" << options_.agent_token << "\"\n";
  }
  cfg << "[[hosts]]\nname = \"local\"\n";
  if (options_.backend.empty()) {
    cfg << "backend = \"static\"\n"
        << "[[hosts.devices]]\nkind = \"" << options_.local_kind << "\"\nmodel = \"u250\"\ncount = " << options_.fpgas
        << "\nattach = \"network\"\n";
  } else {
    cfg << "backend = \"" << options_.backend << "\"\n";
    if (!options_.pocl_cache_dir.empty()) {
      cfg << "[hosts.settings]\ncache_dir = \"" << options_.pocl_cache_dir << "\"\n";
    }
  }
}

ManagerProcess::~ManagerProcess() {
  stop();
  remove_tree(dir_);
}

bool ManagerProcess::start() {
  error_.clear();
  std::string bin = binary();
  if (bin.empty()) {
    error_ = "no accelpool-manager in this build";
    return false;
  }
  std::filesystem::create_directories(dir_ + "/data");
  std::string log = dir_ + "/manager.log";
  std::filesystem::remove(dir_ + "/data/endpoints.json");
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::string cfg = dir_ + "/manager.toml";
    execl(bin.c_str(), bin.c_str(), "--config", cfg.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  pid_ = pid;
  auto deadline = std::chrono::steady_clock::now() + accelpool::testing::kHungAfter;
  while (std::chrono::steady_clock::now() < deadline) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "accelpool-manager exited at start: " + read_file(log);
      return false;
    }
    std::string ep = read_file(dir_ + "/data/endpoints.json");
    auto j = nlohmann::json::parse(ep, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("pid", 0) == pid_) {
      tcp_ = j.value("guest_tcp", "");
      unix_ = j.value("guest_unix", "");
      admin_ = j.value("admin", "");
      agents_ = j.value("agents", "");
      std::string text = read_file(log);
      auto grab = [&](const std::string& marker, std::string& out) {
        auto p = text.find(marker);
        if (p == std::string::npos) return;
        auto e = text.find('\n', p);
        out = text.substr(p + marker.size(), e - p - marker.size());
      };
      grab("guest token for tenant default (shown once): ", guest_token_);
      grab("admin token (shown once): ", admin_token_);
      if (guest_token_.empty() || admin_token_.empty()) {
        error_ = "no tokens in the manager's output: " + text;
        return false;
      }
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  error_ = "accelpool-manager did not write endpoints.json in time: " + read_file(log);
  stop();
  return false;
}

void ManagerProcess::stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int st;
  while (waitpid(pid_, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
}

int ManagerProcess::admin_request(const std::string& method, const std::string& path, const std::string& json_body,
                                  std::string& body) const {
  // admin_ is http://127.0.0.1:PORT
  auto colon = admin_.rfind(':');
  int port = std::atoi(admin_.c_str() + colon + 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  std::string req = method + " " + path +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer " + admin_token_ +
                    "\r\n";
  if (!json_body.empty()) {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(json_body.size()) + "\r\n";
  }
  req += "\r\n" + json_body;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return -1;
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  auto sp = resp.find(' ');
  if (sp == std::string::npos) return -1;
  auto hdr_end = resp.find("\r\n\r\n");
  body = hdr_end == std::string::npos ? "" : resp.substr(hdr_end + 4);
  return std::atoi(resp.c_str() + sp + 1);
}

bool Child::wait() {
  return eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; });
}

void Child::kill_group() {
  ::kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
}

int Child::exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

Child spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
            const std::string& out) {
  Child c;
  c.out = out;
  c.pid = fork();
  if (c.pid == 0) {
    setpgid(0, 0);
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const auto& [k, v] : env) {
      if (v.empty())
        unsetenv(k.c_str());
      else
        setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return c;
}

}  // namespace accelpool::shim::test
