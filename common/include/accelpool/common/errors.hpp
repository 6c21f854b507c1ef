// The error codes of accelpool: one enumeration (Errc) and one table that gives each code its wire name (the word
// clients branch on: `error.code` of the admin API, `error.data.code` of the JSON-RPC protocols), its HTTP status
// (admin API) and its JSON-RPC code (guest protocol, agent protocol, accelpool-guestd). Every place that writes an
// error to a wire or reads one from it goes through this table. Header-only.
//
// Adding a code: one row below, and a line in the error tables of docs/api/openapi.yaml, docs/guest-protocol.md or
// docs/agent-protocol.md where the code can reach that wire. Wire names never change; two codes are merged only when
// they mean the same thing (`io` went into `io_error`, `config` into `invalid_config`), and the merge is documented.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace accelpool {

// X(code, HTTP status, JSON-RPC code). Where several codes share a JSON-RPC code, the first row of that code names
// the word a reply without `data.code` is read as (errc_from_rpc).
// clang-format off
#define ACCELPOOL_ERROR_CODES(X)                                                                               \
  /* anything not covered below: a broken invariant, a word this side does not know (errc_from_name) */     \
  X(internal,            500, -32000)                                                                         \
  /* the request */                                                                                           \
  X(parse_error,         400, -32700) /* a line that is not JSON */                                          \
  X(invalid_request,     400, -32600) /* not a JSON-RPC message (envelope, id, line too long) */             \
  X(method_not_found,    404, -32601) /* no such JSON-RPC method */                                          \
  X(invalid_argument,    400, -32602) /* a bad field, parameter or value; the message names it */            \
  X(unsupported_version, 400, -32602) /* a protocol version this side does not speak */                      \
  X(bad_request,         400, -32600) /* not HTTP/1.1 (admin API) */                                         \
  X(too_large,           413, -32600) /* a body over the limit (431 for headers, admin_http.cpp) */          \
  X(method_not_allowed,  405, -32601) /* an HTTP method a path does not take */                              \
  X(unauthorized,        401, -32001) /* no credential, or a wrong one */                                    \
  X(timeout,             504, -32001) /* no answer in time (the guest server: no hello in time) */           \
  X(forbidden,           403, -32003) /* a valid credential of the wrong kind */                             \
  X(not_found,           404, -32004) /* no such object */                                                   \
  X(invalid_state,       409, -32009) /* the object's state does not allow it */                             \
  X(conflict,            409, -32009) /* it clashes with another object */                                   \
  X(already_exists,      409, -32009) /* a bitstream version registered already */                           \
  X(already_registered,  409, -32010) /* a host name a live agent connection registered already */           \
  X(infeasible,          422, -32022) /* no device of the pool could ever serve the request */               \
  X(quota_exceeded,      422, -32029) /* a tenant's or a guest's limit would be exceeded */                  \
  X(cancelled,           500, -32000) /* the caller cancelled it */                                          \
  /* bitstreams and images */                                                                                 \
  X(invalid_manifest,    400, -32000) /* a bitstream manifest that does not parse or check */                \
  X(missing_file,        422, -32000) /* a bitstream's image file is not there */                            \
  X(checksum_mismatch,   422, -32000) /* an image whose sha256 is not the manifest's */                      \
  X(corrupt_image,       422, -32000) /* an image that is not what its format says (xclbin) */               \
  X(incompatible,        422, -32000) /* a bitstream that does not fit the device (model, slot or full) */   \
  X(unsupported,         500, -32000) /* this build cannot do it (no XRT to read an xclbin) */               \
  /* devices, hosts and the hypervisor */                                                                     \
  X(program_failed,      500, -32000)                                                                         \
  X(run_failed,          500, -32000)                                                                         \
  X(reset_failed,        500, -32000)                                                                         \
  X(backend_failed,      500, -32000) /* a device backend failed to start or answer */                       \
  X(not_programmed,      500, -32000)                                                                         \
  X(quarantined,         500, -32000) /* a device taken out of service by its health checks */               \
  X(attach_failed,       500, -32000)                                                                         \
  X(detach_failed,       500, -32000)                                                                         \
  X(already_attached,    500, -32000)                                                                         \
  X(not_attached,        500, -32000)                                                                         \
  X(vm_not_running,      500, -32000)                                                                         \
  X(hypervisor,          500, -32000) /* libvirt failed */                                                   \
  X(host_lost,           500, -32000) /* the agent connection of a host dropped */                           \
  /* connections (mostly the client side: the shim, accelpoolctl) */                                           \
  X(unreachable,         500, -32000) /* the peer cannot be reached */                                       \
  X(unavailable,         500, -32000) /* the peer or a service is there but cannot serve now */             \
  X(disconnected,        500, -32000) /* the stream dropped during the call; its outcome is unknown */       \
  X(closed,              500, -32000) /* the client was closed */                                            \
  X(ended,               500, -32000) /* the lease ended (expired, revoked) */                               \
  X(protocol,            500, -32000) /* the peer sent something this side does not understand */            \
  /* the server's own resources */                                                                            \
  X(invalid_config,      500, -32000) /* a configuration file or option (merged: `config`) */                \
  X(io_error,            500, -32000) /* a file could not be read or written (merged: `io`) */               \
  X(listen,              500, -32000) /* a listening socket could not be opened */                           \
  X(store,               500, -32000) /* the database failed */                                              \
  X(store_missing,       500, -32000) /* the database lost its pool (no schema) */                           \
  X(corrupt,             500, -32000) /* stored data that does not parse */                                  \
  X(busy,                500, -32000) /* another process holds the data folder or the lock */                \
  X(fenced,              500, -32000) /* this manager lost the lead and may not write the store */           \
  X(not_leader,          503, -32000) /* a standby manager: the reply names the leader (docs/ha.md) */      \
  /* the simulator's sweeps */                                                                                \
  X(slurm,               500, -32000) /* submitting a sweep to Slurm failed */                               \
  X(incomplete,          500, -32000) /* a sweep's results are not all there */
