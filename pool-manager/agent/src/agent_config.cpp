#include "agent_config.hpp"

#include <accelpool/backends/config_toml.hpp>

#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace accelpool::agent {

namespace {

struct Reader {
  std::string file;
  std::optional<Error> error;

  void fail(const std::string& key, const std::string& what) {
    if (!error) error = make_error(Errc::invalid_config, file + ": key '" + key + "': " + what);
  }
  void only(const toml::table& t, const std::string& prefix, const std::set<std::string>& keys) {
    for (const auto& [k, v] : t)
      if (!keys.count(std::string(k.str()))) fail(prefix + std::string(k.str()), "unknown key");
  }
  std::string str(const toml::table& t, const std::string& prefix, const char* key, bool required) {
    auto* n = t.get(key);
    if (!n) {
      if (required) fail(prefix + key, "is required");
      return {};
    }
    if (!n->is_string()) {
      fail(prefix + key, "must be a string");
      return {};
    }
    return std::string(n->as_string()->get());
  }
  // A non-empty string, or an array of one or more non-empty strings.
  std::vector<std::string> strs(const toml::table& t, const std::string& prefix, const char* key) {
    auto* n = t.get(key);
    if (!n) {
      fail(prefix + key, "is required");
      return {};
    }
    if (n->is_string()) {
      if (n->as_string()->get().empty()) fail(prefix + key, "must not be empty");
      return {std::string(n->as_string()->get())};
    }
    std::vector<std::string> out;
    auto* a = n->as_array();
    if (a == nullptr || a->empty()) {
      fail(prefix + key, "must be a string or a non-empty array of strings");
      return {};
    }
    for (const auto& e : *a) {
      if (!e.is_string() || e.as_string()->get().empty()) {
        fail(prefix + key, "entry " + std::to_string(out.size() + 1) + " must be a non-empty string");
        return {};
      }
      out.push_back(std::string(e.as_string()->get()));
    }
    return out;
  }
  std::int64_t num(const toml::table& t, const std::string& prefix, const char* key, std::int64_t fallback,
                   std::int64_t min, std::int64_t max) {
    auto* n = t.get(key);
    if (!n) return fallback;
    if (!n->is_integer()) {
      fail(prefix + key, "must be an integer");
      return fallback;
    }
    auto v = n->as_integer()->get();
    if (v < min || v > max)
      fail(prefix + key, "must be between " + std::to_string(min) + " and " + std::to_string(max));
    return v;
  }
};

}  // namespace

