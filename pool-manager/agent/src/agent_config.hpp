// accelpool-agent's configuration file (TOML; every key is documented in docs/hosts.md, "Host agent").
#pragma once

#include <accelpool/backends/config.hpp>
#include <accelpool/common/log.hpp>
#include <accelpool/common/result.hpp>
#include <accelpool/common/tls.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace accelpool::agent {

struct AgentConfig {
  // The managers of the pool, in the order to try them ("127.0.0.1:7071" or "unix:/path"; one or more, e.g. the
  // leader and standbys of a shared store, docs/ha.md): the agent registers with the one that leads, follows a
  // standby's answer to the leader's address, and tries them in turn when a connection fails or ends.
  std::vector<std::string> managers;
  // TLS to the manager (docs/hosts.md): on when tls_ca is set (a TCP manager address only). The context verifies
  // the manager's certificate against tls_ca and presents tls_cert/tls_key when set (mutual TLS).
  std::string tls_ca, tls_cert, tls_key;
  common::tls::Context tls;  // loaded from them; nullptr: plain
  std::string token;
  std::string host;
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds reconnect_min{200};
  std::chrono::milliseconds reconnect_max{10000};
  // Registry folder (created when missing): images it lacks are fetched from the manager over the agent link by
  // sha256 and kept there. Empty: bitstreams are names only (simulated pools).
  std::filesystem::path bitstreams;
  std::filesystem::path state_file;                         // VMs this agent attached devices to; empty: not kept
  std::map<std::string, backends::BackendConfig> backends;  // backend name -> its keys
  // libvirt; an empty uri turns attaching off.
  std::string libvirt_uri;
  std::chrono::milliseconds detach_timeout{30000};
  std::uint32_t shmem_size_mib = 1;
  // Relaying the VMs' guest ports to the manager (needs libvirt); no address turns it off. The managers' guest
  // listeners ("HOST:PORT" or "unix:PATH"), in the order to try them: one, or the leader and standbys of a shared
  // store (docs/ha.md); each VM's port follows a standby's answer to the leader, as the agent link does.
  std::vector<std::string> relay_managers;
  std::string relay_channel = "org.accelpool.guest.0";
  std::chrono::milliseconds relay_scan_interval{1000};
  // What the agent logs and how ([log] level, format; docs/hosts.md "Host agent").
  log::Level log_level = log::Level::info;
  log::Format log_format = log::Format::text;
};

// Reads and checks the file. Unknown tables and keys are errors. Errors: "invalid_config" naming the file, the
// key and what is wrong; "not_found" when the file cannot be read.
Result<AgentConfig> load_agent_config(const std::filesystem::path& file);

}  // namespace accelpool::agent
