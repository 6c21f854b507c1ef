// A pool for the stateful harnesses (guest protocol, admin API): a store in a fresh temporary folder, a core over
// one static host with two fpga devices, tenant "a", an admin token and a bitstream registry. Built anew for each
// input, so a finding reproduces from its input alone.
#pragma once

#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/manager/core.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace accelpool::fuzz {

inline constexpr std::string_view kAdminToken = "fuzz-admin-token";
inline constexpr std::string_view kAgentToken = "fuzz-agent-token";

// Stops the harness with a message: the fixture itself could not be built (not a finding in the code under test).
[[noreturn]] inline void setup_failed(const std::string& what) {
  std::fprintf(stderr, "fuzz fixture: %s\n", what.c_str());
  std::abort();
}

struct Pool {
  std::filesystem::path dir;
  manager::ManualClock clock;
  std::deque<std::function<void()>> posted;  // host completions, run by drain() as the owner thread would
  std::unique_ptr<manager::Store> store;
  std::unique_ptr<manager::PoolCore> core;
  std::shared_ptr<manager::ImageCatalog> catalog;
  std::string tenant_token;  // tenant "a"

  Pool() {
    // /dev/shm where it exists: the store's files never touch a disk.
    std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::string templ = (base / "accelpool-fuzz-XXXXXX").string();
    if (!::mkdtemp(templ.data())) setup_failed("cannot create a temporary folder under " + base.string());
    dir = templ;
    auto registry = bitstreams::SharedRegistry::open(dir / "bitstreams", "");
    if (!registry) setup_failed(registry.error().message);
    catalog = std::make_shared<manager::ImageCatalog>(*registry);
    manager::CoreOptions options;
    options.acquire_check = [c = catalog](const manager::AcquireParams& p) { return c->check(p.kind, p.bitstream); };
    auto s = manager::open_sqlite_store(dir / "pool.db", false);
    if (!s) setup_failed(s.error().message);
    store = std::move(*s);
    auto c = manager::PoolCore::create(options, clock, *store);
    if (!c) setup_failed(c.error().message);
    core = std::move(*c);
    std::vector<manager::HostDevice> devices;
    for (int i = 0; i < 2; ++i) devices.push_back({"fpga" + std::to_string(i), "fpga", "fuzz-fpga", false, ""});
    auto poster = [this](std::function<void()> f) { posted.push_back(std::move(f)); };
    if (auto a = core->attach_host(manager::make_static_host("local", devices, poster)); !a) {
      setup_failed(a.error().message);
    }
    auto t = core->create_tenant("a", 1, 0);
    if (!t) setup_failed(t.error().message);
    tenant_token = *t;
    if (auto a = core->set_admin_token(std::string(kAdminToken)); !a) setup_failed(a.error().message);
  }
  ~Pool() {
    core.reset();
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Runs the posted host completions, then what falls due, as the daemon's owner thread does.
  void drain() {
    while (!posted.empty()) {
      auto f = std::move(posted.front());
      posted.pop_front();
      f();
    }
    core->tick();
  }

  // `text` with the placeholders $TOKEN (tenant "a"), $ADMIN and $AGENT replaced by the pool's tokens, so that
  // inputs can reach what lies behind authentication.
  std::string with_tokens(std::string_view text) const {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
      auto starts = [&](std::string_view p) { return text.substr(i, p.size()) == p; };
      if (starts("$TOKEN")) {
        out += tenant_token;
        i += 6;
      } else if (starts("$ADMIN")) {
        out += kAdminToken;
        i += 6;
      } else if (starts("$AGENT")) {
        out += kAgentToken;
        i += 6;
      } else {
        out += text[i++];
      }
    }
    return out;
  }
};

}  // namespace accelpool::fuzz
