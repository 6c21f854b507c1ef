// The admin API's HTTP transport (Boost.Beast, in admin_http.cpp only). Internal to the manager.
#pragma once

#include <accelpool/common/result.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace accelpool::manager {

class AdminApi;

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
};

class AdminServer {
 public:
  // Listens on `address:port` (port 0: any free port) and serves `api` on `ioc`'s thread. Out of file
  // descriptors, it pauses accepting and says so on stderr (accept_loop).
  // Errors: "listen" with the system's message.
  static Result<std::unique_ptr<AdminServer>> start(boost::asio::io_context& ioc, const std::string& address,
                                                    unsigned short port, AdminApi& api, HttpLimits limits);
  ~AdminServer();
  unsigned short port() const;
  // Stops accepting; open connections finish their current request and close.
  void stop();

  struct Impl;  // defined in admin_http.cpp

 private:
  explicit AdminServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
