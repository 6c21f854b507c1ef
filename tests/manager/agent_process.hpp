// A real accelpool-agent process for the manager's integration tests (agents_integration_test.cpp, ha_test.cpp).
#pragma once

#ifdef ACCELPOOL_AGENT_BIN

#include "child_exit.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

namespace accelpool::manager::itest {

inline const std::string kAgentToken = "agent-token-0123456789";

// One accelpool-agent process with a simulated pool of network-attached devices. `manager`: the manager's agent
// address, or a TOML array of them ("[\"h:1\", \"h:2\"]"). `agent_keys` ("key = value\n" lines) are added to its
// [agent] table.
class Agent {
 public:
  // `extra_config`: more tables for its config file (e.g. "[log]\n...").
  Agent(std::filesystem::path dir, std::string host, const std::string& manager, const std::string& devices,
        const std::string& token = kAgentToken, const std::string& agent_keys = "",
        const std::string& extra_config = "")
      : host_(std::move(host)), config_(dir / (host_ + ".toml")), log_(dir / (host_ + ".log")) {
    const std::string managers = manager.rfind('[', 0) == 0 ? manager : "\"" + manager + "\"";
    std::ofstream(config_) << "[agent]\nmanager = " << managers << "\ntoken = \"" << token << "\"\nhost = \"" << host_
                           << "\"\nheartbeat_interval_ms = 100\nreconnect_min_ms = 50\nreconnect_max_ms = 200\n"
                           << agent_keys << "[backends.sim]\ndevices = \"" << devices
                           << "\"\nprogram_base_ms = 5\nattach = \"network\"\n"
                           << extra_config;
    start();
  }
  ~Agent() { stop(SIGKILL); }
  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 2);
      ::execl(ACCELPOOL_AGENT_BIN, ACCELPOOL_AGENT_BIN, "--config", config_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  void stop(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  // The exit code when it exits by itself within `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    auto code = accelpool::testing::wait_child_exit(pid_, timeout);
    if (code) pid_ = -1;
    return code;
  }
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string host_;
  std::filesystem::path config_, log_;
  pid_t pid_ = -1;
};

}  // namespace accelpool::manager::itest

#endif
