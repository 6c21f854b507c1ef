// The manager's side of the agent protocol (docs/agent-protocol.md), the agent link: AgentListener accepts host
// agents, authenticates them, watches their heartbeats, and hands each registered host to the manager as a
// RemoteHost, a manager::HostDriver that forwards prepare/release/reset to the agent. The agent executable shares
// only the wire library (accelpool/agent/wire.hpp) with it.
//
// Threads: the listener runs one I/O thread of its own, driven by readiness (epoll): each socket is registered
// once, and a wake-up touches only the connections that are readable, writable with output waiting, or were
// given output by the owner thread; heartbeat deadlines sit in a min-heap, so the work per event does not grow
// with the number of agents. Everything it reports (hosts joined and lost, VM ends, device health, operation
// completions) reaches the owner through the Poster, so callbacks run on the pool's owner thread and never
// inline inside a listener or RemoteHost call.
#pragma once

#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/common/result.hpp>
#include <accelpool/common/tls.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace accelpool::agent {

struct Link;  // one agent connection; internal

// A device as its agent registered it.
struct AgentDevice {
  manager::HostDevice device;
  std::string pci_bdf;
  std::string health = "ok";  // "ok", "degraded", "failed"
  std::string detail;         // why, when not ok (e.g. "quarantined in VM web-1: ...")
  // What the agent knows the device serves (after a reconnect, or from a VM's metadata after an agent restart);
  // empty when free. The manager reconciles these against its leases (its store is the source of truth).
  std::string vm;
  std::string lease;
  std::string attach_state;  // "attached", "quarantined", "recorded" (VM noted, nothing hot-plugged), or ""
};

// A host agent seen through its connection. Created by AgentListener when an agent registers; owned by whoever
// takes it in ListenerEvents::host_joined. Operations on a host whose connection is gone complete at once
// (through the Poster) with error "host_lost"; operations pending when the connection drops fail the same way.
class RemoteHost final : public manager::HostDriver {
 public:
  RemoteHost(std::shared_ptr<Link> link, std::vector<AgentDevice> devices);
  ~RemoteHost() override;

  const std::string& name() const override { return name_; }

  // The devices the agent registered (no round trip: it never blocks).
  Result<std::vector<manager::HostDevice>> devices() override;

  // The devices with PCI address and the health reported at registration.
  const std::vector<AgentDevice>& registered_devices() const { return devices_; }

  // HostDriver::prepare: sends device.prepare with every field of `request` (the agent checks, or fetches, the
  // image by its sha256 when not empty, attaches the device to `request.vm` when not empty, and records the lease
  // id in the VM's metadata for reconciliation). `done` gets the agent's whole result (prepare_codec.hpp).
  // Errors reported to `done`: the agent's error (e.g. "not_found", "incompatible", "program_failed",
  // "attach_failed"), "invalid_argument" (a malformed result; the message names the field), or "host_lost".
  void prepare(const host::PrepareRequest& request, PrepareDone done) override;

  // Detaches the device from its VM (waits for the guest's acknowledgement) and resets it. Error "quarantined"
  // when the guest never acknowledged: the device must not be granted again (its health is "failed").
  void release(const std::string& local_id, Done done) override;

  // Resets a free device. Errors: the agent's ("not_found", "reset_failed"), or "host_lost".
  void reset(const std::string& local_id, Done done) override;

  // False once the agent's connection is gone (the manager then marks the host's devices unavailable).
  bool connected() const;

 private:
  std::shared_ptr<Link> link_;
  std::string name_;
  std::vector<AgentDevice> devices_;
};

struct VmStopped {
  std::string vm_name;
  std::string vm_uuid;
  std::string reason;                // "shutdown", "destroyed", "crashed", "stopped"
  std::vector<std::string> devices;  // local ids of the pool devices that were attached to it
};

// What the listener reports; every callback runs through the Poster. Empty functions are allowed.
struct ListenerEvents {
  // An agent asks to register (its token, protocol and fields are checked). The manager takes the host (e.g.
  // PoolCore::attach_host) and returns ok, or returns why it refuses it (e.g. "conflict": the name belongs to
  // another host of the pool; "invalid_argument": a bad device id). The agent's reply waits for this: it is a
  // success only when the host was taken, else this error (the connection stays open, unregistered, and
  // nothing of the host is kept; host_lost is never reported for it). Empty: every host is taken.
  std::function<Status(std::unique_ptr<RemoteHost> host)> host_joined;
  // A registered agent's connection ended: closed, broken, or no heartbeat within the timeout. Its pending
  // operations have already failed with "host_lost". Only for hosts host_joined took.
  std::function<void(const std::string& host, const Error& why)> host_lost;
  // A VM on the host ended: the manager ends that VM's leases.
  std::function<void(const std::string& host, const VmStopped& vm)> vm_stopped;
  // A device's health changed (from a heartbeat or a device.health notification).
  std::function<void(const std::string& host, const std::string& device, const std::string& health,
                     const std::string& detail)>
      device_health;
};

struct ListenerOptions {
  // Addresses to listen on: "127.0.0.1:7071" (TCP; port 0 picks one, see tcp_port()) and/or "unix:/path".
  std::vector<std::string> listen;
  // The token every agent presents in agent.register. Must not be empty.
  std::string token;
  // A registered agent that sends nothing for this long is lost.
  std::chrono::milliseconds heartbeat_timeout{15000};
  // Agent connections (registered or not) at most; more are closed at accept. Out of file descriptors, the
  // listener pauses accepting and says so on stderr (common::AcceptBackoff).
  std::size_t max_connections = 256;
  // The images registered agents may fetch by sha256 (image.manifest, image.read; docs/agent-protocol.md,
  // "Images"), read on a worker thread of the listener's own. Null: none (every such request is "not_found").
  std::shared_ptr<bitstreams::SharedRegistry> images;
  // TLS on TCP connections (Unix sockets stay plain): a server context (common::tls::server_context); with a
  // client CA in it, an agent without a certificate that CA signed is refused at the handshake (mutual TLS).
  // nullptr: plain.
  common::tls::Context tls;
};

class AgentListener {
 public:
  // Binds every address and starts the I/O thread. Errors: "invalid_argument" (no address, empty token, bad
  // address, non-positive timeout), "io_error" (an address cannot be bound). Nothing is left listening on error.
  // `after_turn`, when given, runs a function on the owner thread after the work already queued there (the
  // daemon: asio::post on its io_context): the requests the owner thread sends in one turn then wake the I/O
  // thread once, when the turn ends, rather than once each. Without it each batch wakes the I/O thread at once.
  // Either way only an I/O thread that sleeps is woken: while the owner thread's batches come within 50 µs of each
  // other, the I/O thread stays awake between them (polling, yielding its core to other threads).
  static Result<std::unique_ptr<AgentListener>> create(ListenerOptions options, ListenerEvents events,
                                                       manager::Poster post, manager::Poster after_turn = {});

  // Stops the I/O thread and closes every connection; pending operations fail with "host_lost" (posted).
  ~AgentListener();
  AgentListener(const AgentListener&) = delete;
  AgentListener& operator=(const AgentListener&) = delete;

  // The port of the first TCP address (0 when there is none).
  std::uint16_t tcp_port() const { return tcp_port_; }

  // Names of the hosts whose agents are registered (taken by host_joined) and live now. Any thread.
  std::vector<std::string> hosts() const;

  struct Impl;

 private:
  AgentListener() = default;
  std::unique_ptr<Impl> impl_;
  std::uint16_t tcp_port_ = 0;
};

}  // namespace accelpool::agent
