// The host agent: finds the host's devices through the backends, registers them with the manager, heartbeats,
// and carries out the manager's device.prepare / device.release / device.reset (docs/agent-protocol.md).
//
// Threads: the connection thread (run()) owns the socket: it connects, registers, heartbeats, reads requests and
// writes replies. Device operations run in the host runtime (accelpool/host/runtime.hpp): in order per device,
// different devices in parallel, on the runtime's threads, whose completions only queue replies (programming or a
// detach can take seconds; the heartbeat keeps going meanwhile). libvirt events arrive on the attacher's event
// thread and only queue notifications.
#pragma once

#include "agent_config.hpp"

#include <accelpool/common/result.hpp>

#include <atomic>
#include <memory>

namespace accelpool::agent {

class Agent {
 public:
  // Creates the backends, enumerates the devices, opens the registry and connects to libvirt (when configured),
  // and reconciles what the state file's VMs hold. Errors: the first backend/registry/libvirt error, naming it.
  static Result<std::unique_ptr<Agent>> create(AgentConfig config);
  virtual ~Agent() = default;

  // Serves the manager until `stop` is set (then returns 0), reconnecting with backoff whenever the connection
  // ends. Returns 2 when the manager refuses the agent for good (wrong token, unsupported protocol).
  virtual int run(const std::atomic<bool>& stop) = 0;

  // Makes run() look at `stop` now (async-signal-safe).
  virtual void wake() = 0;
};

}  // namespace accelpool::agent
