// One agent connection as both threads see it: the listener's I/O thread reads and writes its socket, the owner
// thread queues requests through RemoteHost. Internal to the agent link.
#pragma once

#include <accelpool/manager/agent_listener.hpp>

#include <boost/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
  std::mutex mu;  // guards the four fields below
  std::string host;
  Registration registration = Registration::none;
  std::string out;  // bytes waiting to be sent; only the I/O thread writes to the socket
  bool alive = true;
  manager::Poster post;        // runs a function on the owner thread, after what was posted before it. Any thread.
  manager::Poster post_reply;  // the same for a reply's completion, handed over with the wake-up's others. I/O thread.
  // Gives the I/O thread `line` to send on this connection (an empty line: only look at the connection, for a
  // settled registration), at once or, with `at_turn_end` (owner thread), once the owner thread's current turn
  // ends, so that every request queued in one turn, on any link, shares one wake-up. False when the listener has
  // ended. Any thread.
  std::function<bool(std::string line, bool at_turn_end)> send;
  // Owner thread only: the requests waiting for their replies, and whether the owner thread has learned that the
  // connection ended (then a request fails at once).
  std::int64_t next_id = 1;
  std::map<std::int64_t, ReplyDone> pending;
  bool lost = false;
};

// The error of an operation whose host is gone.
Error host_lost_error(const std::string& host, const std::string& why);

// Sends a request for `done`, or fails it at once (through the Poster) when the connection is gone. Owner thread.
void call(Link& link, std::string_view method, boost::json::object params, ReplyDone done);

// Hands a reply (`result` or `error`) to the owner thread, which settles the pending request it answers; a late
// or unknown reply is ignored there. I/O thread.
void complete(const std::shared_ptr<Link>& link, const boost::json::value& id,
              const std::optional<boost::json::value>& result, const std::optional<Error>& error);

// The connection ended: every pending request fails with `error`, and later ones fail at once. Owner thread.
void end_requests(Link& link, const Error& error);

}  // namespace accelpool::agent
