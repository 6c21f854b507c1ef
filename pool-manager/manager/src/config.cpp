#include "config.hpp"

#include <accelpool/backends/config_toml.hpp>
#include <accelpool/common/listener_limits.hpp>
#include <accelpool/common/slots.hpp>
#include <accelpool/common/tls.hpp>

#include <toml++/toml.h>

#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

namespace accelpool::manager {

namespace {

std::string where(const std::filesystem::path& file, const toml::node& n) {
  std::ostringstream o;
  o << file.string() << ":" << n.source().begin.line << ":" << n.source().begin.column;
  return o.str();
}

// Refuses keys a table does not know (usually misspelt).
Status check_keys(const std::filesystem::path& file, const toml::table& t, const std::set<std::string>& known,
                  const std::string& table) {
  for (const auto& [k, v] : t) {
    if (!known.count(std::string(k.str()))) {
      return make_error(Errc::invalid_config,
                        where(file, v) + ": unknown key '" + std::string(k.str()) + "' in " + table);
    }
  }
  return Status::ok();
}

// The entries of the array of tables `n` (`name` in errors), each a table whose keys are all `known`; `entry`
// names one entry in errors ("[[hosts]]").
Result<std::vector<const toml::table*>> tables_in(const std::filesystem::path& file, const toml::node& n,
                                                  const std::string& name, const std::string& entry,
                                                  const std::set<std::string>& known) {
  const auto* arr = n.as_array();
  if (!arr) {
    const std::string syntax = entry.rfind("[[", 0) == 0 ? " (" + entry + ")" : "";
    return make_error(Errc::invalid_config, where(file, n) + ": " + name + " must be an array of tables" + syntax);
  }
  std::vector<const toml::table*> tables;
  for (const auto& e : *arr) {
    const auto* t = e.as_table();
    if (!t) return make_error(Errc::invalid_config, where(file, e) + ": each " + entry + " entry must be a table");
    if (auto s = check_keys(file, *t, known, entry); !s) return s.error();
    tables.push_back(t);
  }
  return tables;
}

template <typename T>
Status read(const std::filesystem::path& file, const toml::table& t, const char* key, T& out,
            const std::string& table) {
  const toml::node* n = t.get(key);
  if (!n) return Status::ok();
  if constexpr (std::is_same_v<T, std::string>) {
    if (auto v = n->value<std::string>()) {
      out = *v;
      return Status::ok();
    }
    return make_error(Errc::invalid_config, where(file, *n) + ": " + table + "." + key + " must be a string");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (auto v = n->value<bool>(); v && n->is_boolean()) {
      out = *v;
      return Status::ok();
    }
    return make_error(Errc::invalid_config, where(file, *n) + ": " + table + "." + key + " must be true or false");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (n->is_number()) {
      out = *n->value<double>();
      return Status::ok();
    }
    return make_error(Errc::invalid_config, where(file, *n) + ": " + table + "." + key + " must be a number");
  } else {
    if (n->is_integer()) {
      auto v = *n->value<std::int64_t>();
      if (v >= 0 && static_cast<std::uint64_t>(v) <= std::numeric_limits<T>::max()) {
        out = static_cast<T>(v);
        return Status::ok();
      }
    }
    return make_error(Errc::invalid_config,
                      where(file, *n) + ": " + table + "." + key + " must be a non-negative integer");
  }
}

#define ACCELPOOL_TRY(expr)                       \
  do {                                            \
    if (auto s_ = (expr); !s_) return s_.error(); \
  } while (0)

const toml::table* sub(const toml::table& t, const char* key) { return t.get_as<toml::table>(key); }

// The TLS keys of `[table]` (tls_cert, tls_key and, with `client_ca`, tls_client_ca), checked by loading them as a
// server would: unreadable files, a key that does not match the certificate and the like are errors here.
Status read_tls(const std::filesystem::path& file, const toml::table& t, const std::string& table, bool client_ca,
                TlsConfig& out) {
  const toml::node* n = t.get("tls_cert")  ? t.get("tls_cert")
                        : t.get("tls_key") ? t.get("tls_key")
                                           : t.get("tls_client_ca");
  if (!n) return Status::ok();
  auto path = [&](const char* key, std::string& v) -> Status {
    ACCELPOOL_TRY(read(file, t, key, v, table));
    if (!v.empty() && std::filesystem::path(v).is_relative()) v = (file.parent_path() / v).string();
    return Status::ok();
  };
  ACCELPOOL_TRY(path("tls_cert", out.cert));
  ACCELPOOL_TRY(path("tls_key", out.key));
  if (client_ca) ACCELPOOL_TRY(path("tls_client_ca", out.client_ca));
  auto ctx = server_tls(out, table);
  if (!ctx) return make_error(Errc::invalid_config, where(file, *n) + ": " + ctx.error().message);
  return Status::ok();
}

}  // namespace

Config default_config() { return Config{}; }

Result<common::tls::Context> server_tls(const TlsConfig& tls, const std::string& table) {
  if (tls.cert.empty() && tls.key.empty() && tls.client_ca.empty()) return common::tls::Context{};
  return common::tls::server_context(
      common::tls::table_files(table, tls.cert, tls.key, tls.client_ca, "tls_client_ca"));
}

Result<Config> load_config(const std::filesystem::path& file) {
  toml::table root;
  try {
    root = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream o;
    o << file.string() << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    return make_error(Errc::invalid_config, o.str());
  }
  Config c;
  ACCELPOOL_TRY(check_keys(file, root,
                           {"data_dir", "store", "guest", "admin", "leases", "scheduler", "limits", "hosts", "tenants",
                            "agents", "bitstreams", "ha", "log", "metrics"},
                           "the top level"));
  std::string data_dir = c.data_dir.string();
  ACCELPOOL_TRY(read(file, root, "data_dir", data_dir, "top level"));
  c.data_dir = data_dir;
  if (c.data_dir.is_relative()) c.data_dir = file.parent_path() / c.data_dir;
  for (const char* name : {"store", "guest", "admin", "leases", "scheduler", "limits", "agents", "bitstreams", "ha"}) {
    if (root.get(name) && !sub(root, name))
      return make_error(Errc::invalid_config, where(file, *root.get(name)) + ": " + name + " must be a table");
  }
  if (auto* t = sub(root, "store")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"file", "full_sync", "url"}, "[store]"));
    ACCELPOOL_TRY(read(file, *t, "file", c.store_file, "store"));
    ACCELPOOL_TRY(read(file, *t, "full_sync", c.full_sync, "store"));
    ACCELPOOL_TRY(read(file, *t, "url", c.store_url, "store"));
    if (const auto* n = t->get("url")) {
      if (c.store_url.rfind("postgresql://", 0) != 0 && c.store_url.rfind("postgres://", 0) != 0) {
        return make_error(Errc::invalid_config,
                          where(file, *n) + ": store.url must be a PostgreSQL URL (postgresql://...)");
      }
      for (const char* sqlite_only : {"file", "full_sync"}) {
        if (t->get(sqlite_only)) {
          return make_error(Errc::invalid_config, where(file, *t->get(sqlite_only)) + ": store." + sqlite_only +
                                                      " is for the SQLite store; it cannot go with store.url");
        }
      }
    }
  }
  if (auto* t = sub(root, "ha")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"name", "leader_timeout_s", "standby_poll_s"}, "[ha]"));
    if (c.store_url.empty()) {
      return make_error(Errc::invalid_config, where(file, *t) + ": [ha] needs the PostgreSQL store ([store] url)");
    }
    ACCELPOOL_TRY(read(file, *t, "name", c.ha.name, "ha"));
    ACCELPOOL_TRY(read(file, *t, "leader_timeout_s", c.ha.leader_timeout_s, "ha"));
    ACCELPOOL_TRY(read(file, *t, "standby_poll_s", c.ha.standby_poll_s, "ha"));
    if (!(c.ha.leader_timeout_s > 0))
      return make_error(Errc::invalid_config, where(file, *t) + ": ha.leader_timeout_s must be > 0");
    if (!(c.ha.standby_poll_s > 0))
      return make_error(Errc::invalid_config, where(file, *t) + ": ha.standby_poll_s must be > 0");
  }
  if (auto* t = sub(root, "guest")) {
    ACCELPOOL_TRY(check_keys(file, *t,
                             {"tcp", "unix", "network_thread", "max_silent", "hello_timeout_s", "tls_cert", "tls_key"},
                             "[guest]"));
    ACCELPOOL_TRY(read_tls(file, *t, "guest", false, c.guest_tls));
    ACCELPOOL_TRY(read(file, *t, "tcp", c.guest_tcp, "guest"));
    ACCELPOOL_TRY(read(file, *t, "unix", c.guest_unix, "guest"));
    ACCELPOOL_TRY(read(file, *t, "network_thread", c.guest_network_thread, "guest"));
    ACCELPOOL_TRY(read(file, *t, "max_silent", c.guest_max_silent, "guest"));
    ACCELPOOL_TRY(read(file, *t, "hello_timeout_s", c.guest_hello_timeout_s, "guest"));
    if (c.guest_max_silent < 1)
      return make_error(Errc::invalid_config, where(file, *t) + ": guest.max_silent must be >= 1");
    if (!(c.guest_hello_timeout_s > 0))
      return make_error(Errc::invalid_config, where(file, *t) + ": guest.hello_timeout_s must be > 0");
  }
  if (auto* t = sub(root, "admin")) {
    ACCELPOOL_TRY(check_keys(
        file, *t, {"listen", "header_timeout_s", "max_connections_per_source", "tls_cert", "tls_key"}, "[admin]"));
    ACCELPOOL_TRY(read_tls(file, *t, "admin", false, c.admin_tls));
    ACCELPOOL_TRY(read(file, *t, "listen", c.admin_listen, "admin"));
    ACCELPOOL_TRY(read(file, *t, "header_timeout_s", c.admin_header_timeout_s, "admin"));
    ACCELPOOL_TRY(read(file, *t, "max_connections_per_source", c.admin_max_connections_per_source, "admin"));
    if (!(c.admin_header_timeout_s > 0))
      return make_error(Errc::invalid_config, where(file, *t) + ": admin.header_timeout_s must be > 0");
    if (c.admin_max_connections_per_source < 1) {
      return make_error(Errc::invalid_config, where(file, *t) + ": admin.max_connections_per_source must be >= 1");
    }
  }
  if (auto* t = sub(root, "leases")) {
    ACCELPOOL_TRY(
        check_keys(file, *t, {"ttl_s", "revoke_grace_s", "history", "keep_ended_days", "max_per_guest"}, "[leases]"));
    ACCELPOOL_TRY(read(file, *t, "ttl_s", c.core.lease_ttl_s, "leases"));
    ACCELPOOL_TRY(read(file, *t, "revoke_grace_s", c.core.revoke_grace_s, "leases"));
    ACCELPOOL_TRY(read(file, *t, "history", c.core.history, "leases"));
    ACCELPOOL_TRY(read(file, *t, "max_per_guest", c.core.max_live_per_guest, "leases"));
    if (c.core.max_live_per_guest < 1 || c.core.max_live_per_guest > 5000) {
      return make_error(Errc::invalid_config, file.string() + ": leases.max_per_guest must be in [1, 5000]");
    }
    double keep_days = c.core.keep_ended_s / 86400;
    ACCELPOOL_TRY(read(file, *t, "keep_ended_days", keep_days, "leases"));
    if (!(keep_days >= 0) || keep_days > 36500) {
      return make_error(Errc::invalid_config, file.string() + ": leases.keep_ended_days must be in [0, 36500]");
    }
    c.core.keep_ended_s = keep_days * 86400;
    if (!(c.core.lease_ttl_s > 0))
      return make_error(Errc::invalid_config, file.string() + ": leases.ttl_s must be > 0");
    if (!(c.core.revoke_grace_s >= 0))
      return make_error(Errc::invalid_config, file.string() + ": leases.revoke_grace_s must be >= 0");
  }
  if (auto* t = sub(root, "scheduler")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"policy"}, "[scheduler]"));
    ACCELPOOL_TRY(read(file, *t, "policy", c.core.policy, "scheduler"));
  }
  if (auto* t = sub(root, "limits")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"max_body_bytes", "request_timeout_s", "max_connections"}, "[limits]"));
    ACCELPOOL_TRY(read(file, *t, "max_body_bytes", c.max_body_bytes, "limits"));
    ACCELPOOL_TRY(read(file, *t, "request_timeout_s", c.request_timeout_s, "limits"));
    ACCELPOOL_TRY(read(file, *t, "max_connections", c.max_connections, "limits"));
    c.max_connections_set = t->contains("max_connections");
  }
  if (auto* t = sub(root, "bitstreams")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"dir", "seed"}, "[bitstreams]"));
    std::string dir, seed;
    ACCELPOOL_TRY(read(file, *t, "dir", dir, "bitstreams"));
    if (t->get("dir") && dir.empty())
      return make_error(Errc::invalid_config, where(file, *t->get("dir")) + ": bitstreams.dir must not be empty");
    if (!dir.empty()) {
      c.bitstreams.dir = dir;
      if (c.bitstreams.dir.is_relative()) c.bitstreams.dir = file.parent_path() / c.bitstreams.dir;
    }
    if (t->get("seed")) {
      ACCELPOOL_TRY(read(file, *t, "seed", seed, "bitstreams"));
      std::filesystem::path sp = seed;
      if (!seed.empty() && sp.is_relative()) sp = file.parent_path() / sp;
      c.bitstreams.seed = sp;
    }
  }
  if (auto* t = sub(root, "agents")) {
    ACCELPOOL_TRY(check_keys(file, *t,
                             {"listen", "token", "token_file", "heartbeat_timeout_ms", "max_connections", "tls_cert",
                              "tls_key", "tls_client_ca"},
                             "[agents]"));
    ACCELPOOL_TRY(read_tls(file, *t, "agents", true, c.agents.tls));
    if (const toml::node* ln = t->get("listen")) {
      const auto* arr = ln->as_array();
      if (!arr)
        return make_error(Errc::invalid_config, where(file, *ln) + ": agents.listen must be an array of strings");
      for (const auto& a : *arr) {
        auto v = a.value<std::string>();
        if (!a.is_string() || !v || v->empty()) {
          return make_error(Errc::invalid_config,
                            where(file, a) + ": agents.listen entries must be \"IP:PORT\" or \"unix:PATH\"");
        }
        if (v->rfind("unix:", 0) != 0) {
          if (auto ep = parse_endpoint(*v); !ep)
            return make_error(Errc::invalid_config, where(file, a) + ": agents.listen: " + ep.error().message);
        } else if (v->size() == 5) {
          return make_error(Errc::invalid_config, where(file, a) + ": agents.listen: 'unix:' needs a path");
        }
        c.agents.listen.push_back(*v);
      }
    }
    ACCELPOOL_TRY(read(file, *t, "token", c.agents.token, "agents"));
    std::string token_file;
    ACCELPOOL_TRY(read(file, *t, "token_file", token_file, "agents"));
    if (!token_file.empty()) {
      if (!c.agents.token.empty()) {
        return make_error(Errc::invalid_config, where(file, *t->get("token_file")) +
                                                    ": agents.token and agents.token_file exclude each other");
      }
      std::filesystem::path tf = token_file;
      if (tf.is_relative()) tf = file.parent_path() / tf;
      std::ifstream in(tf);
      if (!in)
        return make_error(Errc::invalid_config,
                          where(file, *t->get("token_file")) + ": agents.token_file: cannot read " + tf.string());
      std::getline(in, c.agents.token);
      while (!c.agents.token.empty() && (c.agents.token.back() == '\r' || c.agents.token.back() == ' '))
        c.agents.token.pop_back();
    }
    ACCELPOOL_TRY(read(file, *t, "heartbeat_timeout_ms", c.agents.heartbeat_timeout_ms, "agents"));
    ACCELPOOL_TRY(read(file, *t, "max_connections", c.agents.max_connections, "agents"));
    if (c.agents.max_connections < 1)
      return make_error(Errc::invalid_config, where(file, *t) + ": agents.max_connections must be >= 1");
    if (c.agents.heartbeat_timeout_ms < 1 || c.agents.heartbeat_timeout_ms > 3600000) {
      return make_error(Errc::invalid_config, where(file, *t) + ": agents.heartbeat_timeout_ms must be in 1..3600000");
    }
    if (!c.agents.listen.empty() && c.agents.token.size() < 16) {
      return make_error(
          Errc::invalid_config,
          where(file, *t) +
              ": agents.token (or agents.token_file) must hold at least 16 characters when agents.listen is set");
    }
  }
  if (const toml::node* hn = root.get("hosts")) {
    auto hosts = tables_in(file, *hn, "hosts", "[[hosts]]", {"name", "backend", "settings", "devices"});
    if (!hosts) return hosts.error();
    for (const toml::table* t : *hosts) {
      HostConfig hc;
      ACCELPOOL_TRY(read(file, *t, "name", hc.name, "hosts"));
      ACCELPOOL_TRY(read(file, *t, "backend", hc.backend, "hosts"));
      if (auto* s = sub(*t, "settings")) {
        for (const auto& [k, v] : *s) {
          auto value = backends::backend_config_value(v);
          if (!value)
            return make_error(Errc::invalid_config, where(file, v) + ": hosts.settings." + std::string(k.str()) +
                                                        " must be a string, number, boolean or array of integers");
          hc.settings[std::string(k.str())] = std::move(*value);
        }
      }
      if (const toml::node* dn = t->get("devices")) {
        auto devices = tables_in(file, *dn, "hosts.devices", "hosts.devices",
                                 {"kind", "model", "count", "attach", "slots", "slot_shapes"});
        if (!devices) return devices.error();
        for (const toml::table* dt : *devices) {
          StaticDeviceGroup g;
          std::string attach = "network";
          std::uint32_t count = 1;
          ACCELPOOL_TRY(read(file, *dt, "kind", g.kind, "hosts.devices"));
          ACCELPOOL_TRY(read(file, *dt, "model", g.model, "hosts.devices"));
          ACCELPOOL_TRY(read(file, *dt, "count", count, "hosts.devices"));
          ACCELPOOL_TRY(read(file, *dt, "attach", attach, "hosts.devices"));
          ACCELPOOL_TRY(read(file, *dt, "slots", g.slots, "hosts.devices"));
          if (g.slots > kMaxSlotsPerDevice) {
            return make_error(Errc::invalid_config, where(file, *dt) + ": hosts.devices.slots must be in 0.." +
                                                        std::to_string(kMaxSlotsPerDevice));
          }
          if (const toml::node* sn = dt->get("slot_shapes")) {
            const auto* arr = sn->as_array();
            if (!arr)
              return make_error(Errc::invalid_config,
                                where(file, *sn) + ": hosts.devices.slot_shapes must be an array of strings");
            for (const auto& e : *arr) {
              auto v = e.value<std::string>();
              if (!e.is_string() || !v || (!v->empty() && !valid_slot_shape(*v))) {
                return make_error(Errc::invalid_config,
                                  where(file, e) +
                                      ": hosts.devices.slot_shapes entries must be \"\" (no shape) or 1-64 "
                                      "characters of [A-Za-z0-9._:-]");
              }
              g.slot_shapes.push_back(*v);
            }
            if (g.slot_shapes.size() != g.slots) {
              return make_error(Errc::invalid_config, where(file, *sn) + ": hosts.devices.slot_shapes lists " +
                                                          std::to_string(g.slot_shapes.size()) +
                                                          " shapes for devices of " + std::to_string(g.slots) +
                                                          " slots: give one shape per slot");
            }
          }
          if (attach != "network" && attach != "passthrough") {
            return make_error(Errc::invalid_config,
                              where(file, *dt) + ": hosts.devices.attach must be \"network\" or \"passthrough\"");
          }
          if (count < 1 || count > 100000)
            return make_error(Errc::invalid_config, where(file, *dt) + ": hosts.devices.count must be in 1..100000");
          g.count = static_cast<int>(count);
          g.passthrough = attach == "passthrough";
          hc.devices.push_back(g);
        }
      }
      if (hc.backend != "static") {
        if (auto b = host_backends(hc); !b)
          return make_error(Errc::invalid_config, where(file, *t) + ": " + b.error().message);
      }
      c.hosts.push_back(std::move(hc));
    }
  }
  if (const toml::node* tn = root.get("tenants")) {
    auto tenants = tables_in(file, *tn, "tenants", "[[tenants]]", {"name", "weight", "max_devices"});
    if (!tenants) return tenants.error();
    for (const toml::table* t : *tenants) {
      TenantConfig tc;
      ACCELPOOL_TRY(read(file, *t, "name", tc.name, "tenants"));
      ACCELPOOL_TRY(read(file, *t, "weight", tc.weight, "tenants"));
      ACCELPOOL_TRY(read(file, *t, "max_devices", tc.max_devices, "tenants"));
      if (tc.name.empty()) return make_error(Errc::invalid_config, where(file, *t) + ": tenants.name is required");
      c.tenants.push_back(tc);
    }
  }
  for (const char* name : {"log", "metrics"}) {
    if (root.get(name) && !sub(root, name))
      return make_error(Errc::invalid_config, where(file, *root.get(name)) + ": " + name + " must be a table");
  }
  if (auto* t = sub(root, "log")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"level", "format"}, "[log]"));
    std::string level, format;
    ACCELPOOL_TRY(read(file, *t, "level", level, "log"));
    ACCELPOOL_TRY(read(file, *t, "format", format, "log"));
    if (t->get("level")) {
      auto l = log::parse_level(level);
      if (!l)
        return make_error(Errc::invalid_config, where(file, *t->get("level")) +
                                                    ": log.level must be \"debug\", \"info\", \"warn\" or \"error\"");
      c.log.level = *l;
    }
    if (t->get("format")) {
      auto f = log::parse_format(format);
      if (!f)
        return make_error(Errc::invalid_config,
                          where(file, *t->get("format")) + ": log.format must be \"text\" or \"json\"");
      c.log.format = *f;
    }
  }
  if (auto* t = sub(root, "metrics")) {
    ACCELPOOL_TRY(check_keys(file, *t, {"token", "max_label_values"}, "[metrics]"));
    ACCELPOOL_TRY(read(file, *t, "token", c.metrics.token, "metrics"));
    ACCELPOOL_TRY(read(file, *t, "max_label_values", c.metrics.max_label_values, "metrics"));
    if (t->get("token") && c.metrics.token.size() < 16) {
      return make_error(Errc::invalid_config,
                        where(file, *t->get("token")) + ": metrics.token must be at least 16 characters");
    }
    if (c.metrics.max_label_values < 1 || c.metrics.max_label_values > 1000) {
      return make_error(Errc::invalid_config, where(file, *t) + ": metrics.max_label_values must be in 1..1000");
    }
  }
  return c;
}

