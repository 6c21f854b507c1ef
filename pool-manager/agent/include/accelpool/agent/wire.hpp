// The agent protocol's wire layer (docs/agent-protocol.md): newline-delimited JSON-RPC 2.0 messages over a
// stream socket, the same framing as the guest protocol. Shared by the manager's AgentListener and the
// accelpool-agent executable. No threads here: callers own their sockets and poll loops.
#pragma once

#include <accelpool/common/json_lines.hpp>
#include <accelpool/common/result.hpp>
#include <accelpool/host/contract.hpp>

#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace accelpool::agent {

inline constexpr int kAgentProtocolVersion = 1;
inline constexpr std::size_t kMaxLine = 1024 * 1024;  // a register message lists every device of a host
// Images travel over the link in pieces (docs/agent-protocol.md, "Images"): one image.read answers at most this
// many bytes, base64 in one line of about 700 KB, well under kMaxLine; each piece is one line, so other messages
// pass between pieces.
inline constexpr std::size_t kImageChunk = 512 * 1024;
// How many image requests (image.manifest, image.read) of one agent the manager holds at once; it refuses more
// with "unavailable". accelpool-agent keeps one fewer unanswered (kImageRequestsAhead): earlier managers counted a
// request until just after its answer had left, so an agent that sent its next request on that answer could find
// the place still taken.
inline constexpr int kMaxImageRequests = 4;
inline constexpr int kImageRequestsAhead = kMaxImageRequests - 1;

// Line splitting is the common JSON-lines framing (accelpool/common/json_lines.hpp); agent connections split with
// a LineBuffer of kMaxLine. Error codes travel as the table of accelpool/common/errors.hpp says.
using common::LineBuffer;

// Message builders; each returns one line ending in '\n'.
std::string request_line(std::int64_t id, std::string_view method, boost::json::object params);
std::string notification_line(std::string_view method, boost::json::object params);
std::string result_line(const boost::json::value& id, boost::json::value result);
std::string error_line(const boost::json::value& id, const Error& error);

// A parsed message. Exactly one of: a request (method and id), a notification (method, no id), a reply
// (id and result or error).
struct Message {
  boost::json::value id;  // null when absent
  bool has_id = false;
  std::string method;
  boost::json::object params;
  std::optional<boost::json::value> result;
  std::optional<Error> error;
};

// Parses one line. Errors: "parse_error" (not JSON), "invalid_request" (not a JSON-RPC 2.0 message).
Result<Message> parse_message(std::string_view line);

// Strict field access for params objects: wrong types are "invalid_argument" errors naming the field and `where`.
Result<std::string> get_string(const boost::json::object& obj, std::string_view key, std::string_view where,
                               bool required);
Result<bool> get_bool(const boost::json::object& obj, std::string_view key, std::string_view where, bool fallback);
// An integer in [0, max]; absent: 0.
Result<std::uint64_t> get_uint(const boost::json::object& obj, std::string_view key, std::string_view where,
                               std::uint64_t max);
// Refuses fields of `obj` not listed in `allowed` (comma-separated): "invalid_argument" naming the first one.
Status only_fields(const boost::json::object& obj, std::string_view allowed, std::string_view where);

// The prepare contract on the wire (docs/agent-protocol.md, device.prepare).
// device.prepare's params {device, lease, vm, bitstream, sha256, reprogram}: only `device` is required. Errors:
// "invalid_argument" naming the field and `where` (an unknown field, a wrong type, a missing device).
Result<host::PrepareRequest> parse_prepare_request(const boost::json::object& params, std::string_view where);
// device.prepare's result {loaded, attach, guest_pci, endpoint, details: {kind, model, vendor, pci_vendor_id,
// pci_device_id, memory_bytes, host_pci}}.
boost::json::object prepare_result_json(const host::PrepareResult& result);

// Socket helpers. Addresses are "HOST:PORT" (TCP, numeric IPv4) or "unix:PATH".
// Creates a non-blocking listening socket with a backlog of SOMAXCONN, so a storm of hosts connecting at once is
// not turned away (an existing Unix socket file is replaced). Errors: "invalid_argument"
// (bad address), "io_error" (bind/listen failed; names the address and errno text).
Result<int> listen_on(std::string_view address);
// The port a TCP listening socket is bound to (useful with port 0).
std::uint16_t bound_port(int fd);
// Connects (blocking, then switches the socket to non-blocking). Errors: "invalid_argument", "unavailable".
Result<int> connect_to(std::string_view address);
// Writes as much of `out` as the socket takes now and erases it from `out`. Errors: "io_error" (peer gone).
Status write_some(int fd, std::string& out);
// Reads what is available into `in`. Returns false on end of stream or error. A read that the socket did not
// fill ends it, so what arrives later (and an end of stream after data) is found by the next call: for sockets
// watched level-triggered (poll, epoll without EPOLLET).
bool read_some(int fd, LineBuffer& in);

// The manager's side of the prepare contract (with parse_prepare_request and prepare_result_json above: one
// codec for both sides).
// device.prepare's params: device, bitstream and reprogram always; sha256, vm and lease when not empty.
boost::json::object prepare_request_json(const host::PrepareRequest& request);
// Reads a device.prepare result strictly: it must be an object; every field is optional (absent: the default),
// but a field of the wrong type or range, an unknown attach mode or an unknown field is an "invalid_argument"
// error naming the field and `where` (e.g. "device.prepare result: field 'details': field 'memory_bytes' must be
// a non-negative integer").
Result<host::PrepareResult> parse_prepare_result(const boost::json::value& result, std::string_view where);

}  // namespace accelpool::agent
