#include "guest_protocol.hpp"

#include "json_codec.hpp"

#include <accelpool/common/json_lines.hpp>
#include <accelpool/common/log.hpp>
#include <accelpool/manager/auth.hpp>

namespace accelpool::manager {

namespace json = boost::json;

namespace {

// The JSON-RPC error of `code`, with its number and word from the table of errors.hpp.
std::string error_reply(const json::value& id, Errc code, const std::string& message) {
  json::object err{{"code", rpc_code(code)}, {"message", message}, {"data", json::object{{"code", to_string(code)}}}};
  return json::serialize(json::object{{"jsonrpc", "2.0"}, {"id", id}, {"error", std::move(err)}});
}

std::string error_reply(const json::value& id, const Error& e) { return error_reply(id, e.code, e.message); }

std::string result_reply(const json::value& id, json::value result) {
  const json::storage_ptr sp = result.storage();
  return json::serialize(json::object({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}}, sp));
}

// Memory for the JSON values of one message. They are built, serialized and dropped together, so a bump
// allocator over a buffer on the stack takes the place of a malloc and a free per value.
class Scratch {
 public:
  json::storage_ptr storage() { return json::storage_ptr(&resource_); }

 private:
  unsigned char buffer_[8192];
  json::monotonic_resource resource_{buffer_, sizeof buffer_};
};

}  // namespace

std::string GuestProtocol::too_long() {
  return error_reply(nullptr, Errc::invalid_request,
                     "message longer than " + std::to_string(kMaxGuestLine) + " bytes; closing the connection");
}

std::string GuestProtocol::timeout_error() {
  return error_reply(nullptr, Errc::timeout, "no hello in time; closing the connection");
}

std::string GuestProtocol::token_rotated_error(const std::string& tenant) {
  return error_reply(nullptr, Errc::unauthorized,
                     "the token of tenant '" + tenant +
                         "' was rotated: this session ends; connect again and say hello with the new token");
}

std::string GuestProtocol::notification(const Lease& lease, LeaseEvent event) {
  const char* method = "lease.ended";
  switch (event) {
    case LeaseEvent::granted:
      method = "lease.granted";
      break;
    case LeaseEvent::revoking:
      method = "lease.revoking";
      break;
    case LeaseEvent::requeued:
      method = "lease.requeued";
      break;
    case LeaseEvent::ended:
      method = "lease.ended";
      break;
  }
  Scratch scratch;
  const auto sp = scratch.storage();
  return json::serialize(json::object(
      {{"jsonrpc", "2.0"}, {"method", method}, {"params", json::object({{"lease", to_json(lease, sp)}}, sp)}}, sp));
}

