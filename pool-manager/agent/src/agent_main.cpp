// accelpool-agent: the host agent (docs/hosts.md, "Host agent").
#include "agent.hpp"
#include "agent_config.hpp"

#include <accelpool/common/cli.hpp>

#include <csignal>
#include <iostream>

namespace {
std::atomic<bool> g_stop{false};
accelpool::agent::Agent* g_agent = nullptr;
void on_signal(int) {
  g_stop = true;
  if (g_agent) g_agent->wake();
}

constexpr const char* kDescription = R"(accelpool-agent: the host agent of an accelpool pool.

Runs on a hypervisor host: connects to the manager's agent listener (it never listens itself), registers the
host's devices (backends xrt, opencl, sim), programs and attaches them to VMs (libvirt) as the manager asks,
relays its VMs' guest ports, and reconnects with backoff when the manager goes away. Stops on SIGTERM or SIGINT.

The config file (TOML) has [agent] manager, token or token_file, host, heartbeat_interval_ms, bitstreams,
state_file, tls_ca, tls_cert, tls_key; [log] level, format; [libvirt] uri, detach_timeout_ms; one [backends.NAME]
table per backend. Every
key is described in docs/hosts.md, "Host agent".

Exit status: 0 after a signal; 1 when a backend, the registry or libvirt cannot be set up; 2 for bad arguments,
a bad config file, or when the manager refuses the agent for good (wrong token, protocol version).)";
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription};
  accelpool::common::init_cli(app, "accelpool-agent");
  std::string config, log_level, log_format;
  app.add_option("--config", config, "the agent's TOML configuration file, e.g. /etc/accelpool/agent.toml")
      ->type_name("FILE")
      ->required();
  accelpool::common::add_log_options(app, log_level, log_format);
  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  auto cfg = accelpool::agent::load_agent_config(config);
  if (!cfg) {
    std::cerr << "accelpool-agent: " << cfg.error().message << "\n";
    return 2;
  }
  if (!log_level.empty()) cfg->log_level = *accelpool::log::parse_level(log_level);
  if (!log_format.empty()) cfg->log_format = *accelpool::log::parse_format(log_format);
  accelpool::log::configure("accelpool-agent", cfg->log_level, cfg->log_format);
  auto agent = accelpool::agent::Agent::create(std::move(*cfg));
  if (!agent) {
    accelpool::log::error("start failed", {{"error", agent.error().message}});
    return 1;
  }
  g_agent = agent->get();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  int rc = (*agent)->run(g_stop);
  g_agent = nullptr;
  return rc;
}
