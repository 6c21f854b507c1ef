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
  std::string out;  // bytes waiting to be sent; only the I/O thread writes to the socket
  bool alive = true;
  std::int64_t next_id = 1;
  std::map<std::int64_t, ReplyDone> pending;
  manager::Poster post;
  // Tells the I/O thread that this connection has output (or a settled registration) to look at. Any thread.
  std::function<void()> wake;
  // The same for the owner thread's requests: the I/O thread is woken once the owner thread's current turn
  // ends, for every request that turn queued on any link (one wake-up per turn, not per request). Owner thread.
  std::function<void()> wake_after_turn;
};

// The error of an operation whose host is gone.
Error host_lost_error(const std::string& host, const std::string& why);

// Queues a request for `done` for the I/O thread to send, or fails it at once (through the Poster) when the
// connection is gone. Owner thread.
void call(Link& link, std::string_view method, boost::json::object params, ReplyDone done);

// Settles the pending request a reply answers (`result` or `error`), posting its completion. False when the id
// is no pending request (a late or unknown reply: ignored). I/O thread.
bool complete(Link& link, const boost::json::value& id, const std::optional<boost::json::value>& result,
              const std::optional<Error>& error);

}  // namespace accelpool::agent
