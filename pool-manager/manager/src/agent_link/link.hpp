// One agent connection as both threads see it: the listener's I/O thread reads and writes its socket, the owner
// thread queues requests through RemoteHost. Internal to the agent link.
#pragma once

#include <accelpool/manager/agent_listener.hpp>

#include <boost/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace accelpool::agent {

// Where a connection's agent.register stands. The I/O thread checks it and sets `pending`; the owner thread
// settles it (host_joined): `admitted`, or back to `none` when the pool refuses the host.
enum class Registration { none, pending, admitted };

// Receives an agent's reply to a request on the owner thread: its error, or ok and its result (null on error).
using ReplyDone = std::function<void(Status status, boost::json::value result)>;

// Shared by a connection (I/O thread) and its RemoteHost (owner thread).
struct Link {
  std::mutex mu;
  std::string host;
  Registration registration = Registration::none;
  std::string out;  // bytes waiting to be sent
  // A thread took bytes from the front of `out` and writes them to the socket outside `mu` (holding
  // `write_mu`); meanwhile nobody else writes, and what it could not send goes back to the front of `out`.
  bool sending = false;
  bool alive = true;
  // The connection's socket. While `alive` it is open: the I/O thread clears `alive` (under `mu`), then waits for
  // `write_mu` before it closes the socket, so a thread that saw `alive` under `mu` and took `write_mu` before
  // letting `mu` go may write to it until it lets `write_mu` go. Lock order: `mu`, then `write_mu`.
  int fd = -1;
  std::mutex write_mu;
  // Whether the owner thread may write to `fd` itself (plain); with TLS only the I/O thread does.
  bool any_thread_writes = true;
  std::int64_t next_id = 1;
  std::map<std::int64_t, ReplyDone> pending;
  manager::Poster post;
  // Tells the I/O thread that this connection has output (or a settled registration) to look at. Any thread.
  std::function<void()> wake;
};

// The error of an operation whose host is gone.
Error host_lost_error(const std::string& host, const std::string& why);

// Sends a request for `done`, or fails it at once (through the Poster) when the connection is gone. When nothing
// waits ahead of it and nobody is sending, the calling thread writes it to the socket itself (one system call, no
// hand-over to the I/O thread, and without holding `mu`: the I/O thread meanwhile reads and settles replies on the
// same link); what the socket does not take, a write error, or what was queued meanwhile is left to the I/O
// thread. Owner thread.
void call(Link& link, std::string_view method, boost::json::object params, ReplyDone done);

// Settles the pending request a reply answers (`result` or `error`), posting its completion. False when the id
// is no pending request (a late or unknown reply: ignored). I/O thread.
bool complete(Link& link, const boost::json::value& id, const std::optional<boost::json::value>& result,
              const std::optional<Error>& error);

}  // namespace accelpool::agent
