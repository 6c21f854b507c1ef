// accelpoolctl: admin CLI for accelpool-manager over its REST API. See docs/operations.md.
#include "http_client.hpp"

#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/manifest.hpp>

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <map>
#include <string>
#include <vector>

namespace json = boost::json;

namespace {

constexpr const char* kUsage = R"(usage: accelpoolctl [--url URL] [--token TOKEN] [-o table|json] COMMAND [ARGS]

Talks to accelpool-manager's admin API. URL defaults to $ACCELPOOL_URL or http://127.0.0.1:7080; the admin
token comes from --token or $ACCELPOOL_TOKEN.

commands:
  hosts                              hosts and their device counts
  devices [--host H] [--kind K] [--state S]
                                     every device (or those of a host, kind, state: free, leased, draining,
                                     unavailable) with its state, bitstream and lease
  drain TARGET [--deadline SECONDS]  stop granting a device (HOST/LOCAL_ID) or every device of a HOST; with
                                     --deadline, leases still on them then are revoked (with grace)
  undrain TARGET                     resume granting a device or a host
  reset DEVICE                       reset a device no lease holds
  leases [--state S] [--tenant T] [--all] [--newest] [--limit N]
                                     leases (live ones unless --all; ended ones come from the store), oldest
                                     first or --newest first; all of them, page by page, or the first N
  lease ID                           one lease
  revoke ID [--reason TEXT]          revoke a lease (the guest gets its grace period)
  queue                              waiting leases in scheduling order
  bitstreams                         registered bitstreams (and names devices hold or leases ask for)
  bitstreams show NAME [VERSION]     one bitstream (highest version without VERSION)
  bitstreams register MANIFEST.toml [--file IMAGE]
                                     upload an image and its manifest (the image defaults to the manifest's
                                     'file', next to the manifest); the manager verifies and stores them
  bitstreams delete NAME VERSION     remove one; refused while a queued or granted lease uses the name
  tenants                            tenants with weights and quotas
  tenants create NAME [--weight W] [--max-devices N]   prints the new token once
  tenants update NAME [--weight W] [--max-devices N]
  tenants rotate-token NAME          prints the new token once
  policy                             the active policy
  policy set SPEC                    e.g. las+affinity, sjf+pack+guard=3600
  stats [--window SECONDS]           JCT and wait percentiles
  estimates                          run times the scheduler learned, per group (tenant, bitstream, gang
                                     size, label) and per kind
  health                             /healthz and /readyz
)";

struct Options {
  std::string url;
  std::string token;
  bool json_out = false;
};

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "accelpoolctl: %s\n", msg.c_str());
  std::exit(code);
}

json::value call(const Options& o, const std::string& method, const std::string& target, const std::string& body = "") {
  auto r = accelpool::ctl::http_request(o.url, method, target, o.token, body, 10);
  if (!r) {
    if (r.error().code == "unreachable") {
      die(3, "cannot reach the manager at " + o.url + ": " + r.error().message +
                 " (is accelpool-manager running? set --url or ACCELPOOL_URL)");
    }
    die(2, r.error().message);
  }
  json::error_code ec;
  json::value v = json::parse(r->body, ec);
  if (r->status == 401) die(4, "the manager refused the admin token (set --token or ACCELPOOL_TOKEN)");
  if (r->status == 403) die(4, "the manager refused this token: it is a tenant token, not the admin token");
  if (r->status >= 400) {
    std::string msg = !ec && v.is_object() && v.as_object().contains("error")
                          ? std::string(v.at("error").at("message").as_string())
                          : r->body;
    die(1, msg + " (HTTP " + std::to_string(r->status) + ")");
  }
  if (ec) die(1, "the manager sent a reply that is not JSON");
  return v;
}

