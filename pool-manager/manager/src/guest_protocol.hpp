// The guest protocol (docs/guest-protocol.md): newline-delimited JSON-RPC 2.0 messages, independent of the
// byte stream that carries them. Internal to the manager; runs on the owner thread.
#pragma once

#include <accelpool/manager/core.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace accelpool::manager {

inline constexpr int kGuestProtocolVersion = 1;
inline constexpr std::size_t kMaxGuestLine = 64 * 1024;

// What a connection knows about its peer after hello.
struct GuestSession {
  bool authenticated = false;
  std::string tenant;
  std::string guest;
  std::string guest_host;
  // Set by `relay` (a host agent carrying one VM's virtio-serial port): `guest` and `guest_host` are pinned to
  // that VM, and a hello naming another guest is refused.
  bool relayed = false;
  // Set when the connection must be closed after the reply (a refused relay announcement).
  bool close_after_reply = false;

  // Who this session is to the core: the owner of the leases it acquires (Caller::owns).
  Caller caller() const { return {tenant, guest, guest_host, relayed}; }
};

class GuestProtocol {
 public:
  explicit GuestProtocol(PoolCore& core) : core_(core) {}

  // The host agents' token, which a `relay` announcement must carry. Empty (the default): relays are refused.
  // Call before the first handle().
  void set_relay_token(std::string token) { relay_token_ = std::move(token); }

  // Handles one message (a line without its newline). Returns the reply line, or "" when the message was a
  // notification (no id) that needs none. Never throws; bad input gets a JSON-RPC error reply and changes nothing.
  std::string handle(GuestSession& session, std::string_view line);

  // The notification line for a lease event (lease.granted, lease.revoking, lease.requeued, lease.ended).
  static std::string notification(const Lease& lease, LeaseEvent event);

  // The error reply for a line longer than kMaxGuestLine (the connection is closed after it).
  static std::string too_long();
  // The error sent to a connection that did not authenticate in time (it is closed after it).
  static std::string timeout_error();
  // The error sent to a session whose tenant token was rotated (it is closed after it).
  static std::string token_rotated_error(const std::string& tenant);

 private:
  PoolCore& core_;
  std::string relay_token_;
};

}  // namespace accelpool::manager