Result<AgentConfig> load_agent_config(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return make_error(Errc::not_found, "cannot read agent config '" + file.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  toml::table root;
  try {
    root = toml::parse(text.str(), file.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << file.string() << ":" << e.source().begin.line << ": " << e.description();
    return make_error(Errc::invalid_config, msg.str());
  }
  Reader r{file.string(), std::nullopt};
  AgentConfig c;
  r.only(root, "", {"agent", "libvirt", "backends", "relay", "log"});
  auto* agent = root["agent"].as_table();
  if (!agent) return make_error(Errc::invalid_config, file.string() + ": table [agent] is required");
  r.only(*agent, "agent.",
         {"manager", "token", "token_file", "host", "heartbeat_interval_ms", "reconnect_min_ms", "reconnect_max_ms",
          "bitstreams", "state_file", "images_url", "tls_ca", "tls_cert", "tls_key"});
  // Retired: images come over the agent link now (docs/agent-protocol.md, "Images").
  if (agent->contains("images_url"))
    r.fail("agent.images_url",
           "is no longer supported: the agent fetches the images its agent.bitstreams folder lacks "
           "from the manager over its agent connection (agent.manager); remove the key");
  c.managers = r.strs(*agent, "agent.", "manager");
  const bool unix_manager =
      std::any_of(c.managers.begin(), c.managers.end(), [](const std::string& m) { return m.rfind("unix:", 0) == 0; });
  c.tls_ca = r.str(*agent, "agent.", "tls_ca", false);
  c.tls_cert = r.str(*agent, "agent.", "tls_cert", false);
  c.tls_key = r.str(*agent, "agent.", "tls_key", false);
  if (c.tls_ca.empty() && (!c.tls_cert.empty() || !c.tls_key.empty())) {
    r.fail(c.tls_cert.empty() ? "agent.tls_key" : "agent.tls_cert", "needs agent.tls_ca (TLS to the manager)");
  } else if (!c.tls_ca.empty() && unix_manager) {
    r.fail("agent.tls_ca", "TLS is for TCP manager addresses; agent.manager names a Unix socket (plain)");
  } else if (!c.tls_ca.empty() && !r.error) {
    auto ctx =
        common::tls::client_context(common::tls::table_files("agent", c.tls_cert, c.tls_key, c.tls_ca, "tls_ca"));
    if (ctx)
      c.tls = *ctx;
    else if (!r.error)
      r.error = make_error(Errc::invalid_config, file.string() + ": " + ctx.error().message);
  }
  c.token = r.str(*agent, "agent.", "token", false);
  std::string token_file = r.str(*agent, "agent.", "token_file", false);
  if (!token_file.empty()) {
    std::ifstream tf(token_file);
    if (!tf) r.fail("agent.token_file", "cannot read '" + token_file + "'");
    std::getline(tf, c.token);
  }
  if (c.token.empty() && !r.error) r.fail("agent.token", "is required (or agent.token_file)");
  c.host = r.str(*agent, "agent.", "host", true);
  c.heartbeat_interval = std::chrono::milliseconds(r.num(*agent, "agent.", "heartbeat_interval_ms", 2000, 10, 600000));
  c.reconnect_min = std::chrono::milliseconds(r.num(*agent, "agent.", "reconnect_min_ms", 200, 10, 600000));
  c.reconnect_max = std::chrono::milliseconds(r.num(*agent, "agent.", "reconnect_max_ms", 10000, 10, 3600000));
  if (c.reconnect_max < c.reconnect_min) r.fail("agent.reconnect_max_ms", "is less than reconnect_min_ms");
  c.bitstreams = r.str(*agent, "agent.", "bitstreams", false);
  c.state_file = r.str(*agent, "agent.", "state_file", false);

  if (auto* lv = root["libvirt"].as_table()) {
    r.only(*lv, "libvirt.", {"uri", "detach_timeout_ms", "shmem_size_mib"});
    c.libvirt_uri = r.str(*lv, "libvirt.", "uri", false);
    c.detach_timeout = std::chrono::milliseconds(r.num(*lv, "libvirt.", "detach_timeout_ms", 30000, 1, 3600000));
    c.shmem_size_mib = static_cast<std::uint32_t>(r.num(*lv, "libvirt.", "shmem_size_mib", 1, 1, 65536));
  } else if (root.contains("libvirt")) {
    r.fail("libvirt", "must be a table");
  }

  if (auto* rl = root["relay"].as_table()) {
    r.only(*rl, "relay.", {"manager", "channel", "scan_interval_ms"});
    c.relay_managers = r.strs(*rl, "relay.", "manager");
    if (rl->contains("channel")) c.relay_channel = r.str(*rl, "relay.", "channel", false);
    if (c.relay_channel.empty()) r.fail("relay.channel", "must not be empty");
    c.relay_scan_interval = std::chrono::milliseconds(r.num(*rl, "relay.", "scan_interval_ms", 1000, 10, 600000));
    if (c.libvirt_uri.empty()) r.fail("relay", "relaying guest ports needs [libvirt] uri");
  } else if (root.contains("relay")) {
    r.fail("relay", "must be a table");
  }

  if (auto* lg = root["log"].as_table()) {
    r.only(*lg, "log.", {"level", "format"});
    if (lg->contains("level")) {
      auto level = log::parse_level(r.str(*lg, "log.", "level", false));
      if (level)
        c.log_level = *level;
      else
        r.fail("log.level", "must be \"debug\", \"info\", \"warn\" or \"error\"");
    }
    if (lg->contains("format")) {
      auto format = log::parse_format(r.str(*lg, "log.", "format", false));
      if (format)
        c.log_format = *format;
      else
        r.fail("log.format", "must be \"text\" or \"json\"");
    }
  } else if (root.contains("log")) {
    r.fail("log", "must be a table");
  }

  auto* bk = root["backends"].as_table();
  if (!bk || bk->empty()) {
    r.fail("backends", "at least one [backends.<name>] table is required");
  } else {
    for (const auto& [name, node] : *bk) {
      std::string prefix = "backends." + std::string(name.str()) + ".";
      auto* t = node.as_table();
      if (!t) {
        r.fail("backends." + std::string(name.str()), "must be a table");
        continue;
      }
      backends::BackendConfig bc;
      for (const auto& [k, v] : *t) {
        std::string key(k.str());
        if (auto value = backends::backend_config_value(v))
          bc[key] = std::move(*value);
        else
          r.fail(prefix + key, "must be a string, number, boolean or array of integers");
      }
      c.backends[std::string(name.str())] = std::move(bc);
    }
  }
  if (r.error) return *r.error;
  return c;
}

}  // namespace accelpool::agent
