// The daemon's configuration (TOML, docs/operations.md lists every key). Internal to the manager.
#pragma once

#include <accelpool/common/log.hpp>
#include <accelpool/common/result.hpp>
#include <accelpool/common/tls.hpp>
#include <accelpool/manager/core.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace accelpool::manager {

struct StaticDeviceGroup {
  std::string kind = "fpga";
  std::string model;  // "" (not declared): leases of any bitstream may use it (no model to check)
  int count = 1;
  bool passthrough = false;
  std::uint32_t slots = 0;               // partial-reconfiguration slots of each device (HostDevice::slots)
  std::vector<std::string> slot_shapes;  // none, or one per slot in slot order ("" for none; HostDevice::slot_shapes)
};

struct HostConfig {
  std::string name = "local";
  // "sim", "opencl", "xrt" (device backends; several joined with '+', e.g. "sim+opencl") or "static"
  std::string backend = "sim";
  std::map<std::string, std::string> settings;  // the backend's own keys ("<backend>.<key>" with several)
  std::vector<StaticDeviceGroup> devices;       // backend "static" only
};

// One device backend of a host and its own settings.
struct HostBackend {
  std::string name;
  std::map<std::string, std::string> settings;
};

// The backends a device-backend host lists, with their settings: with one backend every settings key is its own;
// with several ("sim+opencl") each key must be "<backend>.<key>" for one of them. Errors: "invalid_config" naming the
// host and the key.
Result<std::vector<HostBackend>> host_backends(const HostConfig& host);

// The manager's bitstream registry ([bitstreams], docs/operations.md).
struct BitstreamsConfig {
  std::filesystem::path dir;  // "" : <data_dir>/bitstreams
  // Folder whose bitstreams are copied in when `dir` does not exist yet. Unset: the sample bitstreams installed
  // or built beside the binary (default_bitstream_seed()); "" disables seeding.
  std::optional<std::filesystem::path> seed;
};

struct TenantConfig {
  std::string name;
  double weight = 1;
  std::uint32_t max_devices = 0;
};

// TLS on a listener ([admin], [guest], [agents]: tls_cert, tls_key, tls_client_ca; docs/operations.md "TLS").
// Paths are absolute (relative ones in the file are taken from its folder). No certificate: plaintext.
struct TlsConfig {
  std::string cert;
  std::string key;
  std::string client_ca;  // [agents] only: clients must present a certificate this CA signed (mutual TLS)
  bool enabled() const { return !cert.empty(); }
};

// The server context of `tls` ([`table`] names the keys in errors); nullptr when TLS is off. Errors: "invalid_config"
// naming the key and the file (common::tls::server_context).
Result<common::tls::Context> server_tls(const TlsConfig& tls, const std::string& table);

// Remote host agents (docs/agent-protocol.md). No address: no agent listener.
struct AgentsConfig {
  std::vector<std::string> listen;  // "IP:PORT" (port 0 picks one) or "unix:PATH"
  std::string token;                // every agent presents it at registration
  std::uint64_t heartbeat_timeout_ms = 15000;
  std::size_t max_connections = 256;  // agent connections, registered or not
  TlsConfig tls;
};

// Several managers on one PostgreSQL store, one leading ([ha], docs/ha.md).
struct HaConfig {
  std::string name;              // this manager among them; "" : the host name and the admin port
  double leader_timeout_s = 10;  // a leader that has not renewed for this long may be replaced (fenced)
  double standby_poll_s = 0.5;   // how often a standby tries to take over
};

// What the manager logs and how ([log], docs/operations.md "Logs").
struct LogConfig {
  log::Level level = log::Level::info;
  log::Format format = log::Format::text;
};

// The Prometheus endpoint ([metrics], docs/operations.md "Metrics").
struct MetricsConfig {
  std::string token;  // "" : GET /metrics needs no token; else this one, or an admin token, as Bearer
  // Distinct tenants (and, separately, bitstreams) that get a label value of their own; later ones share "other".
  std::size_t max_label_values = 32;
};

struct Config {
  std::filesystem::path data_dir = "accelpool-data";
  std::string store_file = "pool.db";  // relative to data_dir
  std::string store_url;  // "postgresql://...": the PostgreSQL store instead of the SQLite file (docs/ha.md)
  HaConfig ha;
  bool full_sync = false;
  bool new_store = false;  // command line only (--new-store): a missing or empty store may start a new pool
  std::string guest_tcp = "127.0.0.1:7070";
  std::string guest_unix = "guest.sock";  // relative to data_dir; "" disables
  bool guest_network_thread = false;      // guest socket I/O on a thread of its own (GuestServerOptions)
  std::size_t guest_max_silent = 64;      // guest connections that sent nothing yet (GuestServerOptions)
  double guest_hello_timeout_s = 2;       // the hello deadline (or request_timeout_s, if shorter)
  std::string admin_listen = "127.0.0.1:7080";
  TlsConfig admin_tls;                // HTTPS for the admin API
  TlsConfig guest_tls;                // TLS on the guest TCP listener (the Unix socket stays plain)
  double admin_header_timeout_s = 5;  // HttpLimits::header_timeout_s
  std::size_t admin_max_connections_per_source = 32;
  CoreOptions core;
  std::size_t max_body_bytes = 1 << 20;
  double request_timeout_s = 10;       // an admin client must send its whole request within this
  std::size_t max_connections = 4096;  // guest connections, and admin connections, each
  bool max_connections_set = false;    // the config file sets it (else the default may shrink to fit the fds)
  std::vector<HostConfig> hosts;       // empty: one "local" host with the sim backend
  std::vector<TenantConfig> tenants;   // created at start when absent; none at all: a "default" tenant
  AgentsConfig agents;
  BitstreamsConfig bitstreams;
  LogConfig log;
  MetricsConfig metrics;

  // How many connections the listeners may hold together (each listener's limit), for the file descriptor budget.
  std::uint64_t connection_budget() const;
  // When max_connections is the default and the connection budget does not fit `fd_limit` descriptors, lowers it
  // to what fits (never below kMinDefaultConnections) and returns a notice saying so.
  std::optional<std::string> fit_default_connections(std::uint64_t fd_limit);
  static constexpr std::size_t kMinDefaultConnections = 64;

  // The registry folder: bitstreams.dir, or <data_dir>/bitstreams.
  std::filesystem::path bitstreams_dir() const;
  // The seed folder to use (see BitstreamsConfig::seed); "" for none.
  std::filesystem::path bitstreams_seed() const;
};

// Where the sample bitstreams of this build or installation are: <exe>/../bitstreams/samples (build tree) or
// <exe>/../share/accelpool/bitstreams (installed); "" when neither exists.
std::filesystem::path default_bitstream_seed();

// Reads a TOML file. Errors: "invalid_config" naming the file, line and key.
Result<Config> load_config(const std::filesystem::path& file);
// The settings used with no config file.
Config default_config();

// "127.0.0.1:7070" -> host, port. Errors: "invalid_config".
Result<std::pair<std::string, unsigned short>> parse_endpoint(const std::string& text);

}  // namespace accelpool::manager