// The query-string form of `s` (RFC 3986 unreserved characters stay as they are).
std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// Every item of a paged listing (GET path?query, items under `key`), following next_cursor page by page until
// the listing ends or `want` items came.
json::array fetch_pages(const Options& o, const std::string& path, const std::string& key, const std::string& query,
                        std::size_t want = SIZE_MAX) {
  json::array items;
  std::string cursor;
  while (items.size() < want) {
    const std::size_t page = std::min<std::size_t>(want - items.size(), 1000);
    auto v = call(o, "GET", path + "?limit=" + std::to_string(page) + query + cursor);
    for (auto& item : v.at(key).as_array()) items.push_back(item);
    const auto& next = v.at("next_cursor");
    if (next.is_null()) break;
    cursor = "&cursor=" + url_encode(next.is_string() ? std::string(next.as_string()) : json::serialize(next));
  }
  return items;
}

std::string str(const json::value& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.as_string().empty() ? "-" : std::string(v.as_string());
  if (v.is_double()) {
    const double d = v.as_double();
    char buf[64];
    // Whole numbers (windows, counts) in full; fractions to three significant digits.
    std::snprintf(buf, sizeof buf, d == std::floor(d) && std::fabs(d) < 1e12 ? "%.0f" : "%.3g", d);
    return buf;
  }
  return json::serialize(v);
}

std::string ago(const json::value& t) {
  if (!t.is_number()) return "-";
  double s = static_cast<double>(std::time(nullptr)) - t.to_number<double>();
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0fm", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  return buf;
}

void table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> w(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) w[i] = head[i].size();
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (std::size_t i = 0; i < r.size(); ++i) {
      out += r[i];
      if (i + 1 < r.size()) out += std::string(w[i] - r[i].size() + 2, ' ');
    }
    std::cout << out << "\n";
  };
  line(head);
  for (const auto& r : rows) line(r);
}

std::string join(const json::value& arr) {
  std::string out;
  for (const auto& v : arr.as_array()) out += (out.empty() ? "" : ",") + std::string(v.as_string());
  return out.empty() ? "-" : out;
}

void print_leases(const json::array& leases) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& l : leases) {
    rows.push_back({str(l.at("id")), str(l.at("state")), str(l.at("tenant")), str(l.at("guest")), str(l.at("kind")),
                    str(l.at("bitstream")), str(l.at("count")), join(l.at("devices")), ago(l.at("created_at"))});
  }
  table({"ID", "STATE", "TENANT", "GUEST", "KIND", "BITSTREAM", "COUNT", "DEVICES", "AGE"}, rows);
}

std::string device_target(const std::string& dev, const std::string& action) {
  auto slash = dev.find('/');
  if (slash == std::string::npos) die(2, "device '" + dev + "' must be HOST/LOCAL_ID, e.g. local/sim:0");
  return "/v1/devices/" + dev + "/" + action;
}

// A drain target: HOST/LOCAL_ID is a device, a bare HOST every device of that host.
std::string drain_target(const std::string& target, const std::string& action) {
  if (target.find('/') == std::string::npos) return "/v1/hosts/" + target + "/" + action;
  return device_target(target, action);
}

std::string json_string(const std::string& s) { return json::serialize(json::value(s)); }