// clang-format on

enum class Errc : std::uint8_t {
#define ACCELPOOL_ERRC_ENUMERATOR(code, http, rpc) code,
  ACCELPOOL_ERROR_CODES(ACCELPOOL_ERRC_ENUMERATOR)
#undef ACCELPOOL_ERRC_ENUMERATOR
};

// One row of the table.
struct ErrcInfo {
  Errc code;
  std::string_view name;  // the wire name
  int http_status;        // admin API
  int rpc_code;           // JSON-RPC error.code
};

inline constexpr ErrcInfo kErrcTable[] = {
#define ACCELPOOL_ERRC_ROW(code, http, rpc) {Errc::code, #code, http, rpc},
    ACCELPOOL_ERROR_CODES(ACCELPOOL_ERRC_ROW)
#undef ACCELPOOL_ERRC_ROW
};

inline constexpr std::size_t kErrcCount = std::size(kErrcTable);

constexpr const ErrcInfo& info(Errc code) { return kErrcTable[static_cast<std::size_t>(code)]; }

// The wire name: "not_found".
constexpr std::string_view to_string(Errc code) { return info(code).name; }

// The code of a wire name; nullopt for a name this side does not know (a newer peer's). Callers that read codes
// from a wire keep such a name in the message and use Errc::internal (error_from_wire in result.hpp).
constexpr std::optional<Errc> errc_from_name(std::string_view name) {
  for (const auto& row : kErrcTable) {
    if (row.name == name) return row.code;
  }
  return std::nullopt;
}

constexpr int http_status(Errc code) { return info(code).http_status; }
constexpr int rpc_code(Errc code) { return info(code).rpc_code; }

// The code a JSON-RPC reply without `data.code` is read as: the first row with that JSON-RPC code, or internal.
constexpr Errc errc_from_rpc(int rpc) {
  for (const auto& row : kErrcTable) {
    if (row.rpc_code == rpc) return row.code;
  }
  return Errc::internal;
}

}  // namespace accelpool
