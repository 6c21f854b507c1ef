#include <accelpool/agent/wire.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace accelpool::agent {

namespace json = boost::json;

namespace {
std::string line_of(const json::object& o) { return json::serialize(o) + "\n"; }
}  // namespace

std::string request_line(std::int64_t id, std::string_view method, json::object params) {
  json::object o;
  o["jsonrpc"] = "2.0";
  o["id"] = id;
  o["method"] = method;
  o["params"] = std::move(params);
  return line_of(o);
}

std::string notification_line(std::string_view method, json::object params) {
  json::object o;
  o["jsonrpc"] = "2.0";
  o["method"] = method;
  o["params"] = std::move(params);
  return line_of(o);
}

std::string result_line(const json::value& id, json::value result) {
  json::object o;
  o["jsonrpc"] = "2.0";
  o["id"] = id;
  o["result"] = std::move(result);
  return line_of(o);
}

std::string error_line(const json::value& id, const Error& error) {
  json::object err;
  err["code"] = rpc_code(error.code);
  err["message"] = error.message;
  err["data"] = json::object{{"code", to_string(error.code)}};
  json::object o;
  o["jsonrpc"] = "2.0";
  o["id"] = id;
  o["error"] = std::move(err);
  return line_of(o);
}

Result<Message> parse_message(std::string_view line) {
  json::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec) return make_error(Errc::parse_error, "message is not JSON: " + ec.message());
  if (!v.is_object()) return make_error(Errc::invalid_request, "message is not a JSON object");
  auto& o = v.get_object();  // params and result are moved out of it, not copied (a registration lists every device)
  Message m;
  for (const auto& kv : o) {
    auto k = kv.key();
    if (k != "jsonrpc" && k != "id" && k != "method" && k != "params" && k != "result" && k != "error")
      return make_error(Errc::invalid_request, "unknown member '" + std::string(k) + "' in message");
  }
  auto* ver = o.if_contains("jsonrpc");
  if (!ver || !ver->is_string() || ver->get_string() != "2.0")
    return make_error(Errc::invalid_request, "member 'jsonrpc' must be \"2.0\"");
  if (auto* id = o.if_contains("id")) {
    if (!id->is_int64() && !id->is_uint64() && !(id->is_string() && id->get_string().size() <= 128) && !id->is_null())
      return make_error(Errc::invalid_request, "member 'id' must be an integer or a string of at most 128 characters");
    m.id = *id;
    m.has_id = !id->is_null();
  }
  if (auto* method = o.if_contains("method")) {
    if (!method->is_string()) return make_error(Errc::invalid_request, "member 'method' must be a string");
    m.method = std::string(method->get_string());
    if (auto* p = o.if_contains("params")) {
      if (!p->is_object()) return make_error(Errc::invalid_request, "member 'params' must be an object");
      m.params = std::move(p->get_object());
    }
    if (o.contains("result") || o.contains("error"))
      return make_error(Errc::invalid_request, "a request may not carry 'result' or 'error'");
    return m;
  }
  if (!o.contains("id")) return make_error(Errc::invalid_request, "message has neither 'method' nor 'id'");
  if (auto* r = o.if_contains("result")) {
    m.result = std::move(*r);
  } else if (auto* e = o.if_contains("error")) {
    if (!e->is_object()) return make_error(Errc::invalid_request, "member 'error' must be an object");
    const auto& eo = e->get_object();
    // data.code names the code; without it, the JSON-RPC code's first word (errors.hpp).
    std::string message;
    if (auto* msg = eo.if_contains("message"); msg && msg->is_string()) message = std::string(msg->get_string());
    std::string name;
    if (auto* d = eo.if_contains("data"); d && d->is_object())
      if (auto* c = d->get_object().if_contains("code"); c && c->is_string()) name = std::string(c->get_string());
    if (name.empty()) {
      const auto* rpc = eo.if_contains("code");
      name = to_string(rpc && rpc->is_int64() ? errc_from_rpc(static_cast<int>(rpc->get_int64())) : Errc::internal);
    }
    m.error = error_from_wire(name, std::move(message));
  } else {
    return make_error(Errc::invalid_request, "reply has neither 'result' nor 'error'");
  }
  return m;
}

Result<std::string> get_string(const json::object& obj, std::string_view key, std::string_view where, bool required) {
  auto* v = obj.if_contains(key);
  if (!v) {
    if (required)
      return make_error(Errc::invalid_argument, std::string(where) + ": field '" + std::string(key) + "' is required");
    return std::string();
  }
  if (!v->is_string())
    return make_error(Errc::invalid_argument,
                      std::string(where) + ": field '" + std::string(key) + "' must be a string");
  if (v->get_string().size() > 4096)
    return make_error(Errc::invalid_argument, std::string(where) + ": field '" + std::string(key) + "' is too long");
  return std::string(v->get_string());
}

Result<bool> get_bool(const json::object& obj, std::string_view key, std::string_view where, bool fallback) {
  auto* v = obj.if_contains(key);
  if (!v) return fallback;
  if (!v->is_bool())
    return make_error(Errc::invalid_argument,
                      std::string(where) + ": field '" + std::string(key) + "' must be a boolean");
  return v->get_bool();
}

