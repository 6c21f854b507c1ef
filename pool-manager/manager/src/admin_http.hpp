// The admin API's HTTP transport (Boost.Beast, in admin_http.cpp only). Internal to the manager.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/common/tls.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace accelpool::manager {

class AdminApi;
class EventStream;

struct HttpLimits {
  std::size_t max_body_bytes = 1 << 20;
  std::size_t max_header_bytes = 16 * 1024;
  double request_timeout_s = 10;  // the whole request must arrive within this
  // The request line and headers must arrive within this (or request_timeout_s, if shorter); an idle keep-alive
  // connection is closed after it too. Slow clients (slowloris) then hold a connection only this long.
  double header_timeout_s = 5;
  std::size_t max_connections = 4096;
  // Connections from one source address at most; more are closed at accept, so that one client cannot take
  // every connection.
  std::size_t max_connections_per_source = 32;
  // GET /v1/events: the events queued for one watcher beyond the one being written, at most. A watcher that falls
  // further behind loses them and gets a fresh snapshot once it has read what is in flight (drop and resync).
  std::size_t max_stream_backlog_bytes = 4 << 20;
};

class AdminServer {
 public:
  // Listens on `address:port` (port 0: any free port) and serves `api` on `ioc`'s thread. Out of file
  // descriptors, it pauses accepting and says so on stderr (accept_loop). With `events`, GET /v1/events streams
  // it (Server-Sent Events, docs/dashboard.md) to each watcher `api.stream_viewer` admits. With `tls` (a server
  // context, common::tls::server_context) it speaks HTTPS only; without, plain HTTP.
  // Errors: "listen" with the system's message.
  static Result<std::unique_ptr<AdminServer>> start(boost::asio::io_context& ioc, const std::string& address,
                                                    unsigned short port, AdminApi& api, HttpLimits limits,
                                                    EventStream* events = nullptr, common::tls::Context tls = nullptr);
  ~AdminServer();
  unsigned short port() const;
  // Closes the event stream's refresh (EventStream::refresh: call once its work() is done) and sends each watcher
  // its event: a new watcher its snapshot, the others the delta. Nothing while nobody watches.
  void publish();
  // `publish_request` is called when a watcher comes: it should publish() soon (its snapshot waits for that).
  void on_watch(std::function<void()> publish_request);
  // How many watch GET /v1/events now.
  std::size_t watchers() const;
  // Stops accepting; open connections finish their current request and close.
  void stop();

  struct Impl;  // defined in admin_http.cpp

 private:
  explicit AdminServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
