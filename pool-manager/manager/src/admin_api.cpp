#include "admin_api.hpp"

#include "dashboard_assets.hpp"
#include "json_codec.hpp"
#include "metrics.hpp"

#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/common/log.hpp>

#include <accelpool/manager/auth.hpp>

#include <charconv>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace accelpool::manager {

namespace json = boost::json;

namespace {

ApiResponse ok(json::value v, int status = 200) { return {status, "application/json", json::serialize(v)}; }
ApiResponse from_error(const Error& e) { return AdminApi::error(e.code, e.message); }

std::string url_decode(std::string_view s, bool* bad) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      unsigned v = 0;
      if (i + 2 >= s.size()) {
        *bad = true;
        return {};
      }
      auto r = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
      if (r.ec != std::errc() || r.ptr != s.data() + i + 3) {
        *bad = true;
        return {};
      }
      out.push_back(static_cast<char>(v));
      i += 2;
    } else if (s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct Target {
  std::vector<std::string> segments;
  std::map<std::string, std::string> query;
};

std::optional<Target> parse_target(const std::string& target) {
  Target t;
  auto q = target.find('?');
  std::string path = target.substr(0, q);
  bool bad = false;
  std::size_t start = 1;
  if (path.empty() || path[0] != '/') return std::nullopt;
  while (start <= path.size()) {
    auto end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) t.segments.push_back(url_decode(std::string_view(path).substr(start, end - start), &bad));
    start = end + 1;
  }
  if (q != std::string::npos) {
    std::string_view qs = std::string_view(target).substr(q + 1);
    while (!qs.empty()) {
      auto amp = qs.find('&');
      auto part = qs.substr(0, amp);
      auto eq = part.find('=');
      std::string key = url_decode(part.substr(0, eq), &bad);
      std::string value = eq == std::string_view::npos ? "" : url_decode(part.substr(eq + 1), &bad);
      if (!key.empty()) t.query[key] = value;
      if (amp == std::string_view::npos) break;
      qs.remove_prefix(amp + 1);
    }
  }
  if (bad) return std::nullopt;
  return t;
}

// Parses a JSON object body ("" counts as {}). Sets `err` on failure.
std::optional<json::object> parse_body(const std::string& body, ApiResponse* err) {
  if (body.empty()) return json::object{};
  json::error_code ec;
  auto v = json::parse(body, ec);
  if (ec) {
    *err = AdminApi::error(Errc::invalid_argument, "the body is not valid JSON: " + ec.message());
    return std::nullopt;
  }
  if (!v.is_object()) {
    *err = AdminApi::error(Errc::invalid_argument, "the body must be a JSON object");
    return std::nullopt;
  }
  return std::move(v.get_object());
}