Result<std::uint64_t> get_uint(const json::object& obj, std::string_view key, std::string_view where,
                               std::uint64_t max) {
  auto* v = obj.if_contains(key);
  if (!v) return std::uint64_t{0};
  std::uint64_t n = 0;
  if (v->is_uint64()) {
    n = v->get_uint64();
  } else if (v->is_int64() && v->get_int64() >= 0) {
    n = static_cast<std::uint64_t>(v->get_int64());
  } else {
    return make_error(Errc::invalid_argument,
                      std::string(where) + ": field '" + std::string(key) + "' must be a non-negative integer");
  }
  if (n > max)
    return make_error(Errc::invalid_argument,
                      std::string(where) + ": field '" + std::string(key) + "' is above " + std::to_string(max));
  return n;
}

json::object prepare_request_json(const host::PrepareRequest& request) {
  json::object p{{"device", request.device}, {"bitstream", request.bitstream}, {"reprogram", request.reprogram}};
  if (!request.sha256.empty()) p["sha256"] = request.sha256;
  if (!request.vm.empty()) p["vm"] = request.vm;
  if (!request.lease.empty()) p["lease"] = request.lease;
  return p;
}

namespace {

Result<host::DeviceDetails> parse_details(const json::value& value, const std::string& where) {
  if (!value.is_object()) return make_error(Errc::invalid_argument, where + ": must be an object");
  const auto& o = value.get_object();
  if (auto s = only_fields(o, "kind,model,vendor,pci_vendor_id,pci_device_id,memory_bytes,host_pci", where); !s)
    return s.error();
  constexpr auto kMax32 = std::numeric_limits<std::uint32_t>::max();
  auto kind = get_string(o, "kind", where, false);
  auto model = get_string(o, "model", where, false);
  auto vendor = get_string(o, "vendor", where, false);
  auto vendor_id = get_uint(o, "pci_vendor_id", where, kMax32);
  auto device_id = get_uint(o, "pci_device_id", where, kMax32);
  auto memory = get_uint(o, "memory_bytes", where, std::numeric_limits<std::uint64_t>::max());
  auto host_pci = get_string(o, "host_pci", where, false);
  for (const Status& s : {kind.status(), model.status(), vendor.status(), vendor_id.status(), device_id.status(),
                          memory.status(), host_pci.status()})
    if (!s) return s.error();
  return host::DeviceDetails{
      *kind,   *model,   *vendor, static_cast<std::uint32_t>(*vendor_id), static_cast<std::uint32_t>(*device_id),
      *memory, *host_pci};
}

}  // namespace

Result<host::PrepareResult> parse_prepare_result(const json::value& value, std::string_view where) {
  const std::string w(where);
  if (!value.is_object()) return make_error(Errc::invalid_argument, w + ": must be an object");
  const auto& o = value.get_object();
  if (auto s = only_fields(o, "loaded,attach,guest_pci,endpoint,details", w); !s) return s.error();
  auto loaded = get_string(o, "loaded", w, false);
  auto attach = get_string(o, "attach", w, false);
  auto guest_pci = get_string(o, "guest_pci", w, false);
  auto endpoint = get_string(o, "endpoint", w, false);
  for (const Status& s : {loaded.status(), attach.status(), guest_pci.status(), endpoint.status()})
    if (!s) return s.error();
  host::PrepareResult result;
  result.loaded = *loaded;
  if (!attach->empty() && !host::parse_attach_mode(*attach, result.attach))
    return make_error(Errc::invalid_argument, w + ": field 'attach' has unknown mode '" + *attach + "'");
  result.guest_pci = *guest_pci;
  result.endpoint = *endpoint;
  if (auto* details = o.if_contains("details")) {
    auto parsed = parse_details(*details, w + ": field 'details'");
    if (!parsed) return parsed.error();
    result.details = std::move(*parsed);
  }
  return result;
}

Status only_fields(const json::object& obj, std::string_view allowed, std::string_view where) {
  // Whether `k` is a whole item of the list: found with a comma (or an end of the list) on both sides.
  auto listed = [allowed](std::string_view k) {
    for (auto at = allowed.find(k); at != std::string_view::npos; at = allowed.find(k, at + 1)) {
      const auto end = at + k.size();
      if ((at == 0 || allowed[at - 1] == ',') && (end == allowed.size() || allowed[end] == ',')) return true;
    }
    return false;
  };
  for (const auto& kv : obj) {
    std::string_view k = kv.key();
    if (!listed(k))
      return make_error(Errc::invalid_argument, std::string(where) + ": unknown field '" + std::string(k) + "'");
  }
  return Status::ok();
}

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string errno_text() { return std::strerror(errno); }

struct Parsed {
  bool unix_socket = false;
  sockaddr_un un{};
  sockaddr_in in{};
};