void print_bitstreams(const json::array& list) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& b : list) {
    const auto& o = b.as_object();
    auto field = [&](const char* k) { return o.contains(k) ? str(o.at(k)) : std::string("-"); };
    std::string sha = field("sha256");
    rows.push_back({field("name"), field("version"), field("kind"), field("format"), sha.size() > 12 ? sha.substr(0, 12) : sha,
                    o.contains("compatible") ? join(o.at("compatible")) : "-", join(o.at("loaded_on")),
                    o.contains("leases") ? std::to_string(o.at("leases").as_array().size()) : "0"});
  }
  table({"BITSTREAM", "VERSION", "KIND", "FORMAT", "SHA256", "COMPATIBLE", "LOADED ON", "LEASES"}, rows);
}

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die(2, std::string("cannot read the ") + what + " " + path.string());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The register request: the manifest's text and the image's bytes. The image is `image`, or the manifest's
// 'file' next to the manifest.
std::string upload_body(const std::string& manifest_path, const std::string& image) {
  std::string text = read_file(manifest_path, "manifest");
  auto m = accelpool::bitstreams::parse_manifest(text, manifest_path);
  if (!m) die(2, m.error().message);
  std::filesystem::path file = image.empty() ? std::filesystem::path(manifest_path).parent_path() / m->file : std::filesystem::path(image);
  std::string bytes = read_file(file, "image");
  json::object body{{"manifest", text}, {"content_base64", accelpool::bitstreams::base64_encode(bytes)}};
  return json::serialize(body);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const char* u = std::getenv("ACCELPOOL_URL")) o.url = u;
  if (const char* t = std::getenv("ACCELPOOL_TOKEN")) o.token = t;
  if (o.url.empty()) o.url = "http://127.0.0.1:7080";
  std::vector<std::string> args;
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) die(2, a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--url") o.url = value();
    else if (a == "--token") o.token = value();
    else if (a == "-o" || a == "--output") {
      std::string v = value();
      if (v != "json" && v != "table") die(2, "-o takes 'table' or 'json'");
      o.json_out = v == "json";
    } else if (a == "--all") flags["all"] = "true";
    else if (a == "--newest") flags["order"] = "desc";
    else if (a == "--state" || a == "--tenant" || a == "--reason" || a == "--weight" || a == "--max-devices" ||
             a == "--window" || a == "--deadline" || a == "--file" || a == "--limit" || a == "--host" || a == "--kind") flags[a.substr(2)] = value();
    else if (a.rfind("--", 0) == 0) die(2, "unknown option " + a + "\n" + kUsage);
    else args.push_back(a);
  }
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = args[0];
  auto need = [&](std::size_t n, const char* what) {
    if (args.size() < n + 1) die(2, cmd + " needs " + what);
  };
  auto out = [&](const json::value& v) -> bool {
    if (o.json_out) std::cout << json::serialize(v) << "\n";
    return o.json_out;
  };
  auto tenant_body = [&](const std::string* name) {
    json::object b;
    if (name) b["name"] = *name;
    try {
      if (flags.count("weight")) b["weight"] = std::stod(flags["weight"]);
      if (flags.count("max-devices")) b["max_devices"] = std::stoull(flags["max-devices"]);
    } catch (const std::exception&) {
      die(2, "--weight takes a number and --max-devices a non-negative integer");
    }
    return json::serialize(b);
  };

  auto query_of = [&](std::initializer_list<const char*> keys) {
    std::string q;
    for (const char* k : keys) {
      if (flags.count(k)) q += "&" + std::string(k) + "=" + url_encode(flags[k]);
    }
    return q;
  };
  if (cmd == "hosts") {
    // The API answers in pages; every page is fetched.
    auto hosts = fetch_pages(o, "/v1/hosts", "hosts", "");
    if (out(json::object{{"hosts", hosts}})) return 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& h : hosts) {
      rows.push_back({str(h.at("name")), str(h.at("device_count")), h.at("connected").as_bool() ? "yes" : "no",
                      h.at("draining").as_bool() ? "yes" : "no"});
    }
    table({"HOST", "DEVICES", "CONNECTED", "DRAINING"}, rows);
  } else if (cmd == "devices") {
    auto devices = fetch_pages(o, "/v1/devices", "devices", query_of({"host", "kind", "state"}));
    if (out(json::object{{"devices", devices}})) return 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& d : devices) {
      rows.push_back({str(d.at("name")), str(d.at("kind")), str(d.at("model")), str(d.at("attach")), str(d.at("state")),
                      str(d.at("loaded")), str(d.at("lease"))});
    }
    table({"DEVICE", "KIND", "MODEL", "ATTACH", "STATE", "LOADED", "LEASE"}, rows);
  } else if (cmd == "drain" || cmd == "undrain") {
    need(1, "a device (HOST/LOCAL_ID) or a host");
    std::string body;
    if (flags.count("deadline")) {
      if (cmd != "drain") die(2, "--deadline applies to drain only");
      char* end = nullptr;
      double s = std::strtod(flags["deadline"].c_str(), &end);
      if (flags["deadline"].empty() || *end != '\0' || !(s >= 0)) die(2, "--deadline takes a number of seconds >= 0");
      body = "{\"deadline_s\":" + json::serialize(json::value(s)) + "}";
    }
    auto v = call(o, "POST", drain_target(args[1], cmd), body);
    if (out(v)) return 0;
    if (v.as_object().contains("devices")) {
      std::cout << "host " << args[1] << ": " << (v.at("draining").as_bool() ? "draining" : "not draining") << ", "
                << v.at("devices").as_array().size() << " devices\n";
    } else {
      std::cout << "device " << args[1] << ": " << str(v.at("state")) << "\n";
    }
  } else if (cmd == "reset") {
    need(1, "a device (HOST/LOCAL_ID)");
    auto v = call(o, "POST", device_target(args[1], cmd));
    if (out(v)) return 0;
    std::cout << "device " << args[1] << ": " << str(v.at("state")) << " (reset started)\n";
  } else if (cmd == "leases") {
    std::string q = query_of({"state", "tenant", "all", "order"});
    std::size_t want = SIZE_MAX;
    if (flags.count("limit")) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(flags["limit"].c_str(), &end, 10);
      if (flags["limit"].empty() || *end != '\0' || n == 0) die(2, "--limit takes a whole number >= 1");
      want = n;
    }
    // The API answers in pages; follow next_cursor until the listing or the limit ends.
    json::array leases = fetch_pages(o, "/v1/leases", "leases", q, want);
    json::value v = json::object{{"leases", leases}};
    if (out(v)) return 0;
    print_leases(leases);
  } else if (cmd == "lease") {
    need(1, "a lease id");
    auto v = call(o, "GET", "/v1/leases/" + args[1]);
    if (out(v)) return 0;
    print_leases(json::array{v});
  } else if (cmd == "revoke") {
    need(1, "a lease id");
    std::string body = flags.count("reason") ? "{\"reason\":" + json_string(flags["reason"]) + "}" : "";
    auto v = call(o, "POST", "/v1/leases/" + args[1] + "/revoke", body);
    if (out(v)) return 0;
    std::cout << "lease " << args[1] << ": " << str(v.at("state")) << "\n";
  } else if (cmd == "queue") {
    auto v = call(o, "GET", "/v1/queue");
    if (out(v)) return 0;
    print_leases(v.at("queue").as_array());
  } else if (cmd == "bitstreams") {
    std::string sub = args.size() > 1 ? args[1] : "list";
    if (sub == "list") {
      auto v = call(o, "GET", "/v1/bitstreams");
      if (out(v)) return 0;
      print_bitstreams(v.at("bitstreams").as_array());
      for (const auto& r : v.at("rejected").as_array()) std::cerr << "left out: " << str(r.at("message")) << "\n";
    } else if (sub == "show") {
      need(2, "a bitstream name");
      auto v = call(o, "GET", "/v1/bitstreams/" + args[2] + (args.size() > 3 ? "/" + args[3] : ""));
      if (out(v)) return 0;
      print_bitstreams(json::array{v});
    } else if (sub == "register") {
      need(2, "a manifest file");
      auto v = call(o, "POST", "/v1/bitstreams", upload_body(args[2], flags.count("file") ? flags["file"] : ""));
      if (out(v)) return 0;
      std::cout << "registered " << str(v.at("name")) << "@" << str(v.at("version")) << " (sha256 " << str(v.at("sha256"))
                << ", " << str(v.at("size_bytes")) << " bytes)\n";
    } else if (sub == "delete") {
      need(3, "a bitstream name and version");
      auto v = call(o, "DELETE", "/v1/bitstreams/" + args[2] + "/" + args[3]);
      if (out(v)) return 0;
      std::cout << "deleted " << str(v.at("deleted")) << "\n";
    } else {
      die(2, "bitstreams takes list, show, register or delete");
    }
  } else if (cmd == "tenants") {
    std::string sub = args.size() > 1 ? args[1] : "list";
    if (sub == "list") {
      auto v = call(o, "GET", "/v1/tenants");
      if (out(v)) return 0;
      std::vector<std::vector<std::string>> rows;
      for (const auto& t : v.at("tenants").as_array()) {
        auto max = t.at("max_devices").to_number<std::uint64_t>();
        rows.push_back({str(t.at("name")), str(t.at("weight")), max == 0 ? "none" : std::to_string(max)});
      }
      table({"TENANT", "WEIGHT", "MAX DEVICES"}, rows);
    } else if (sub == "create" || sub == "update" || sub == "rotate-token") {
      need(2, "a tenant name");
      json::value v = sub == "create"   ? call(o, "POST", "/v1/tenants", tenant_body(&args[2]))
                      : sub == "update" ? call(o, "PATCH", "/v1/tenants/" + args[2], tenant_body(nullptr))
                                        : call(o, "POST", "/v1/tenants/" + args[2] + "/rotate-token");
      if (out(v)) return 0;
      if (v.as_object().contains("token")) {
        std::cout << "tenant " << args[2] << " token (shown once): " << str(v.at("token")) << "\n";
      } else {
        std::cout << "tenant " << args[2] << ": weight " << str(v.at("weight")) << ", max devices "
                  << str(v.at("max_devices")) << "\n";
      }
    } else {
      die(2, "tenants takes list, create, update or rotate-token");
    }
  } else if (cmd == "policy") {
    json::value v;
    if (args.size() >= 3 && args[1] == "set") v = call(o, "PUT", "/v1/policy", "{\"policy\":" + json_string(args[2]) + "}");
    else if (args.size() == 1 || (args.size() == 2 && args[1] == "get")) v = call(o, "GET", "/v1/policy");
    else die(2, "usage: policy [get] | policy set SPEC");
    if (out(v)) return 0;
    std::cout << str(v.at("policy")) << "\n";
  } else if (cmd == "estimates") {
    auto v = call(o, "GET", "/v1/estimates");
    if (out(v)) return 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& g : v.at("groups").as_array()) {
      std::string group = "(whole kind)";
      if (!g.at("whole_kind").as_bool()) {
        group = "tenant " + str(g.at("tenant")) + ", bitstream " + str(g.at("bitstream")) + ", " +
                str(g.at("count")) + " device(s), label " + str(g.at("label"));
      }
      rows.push_back({str(g.at("kind")), group, str(g.at("observations")), g.at("warm").as_bool() ? "yes" : "no",
                      str(g.at("estimate_s")), str(g.at("p50_device_s")), str(g.at("p90_device_s"))});
    }
    table({"KIND", "GROUP", "OBSERVED", "WARM", "ESTIMATE S", "P50 DEVICE-S", "P90 DEVICE-S"}, rows);
  } else if (cmd == "stats") {
    std::string q = flags.count("window") ? "?window=" + flags["window"] : "";
    auto v = call(o, "GET", "/v1/stats" + q);
    if (out(v)) return 0;
    std::vector<std::vector<std::string>> rows;
    auto add = [&](const std::string& window, const std::string& scope, const json::value& g) {
      const auto& j = g.at("jct_s");
      const auto& w = g.at("wait_s");
      rows.push_back({window, scope, str(j.at("count")), str(j.at("avg")), str(j.at("p50")), str(j.at("p95")),
                      str(j.at("p99")), str(w.at("avg")), str(w.at("p99"))});
    };
    for (const auto& win : v.at("windows").as_array()) {
      std::string ws = str(win.at("window_s")) + "s";
      add(ws, "all", win.at("all"));
      for (const auto& kv : win.at("by_tenant").as_object()) add(ws, "tenant " + std::string(kv.key()), kv.value());
      for (const auto& kv : win.at("by_bitstream").as_object()) add(ws, "bitstream " + std::string(kv.key()), kv.value());
    }
    table({"WINDOW", "SCOPE", "JOBS", "JCT AVG", "P50", "P95", "P99", "WAIT AVG", "WAIT P99"}, rows);
    std::cout << "queue length " << str(v.at("queue_length")) << "; " << json::serialize(v.at("counters")) << "\n";
  } else if (cmd == "health") {
    auto h = call(o, "GET", "/healthz");
    auto r = accelpool::ctl::http_request(o.url, "GET", "/readyz", "", "", 10);
    bool ready = r && r->status == 200;
    if (o.json_out) {
      std::cout << json::serialize(json::object{{"healthy", true}, {"ready", ready}}) << "\n";
    } else {
      std::cout << "healthy; " << (ready ? "ready" : "not ready") << "\n";
    }
    return ready ? 0 : 1;
  } else {
    die(2, "unknown command '" + cmd + "'\n" + kUsage);
  }
  return 0;
}
