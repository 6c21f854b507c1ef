// What a standby manager of a shared store serves while it waits (docs/ha.md, "Clients and failover"): on the
// guest, agent and admin addresses it will serve once it leads, it tells every client where the leader is, so
// clients configured with every manager's address find the leader without waiting for a timeout. Internal to the
// manager.
#pragma once

#include "admin_api.hpp"

#include <accelpool/common/result.hpp>
#include <accelpool/manager/store.hpp>

#include <functional>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace accelpool::manager {

// The addresses a standby answers on, as configured ("" for none). TLS listeners are left out by the caller (a
// client of a TLS listener then finds this manager refusing, and tries its next address).
struct StandbyAddresses {
  std::string guest_tcp;   // "host:port"
  std::string guest_unix;  // socket path
  std::string agents;      // "host:port" or "unix:/path"
  std::string admin;       // "host:port"
  bool guest_tls = false;  // the leader's guest listener speaks TLS (its address is then tls://)
};

class StandbyServer {
 public:
  // Listens on `at` on `ioc` (which the caller runs on its thread) and answers each connection:
  //  - guests and agents (JSON lines): their first request gets the JSON-RPC error `not_leader` (code -32000),
  //    with `data.leader` the leader's address for that listener ("tcp://host:port" for guests, "host:port" for
  //    agents), or no `leader` when nobody leads yet; then the connection is closed.
  //  - the admin API (HTTP/1.1, one request per connection): a GET (but GET /v1/events) is answered by `reads`
  //    (the pool as the store holds it); every other request is 503 with an `error` (code `not_leader`) and
  //    `leader` (the leader's admin URL, null when none).
  // Errors: "listen" naming the address and the system's message.
  static Result<std::unique_ptr<StandbyServer>> start(boost::asio::io_context& ioc, const StandbyAddresses& at,
                                                      std::string self_name,
                                                      std::function<ApiResponse(const ApiRequest&)> reads);
  ~StandbyServer();
  // Who leads now (as the store said): the addresses later answers name.
  void set_leader(const Leadership& view);

  struct Impl;  // standby_server.cpp

 private:
  explicit StandbyServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelpool::manager
