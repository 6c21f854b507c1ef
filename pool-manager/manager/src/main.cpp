// accelpool-manager: the pool manager daemon, and offline token commands on its store. See docs/operations.md.
#include "config.hpp"
#include "daemon.hpp"
#include "token_command.hpp"

#include <accelpool/common/cli.hpp>

#include <cstdio>
#include <iostream>
#include <string>

namespace {

constexpr const char* kDescription = R"(accelpool-manager: the accelpool pool manager.

With no config file it runs the embedded default: a data folder ./accelpool-data with the SQLite store, one
local host with simulated devices, guest listeners on 127.0.0.1:7070 and DATA/guest.sock, the admin API on
127.0.0.1:7080. Once its listeners are up, a new pool prints a guest token per new tenant and the admin token,
each shown once (a start that fails creates none). Every setting is described in docs/operations.md.
)";

constexpr const char* kTokenFooter = R"(
Tokens of a stopped manager's store (the data folder's manager.lock tells whether one runs there; a running
manager changes tokens through its admin API). New tokens are printed once; only their hashes are stored.
  token list                     admin token names and tenants
  token create NAME              a new admin token NAME (one per operator)
  token rotate NAME              a new token for admin token NAME; the old one stops working
  token rotate --tenant TENANT   a new guest token for TENANT; the old one stops working
  token revoke NAME              admin token NAME stops working)";

}  // namespace

int main(int argc, char** argv) {
  using namespace accelpool::manager;
  CLI::App app{kDescription};
  accelpool::common::init_cli(app, "accelpool-manager");
  app.get_formatter()->column_width(34);
  std::string config_file, data_dir, guest_tcp, admin, log_level, log_format;
  bool new_store = false;
  app.add_option("--config", config_file, "TOML configuration file (docs/operations.md)")->type_name("FILE");
  app.add_option("--data-dir", data_dir, "data folder (overrides data_dir of the config)")->type_name("DIR");
  auto* guest_tcp_option =
      app.add_option("--guest-tcp", guest_tcp, "guest TCP listener, e.g. 127.0.0.1:0 for any free port (\"\" disables)")
          ->type_name("IP:PORT");
  app.add_option("--admin", admin, "admin API listener, e.g. 127.0.0.1:0")->type_name("IP:PORT");
  app.add_flag("--new-store", new_store,
               "start a new, empty pool even though the store of this data folder is missing or empty (without it "
               "the manager refuses to start then: restore the store from a backup instead)");

  accelpool::common::add_log_options(app, log_level, log_format);

  TokenCommand token;
  auto* token_cmd = app.add_subcommand("token",
                                       "offline: list, create, rotate or revoke the tokens of a stopped "
                                       "manager's store (token --help)");
  token_cmd->footer(kTokenFooter);
  token_cmd->require_subcommand(1);
  token_cmd->fallthrough();  // --data-dir and --config may follow the subcommand too
  auto* list = token_cmd->add_subcommand("list", "admin token names and tenants");
  list->fallthrough();
  auto* create = token_cmd->add_subcommand("create", "a new admin token NAME (printed once)");
  create->fallthrough();
  create->add_option("name", token.name, "the admin token's name, e.g. the operator's")->required();
  auto* rotate = token_cmd->add_subcommand("rotate", "a new token for admin token NAME, or for --tenant's guests");
  rotate->fallthrough();
  auto* rotate_name = rotate->add_option("name", token.name, "the admin token's name");
  auto* rotate_tenant = rotate->add_option("--tenant", token.tenant, "rotate this tenant's guest token instead");
  rotate_name->excludes(rotate_tenant);
  auto* revoke = token_cmd->add_subcommand("revoke", "admin token NAME stops working");
  revoke->fallthrough();
  revoke->add_option("name", token.name, "the admin token's name")->required();

  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  if (rotate->parsed() && token.name.empty() && token.tenant.empty()) {
    std::fprintf(stderr, "accelpool-manager: token rotate needs NAME, or --tenant TENANT\n");
    return 2;
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
  if (token_cmd->parsed()) {
    token.action = list->parsed()     ? TokenCommand::Action::list
                   : create->parsed() ? TokenCommand::Action::create
                   : rotate->parsed() ? TokenCommand::Action::rotate
                                      : TokenCommand::Action::revoke;
    return run_token_command(config, token, std::cout);
  }
  if (guest_tcp_option->count() > 0) config.guest_tcp = guest_tcp;
  if (!admin.empty()) config.admin_listen = admin;
  config.new_store = new_store;
  if (!log_level.empty()) config.log.level = *accelpool::log::parse_level(log_level);
  if (!log_format.empty()) config.log.format = *accelpool::log::parse_format(log_format);
  return run_daemon(config, std::cout);
}
