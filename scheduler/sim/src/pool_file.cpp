// Pool description files (JSON). nlohmann::json throws on syntax errors; they are caught here and turned
// into errors naming the file and byte offset.
#include <accelpool/sim/pool_file.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace accelpool::sim {

namespace {

using nlohmann::json;

class PoolParser {
 public:
  explicit PoolParser(std::string source) : source_(std::move(source)) {}

  Result<PoolSpec> parse(const json& root) {
    PoolSpec pool;
    if (!root.is_object()) return fail("", "expected a JSON object");
    if (auto st = only(root, "", {"hosts", "models", "default"}); !st) return st.error();
    if (root.contains("default")) {
      auto c = cost(root["default"], "default");
      if (!c) return c.error();
      pool.default_cost = *c;
    }
    if (root.contains("models")) {
      const json& models = root["models"];
      if (!models.is_object()) return fail("models", "expected an object of model name -> {reconfig_s, attach_s}");
      for (const auto& [name, value] : models.items()) {
        auto c = cost(value, "models." + name);
        if (!c) return c.error();
        pool.models[name] = *c;
      }
    }
    if (!root.contains("hosts")) return fail("", "missing \"hosts\"");
    const json& hosts = root["hosts"];
    if (!hosts.is_array() || hosts.empty()) return fail("hosts", "expected a non-empty array");
    std::set<std::string> names;
    for (std::size_t i = 0; i < hosts.size(); ++i) {
      const std::string where = "hosts[" + std::to_string(i) + "]";
      const json& h = hosts[i];
      if (!h.is_object()) return fail(where, "expected an object");
      if (auto st = only(h, where, {"name", "repeat", "devices"}); !st) return st.error();
      std::string name = "host" + std::to_string(i);
      if (h.contains("name")) {
        if (!h["name"].is_string() || h["name"].get<std::string>().empty())
          return fail(where + ".name", "expected a non-empty string");
        name = h["name"].get<std::string>();
      }
      std::uint64_t repeat = 1;
      const bool repeated = h.contains("repeat");
      if (repeated) {
        auto r = count(h["repeat"], where + ".repeat");
        if (!r) return r.error();
        repeat = *r;
      }
      if (!h.contains("devices") || !h["devices"].is_array() || h["devices"].empty()) {
        return fail(where + ".devices", "expected a non-empty array");
      }
      HostSpec host;
      for (std::size_t k = 0; k < h["devices"].size(); ++k) {
        const std::string dw = where + ".devices[" + std::to_string(k) + "]";
        const json& d = h["devices"][k];
        if (!d.is_object()) return fail(dw, "expected an object");
        if (auto st = only(d, dw, {"kind", "model", "attach", "count", "slots", "slot_share"}); !st) return st.error();
        DeviceGroupSpec g;
        for (const char* key : {"kind", "model"}) {
          if (!d.contains(key)) continue;
          if (!d[key].is_string() || d[key].get<std::string>().empty())
            return fail(dw + "." + key, "expected a non-empty string");
          (std::string(key) == "kind" ? g.kind : g.model) = d[key].get<std::string>();
        }
        if (d.contains("attach")) {
          const std::string a = d["attach"].is_string() ? d["attach"].get<std::string>() : "";
          if (a == "network") {
            g.attach = scheduler::AttachMode::network;
          } else if (a == "passthrough") {
            g.attach = scheduler::AttachMode::passthrough;
          } else {
            return fail(dw + ".attach", "expected \"network\" or \"passthrough\"");
          }
        }
        if (d.contains("count")) {
          auto c = count(d["count"], dw + ".count");
          if (!c) return c.error();
          g.count = static_cast<std::uint32_t>(*c);
        }
        if (d.contains("slots")) {
          const json& v = d["slots"];
          if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 64) {
            return fail(dw + ".slots", "expected an integer from 0 to 64");
          }
          g.slots = static_cast<std::uint32_t>(v.get<std::int64_t>());
        }
        if (d.contains("slot_share")) {
          const json& v = d["slot_share"];
          if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= 1)) {
            return fail(dw + ".slot_share", "expected a number in (0, 1]");
          }
          g.slot_share = v.get<double>();
        }
        host.devices.push_back(g);
      }
      for (std::uint64_t r = 0; r < repeat; ++r) {
        host.name = repeated ? name + std::to_string(r) : name;
        if (!names.insert(host.name).second) return fail(where + ".name", "host \"" + host.name + "\" declared twice");
        pool.hosts.push_back(host);
      }
    }
    if (pool.total_devices() > 10'000'000) return fail("hosts", "more than 10,000,000 devices");
    return pool;
  }

 private:
  Error fail(const std::string& where, const std::string& what) const {
    return make_error(Errc::invalid_argument, source_ + ": " + (where.empty() ? "" : where + ": ") + what);
  }
  Status only(const json& obj, const std::string& where, std::initializer_list<const char*> keys) const {
    for (const auto& [key, value] : obj.items()) {
      bool ok = false;
      for (const char* k : keys) ok = ok || key == k;
      if (!ok) {
        std::string list;
        for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
        return fail(where, "unknown key \"" + key + "\" (known: " + list + ")");
      }
    }
    return Status::ok();
  }
  Result<std::uint64_t> count(const json& v, const std::string& where) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > 10'000'000) {
      return fail(where, "expected an integer from 1 to 10000000");
    }
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  }
  Result<ModelCost> cost(const json& v, const std::string& where) const {
    if (!v.is_object()) return fail(where, "expected an object {\"reconfig_s\": S, \"attach_s\": S}");
    if (auto st = only(v, where, {"reconfig_s", "attach_s", "partial_reconfig_s"}); !st) return st.error();
    ModelCost c;
    for (const char* key : {"reconfig_s", "attach_s", "partial_reconfig_s"}) {
      if (!v.contains(key)) continue;
      const json& x = v[key];
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0) {
        return fail(where + "." + key, "expected a number of seconds >= 0");
      }
      const std::string k = key;
      (k == "reconfig_s" ? c.reconfig_s : k == "attach_s" ? c.attach_s : c.partial_reconfig_s) = x.get<double>();
    }
    return c;
  }

  std::string source_;
};

}  // namespace

Result<PoolSpec> parse_pool_json(const std::string& text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    return make_error(Errc::invalid_argument,
                      source + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
  return PoolParser(source).parse(root);
}

Result<PoolSpec> load_pool_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(Errc::not_found, "cannot open pool file " + path + ": " + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_pool_json(buf.str(), path);
}

}  // namespace accelpool::sim
