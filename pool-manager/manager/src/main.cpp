// accelpool-manager: the pool manager daemon. See docs/operations.md.
#include "config.hpp"
#include "daemon.hpp"

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

namespace {

constexpr const char* kUsage = R"(usage: accelpool-manager [--config FILE] [--data-dir DIR] [--new-store]

Runs the accelpool pool manager. With no config file it uses the embedded default: a data folder
./accelpool-data with the SQLite store, one local host with simulated devices, guest listeners on
127.0.0.1:7070 and DATA/guest.sock, the admin API on 127.0.0.1:7080. On first start it prints a guest
token and the admin token once. Every setting is described in docs/operations.md.

  --config FILE    TOML configuration file
  --data-dir DIR   data folder (overrides data_dir of the config)
  --guest-tcp EP   guest TCP listener, e.g. 127.0.0.1:0 for any free port ("" disables)
  --admin EP       admin API listener, e.g. 127.0.0.1:0
  --new-store      start a new, empty pool even though the store of this data folder is missing or empty
                   (without it the manager refuses to start then: restore the store from a backup instead)
  --help           this text
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace accelpool::manager;
  std::string config_file, data_dir, guest_tcp, admin;
  bool have_guest_tcp = false, new_store = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "accelpool-manager: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      out = argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--config") {
      value(config_file);
    } else if (a == "--data-dir") {
      value(data_dir);
    } else if (a == "--guest-tcp") {
      value(guest_tcp);
      have_guest_tcp = true;
    } else if (a == "--admin") {
      value(admin);
    } else if (a == "--new-store") {
      new_store = true;
    } else {
      std::fprintf(stderr, "accelpool-manager: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  Config config = default_config();
  if (!config_file.empty()) {
    auto c = load_config(config_file);
    if (!c) {
      std::fprintf(stderr, "accelpool-manager: %s\n", c.error().message.c_str());
      return 2;
    }
    config = std::move(*c);
  }
  if (!data_dir.empty()) config.data_dir = data_dir;
  if (have_guest_tcp) config.guest_tcp = guest_tcp;
  if (!admin.empty()) config.admin_listen = admin;
  config.new_store = new_store;
  return run_daemon(config, std::cout);
}