std::optional<std::uint64_t> parse_id(const std::string& s) {
  std::uint64_t v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// The `limit` query parameter of a paged listing: 1..max.
Result<std::size_t> parse_limit(const std::string& v, std::size_t max) {
  auto n = parse_id(v);
  if (!n || *n < 1 || *n > max) {
    return make_error(Errc::invalid_argument, "query 'limit' must be a whole number from 1 to " + std::to_string(max));
  }
  return static_cast<std::size_t>(*n);
}

Error unknown_query_parameter(const std::string& key) {
  return make_error(Errc::invalid_argument, "unknown query parameter '" + key + "'");
}

// Reads `limit` or `cursor` (a name) into `spec` of a listing by name; any other `key` is an unknown parameter.
Status read_page_param(const std::string& key, const std::string& v, PageSpec& spec) {
  if (key == "limit") {
    auto n = parse_limit(v, PageSpec::kMaxLimit);
    if (!n) return n.error();
    spec.limit = *n;
    return Status::ok();
  }
  if (key == "cursor") {
    if (v.empty())
      return make_error(Errc::invalid_argument, "query 'cursor' is empty (pass the next_cursor of a page)");
    spec.after = v;
    return Status::ok();
  }
  return unknown_query_parameter(key);
}

json::value cursor_json(const std::optional<std::string>& next) {
  return next ? json::value(*next) : json::value(nullptr);
}

// A page of a listing by name: {"<key>": [the items], "next_cursor": the name to go on from, or null}.
template <class Items>
json::object page_json(const char* key, const Items& items, const std::optional<std::string>& next) {
  json::array a;
  a.reserve(items.size());
  for (const auto& item : items) a.emplace_back(to_json(item));
  return json::object{{key, std::move(a)}, {"next_cursor", cursor_json(next)}};
}

ApiResponse method_not_allowed(const std::string& method, const std::string& path) {
  return AdminApi::error(Errc::method_not_allowed, method + " is not allowed on " + path);
}

// The dashboard's pages run only this server's scripts and styles (no inline script, nothing from elsewhere),
// talk only to it, and are never framed.
const char* const kDashboardCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// GET / (the dashboard's page) and GET /assets/NAME: built-in files with their content type, the CSP, and an ETag
// (revalidated on every use: Cache-Control no-cache, 304 when unchanged).
ApiResponse dashboard_file(const ApiRequest& req, const std::string& name, const std::string& path) {
  if (req.method != "GET") return method_not_allowed(req.method, path);
  const DashboardAsset* a = find_dashboard_asset(name);
  if (!a) return AdminApi::error(Errc::not_found, "no dashboard file " + path);
  bool unchanged = req.if_none_match == a->etag;
  ApiResponse r{unchanged ? 304 : 200, std::string(a->content_type), unchanged ? "" : std::string(a->body), {}};
  r.headers = {{"Content-Security-Policy", kDashboardCsp},
               {"X-Frame-Options", "DENY"},
               {"Referrer-Policy", "no-referrer"},
               {"Cache-Control", "no-cache"},
               {"ETag", std::string(a->etag)}};
  return r;
}

// A state-changing call from a page of another origin is refused: with a bearer token a browser never sends on its
// own this is defence in depth (docs/dashboard.md). Calls without an Origin header (tools, agents) pass.
std::optional<ApiResponse> cross_origin_refusal(const ApiRequest& req) {
  if (req.method == "GET" || req.method == "HEAD" || req.origin.empty()) return std::nullopt;
  if (req.origin == "http://" + req.host || req.origin == "https://" + req.host) return std::nullopt;
  return AdminApi::error(Errc::forbidden, "cross-origin " + req.method + " refused: Origin '" + req.origin +
                                              "' is not this server ('" + req.host + "')");
}

// The bearer token of `req`, or nullopt when it has none.
std::optional<std::string> bearer_token(const ApiRequest& req) {
  const std::string prefix = "Bearer ";
  if (req.authorization.rfind(prefix, 0) != 0) return std::nullopt;
  return req.authorization.substr(prefix.size());
}

}  // namespace

ApiResponse AdminApi::error(Errc code, const std::string& message) {
  return ok(json::object{{"error", json::object{{"code", to_string(code)}, {"message", message}}}}, http_status(code));
}

AdminApi::AdminApi(PoolCore& core, Metrics& metrics, std::string openapi, std::function<bool()> ready,
                   std::function<void()> commit)
    : core_(core),
      metrics_(metrics),
      openapi_(std::move(openapi)),
      ready_(std::move(ready)),
      commit_(std::move(commit)) {}

namespace {
// One debug line per admin request: method, path without the query, status. Never a header or a body (tokens).
void log_request(const ApiRequest& req, int status) {
  if (!log::enabled(log::Level::debug)) return;
  log::debug("admin request",
             {{"method", req.method}, {"path", req.target.substr(0, req.target.find('?'))}, {"status", status}});
}
}  // namespace

ApiResponse AdminApi::handle(const ApiRequest& req) {
  ApiResponse r = route(req);
  if (commit_) commit_();
  log_request(req, r.status);
  return r;
}

void AdminApi::handle(ApiRequest request, std::function<void(ApiResponse)> respond) {
  deferrable_ = &request;
  respond_later_ = &respond;
  ApiResponse r = route(request);
  deferrable_ = nullptr;
  respond_later_ = nullptr;
  if (r.status == 0) return;  // an upload or an image read: the worker answers through the poster
  if (commit_) commit_();
  log_request(request, r.status);
  respond(std::move(r));
}