Result<Parsed> parse_address(std::string_view address) {
  Parsed p;
  if (address.rfind("unix:", 0) == 0) {
    std::string path(address.substr(5));
    if (path.empty() || path.size() >= sizeof(p.un.sun_path))
      return make_error(Errc::invalid_argument, "address '" + std::string(address) + "': bad Unix socket path");
    p.unix_socket = true;
    p.un.sun_family = AF_UNIX;
    std::memcpy(p.un.sun_path, path.c_str(), path.size() + 1);
    return p;
  }
  auto colon = address.rfind(':');
  if (colon == std::string_view::npos)
    return make_error(Errc::invalid_argument,
                      "address '" + std::string(address) + "': expected HOST:PORT or unix:PATH");
  std::string host(address.substr(0, colon));
  std::string port(address.substr(colon + 1));
  char* end = nullptr;
  long n = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || n < 0 || n > 65535)
    return make_error(Errc::invalid_argument, "address '" + std::string(address) + "': bad port '" + port + "'");
  p.in.sin_family = AF_INET;
  p.in.sin_port = htons(static_cast<std::uint16_t>(n));
  if (host == "localhost") host = "127.0.0.1";
  if (::inet_pton(AF_INET, host.c_str(), &p.in.sin_addr) != 1)
    return make_error(Errc::invalid_argument,
                      "address '" + std::string(address) + "': host must be a numeric IPv4 address");
  return p;
}

}  // namespace

Result<int> listen_on(std::string_view address) {
  auto p = parse_address(address);
  if (!p) return p.error();
  int fd = ::socket(p->unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(Errc::io_error, "socket: " + errno_text());
  int rc;
  if (p->unix_socket) {
    ::unlink(p->un.sun_path);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&p->un), sizeof(p->un));
  } else {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&p->in), sizeof(p->in));
  }
  if (rc != 0 || ::listen(fd, SOMAXCONN) != 0) {
    auto e = make_error(Errc::io_error, "cannot listen on '" + std::string(address) + "': " + errno_text());
    ::close(fd);
    return e;
  }
  set_nonblocking(fd);
  return fd;
}

std::uint16_t bound_port(int fd) {
  sockaddr_in in{};
  socklen_t len = sizeof(in);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&in), &len) != 0 || in.sin_family != AF_INET) return 0;
  return ntohs(in.sin_port);
}

Result<int> connect_to(std::string_view address) {
  auto p = parse_address(address);
  if (!p) return p.error();
  int fd = ::socket(p->unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(Errc::unavailable, "socket: " + errno_text());
  int rc = p->unix_socket ? ::connect(fd, reinterpret_cast<sockaddr*>(&p->un), sizeof(p->un))
                          : ::connect(fd, reinterpret_cast<sockaddr*>(&p->in), sizeof(p->in));
  if (rc != 0) {
    auto e = make_error(Errc::unavailable, "cannot connect to '" + std::string(address) + "': " + errno_text());
    ::close(fd);
    return e;
  }
  if (!p->unix_socket) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  set_nonblocking(fd);
  return fd;
}

Status write_some(int fd, std::string& out) {
  while (!out.empty()) {
    ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::ok();
    if (n < 0 && errno == EINTR) continue;
    return make_error(Errc::io_error, "write: " + errno_text());
  }
  return Status::ok();
}

bool read_some(int fd, LineBuffer& in) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      in.append(std::string_view(buf, static_cast<std::size_t>(n)));
      if (static_cast<std::size_t>(n) < sizeof(buf)) return true;  // drained: no second call to learn EAGAIN
      continue;
    }
    if (n == 0) return false;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == EINTR) continue;
    return false;
  }
}

Result<host::PrepareRequest> parse_prepare_request(const json::object& params, std::string_view where) {
  if (auto s = only_fields(params, "device,bitstream,sha256,reprogram,vm,lease", where); !s) return s.error();
  auto device = get_string(params, "device", where, true);
  auto bitstream = get_string(params, "bitstream", where, false);
  auto sha256 = get_string(params, "sha256", where, false);
  auto reprogram = get_bool(params, "reprogram", where, false);
  auto vm = get_string(params, "vm", where, false);
  auto lease = get_string(params, "lease", where, false);
  for (const Status& s :
       {device.status(), bitstream.status(), sha256.status(), reprogram.status(), vm.status(), lease.status()})
    if (!s) return s.error();
  host::PrepareRequest r;
  r.device = *device;
  r.lease = *lease;
  r.vm = *vm;
  r.bitstream = *bitstream;
  r.sha256 = *sha256;
  r.reprogram = *reprogram;
  return r;
}

json::object prepare_result_json(const host::PrepareResult& result) {
  const auto& d = result.details;
  return json::object{{"loaded", result.loaded},
                      {"attach", std::string(host::to_string(result.attach))},
                      {"guest_pci", result.guest_pci},
                      {"endpoint", result.endpoint},
                      {"details", json::object{{"kind", d.kind},
                                               {"model", d.model},
                                               {"vendor", d.vendor},
                                               {"pci_vendor_id", d.pci_vendor_id},
                                               {"pci_device_id", d.pci_device_id},
                                               {"memory_bytes", d.memory_bytes},
                                               {"host_pci", d.host_pci}}}};
}

}  // namespace accelpool::agent