std::uint64_t Config::connection_budget() const {
  std::uint64_t n = 0;
  if (!guest_tcp.empty() || !guest_unix.empty()) n += max_connections;
  n += max_connections;  // the admin API
  if (!agents.listen.empty()) n += agents.max_connections;
  return n;
}

std::optional<std::string> Config::fit_default_connections(std::uint64_t fd_limit) {
  if (max_connections_set || connection_budget() + common::kReservedFds <= fd_limit) return std::nullopt;
  const std::uint64_t shares = guest_tcp.empty() && guest_unix.empty() ? 1 : 2;  // admin, and guests if they listen
  const std::uint64_t others = connection_budget() - shares * max_connections;   // the agents' limit
  const std::uint64_t room =
      fd_limit > others + common::kReservedFds ? (fd_limit - others - common::kReservedFds) / shares : 0;
  if (room < kMinDefaultConnections) return std::nullopt;  // too few to serve: the budget check refuses to start
  const std::size_t was = max_connections;
  max_connections = static_cast<std::size_t>(room);
  return "the file descriptor limit (RLIMIT_NOFILE) is " + std::to_string(fd_limit) +
         ": [limits] max_connections lowered from " + std::to_string(was) + " to " + std::to_string(max_connections) +
         " (set it in the config, or raise the limit with ulimit -n or LimitNOFILE=)";
}