ApiResponse AdminApi::route(const ApiRequest& req) {
  auto parsed = parse_target(req.target);
  if (!parsed) return error(Errc::invalid_argument, "malformed request target");
  const auto& seg = parsed->segments;
  const auto& query = parsed->query;
  const std::string& m = req.method;
  std::string path = req.target.substr(0, req.target.find('?'));

  // Unauthenticated: probes, metrics (unless [metrics] token is set), the API description.
  if (seg.size() == 1 && seg[0] == "healthz") {
    if (m != "GET") return method_not_allowed(m, path);
    return ok(json::object{{"status", "ok"}});
  }
  if (seg.size() == 1 && seg[0] == "readyz") {
    if (m != "GET") return method_not_allowed(m, path);
    bool r = ready_();
    return ok(json::object{{"ready", r}}, r ? 200 : 503);
  }
  if (seg.size() == 1 && seg[0] == "metrics") {
    if (m != "GET") return method_not_allowed(m, path);
    if (!metrics_token_.empty()) {
      auto bearer = bearer_token(req);
      if (!bearer)
        return error(Errc::unauthorized,
                     "missing 'Authorization: Bearer <metrics token>' header ([metrics] token is set)");
      bool allowed = (bearer->size() == metrics_token_.size() && constant_time_equal(*bearer, metrics_token_)) ||
                     core_.check_admin(*bearer);
      if (!allowed) return error(Errc::unauthorized, "wrong metrics token");
    }
    return {200, "text/plain; version=0.0.4", metrics_.scrape()};
  }
  if (seg.size() == 2 && seg[0] == "v1" && seg[1] == "openapi.yaml") {
    if (m != "GET") return method_not_allowed(m, path);
    return {200, "application/yaml", openapi_};
  }
  // The dashboard (docs/dashboard.md): its page and files need no token; what they show comes from /v1 with one.
  if (seg.empty()) return dashboard_file(req, "index.html", path);
  if (seg.size() == 2 && seg[0] == "assets") return dashboard_file(req, seg[1], path);
  if (auto refused = cross_origin_refusal(req)) return *refused;

  if (seg.empty() || seg[0] != "v1") return error(Errc::not_found, "no route " + path);
  // Images by sha256, for host agents (their agent token) as well as admins.
  if (seg.size() >= 3 && seg.size() <= 4 && seg[1] == "images") return image(req, seg);
  if (seg.size() == 2 && seg[1] == "events") {
    return error(Errc::not_found, "GET /v1/events is a stream: this server has none");  // with one, admin_http took it
  }
  // The queue takes a tenant's token as well (its own entries), like the event stream.
  if (seg.size() == 2 && seg[1] == "queue") return queue(req, query);
  // Everything else under /v1 needs the admin token.
  auto bearer = bearer_token(req);
  if (!bearer) return error(Errc::unauthorized, "missing 'Authorization: Bearer <admin token>' header");
  const std::string& token = *bearer;
  if (!core_.check_admin(token)) {
    if (core_.authenticate(token)) return error(Errc::forbidden, "a tenant token cannot use the admin API");
    return error(Errc::unauthorized, "wrong admin token");
  }
  // An upload's body (the image, base64) is parsed where it is written: not here when it can be deferred.
  if (seg.size() == 2 && seg[1] == "bitstreams" && m == "POST" && catalog_) return upload(req);
  ApiResponse bad;
  auto body = parse_body(req.body, &bad);
  if (!body) return bad;
  FieldReader in(*body, m + " " + path);

  const std::string r1 = seg.size() > 1 ? seg[1] : "";
  if (r1 == "hosts") {
    if (seg.size() == 4) {
      const std::string& action = seg[3];
      if (action != "drain" && action != "undrain") return error(Errc::not_found, "no route " + path);
      if (m != "POST") return method_not_allowed(m, path);
      auto deadline = in.number("deadline_s", false, 0, kMaxDrainDeadlineS);
      if (auto e = in.finish()) return from_error(*e);
      if (auto s = core_.set_host_draining(seg[2], action == "drain", deadline); !s) return from_error(s.error());
    } else if (m != "GET") {
      return method_not_allowed(m, path);
    }
    if (seg.size() == 2) {
      HostFilter f;
      PageSpec spec;
      for (const auto& [k, v] : query) {
        if (k == "connected" || k == "draining") {
          if (v != "true" && v != "false")
            return error(Errc::invalid_argument, "query '" + k + "' must be true or false");
          (k == "connected" ? f.connected : f.draining) = v == "true";
        } else if (auto s = read_page_param(k, v, spec); !s) {
          return from_error(s.error());
        }
      }
      auto page = core_.host_page(f, spec);
      return ok(page_json("hosts", page.hosts, page.next));
    }
    if (seg.size() == 3 || seg.size() == 4) {
      auto h = core_.host(seg[2]);
      if (!h) return from_error(h.error());
      json::object o = to_json(*h);
      json::array devs;
      for (const auto& d : core_.host_devices(seg[2])) devs.emplace_back(to_json(d));
      o["devices"] = std::move(devs);
      return ok(std::move(o));
    }
  }
  if (r1 == "devices") {
    if (seg.size() == 2) {
      if (m != "GET") return method_not_allowed(m, path);
      DeviceFilter f;
      PageSpec spec;
      for (const auto& [k, v] : query) {
        if (k == "host")
          f.host = v;
        else if (k == "kind")
          f.kind = v;
        else if (k == "state") {
          if (v != "free" && v != "leased" && v != "draining" && v != "unavailable" && v != "shared" && v != "holding")
            return error(Errc::invalid_argument,
                         "query 'state' must be free, leased, draining, unavailable, shared or holding");
          f.state = v;
        } else if (auto s = read_page_param(k, v, spec); !s) {
          return from_error(s.error());
        }
      }
      auto page = core_.device_page(f, spec);
      return ok(page_json("devices", page.devices, page.next));
    }
    if (seg.size() == 4 || seg.size() == 5) {
      std::string name = seg[2] + "/" + seg[3];
      if (seg.size() == 4) {
        if (m != "GET") return method_not_allowed(m, path);
        auto d = core_.device(name);
        if (!d) return from_error(d.error());
        return ok(to_json(*d));
      }
      const std::string& action = seg[4];
      if (action != "drain" && action != "undrain" && action != "reset")
        return error(Errc::not_found, "no route " + path);
      if (m != "POST") return method_not_allowed(m, path);
      std::optional<double> deadline;
      if (action != "reset") deadline = in.number("deadline_s", false, 0, kMaxDrainDeadlineS);
      if (auto e = in.finish()) return from_error(*e);
      Status s = action == "reset" ? core_.reset_device(name) : core_.set_draining(name, action == "drain", deadline);
      if (!s) return from_error(s.error());
      auto d = core_.device(name);
      if (!d) return from_error(d.error());
      return ok(to_json(*d), action == "reset" ? 202 : 200);
    }
  }
  if (r1 == "leases") {
    if (seg.size() == 2) {
      if (m != "GET") return method_not_allowed(m, path);
      LeaseFilter f;
      LeasePageSpec spec;
      for (const auto& [k, v] : query) {
        if (k == "tenant")
          f.tenant = v;
        else if (k == "guest")
          f.guest = v;
        else if (k == "device")
          f.device = v;
        else if (k == "state") {
          f.state = parse_lease_state(v);
          if (!f.state) return error(Errc::invalid_argument, "query 'state': unknown lease state '" + v + "'");
        } else if (k == "all") {
          if (v != "true" && v != "false") return error(Errc::invalid_argument, "query 'all' must be true or false");
          f.include_ended = v == "true";
        } else if (k == "limit") {
          auto n = parse_limit(v, LeasePageSpec::kMaxLimit);
          if (!n) return from_error(n.error());
          spec.limit = *n;
        } else if (k == "cursor") {
          spec.after = parse_id(v);
          if (!spec.after) return error(Errc::invalid_argument, "query 'cursor' must be a lease id (a next_cursor)");
        } else if (k == "order") {
          if (v != "asc" && v != "desc") return error(Errc::invalid_argument, "query 'order' must be asc or desc");
          spec.newest_first = v == "desc";
        } else {
          return from_error(unknown_query_parameter(k));
        }
      }
      auto page = core_.page(f, spec);
      if (!page) return from_error(page.error());
      return ok(json::object{{"leases", to_json(page->leases)},
                             {"next_cursor", page->next ? json::value(*page->next) : json::value(nullptr)}});
    }
    auto id = parse_id(seg[2]);
    if (!id) return error(Errc::invalid_argument, "lease id '" + seg[2] + "' is not a non-negative integer");
    if (seg.size() == 3) {
      if (m != "GET") return method_not_allowed(m, path);
      auto l = core_.get(Caller::admin(), *id);
      if (!l) return from_error(l.error());
      return ok(to_json(*l));
    }
    if (seg.size() == 4 && seg[3] == "revoke") {
      if (m != "POST") return method_not_allowed(m, path);
      auto reason = in.string("reason", false, 256);
      if (auto e = in.finish()) return from_error(*e);
      auto l = core_.revoke(*id, reason.value_or(""));
      if (!l) return from_error(l.error());
      return ok(to_json(*l));
    }
  }
  if (r1 == "bitstreams") return bitstreams(req, seg);
  if (r1 == "tenants") {
    if (seg.size() == 2) {
      if (m == "GET") {
        json::array a;
        for (const auto& t : core_.tenants()) a.emplace_back(to_json(t));
        return ok(json::object{{"tenants", std::move(a)}});
      }
      if (m != "POST") return method_not_allowed(m, path);
      auto name = in.string("name", true, 64);
      auto weight = in.number("weight", false, 1e-9, 1e6);
      auto max = in.uint("max_devices", false, 1u << 20);
      if (auto e = in.finish()) return from_error(*e);
      auto token = core_.create_tenant(*name, weight.value_or(1.0), static_cast<std::uint32_t>(max.value_or(0)));
      if (!token) return from_error(token.error());
      json::object o{{"name", *name},
                     {"weight", json_number(weight.value_or(1.0))},
                     {"max_devices", max.value_or(0)},
                     {"token", *token}};
      return ok(o, 201);
    }
    if (seg.size() == 3) {
      if (m == "GET") {
        for (const auto& t : core_.tenants()) {
          if (t.name == seg[2]) return ok(to_json(t));
        }
        return error(Errc::not_found, "no tenant " + seg[2]);
      }
      if (m == "DELETE") {
        if (auto e = in.finish()) return from_error(*e);
        if (auto s = core_.delete_tenant(seg[2]); !s) return from_error(s.error());
        return ok(json::object{{"deleted", seg[2]}});
      }
      if (m != "PATCH") return method_not_allowed(m, path);
      auto weight = in.number("weight", false, 1e-9, 1e6);
      auto max = in.uint("max_devices", false, 1u << 20);
      if (auto e = in.finish()) return from_error(*e);
      std::optional<std::uint32_t> max32;
      if (max) max32 = static_cast<std::uint32_t>(*max);
      if (auto s = core_.update_tenant(seg[2], weight, max32); !s) return from_error(s.error());
      for (const auto& t : core_.tenants()) {
        if (t.name == seg[2]) return ok(to_json(t));
      }
    }
    if (seg.size() == 4 && seg[3] == "rotate-token") {
      if (m != "POST") return method_not_allowed(m, path);
      if (auto e = in.finish()) return from_error(*e);
      auto token = core_.rotate_tenant_token(seg[2]);
      if (!token) return from_error(token.error());
      return ok(json::object{{"name", seg[2]}, {"token", *token}});
    }
  }
  if (r1 == "admin-tokens") return admin_tokens(req, seg, in);
  if (r1 == "policy" && seg.size() == 2) {
    if (m == "GET") return ok(json::object{{"policy", core_.policy()}});
    if (m != "PUT") return method_not_allowed(m, path);
    auto policy = in.string("policy", true, 256);
    if (auto e = in.finish()) return from_error(*e);
    if (auto s = core_.set_policy(*policy); !s) return from_error(s.error());
    return ok(json::object{{"policy", core_.policy()}});
  }
  if (r1 == "estimates" && seg.size() == 2) {
    if (m != "GET") return method_not_allowed(m, path);
    if (!query.empty()) return from_error(unknown_query_parameter(query.begin()->first));
    json::array groups;
    for (const auto& g : core_.learned_estimates()) groups.emplace_back(to_json(g));
    return ok(json::object{{"warmup", core_.learning_warmup()}, {"groups", std::move(groups)}});
  }
  if (r1 == "leadership" && seg.size() == 2) {
    if (m != "GET") return method_not_allowed(m, path);
    if (!query.empty()) return from_error(unknown_query_parameter(query.begin()->first));
    if (!leadership_) return ok(json::object{{"shared", false}, {"epoch", 0}, {"standbys", json::array{}}});
    auto view = leadership_();
    if (!view) return from_error(view.error());
    auto manager = [](const ManagerInfo& i) {
      return json::object{
          {"name", i.name}, {"admin_url", i.admin_url}, {"guest_tcp", i.guest_tcp}, {"agents", i.agents}};
    };
    json::array standbys;
    for (const auto& s : view->standbys) standbys.emplace_back(manager(s));
    return ok(json::object{{"shared", true},
                           {"epoch", view->epoch},
                           {"leader", manager(view->leader)},
                           {"since", view->since},
                           {"renewed_at", view->renewed_at},
                           {"standbys", std::move(standbys)}});
  }
  if (r1 == "stats" && seg.size() == 2) {
    if (m != "GET") return method_not_allowed(m, path);
    std::vector<double> windows = {60, 300, 3600};
    for (const auto& [k, v] : query) {
      if (k != "window") return from_error(unknown_query_parameter(k));
      double w = 0;
      auto r = std::from_chars(v.data(), v.data() + v.size(), w);
      if (r.ec != std::errc() || r.ptr != v.data() + v.size() || !(w > 0) || w > 1e8) {
        return error(Errc::invalid_argument, "query 'window' must be a number of seconds in (0, 1e8]");
      }
      windows = {w};
    }
    json::array a;
    for (double w : windows) a.emplace_back(to_json(core_.stats(w)));
    Counters c = core_.counters();
    return ok(json::object{{"windows", std::move(a)},
                           {"counters", json::object{{"grants", c.grants},
                                                     {"reprogrammings", c.reprogrammings},
                                                     {"preemptions", c.preemptions},
                                                     {"expirations", c.expirations}}},
                           {"queue_length", core_.queue_length()}});
  }
  return error(Errc::not_found, "no route " + m + " " + path);
}

