// The guest protocol's line handling (docs/guest-protocol.md): the input is a byte stream as a guest would send
// it, split by the common JSON-lines framing (LineBuffer, as GuestServer does) into messages that GuestProtocol
// handles against a fresh pool. $TOKEN / $AGENT in the input stand for the tenant's and the agents' tokens.
#include "pool_fixture.hpp"

#include <accelpool/common/json_lines.hpp>

#include <guest_protocol.hpp>

#include <cstddef>
#include <cstdint>

namespace {

struct Notifications final : accelpool::manager::CoreListener {
  void lease_event(const accelpool::manager::Lease& lease, accelpool::manager::LeaseEvent event) override {
    // Every event a guest would be told about is serialised, as the server does for its connections.
    (void)accelpool::manager::GuestProtocol::notification(lease, event);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool;
  Notifications notifications;  // outlives the pool, which holds a pointer to it
  fuzz::Pool pool;
  pool.core->add_listener(&notifications);
  manager::GuestProtocol protocol(*pool.core);
  protocol.set_relay_token(std::string(fuzz::kAgentToken));
  manager::GuestSession session;
  common::LineBuffer lines(manager::kMaxGuestLine);
  lines.append(pool.with_tokens(std::string_view(reinterpret_cast<const char*>(data), size)));
  while (auto line = lines.next_line()) {
    (void)protocol.handle(session, *line);
    pool.drain();
    if (session.close_after_reply) break;
  }
  if (lines.overflow()) (void)manager::GuestProtocol::too_long();
  // Past every lease's TTL: expiries run their course too.
  pool.clock.advance(3600);
  pool.drain();
  return 0;
}
