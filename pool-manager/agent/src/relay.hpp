// The guest-port relay of the host agent (docs/agent-protocol.md, "Relaying guest ports"): for every running VM
// with the guest channel, one connection to the VM's virtio-serial socket and one to the manager's guest
// listener, bytes copied both ways. The manager connection starts with a `relay` announcement carrying the agent
// token, the host and the VM, so the manager pins that connection to the VM (a guest cannot claim to be another).
// Given several managers (the leader and standbys of a shared store, docs/ha.md), each VM's link finds the leader
// by the rule of the agent link (manager_list.hpp): a standby's `not_leader` names the leader, tried at once; a
// failed or ended manager connection moves on to the next manager of the list.
//
// Threads: one relay thread owns every socket; start() and the destructor are called from the agent's thread.
#pragma once

#include <accelpool/common/result.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace accelpool::agent {

struct RelayOptions {
  // The managers' guest listeners, in the order to try them: "HOST:PORT" (numeric IPv4) or "unix:PATH". Plain
  // connections: a leader named at a `tls://` address is not followed (the list is tried instead).
  std::vector<std::string> managers;
  std::string token;                              // the agent token
  std::string host;                               // this host's name in the pool
  std::chrono::milliseconds scan_interval{1000};  // how often the VMs are listed again
  std::chrono::milliseconds reconnect_min{200};   // backoff after a link drops, doubling up to reconnect_max
  std::chrono::milliseconds reconnect_max{10000};
  std::chrono::milliseconds handshake_timeout{5000};  // the manager's answer to `relay`
};

// A VM whose port is to be relayed.
struct RelayTarget {
  std::string vm;      // domain name: the guest id the manager pins
  std::string socket;  // host end of its virtio-serial channel (a Unix socket QEMU listens on)
};

// Lists the current targets; called on the relay thread every scan_interval. An error keeps the links as they
// are (they end on their own when a VM goes away).
using RelayTargets = std::function<Result<std::vector<RelayTarget>>()>;
using RelayLog = std::function<void(const std::string&)>;

class Relay {
 public:
  // Starts the relay thread. Errors: "invalid_argument" (no manager address or an empty one, an empty token or
  // host). A bad address is logged when it is tried.
  static Result<std::unique_ptr<Relay>> start(RelayOptions options, RelayTargets targets, RelayLog log);
  // Stops the thread and closes every link (the guests see their host side go away).
  virtual ~Relay() = default;

  // Lists the targets again now (e.g. after a VM lifecycle event). Thread-safe, never blocks.
  virtual void rescan() = 0;
};

}  // namespace accelpool::agent