namespace {

json::object bitstream_json(const bitstreams::Bitstream& b, const std::vector<DeviceView>& devices,
                            const std::vector<Lease>& live) {
  json::array compatible, kernels, on, leases;
  for (const auto& c : b.manifest.compatible) compatible.emplace_back(c);
  for (const auto& k : b.manifest.kernels) kernels.emplace_back(k);
  for (const auto& d : devices) {
    if (d.record.loaded == b.manifest.name) on.emplace_back(d.record.name);
  }
  for (const auto& l : live) {
    if (l.bitstream == b.manifest.name) leases.emplace_back(l.id);
  }
  json::object o{{"name", b.manifest.name},
                 {"version", b.manifest.version},
                 {"kind", b.manifest.kind},
                 {"format", std::string(bitstreams::to_string(b.manifest.format))},
                 {"file", b.manifest.file},
                 {"sha256", b.manifest.sha256},
                 {"size_bytes", b.size_bytes},
                 {"programming_seconds", b.manifest.programming_seconds},
                 {"compatible", std::move(compatible)},
                 {"kernels", std::move(kernels)},
                 {"description", b.manifest.description},
                 {"registered", true},
                 {"loaded_on", std::move(on)},
                 {"leases", std::move(leases)}};
  if (b.xclbin) o["xclbin"] = json::object{{"uuid", b.xclbin->uuid}, {"platform", b.xclbin->platform}};
  return o;
}

// Writes `bytes` to a new file in `dir` (hidden name, never a manifest). Errors: "io_error".
Result<std::filesystem::path> write_upload(const std::filesystem::path& dir, const std::string& bytes) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  auto path = dir / (".upload-" + std::to_string(rng()));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return make_error(Errc::io_error, "cannot write the uploaded image to " + path.string());
  }
  return path;
}

