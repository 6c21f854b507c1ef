// The guest listeners: TCP and Unix-socket connections speaking the guest protocol (docs/guest-protocol.md).
//
// Socket work runs on a network thread of its own: accepting, reading and splitting lines, writing. Every call
// runs on the owner's io_context, where the core lives: the network thread posts each batch of received lines
// there, and the owner posts what a connection must write back. So the owner thread spends its time on the
// pool's state and the store, not in the kernel's socket code.
#pragma once

#include "guest_protocol.hpp"

#include <accelpool/common/result.hpp>
#include <accelpool/manager/core.hpp>

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace accelpool::manager {

struct GuestServerOptions {
  std::size_t max_connections = 1024;                  // further connections are closed at once
  std::chrono::milliseconds hello_timeout{10'000};     // a connection must say hello (or relay) within this
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

  // Group commit. A reply is held until the change it reports is durable: the server calls `request` (owner
  // thread) after every call it handled, and the owner calls send_held() inside the commit, before the
  // notifications of the same commit go out.
  void set_commit_request(std::function<void()> request);
  void send_held();

  // Listen on "ADDR:PORT" (port 0: any) / on a Unix socket path (a stale socket file is replaced). Before
  // start(). Return what was bound ("ADDR:PORT", the path) or an error naming the endpoint.
  Result<std::string> listen_tcp(const std::string& endpoint);
  Result<std::string> listen_unix(const std::filesystem::path& path);

  // Starts the network thread.
  void start();
  // Stops accepting and closes every connection; joins the network thread. Idempotent. Call it from the
  // owner thread or after the owner stopped.
  void stop();

  struct Impl;  // shared with the connections, which may outlive this object on the owner's queue

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
