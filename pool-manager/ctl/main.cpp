// accelpoolctl: admin CLI for accelpool-manager over its REST API. See docs/operations.md.
#include "http_client.hpp"

#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/manifest.hpp>
#include <accelpool/common/cli.hpp>
#include <accelpool/common/number_text.hpp>

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace json = boost::json;

namespace {

constexpr const char* kDescription = R"(accelpoolctl: the admin command line of accelpool-manager, over its REST API.

The manager's URL comes from --url, else $ACCELPOOL_URL, else http://127.0.0.1:7080; the admin token from --token,
else $ACCELPOOL_TOKEN. An https:// URL is verified against --cacert (or $ACCELPOOL_CACERT). Tables by default, -o json for the API's JSON. `accelpoolctl COMMAND --help` describes a
command. Exit status: 0 done, 1 the manager refused (its message is printed), 2 bad arguments, 3 the manager
cannot be reached, 4 the token was refused.)";

struct Options {
  std::string url;
  std::string cacert;  // HTTPS: the CA file that verifies the manager's certificate
  std::string token;
  bool json_out = false;
};

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "accelpoolctl: %s\n", msg.c_str());
  std::exit(code);
}

// The leader's URL that a standby's answer (503 with `leader`, docs/ha.md) names; "" for any other answer.
std::string standby_names_leader(const accelpool::ctl::HttpReply& r) {
  if (r.status != 503) return "";
  json::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (ec || !v.is_object()) return "";
  const auto* leader = v.as_object().if_contains("leader");
  return leader && leader->is_string() ? std::string(leader->as_string()) : "";
}

