// The daemon's configuration (TOML, docs/operations.md lists every key). Internal to the manager.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/manager/core.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace accelpool::manager {

struct StaticDeviceGroup {
  std::string kind = "fpga";
  std::string model = "static";
  int count = 1;
  bool passthrough = false;
};

struct HostConfig {
  std::string name = "local";
  std::string backend = "sim";                  // "sim", "opencl", "xrt" (device backends) or "static"
  std::map<std::string, std::string> settings;  // the backend's own keys
  std::vector<StaticDeviceGroup> devices;       // backend "static" only
};

struct TenantConfig {
  std::string name;
  double weight = 1;
  std::uint32_t max_devices = 0;
};

// Remote host agents (docs/agent-protocol.md). No address: no agent listener.
struct AgentsConfig {
  std::vector<std::string> listen;        // "IP:PORT" (port 0 picks one) or "unix:PATH"
  std::string token;                      // every agent presents it at registration
  std::uint64_t heartbeat_timeout_ms = 15000;
};

struct Config {
  std::filesystem::path data_dir = "accelpool-data";
  std::string store_file = "pool.db";  // relative to data_dir
  bool full_sync = false;
  std::string guest_tcp = "127.0.0.1:7070";
  std::string guest_unix = "guest.sock";  // relative to data_dir; "" disables
  std::string admin_listen = "127.0.0.1:7080";
  CoreOptions core;
  std::size_t max_body_bytes = 1 << 20;
  double request_timeout_s = 10;    // an admin client must send its whole request within this
  std::size_t max_connections = 4096;
  std::vector<HostConfig> hosts;    // empty: one "local" host with the sim backend
  std::vector<TenantConfig> tenants;  // created at start when absent; none at all: a "default" tenant
  AgentsConfig agents;
};

// Reads a TOML file. Errors: "config" naming the file, line and key.
Result<Config> load_config(const std::filesystem::path& file);
// The settings used with no config file.
Config default_config();

// "127.0.0.1:7070" -> host, port. Errors: "config".
Result<std::pair<std::string, unsigned short>> parse_endpoint(const std::string& text);

}  // namespace accelpool::manager