std::filesystem::path Config::bitstreams_dir() const {
  return bitstreams.dir.empty() ? data_dir / "bitstreams" : bitstreams.dir;
}

std::filesystem::path Config::bitstreams_seed() const {
  return bitstreams.seed ? *bitstreams.seed : default_bitstream_seed();
}

std::filesystem::path default_bitstream_seed() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  auto prefix = exe.parent_path().parent_path();
  for (const auto& candidate : {prefix / "bitstreams" / "samples", prefix / "share" / "accelpool" / "bitstreams"}) {
    if (std::filesystem::is_directory(candidate, ec)) return candidate;
  }
  return {};
}

Result<std::vector<HostBackend>> host_backends(const HostConfig& host) {
  std::vector<HostBackend> out;
  std::string_view rest = host.backend;
  while (true) {
    auto plus = rest.find('+');
    std::string name(rest.substr(0, plus));
    if (name.empty() || name == "static") {
      return make_error(Errc::invalid_config,
                        "host " + host.name + ": backend '" + host.backend +
                            "' must be one backend name or several joined with '+' (e.g. \"sim+opencl\"); "
                            "\"static\" stands alone");
    }
    for (const auto& b : out) {
      if (b.name == name)
        return make_error(Errc::invalid_config, "host " + host.name + ": backend '" + name + "' is listed twice");
    }
    out.push_back({name, {}});
    if (plus == std::string_view::npos) break;
    rest.remove_prefix(plus + 1);
  }
  if (out.size() == 1) {
    out.front().settings = host.settings;
    return out;
  }
  for (const auto& [key, value] : host.settings) {
    auto dot = key.find('.');
    bool placed = false;
    if (dot != std::string::npos) {
      for (auto& b : out) {
        if (b.name == key.substr(0, dot)) {
          b.settings[key.substr(dot + 1)] = value;
          placed = true;
        }
      }
    }
    if (!placed) {
      return make_error(Errc::invalid_config, "host " + host.name + ": settings key '" + key +
                                                  "' must be '<backend>.<key>' for one of " + host.backend +
                                                  " (the host has several backends)");
    }
  }
  return out;
}

Result<std::pair<std::string, unsigned short>> parse_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return make_error(Errc::invalid_config, "endpoint '" + text + "' must look like ADDRESS:PORT, e.g. 127.0.0.1:7070");
  }
  std::string host = text.substr(0, colon);
  unsigned port = 0;
  auto r = std::from_chars(text.data() + colon + 1, text.data() + text.size(), port);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || port > 65535) {
    return make_error(Errc::invalid_config, "endpoint '" + text + "': the port must be a number in 0..65535");
  }
  return std::make_pair(host, static_cast<unsigned short>(port));
}

}  // namespace accelpool::manager