// Sends the request to the manager of `o.url`, a URL or a comma-separated list of them (the managers of a shared
// store): each in turn until one answers; a standby's answer naming the leader is followed there (once).
accelpool::Result<accelpool::ctl::HttpReply> send(const Options& o, const std::string& method,
                                                  const std::string& target, const std::string& token,
                                                  const std::string& body) {
  std::vector<std::string> urls;
  for (std::size_t at = 0;;) {
    auto comma = o.url.find(',', at);
    urls.push_back(o.url.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  accelpool::Result<accelpool::ctl::HttpReply> r =
      accelpool::make_error(accelpool::Errc::unreachable, "no manager URL");
  std::string reasons;
  for (const auto& url : urls) {
    r = accelpool::ctl::http_request(url, o.cacert, method, target, token, body, 10);
    if (r) {
      auto leader = standby_names_leader(*r);
      if (leader.empty() || leader == url) return r;
      std::fprintf(stderr, "accelpoolctl: %s is a standby; asking the leader at %s\n", url.c_str(), leader.c_str());
      return accelpool::ctl::http_request(leader, o.cacert, method, target, token, body, 10);
    }
    if (r.error().code != accelpool::Errc::unreachable) return r;
    reasons += (reasons.empty() ? "" : "; ") + url + ": " + r.error().message;
  }
  if (urls.size() > 1) r = accelpool::make_error(accelpool::Errc::unreachable, reasons);
  return r;
}

json::value call(const Options& o, const std::string& method, const std::string& target, const std::string& body = "") {
  auto r = send(o, method, target, o.token, body);
  if (!r) {
    if (r.error().code == accelpool::Errc::unreachable) {
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

// The --limit flag: how many items of a paged listing to fetch (all when absent).
std::size_t limit_flag(std::map<std::string, std::string>& flags) {
  if (!flags.count("limit")) return SIZE_MAX;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(flags["limit"].c_str(), &end, 10);
  if (flags["limit"].empty() || *end != '\0' || n == 0) die(2, "--limit takes a whole number >= 1");
  return n;
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

// How long ago `t` (seconds since the epoch) was; a time a little ahead of this machine's clock reads as 0s.
std::string ago(const json::value& t) {
  if (!t.is_number()) return "-";
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double s = std::max(0.0, now - t.to_number<double>());
  char buf[32];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.0fm", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
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
    rows.push_back({field("name"), field("version"), field("kind"), field("format"),
                    sha.size() > 12 ? sha.substr(0, 12) : sha,
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
  std::filesystem::path file =
      image.empty() ? std::filesystem::path(manifest_path).parent_path() / m->file : std::filesystem::path(image);
  std::string bytes = read_file(file, "image");
  json::object body{{"manifest", text}, {"content_base64", accelpool::bitstreams::base64_encode(bytes)}};
  return json::serialize(body);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{kDescription};
  accelpool::common::init_cli(app, "accelpoolctl");
  app.require_subcommand(1);
  app.add_option("--url", o.url,
                 "the manager's admin API (the managers of a shared store: their URLs, comma-separated)")
      ->envname("ACCELPOOL_URL")
      ->default_str("http://127.0.0.1:7080");
  app.add_option("--token", o.token, "an admin token")->envname("ACCELPOOL_TOKEN");
  app.add_option("--cacert", o.cacert,
                 "https:// URLs: the PEM CA file that signed the manager's certificate (default: the system's CAs)")
      ->envname("ACCELPOOL_CACERT");
  std::string output = "table";
  app.add_option("-o,--output", output, "table or json")->check(CLI::IsMember({"table", "json"}));

  // Each command's arguments and options; the commands below read them.
  std::vector<std::string> args;  // positional arguments of the command and its sub-command
  std::map<std::string, std::string> flags;
  auto command = [&](CLI::App* parent, const std::string& name, const std::string& help) {
    auto* c = parent->add_subcommand(name, help);
    c->fallthrough();  // --url, --token, --cacert and -o may follow the command
    return c;
  };
  auto positional = [&](CLI::App* c, const std::string& name, const std::string& help) {
    return c
        ->add_option_function<std::string>(
            name, [&args](const std::string& v) { args.push_back(v); }, help)
        ->required();
  };
  auto flag_option = [&](CLI::App* c, const std::string& name, const std::string& help) {
    const std::string key = name.substr(2);
    return c->add_option_function<std::string>(
        name, [&flags, key](const std::string& v) { flags[key] = v; }, help);
  };
  auto flag_switch = [&](CLI::App* c, const std::string& name, const std::string& key, const std::string& value,
                         const std::string& help) {
    return c->add_flag_callback(
        name, [&flags, key, value] { flags[key] = value; }, help);
  };

  auto* hosts = command(&app, "hosts", "hosts and their device counts");
  auto* devices = command(&app, "devices", "devices with their state, bitstream and lease");
  flag_option(devices, "--host", "only this host's");
  flag_option(devices, "--kind", "only this kind");
  flag_option(devices, "--state", "only those free, leased, draining or unavailable");
  auto* drain = command(&app, "drain", "stop granting a device (HOST/LOCAL_ID) or every device of a HOST");
  positional(drain, "target", "HOST/LOCAL_ID or HOST");
  flag_option(drain, "--deadline", "seconds: leases still on the devices then are revoked (with grace)");
  auto* undrain = command(&app, "undrain", "resume granting a device or a host");
  positional(undrain, "target", "HOST/LOCAL_ID or HOST");
  auto* reset = command(&app, "reset", "reset a device no lease holds");
  positional(reset, "device", "HOST/LOCAL_ID");
  auto* leases = command(&app, "leases", "leases: live ones unless --all (ended ones come from the store)");
  flag_option(leases, "--state", "only leases in this state");
  flag_option(leases, "--tenant", "only this tenant's");
  flag_switch(leases, "--all", "all", "true", "ended leases too");
  flag_switch(leases, "--newest", "order", "desc", "newest first (default: oldest first)");
  flag_option(leases, "--limit", "the first N only (default: all, page by page)");
  auto* lease = command(&app, "lease", "one lease");
  positional(lease, "id", "the lease id");
  auto* revoke = command(&app, "revoke", "revoke a lease (the guest gets its grace period)");
  positional(revoke, "id", "the lease id");
  flag_option(revoke, "--reason", "told to the guest");
  auto* queue = command(&app, "queue", "waiting leases in scheduling order");
  flag_option(queue, "--limit", "the first N only (default: all, page by page)");

  auto* bitstreams = command(&app, "bitstreams", "the bitstream registry (default: list)");
  auto* bs_list = command(bitstreams, "list", "registered bitstreams, and names devices hold or leases ask for");
  auto* bs_show = command(bitstreams, "show", "one bitstream (its highest version without VERSION)");
  positional(bs_show, "name", "the bitstream's name");
  bs_show->add_option_function<std::string>(
      "version", [&args](const std::string& v) { args.push_back(v); }, "a version");
  auto* bs_register =
      command(bitstreams, "register", "upload an image and its manifest; the manager verifies and stores them");
  positional(bs_register, "manifest", "the manifest TOML file");
  flag_option(bs_register, "--file", "the image (default: the manifest's 'file', next to the manifest)");
  auto* bs_delete = command(bitstreams, "delete", "remove one version; refused while a live lease asks for the name");
  positional(bs_delete, "name", "the bitstream's name");
  positional(bs_delete, "version", "its version");

  auto* tenants = command(&app, "tenants", "tenants (default: list)");
  auto* t_list = command(tenants, "list", "tenants with weights and quotas");
  auto* t_show = command(tenants, "show", "one tenant");
  positional(t_show, "name", "the tenant");
  auto* t_create = command(tenants, "create", "a new tenant; prints its guest token once");
  auto* t_update = command(tenants, "update", "change a tenant's weight or quota");
  for (auto* c : {t_create, t_update}) {
    positional(c, "name", "the tenant");
    flag_option(c, "--weight", "its share against the other tenants (default 1)");
    flag_option(c, "--max-devices", "the most devices it may hold or wait for (0: no quota)");
  }
  auto* t_rotate = command(tenants, "rotate-token", "a new guest token (printed once); the old one stops working");
  positional(t_rotate, "name", "the tenant");
  auto* t_delete = command(tenants, "delete", "delete a tenant without live leases, and its token");
  positional(t_delete, "name", "the tenant");

  auto* admins = command(&app, "admin-tokens", "named admin tokens, one per operator (default: list)");
  auto* a_list = command(admins, "list", "the admin tokens' names");
  auto* a_create = command(admins, "create", "a new admin token NAME (printed once)");
  positional(a_create, "name", "e.g. the operator's name");
  auto* a_rotate = command(admins, "rotate", "a new token for NAME (printed once); the old one stops working");
  positional(a_rotate, "name", "the admin token's name");
  auto* a_revoke = command(admins, "revoke", "admin token NAME stops working (never the last one)");
  positional(a_revoke, "name", "the admin token's name");

  auto* policy = command(&app, "policy", "the active policy (default: get)");
  auto* p_get = command(policy, "get", "the active policy");
  auto* p_set = command(policy, "set", "switch policy, e.g. las+affinity, sjf+pack+guard=3600");
  positional(p_set, "spec", "the policy");
  auto* stats = command(&app, "stats", "JCT and wait percentiles, overall, per tenant and per bitstream");
  flag_option(stats, "--window", "one window in seconds (default: 60, 300 and 3600)");
  auto* estimates =
      command(&app, "estimates",
              "run times the scheduler learned, per group (tenant, bitstream, gang size, label) and per kind");
  auto* health = command(&app, "health", "/healthz and /readyz; exit status 1 when not ready");
  auto* status = command(&app, "status", "which manager leads, since when, and the standbys (docs/ha.md)");

  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  if (o.url.empty()) o.url = "http://127.0.0.1:7080";
  o.json_out = output == "json";

  auto out = [&](const json::value& v) -> bool {
    if (o.json_out) std::cout << json::serialize(v) << "\n";
    return o.json_out;
  };
  // A tenant's fields as JSON, numbers as typed ("2", not Boost.JSON's "2E0").
  auto tenant_body = [&](const std::string* name) {
    std::string body;
    auto add = [&body](const std::string& key, const std::string& value) {
      body += (body.empty() ? "{" : ",") + json_string(key) + ":" + value;
    };
    if (name) add("name", json_string(*name));
    if (flags.count("weight")) {
      char* end = nullptr;
      const double w = std::strtod(flags["weight"].c_str(), &end);
      if (flags["weight"].empty() || *end != '\0' || !std::isfinite(w)) die(2, "--weight takes a number");
      add("weight", accelpool::common::number_text(w));
    }
    if (flags.count("max-devices")) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(flags["max-devices"].c_str(), &end, 10);
      if (flags["max-devices"].empty() || *end != '\0' || flags["max-devices"][0] == '-') {
        die(2, "--max-devices takes a non-negative integer");
      }
      add("max_devices", std::to_string(n));
    }
    return body.empty() ? std::string("{}") : body + "}";
  };
  auto query_of = [&](std::initializer_list<const char*> keys) {
    std::string q;
    for (const char* k : keys) {
      if (flags.count(k)) q += "&" + std::string(k) + "=" + url_encode(flags[k]);
    }
    return q;
  };
  auto print_token = [&](const json::value& v, const std::string& what) {
    if (out(v)) return;
    std::cout << what << " token (shown once): " << str(v.at("token")) << "\n";
  };

  if (hosts->parsed()) {
    // The API answers in pages; every page is fetched.
    auto list = fetch_pages(o, "/v1/hosts", "hosts", "");
    if (out(json::object{{"hosts", list}})) return 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& h : list) {
      rows.push_back({str(h.at("name")), str(h.at("device_count")), h.at("connected").as_bool() ? "yes" : "no",
                      h.at("draining").as_bool() ? "yes" : "no"});
    }
    table({"HOST", "DEVICES", "CONNECTED", "DRAINING"}, rows);
  } else if (devices->parsed()) {
    auto list = fetch_pages(o, "/v1/devices", "devices", query_of({"host", "kind", "state"}));
    if (out(json::object{{"devices", list}})) return 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& d : list) {
      rows.push_back({str(d.at("name")), str(d.at("kind")), str(d.at("model")), str(d.at("attach")), str(d.at("state")),
                      str(d.at("loaded")), str(d.at("lease"))});
    }
    table({"DEVICE", "KIND", "MODEL", "ATTACH", "STATE", "LOADED", "LEASE"}, rows);
  } else if (drain->parsed() || undrain->parsed()) {
    const std::string cmd = drain->parsed() ? "drain" : "undrain";
    std::string body;
    if (flags.count("deadline")) {
      char* end = nullptr;
      double s = std::strtod(flags["deadline"].c_str(), &end);
      if (flags["deadline"].empty() || *end != '\0' || !(s >= 0) || !std::isfinite(s)) {
        die(2, "--deadline takes a number of seconds >= 0");
      }
      body = "{\"deadline_s\":" + accelpool::common::number_text(s) + "}";
    }
    auto v = call(o, "POST", drain_target(args[0], cmd), body);
    if (out(v)) return 0;
    if (v.as_object().contains("devices")) {
      std::cout << "host " << args[0] << ": " << (v.at("draining").as_bool() ? "draining" : "not draining") << ", "
                << v.at("devices").as_array().size() << " devices\n";
    } else {
      std::cout << "device " << args[0] << ": " << str(v.at("state")) << "\n";
    }
  } else if (reset->parsed()) {
    auto v = call(o, "POST", device_target(args[0], "reset"));
    if (out(v)) return 0;
    std::cout << "device " << args[0] << ": " << str(v.at("state")) << " (reset started)\n";
  } else if (leases->parsed()) {
    std::string q = query_of({"state", "tenant", "all", "order"});
    // The API answers in pages; follow next_cursor until the listing or the limit ends.
    json::array list = fetch_pages(o, "/v1/leases", "leases", q, limit_flag(flags));
    if (out(json::object{{"leases", list}})) return 0;
    print_leases(list);
  } else if (lease->parsed()) {
    auto v = call(o, "GET", "/v1/leases/" + url_encode(args[0]));
    if (out(v)) return 0;
    print_leases(json::array{v});
  } else if (revoke->parsed()) {
    std::string body = flags.count("reason") ? "{\"reason\":" + json_string(flags["reason"]) + "}" : "";
    auto v = call(o, "POST", "/v1/leases/" + url_encode(args[0]) + "/revoke", body);
    if (out(v)) return 0;
    std::cout << "lease " << args[0] << ": " << str(v.at("state")) << "\n";
  } else if (queue->parsed()) {
    json::array list = fetch_pages(o, "/v1/queue", "queue", "", limit_flag(flags));
    if (out(json::object{{"queue", list}})) return 0;
    print_leases(list);
  } else if (bitstreams->parsed()) {
    if (bs_show->parsed()) {
      auto v = call(o, "GET", "/v1/bitstreams/" + args[0] + (args.size() > 1 ? "/" + args[1] : ""));
      if (out(v)) return 0;
      print_bitstreams(json::array{v});
    } else if (bs_register->parsed()) {
      auto v = call(o, "POST", "/v1/bitstreams", upload_body(args[0], flags.count("file") ? flags["file"] : ""));
      if (out(v)) return 0;
      std::cout << "registered " << str(v.at("name")) << "@" << str(v.at("version")) << " (sha256 "
                << str(v.at("sha256")) << ", " << str(v.at("size_bytes")) << " bytes)\n";
    } else if (bs_delete->parsed()) {
      auto v = call(o, "DELETE", "/v1/bitstreams/" + args[0] + "/" + args[1]);
      if (out(v)) return 0;
      std::cout << "deleted " << str(v.at("deleted")) << "\n";
    } else {
      (void)bs_list;
      auto v = call(o, "GET", "/v1/bitstreams");
      if (out(v)) return 0;
      print_bitstreams(v.at("bitstreams").as_array());
      for (const auto& r : v.at("rejected").as_array()) std::cerr << "left out: " << str(r.at("message")) << "\n";
    }
  } else if (tenants->parsed()) {
    auto print_tenants = [&](const json::array& list) {
      std::vector<std::vector<std::string>> rows;
      for (const auto& t : list) {
        auto max = t.at("max_devices").to_number<std::uint64_t>();
        rows.push_back({str(t.at("name")), str(t.at("weight")), max == 0 ? "none" : std::to_string(max)});
      }
      table({"TENANT", "WEIGHT", "MAX DEVICES"}, rows);
    };
    if (t_create->parsed()) {
      print_token(call(o, "POST", "/v1/tenants", tenant_body(&args[0])), "tenant " + args[0]);
    } else if (t_rotate->parsed()) {
      print_token(call(o, "POST", "/v1/tenants/" + url_encode(args[0]) + "/rotate-token"), "tenant " + args[0]);
    } else if (t_update->parsed()) {
      auto v = call(o, "PATCH", "/v1/tenants/" + url_encode(args[0]), tenant_body(nullptr));
      if (out(v)) return 0;
      std::cout << "tenant " << args[0] << ": weight " << str(v.at("weight")) << ", max devices "
                << str(v.at("max_devices")) << "\n";
    } else if (t_show->parsed()) {
      auto v = call(o, "GET", "/v1/tenants/" + url_encode(args[0]));
      if (out(v)) return 0;
      print_tenants(json::array{v});
    } else if (t_delete->parsed()) {
      auto v = call(o, "DELETE", "/v1/tenants/" + url_encode(args[0]));
      if (out(v)) return 0;
      std::cout << "tenant " << args[0] << " deleted\n";
    } else {
      (void)t_list;
      auto v = call(o, "GET", "/v1/tenants");
      if (out(v)) return 0;
      print_tenants(v.at("tenants").as_array());
    }
  } else if (admins->parsed()) {
    if (a_create->parsed()) {
      print_token(call(o, "POST", "/v1/admin-tokens", "{\"name\":" + json_string(args[0]) + "}"), "admin " + args[0]);
    } else if (a_rotate->parsed()) {
      print_token(call(o, "POST", "/v1/admin-tokens/" + url_encode(args[0]) + "/rotate"), "admin " + args[0]);
    } else if (a_revoke->parsed()) {
      auto v = call(o, "DELETE", "/v1/admin-tokens/" + url_encode(args[0]));
      if (out(v)) return 0;
      std::cout << "admin token " << args[0] << " revoked\n";
    } else {
      (void)a_list;
      auto v = call(o, "GET", "/v1/admin-tokens");
      if (out(v)) return 0;
      for (const auto& t : v.at("admin_tokens").as_array()) std::cout << str(t.at("name")) << "\n";
    }
  } else if (policy->parsed()) {
    (void)p_get;
    auto v = p_set->parsed() ? call(o, "PUT", "/v1/policy", "{\"policy\":" + json_string(args[0]) + "}")
                             : call(o, "GET", "/v1/policy");
    if (out(v)) return 0;
    std::cout << str(v.at("policy")) << "\n";
  } else if (status->parsed()) {
    auto v = call(o, "GET", "/v1/leadership");
    if (out(v)) return 0;
    if (!v.at("shared").as_bool()) {
      std::cout << "alone on its SQLite store: no standbys\n";
      return 0;
    }
    const auto& l = v.at("leader");
    const auto since = static_cast<std::time_t>(v.at("since").to_number<double>());
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&since));
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"leader", str(l.at("name")), str(l.at("admin_url")), str(l.at("guest_tcp")),
                    "epoch " + str(v.at("epoch")) + " since " + when});
    for (const auto& s : v.at("standbys").as_array())
      rows.push_back({"standby", str(s.at("name")), str(s.at("admin_url")), str(s.at("guest_tcp")), "-"});
    table({"ROLE", "NAME", "ADMIN", "GUESTS", "LEADS"}, rows);
  } else if (estimates->parsed()) {
    auto v = call(o, "GET", "/v1/estimates");
    if (out(v)) return 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& g : v.at("groups").as_array()) {
      std::string group = "(whole kind)";
      if (!g.at("whole_kind").as_bool()) {
        group = "tenant " + str(g.at("tenant")) + ", bitstream " + str(g.at("bitstream")) + ", " + str(g.at("count")) +
                " device(s), label " + str(g.at("label"));
      }
      rows.push_back({str(g.at("kind")), group, str(g.at("observations")), g.at("warm").as_bool() ? "yes" : "no",
                      str(g.at("estimate_s")), str(g.at("p50_device_s")), str(g.at("p90_device_s"))});
    }
    table({"KIND", "GROUP", "OBSERVED", "WARM", "ESTIMATE S", "P50 DEVICE-S", "P90 DEVICE-S"}, rows);
  } else if (stats->parsed()) {
    std::string q = flags.count("window") ? "?window=" + url_encode(flags["window"]) : "";
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
      for (const auto& kv : win.at("by_bitstream").as_object())
        add(ws, "bitstream " + std::string(kv.key()), kv.value());
    }
    table({"WINDOW", "SCOPE", "JOBS", "JCT AVG", "P50", "P95", "P99", "WAIT AVG", "WAIT P99"}, rows);
    const auto& c = v.at("counters");
    std::cout << "queue length " << str(v.at("queue_length")) << "; grants " << str(c.at("grants"))
              << ", reprogrammings " << str(c.at("reprogrammings")) << ", preemptions " << str(c.at("preemptions"))
              << ", expirations " << str(c.at("expirations")) << "\n";
  } else if (health->parsed()) {
    call(o, "GET", "/healthz");
    auto r = send(o, "GET", "/readyz", "", "");
    bool ready = r && r->status == 200;
    if (o.json_out) {
      std::cout << json::serialize(json::object{{"healthy", true}, {"ready", ready}}) << "\n";
    } else {
      std::cout << "healthy; " << (ready ? "ready" : "not ready") << "\n";
    }
    return ready ? 0 : 1;
  }
  return 0;
}
