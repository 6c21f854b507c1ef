#include "token_command.hpp"

#include "data_lock.hpp"

#include <accelpool/manager/auth.hpp>
#include <accelpool/manager/store.hpp>

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace accelpool::manager {

int run_token_command(const Config& config, const TokenCommand& command, std::ostream& out) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "accelpool-manager token: %s\n", what.c_str());
    return 1;
  };
  const auto file = config.data_dir / config.store_file;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec) || std::filesystem::file_size(file, ec) == 0) {
    return fail("no store at " + file.string() + " (start the manager once to create its pool, or pass --data-dir)");
  }
  auto lock = DataLock::acquire(config.data_dir);
  if (!lock) {
    return fail(lock.error().message + "; stop it first, or change tokens through its admin API (docs/operations.md)");
  }
  auto store = open_sqlite_store(file, config.full_sync);
  if (!store) return fail(store.error().message);
  auto snap = (*store)->load(0);
  if (!snap) return fail(snap.error().message);
  AdminTokens admins(snap->meta);
  Batch batch;
  switch (command.action) {
    case TokenCommand::Action::list:
      for (const auto& name : admins.names()) out << "admin  " << name << "\n";
      for (const auto& t : snap->tenants) out << "tenant " << t.name << "\n";
      return 0;
    case TokenCommand::Action::create:
    case TokenCommand::Action::rotate: {
      if (!command.tenant.empty()) {
        auto it = std::find_if(snap->tenants.begin(), snap->tenants.end(),
                               [&](const TenantRecord& t) { return t.name == command.tenant; });
        if (it == snap->tenants.end()) return fail("no tenant " + command.tenant);
        std::string token = new_tenant_token(*it);
        batch.tenants.push_back(*it);
        if (auto s = (*store)->apply(batch); !s) return fail(s.error().message);
        out << "guest token for tenant " << command.tenant << " (shown once): " << token << "\n";
        return 0;
      }
      bool replace = command.action == TokenCommand::Action::rotate;
      auto token = admins.issue(command.name, replace, batch.meta);
      if (!token) return fail(token.error().message);
      if (auto s = (*store)->apply(batch); !s) return fail(s.error().message);
      out << "admin token " << command.name << " (shown once): " << *token << "\n";
      return 0;
    }
    case TokenCommand::Action::revoke: {
      if (auto s = admins.revoke(command.name, batch.meta); !s) return fail(s.error().message);
      if (auto s = (*store)->apply(batch); !s) return fail(s.error().message);
      out << "admin token " << command.name << " revoked\n";
      if (admins.empty()) out << "no admin token is left: the manager's next start creates one and prints it\n";
      return 0;
    }
  }
  return 2;
}

}  // namespace accelpool::manager