std::string GuestProtocol::handle(GuestSession& session, std::string_view line) {
  Scratch scratch;
  const auto sp = scratch.storage();
  json::error_code ec;
  json::value msg = json::parse(line, ec, sp);
  if (ec) return error_reply(nullptr, Errc::parse_error, "not valid JSON: " + ec.message());
  if (!msg.is_object()) return error_reply(nullptr, Errc::invalid_request, "a message must be a JSON object");
  const auto& obj = msg.get_object();
  json::value id = nullptr;
  bool has_id = false;
  if (auto it = obj.find("id"); it != obj.end()) {
    const auto& v = it->value();
    if (!(v.is_string() || v.is_int64() || v.is_uint64() || v.is_null()) ||
        (v.is_string() && v.get_string().size() > 128)) {
      return error_reply(nullptr, Errc::invalid_request,
                         "'id' must be an integer or a string of at most 128 characters");
    }
    id = v;
    has_id = true;
  }
  auto reply = [&](std::string r) { return has_id ? r : std::string(); };
  auto jv = obj.find("jsonrpc");
  if (jv == obj.end() || !jv->value().is_string() || jv->value().get_string() != "2.0") {
    return reply(error_reply(id, Errc::invalid_request, "'jsonrpc' must be \"2.0\""));
  }
  auto mit = obj.find("method");
  if (mit == obj.end() || !mit->value().is_string()) {
    return reply(error_reply(id, Errc::invalid_request, "'method' must be a string"));
  }
  for (const auto& kv : obj) {
    if (kv.key() != "jsonrpc" && kv.key() != "id" && kv.key() != "method" && kv.key() != "params") {
      return reply(error_reply(id, Errc::invalid_request, "unknown member '" + std::string(kv.key()) + "'"));
    }
  }
  std::string method(mit->value().get_string());
  static const json::object kEmpty;
  const json::object* params = &kEmpty;
  if (auto pit = obj.find("params"); pit != obj.end()) {
    if (!pit->value().is_object()) return reply(error_reply(id, Errc::invalid_argument, "'params' must be an object"));
    params = &pit->value().get_object();
  }
  FieldReader in(*params, method);

  if (method == "relay") {
    // A host agent announces that this connection carries the virtio-serial port of VM `vm` on host `host`.
    auto token = in.string("token", true);
    auto host = in.string("host", true, 64);
    auto vm = in.guest_id("vm");
    if (auto e = in.finish()) return reply(error_reply(id, *e));
    if (session.authenticated || session.relayed) {
      return reply(error_reply(id, Errc::invalid_state, "relay must be the first call on a connection"));
    }
    if (relay_token_.empty() || !constant_time_equal(*token, relay_token_)) {
      session.close_after_reply = true;
      return reply(error_reply(id, Errc::unauthorized,
                               "relay refused: wrong agent token for host '" + *host + "'; closing the connection"));
    }
    session.relayed = true;
    session.guest = *vm;
    session.guest_host = *host;
    return reply(
        result_reply(id, json::object{{"protocol", kGuestProtocolVersion}, {"guest", *vm}, {"guest_host", *host}}));
  }
  if (method == "hello") {
    auto version = in.uint("protocol", true, 1000);
    auto token = in.string("token", true);
    auto guest = in.guest_id("guest");
    auto host = in.string("guest_host", false, 64);
    if (auto e = in.finish()) return reply(error_reply(id, *e));
    if (*version != static_cast<std::uint64_t>(kGuestProtocolVersion)) {
      return reply(error_reply(id, Errc::unsupported_version,
                               "protocol version " + std::to_string(*version) +
                                   " is not supported; this manager speaks " + std::to_string(kGuestProtocolVersion)));
    }
    if (session.relayed && (*guest != session.guest || (host && *host != session.guest_host))) {
      return reply(error_reply(id, Errc::forbidden,
                               "this connection is the port of VM '" + session.guest + "' on host '" +
                                   session.guest_host + "'; it cannot speak for guest '" + *guest + "'" +
                                   (host ? " on host '" + *host + "'" : std::string())));
    }
    auto tenant = core_.authenticate(*token);
    if (!tenant) {
      log::info("guest hello refused",
                {{"guest", *guest}, {"relayed", session.relayed}, {"error", to_string(tenant.error().code)}});
      return reply(error_reply(id, tenant.error()));
    }
    log::debug("guest hello", {{"tenant", *tenant}, {"guest", *guest}, {"relayed", session.relayed}});
    session.authenticated = true;
    session.tenant = *tenant;
    session.guest = *guest;
    if (!session.relayed) session.guest_host = host.value_or("");
    LeaseFilter f;
    f.owner = session.caller();
    return reply(result_reply(id, json::object{{"protocol", kGuestProtocolVersion},
                                               {"server", "accelpool-manager"},
                                               {"tenant", session.tenant},
                                               {"guest", session.guest},
                                               {"leases", to_json(core_.list(f))}}));
  }
  if (!session.authenticated) {
    return reply(error_reply(id, Errc::unauthorized, "call hello with a tenant token first"));
  }
  if (method == "acquire") {
    AcquireParams p;
    p.tenant = session.tenant;
    p.guest = session.guest;
    p.guest_host = session.guest_host;
    p.relayed = session.relayed;
    auto kind = in.string("kind", true, 64);
    auto bitstream = in.string("bitstream", false, 128);
    auto count = in.uint("count", false, 4096);
    auto estimate = in.number("estimate_s", false, 0, 1e9);
    auto label = in.string("label", false, 64);
    if (auto e = in.finish()) return reply(error_reply(id, *e));
    p.kind = *kind;
    p.bitstream = bitstream.value_or("");
    p.count = static_cast<std::uint32_t>(count.value_or(1));
    p.estimate_s = estimate;
    p.label = label.value_or("");
    auto l = core_.acquire(p);
    if (!l) return reply(error_reply(id, l.error()));
    log::info("lease acquired", {{"lease", l->id},
                                 {"tenant", l->tenant},
                                 {"guest", l->guest},
                                 {"kind", l->kind},
                                 {"bitstream", l->bitstream},
                                 {"count", l->count},
                                 {"state", to_string(l->state)}});
    return reply(result_reply(id, json::object({{"lease", to_json(*l, sp)}}, sp)));
  }
  if (method == "cancel" || method == "release" || method == "get") {
    auto lease = in.uint("lease", true, UINT64_MAX);
    if (auto e = in.finish()) return reply(error_reply(id, *e));
    const Caller caller = session.caller();
    Result<Lease> l = method == "cancel"    ? core_.cancel(caller, *lease)
                      : method == "release" ? core_.release(caller, *lease)
                                            : core_.get(caller, *lease);
    if (!l) return reply(error_reply(id, l.error()));
    return reply(result_reply(id, json::object({{"lease", to_json(*l, sp)}}, sp)));
  }
  if (method == "heartbeat") {
    auto lease = in.uint("lease", false, UINT64_MAX);
    if (auto e = in.finish()) return reply(error_reply(id, *e));
    auto ls = core_.heartbeat(session.caller(), lease);
    if (!ls) return reply(error_reply(id, ls.error()));
    // Every lease renewed in one call shares its expiry. The reply to a heartbeat of every lease counts them
    // instead of listing them, so that its size does not grow with the number of leases.
    json::object result({{"renewed", ls->size()},
                         {"expires_at", ls->empty() ? json::value(nullptr) : json::value(ls->front().expires_at)}},
                        sp);
    if (lease) result["leases"] = to_json(*ls, sp);
    return reply(result_reply(id, std::move(result)));
  }
  if (method == "list") {
    if (auto e = in.finish()) return reply(error_reply(id, *e));
    LeaseFilter f;
    f.owner = session.caller();
    return reply(result_reply(id, json::object{{"leases", to_json(core_.list(f))}}));
  }
  return reply(error_reply(id, Errc::method_not_found, "no method '" + method + "'"));
}

}  // namespace accelpool::manager
