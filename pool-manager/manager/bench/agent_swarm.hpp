// Emulated host agents for the scale benchmark: many agent connections from one process, driven by one epoll
// thread, speaking the agent protocol (docs/agent-protocol.md) as accelpool-agent does: agent.register with every
// device, agent.heartbeat every interval, and device.prepare / release / reset answered at once (nothing is
// programmed). Not a test double: the manager cannot tell these agents from real ones on the wire.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace accelpool::bench {

struct SwarmOptions {
  int port = 0;       // the manager's agent listener on 127.0.0.1
  std::string token;  // the agent token
  int agents = 10;    // hosts "emu0000".. each with `devices` fpgas "fpga0".. (kind fpga, network attach)
  int devices = 100;
  std::chrono::milliseconds heartbeat{2000};
  // true: every heartbeat lists every device (as agents did before heartbeat deltas; a manager of that time
  // accepts it); false: only changes, and every 10th beat a full list with "full": true.
  bool full_heartbeats = false;
};

class AgentSwarm {
 public:
  explicit AgentSwarm(SwarmOptions options);
  ~AgentSwarm();  // closes every connection and stops the thread
  AgentSwarm(const AgentSwarm&) = delete;
  AgentSwarm& operator=(const AgentSwarm&) = delete;

  // Every agent connects and registers, and reconnects (every 50 ms until it can) whenever its connection ends.
  void connect_all();
  // Every agent closes its connection at once and stays away until connect_all.
  void drop_all();
  // Agents whose registration the manager accepted, on their current connection.
  int registered() const;
  // Requests (prepare, release, reset) answered so far.
  std::uint64_t answered() const;
  // Registrations the manager refused (a bug or a misconfiguration: the benchmark reports it).
  std::uint64_t refused() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelpool::bench
