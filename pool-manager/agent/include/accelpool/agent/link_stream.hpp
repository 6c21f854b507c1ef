// The byte stream of one agent link connection, on either side: plain, or TLS (OpenSSL) over the same
// non-blocking socket (docs/agent-protocol.md, "TLS"). The connection's loop (epoll in the manager's listener,
// poll in the agent) watches the descriptor as before and calls read_some/write_some; a TLS stream does its
// handshake inside them, as data needs it.
#pragma once

#include <accelpool/agent/wire.hpp>
#include <accelpool/common/tls.hpp>

#include <memory>
#include <string>

namespace accelpool::agent {

class LinkStream {
 public:
  virtual ~LinkStream() = default;

  // Reads what is available into `in` (level-triggered, like agent::read_some). False on end of stream or error
  // (error() says which for TLS).
  virtual bool read_some(LineBuffer& in) = 0;
  // Writes as much of `out` as the socket takes now and erases it from `out`. Errors: "io_error".
  virtual Status write_some(std::string& out) = 0;
  // TLS: the last read or write waits for the socket to take bytes (watch it for writing, then read or write
  // again). Always false for a plain stream.
  virtual bool blocked_on_write() const = 0;
  // Why the stream ended, when TLS said so (e.g. "certificate verify failed"); "" otherwise.
  virtual std::string error() const = 0;
};

// A plain stream over `fd` (which the caller keeps owning and closes).
std::unique_ptr<LinkStream> plain_stream(int fd);
// TLS over the connected non-blocking `fd` (the caller owns and closes it): the accepting side with a server
// context (common::tls::server_context; with a client CA the agent's certificate is required), or the
// connecting side with a client context, checking that the manager's certificate names `host`. Errors:
// "invalid_argument" for a host name OpenSSL cannot check, "internal".
Result<std::unique_ptr<LinkStream>> tls_server_stream(int fd, const common::tls::Context& ctx);
Result<std::unique_ptr<LinkStream>> tls_client_stream(int fd, const common::tls::Context& ctx, const std::string& host);

}  // namespace accelpool::agent