// An upload registered, or why not.
struct UploadOutcome {
  std::optional<bitstreams::Bitstream> added;
  ApiResponse refusal;
};

// Parses an upload's body ({"manifest": TOML, "content_base64": ...}), writes the image beside the registry and
// registers it (copied and verified: Registry::add). Any thread; touches no core state.
UploadOutcome register_upload(bitstreams::SharedRegistry& registry, const std::string& body) {
  const std::string where = "POST /v1/bitstreams";
  UploadOutcome out;
  auto parsed = parse_body(body, &out.refusal);
  if (!parsed) return out;
  FieldReader in(*parsed, where);
  auto manifest_text = in.string("manifest", true, 64 * 1024);
  auto content = in.string("content_base64", true, std::size_t{1} << 32);
  if (auto e = in.finish()) return {std::nullopt, from_error(*e)};
  auto manifest = bitstreams::parse_manifest(*manifest_text, "(uploaded)");
  if (!manifest) return {std::nullopt, from_error(manifest.error())};
  auto bytes = bitstreams::base64_decode(*content);
  if (!bytes)
    return {std::nullopt,
            AdminApi::error(Errc::invalid_argument, where + ": field 'content_base64': " + bytes.error().message)};
  auto written = write_upload(registry.dir(), *bytes);
  if (!written) return {std::nullopt, from_error(written.error())};
  auto added = registry.add(*manifest, *written);
  std::error_code ec;
  std::filesystem::remove(*written, ec);
  if (!added) return {std::nullopt, from_error(added.error())};
  out.added = std::move(*added);
  return out;
}

}  // namespace

