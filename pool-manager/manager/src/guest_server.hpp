// The guest listeners: TCP and Unix-socket connections speaking the guest protocol (docs/guest-protocol.md).
//
// With `network_thread`, socket work runs on a thread of its own: accepting, reading and splitting lines,
// writing. Every call runs on the owner's io_context, where the core lives: the network thread posts each batch
// of received lines there, and the owner posts what a connection must write back. The owner thread then spends
// its time on the pool's state and the store, not in the kernel's socket code: more calls per second when the
// owner is the bottleneck and cores are free. Without it the sockets live on the owner's io_context and the
// same posts stay on one thread: no thread hand-offs, so lower latency when cores are few.
#pragma once

#include "guest_protocol.hpp"

#include <accelpool/common/result.hpp>
#include <accelpool/common/tls.hpp>
#include <accelpool/manager/core.hpp>

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace accelpool::manager {

class GuestConnection;  // one guest's connection, as the owner thread sees it
// Replies held for a commit, in the order their calls were handled: each for its connection, if still open.
using HeldReplies = std::vector<std::pair<std::weak_ptr<GuestConnection>, std::string>>;

struct GuestServerOptions {
  std::size_t max_connections = 1024;  // further connections are closed at once (see below)
  // Connections that have not sent a complete line (their hello) yet, at most. A new connection over either
  // limit closes the oldest of these to make room; with none of them open it is closed itself.
  std::size_t max_silent = 64;
  std::chrono::milliseconds hello_timeout{2'000};  // a connection must say hello (or relay) within this
  bool network_thread = false;                     // socket I/O on a thread of its own (see above)
};

class GuestServer {
 public:
  // `owner` runs the core; `protocol` is used only on it. Nothing listens until listen_*; no thread runs until
  // start().
  GuestServer(boost::asio::io_context& owner, GuestProtocol& protocol, GuestServerOptions options);
  ~GuestServer();  // stop()
  GuestServer(const GuestServer&) = delete;
  GuestServer& operator=(const GuestServer&) = delete;

  // Routes lease events to the connections of the lease's guest. Register it with the core; owner thread.
  CoreListener& hub();

  // Group commit, which the core must have on (PoolCore::set_group_commit): a reply is held until the change
  // it reports is durable. The server calls `request` (owner thread) after each batch of calls it handled. The
  // owner takes the replies held so far when it takes the core's pending changes (PoolCore::take_commit), and
  // sends them once those are durable, before the notifications of the same commit go out.
  void set_commit_request(std::function<void()> request);
  HeldReplies take_held();
  void send_held(HeldReplies replies);
  // How many batches of received calls wait in the owner's queue (any thread; a snapshot).
  std::size_t calls_waiting() const;

  // Listen on "ADDR:PORT" (port 0: any) / on a Unix socket path (a stale socket file is replaced). Before
  // start(). Return what was bound ("ADDR:PORT", the path) or an error naming the endpoint. With `tls` (a server
  // context) TCP guests must speak TLS: the handshake, then the protocol; it must end by the hello deadline.
  Result<std::string> listen_tcp(const std::string& endpoint, common::tls::Context tls = nullptr);
  Result<std::string> listen_unix(const std::filesystem::path& path);

  // Starts the network thread, if there is one.
  void start();
  // Stops accepting and closes every connection; joins the network thread. Idempotent. Call it after the
  // owner's io_context stopped running, before it is destroyed.
  void stop();

  struct Impl;  // shared with the connections, which may outlive this object on the owner's queue

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
