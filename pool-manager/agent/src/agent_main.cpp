// accelpool-agent: the host agent. Usage: accelpool-agent --config FILE
#include "agent.hpp"
#include "agent_config.hpp"

#include <csignal>
#include <cstring>
#include <iostream>

namespace {
std::atomic<bool> g_stop{false};
accelpool::agent::Agent* g_agent = nullptr;
void on_signal(int) {
  g_stop = true;
  if (g_agent) g_agent->wake();
}
}  // namespace

int main(int argc, char** argv) {
  std::string config;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config = argv[++i];
    } else if (std::strcmp(argv[i], "--help") == 0) {
      std::cout << "usage: accelpool-agent --config FILE\n(see docs/hosts.md, \"Host agent\")\n";
      return 0;
    } else {
      std::cerr << "accelpool-agent: unknown argument '" << argv[i] << "' (usage: accelpool-agent --config FILE)\n";
      return 2;
    }
  }
  if (config.empty()) {
    std::cerr << "accelpool-agent: --config FILE is required\n";
    return 2;
  }
  auto cfg = accelpool::agent::load_agent_config(config);
  if (!cfg) {
    std::cerr << "accelpool-agent: " << cfg.error().message << "\n";
    return 2;
  }
  auto agent = accelpool::agent::Agent::create(std::move(*cfg));
  if (!agent) {
    std::cerr << "accelpool-agent: " << agent.error().message << "\n";
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