std::variant<Viewer, ApiResponse> AdminApi::stream_viewer(const ApiRequest& req) const {
  auto token = bearer_token(req);
  if (!token) return error(Errc::unauthorized, "missing 'Authorization: Bearer <admin or tenant token>' header");
  if (core_.check_admin(*token)) return Viewer{};
  if (auto tenant = core_.authenticate(*token)) return Viewer{*tenant};
  return error(Errc::unauthorized, "wrong token: it is neither an admin token nor a tenant's token");
}

ApiResponse AdminApi::queue(const ApiRequest& req, const std::map<std::string, std::string>& query) {
  auto admitted = stream_viewer(req);
  if (auto* refused = std::get_if<ApiResponse>(&admitted)) return *refused;
  const Viewer& viewer = std::get<Viewer>(admitted);
  ApiResponse bad;
  if (!parse_body(req.body, &bad)) return bad;
  if (req.method != "GET") return method_not_allowed(req.method, req.target.substr(0, req.target.find('?')));
  // Pages by index into the caller's queue in the policy's order, which is computed anew for each page: between two
  // pages, entries may be granted, leave or move, so a cursor is the index of the next page's first entry then.
  std::size_t limit = PageSpec::kDefaultLimit;
  std::uint64_t skip = 0;
  for (const auto& [k, v] : query) {
    if (k == "limit") {
      auto n = parse_limit(v, PageSpec::kMaxLimit);
      if (!n) return from_error(n.error());
      limit = *n;
    } else if (k == "cursor") {
      auto at = parse_id(v);
      if (!at) return error(Errc::invalid_argument, "query 'cursor' must be a position in the queue (a next_cursor)");
      skip = *at;
    } else {
      return from_error(unknown_query_parameter(k));
    }
  }
  json::array page;
  std::uint64_t total = 0;  // entries in the caller's queue
  auto show = [&](const Lease& l, std::size_t position) {
    page.emplace_back(queue_entry_json(l, position, core_.expected_start(l.id)));
  };
  if (viewer.admin()) {
    total = core_.queue_length();
    const auto first = static_cast<std::size_t>(std::min(skip, total));
    const auto leases = core_.queue(limit, first);
    for (std::size_t i = 0; i < leases.size(); ++i) show(leases[i], first + i + 1);
  } else {
    // A tenant's own entries, wherever they stand in the whole order.
    auto own =
        core_.tenant_queue(viewer.tenant, limit, static_cast<std::size_t>(std::min<std::uint64_t>(skip, SIZE_MAX)));
    for (const auto& [lease, position] : own.entries) show(lease, position);
    total = own.total;
  }
  const std::uint64_t next = skip + page.size();
  return ok(json::object{{"queue", std::move(page)},
                         {"total", total},
                         {"next_cursor", next < total ? json::value(next) : json::value(nullptr)}});
}

ApiResponse AdminApi::upload(const ApiRequest& req) {
  auto answer = [this](const UploadOutcome& outcome) {
    if (!outcome.added) return outcome.refusal;
    core_.bitstream_changed(outcome.added->manifest.name);  // queued leases of that name fit its models now
    return ok(bitstream_json(*outcome.added, core_.devices(), core_.list(LeaseFilter{})), 201);
  };
  if (!deferrable_ || !post_) return answer(register_upload(*catalog_->registry(), req.body));
  catalog_->run_on_worker([answer, catalog = catalog_, post = post_, commit = commit_,
                           body = std::move(deferrable_->body), respond = std::move(*respond_later_)]() mutable {
    auto outcome = register_upload(*catalog->registry(), body);
    body = std::string();  // the image's bytes go now, not when the response is sent
    if (outcome.added) catalog->queue_verification(outcome.added->manifest.name);  // acquires find it verified
    post([answer, commit, respond = std::move(respond), outcome = std::move(outcome)] {
      ApiResponse r = answer(outcome);
      if (commit) commit();
      respond(std::move(r));
    });
  });
  return {0, "", ""};
}

ApiResponse AdminApi::image(const ApiRequest& req, const std::vector<std::string>& seg) {
  std::string path = req.target.substr(0, req.target.find('?'));
  if (seg.size() == 4 && seg[3] != "manifest") return error(Errc::not_found, "no route " + path);
  auto bearer = bearer_token(req);
  if (!bearer) return error(Errc::unauthorized, "missing 'Authorization: Bearer <agent or admin token>' header");
  const std::string& token = *bearer;
  bool agent = !agent_token_.empty() && token.size() == agent_token_.size() && constant_time_equal(token, agent_token_);
  if (!agent && !core_.check_admin(token)) {
    if (core_.authenticate(token)) return error(Errc::forbidden, "a tenant token cannot read images");
    return error(Errc::unauthorized, "wrong agent or admin token");
  }
  if (req.method != "GET") return method_not_allowed(req.method, path);
  if (!catalog_) return error(Errc::not_found, "this manager has no bitstream registry");
  auto b = catalog_->registry()->find_by_sha256(seg[2]);
  if (!b) return from_error(b.error());
  if (seg.size() == 4) return {200, "application/toml", bitstreams::to_toml(b->manifest)};
  // The image itself is read on the catalog's worker and answered through the poster, like an upload.
  auto read = [registry = catalog_->registry(), sha256 = seg[2]]() -> ApiResponse {
    std::uint64_t total = 0;
    auto bytes = registry->read_image(sha256, 0, std::numeric_limits<std::size_t>::max(), total);
    if (!bytes) return from_error(bytes.error());
    return {200, "application/octet-stream", std::move(*bytes)};
  };
  if (!deferrable_ || !post_) return read();
  catalog_->run_on_worker([read, post = post_, respond = std::move(*respond_later_)]() mutable {
    post([respond = std::move(respond), r = std::make_shared<ApiResponse>(read())] { respond(std::move(*r)); });
  });
  return {0, "", ""};
}

ApiResponse AdminApi::admin_tokens(const ApiRequest& req, const std::vector<std::string>& seg, FieldReader& in) {
  const std::string& m = req.method;
  std::string path = req.target.substr(0, req.target.find('?'));
  if (seg.size() == 2) {
    if (m == "GET") {
      if (auto e = in.finish()) return from_error(*e);
      json::array a;
      for (const auto& name : core_.admin_token_names()) a.emplace_back(json::object{{"name", name}});
      return ok(json::object{{"admin_tokens", std::move(a)}});
    }
    if (m != "POST") return method_not_allowed(m, path);
    auto name = in.string("name", true, 64);
    if (auto e = in.finish()) return from_error(*e);
    auto token = core_.issue_admin_token(*name);
    if (!token) return from_error(token.error());
    log::info("admin token created", {{"name", *name}});
    return ok(json::object{{"name", *name}, {"token", *token}}, 201);
  }
  if (seg.size() == 3) {
    if (m != "DELETE") return method_not_allowed(m, path);
    if (auto e = in.finish()) return from_error(*e);
    auto names = core_.admin_token_names();
    if (names.size() == 1 && names.front() == seg[2]) {
      return error(Errc::conflict, "admin token " + seg[2] +
                                       " is the only one: create another first (or use "
                                       "'accelpool-manager token' on the stopped manager's store)");
    }
    if (auto s = core_.revoke_admin_token(seg[2]); !s) return from_error(s.error());
    log::info("admin token revoked", {{"name", seg[2]}});
    return ok(json::object{{"revoked", seg[2]}});
  }
  if (seg.size() == 4 && seg[3] == "rotate") {
    if (m != "POST") return method_not_allowed(m, path);
    if (auto e = in.finish()) return from_error(*e);
    auto token = core_.issue_admin_token(seg[2], true);
    if (!token) return from_error(token.error());
    log::info("admin token rotated", {{"name", seg[2]}});
    return ok(json::object{{"name", seg[2]}, {"token", *token}});
  }
  return error(Errc::not_found, "no route " + m + " " + path);
}

ApiResponse AdminApi::bitstreams(const ApiRequest& req, const std::vector<std::string>& seg) {
  const std::string& m = req.method;
  std::string path = req.target.substr(0, req.target.find('?'));
  auto devices = core_.devices();
  auto live = core_.list(LeaseFilter{});
  if (seg.size() == 2 && m == "GET") {
    json::array a;
    std::set<std::string> registered;
    if (catalog_) {
      for (const auto& b : catalog_->registry()->list()) {
        registered.insert(b.manifest.name);
        a.emplace_back(bitstream_json(b, devices, live));
      }
    }
    // Names devices hold or leases ask for that the registry does not have (static hosts, host agents' own).
    for (const auto& name : core_.bitstreams()) {
      if (registered.count(name)) continue;
      json::array on, leases;
      for (const auto& d : devices) {
        if (d.record.loaded == name) on.emplace_back(d.record.name);
      }
      for (const auto& l : live) {
        if (l.bitstream == name) leases.emplace_back(l.id);
      }
      a.emplace_back(json::object{
          {"name", name}, {"registered", false}, {"loaded_on", std::move(on)}, {"leases", std::move(leases)}});
    }
    json::array rejected;
    if (catalog_) {
      for (const auto& r : catalog_->registry()->rejected()) {
        rejected.emplace_back(json::object{
            {"manifest", r.manifest_path.string()}, {"code", to_string(r.error.code)}, {"message", r.error.message}});
      }
    }
    return ok(json::object{{"bitstreams", std::move(a)}, {"rejected", std::move(rejected)}});
  }
  if (seg.size() == 2 && m == "POST") {
    return error(Errc::not_found, "this manager has no bitstream registry");  // with one, route() took it
  }
  if (seg.size() == 2) return method_not_allowed(m, path);
  if (seg.size() == 3 || seg.size() == 4) {
    if (!catalog_) return error(Errc::not_found, "this manager has no bitstream registry");
    const std::string& name = seg[2];
    std::string version = seg.size() == 4 ? seg[3] : "";
    if (m == "GET") {
      auto b = catalog_->registry()->get(name, version);
      if (!b) return from_error(b.error());
      return ok(bitstream_json(*b, devices, live));
    }
    if (m == "DELETE") {
      if (seg.size() != 4) {
        return error(Errc::method_not_allowed, "DELETE is not allowed on " + path +
                                                   ": it needs a version, "
                                                   "/v1/bitstreams/{name}/{version}");
      }
      auto b = catalog_->registry()->get(name, version);
      if (!b) return from_error(b.error());
      std::string users;
      for (const auto& l : live) {
        if (l.bitstream == name)
          users += (users.empty() ? "" : ", ") + std::to_string(l.id) + " (" + std::string(to_string(l.state)) + ")";
      }
      if (!users.empty()) {
        return error(Errc::conflict,
                     "bitstream " + b->id() + " is in use by leases " + users + "; delete it when they have ended");
      }
      if (auto s = catalog_->registry()->remove(name, version); !s) return from_error(s.error());
      return ok(json::object{{"deleted", b->id()}, {"sha256", b->manifest.sha256}});
    }
    return method_not_allowed(m, path);
  }
  return error(Errc::not_found, "no route " + m + " " + path);
}

}  // namespace accelpool::manager
