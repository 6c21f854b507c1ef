// The daemon: one io_context on one thread (the owner) owns the pool. Guest calls, the admin API, host
// completions and timers all run as handlers on it, so the core is never touched concurrently. Guest socket I/O
// runs there too, or on the guest server's network thread ([guest] network_thread), which posts calls to it.
#include "daemon.hpp"

#include "admin_api.hpp"
#include "admin_http.hpp"
#include "data_lock.hpp"
#include "event_stream.hpp"
#include "guest_protocol.hpp"
#include "guest_server.hpp"
#include "host_event_queue.hpp"
#include "lease_log.hpp"
#include "metrics.hpp"
#include "standby_server.hpp"
#include "store_writer.hpp"

#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/common/listener_limits.hpp>
#include <accelpool/common/log.hpp>
#include <accelpool/manager/auth.hpp>
#include <accelpool/manager/core.hpp>

#ifdef ACCELPOOL_HAVE_BACKENDS
#include <accelpool/backends/factory.hpp>
#endif
#ifdef ACCELPOOL_HAVE_AGENT_LINK
#include <accelpool/manager/agent_listener.hpp>
#endif

#include <boost/asio.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>

namespace accelpool::manager {

extern const char* const kOpenApiYaml;  // openapi_text.cpp, generated from docs/api/openapi.yaml

namespace asio = boost::asio;

namespace {

Status write_endpoints(const std::filesystem::path& dir, const std::string& admin, const std::string& tcp_ep,
                       const std::string& unix_path, const std::string& agents) {
  auto tmp = dir / "endpoints.json.tmp";
  {
    std::ofstream o(tmp);
    o << "{\"admin\":\"" << admin << "\",\"guest_tcp\":\"" << tcp_ep << "\",\"guest_unix\":\"" << unix_path
      << "\",\"agents\":\"" << agents << "\",\"pid\":" << getpid() << "}\n";
    if (!o) return make_error(Errc::io_error, "cannot write " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dir / "endpoints.json", ec);
  if (ec) return make_error(Errc::io_error, "cannot write " + (dir / "endpoints.json").string() + ": " + ec.message());
  return Status::ok();
}

// A host reported a device's health (an agent, or the in-process host's runtime): a failed device is not granted.
void device_health(PoolCore& core, const std::string& host, const std::string& device, const std::string& health,
                   const std::string& detail) {
  std::string name = host + "/" + device;
  bool usable = health != "failed";
  if (!usable) log::warn("device failed", {{"device", name}, {"detail", detail}});
  if (auto s = core.set_device_usable(name, usable); !s) {
    log::warn("device health not applied", {{"device", name}, {"health", health}, {"error", s.error().message}});
  }
}

Result<std::unique_ptr<HostDriver>> make_host(const HostConfig& h, const std::shared_ptr<ImageCatalog>& catalog,
                                              Poster post, DeviceHealth on_health) {
  if (h.backend == "static") {
    std::vector<HostDevice> devs;
    std::map<std::string, int> next;
    for (const auto& g : h.devices) {
      for (int i = 0; i < g.count; ++i) {
        HostDevice d{g.kind + std::to_string(next[g.kind]++), g.kind, g.model, g.passthrough, ""};
        d.slots = g.slots;
        d.slot_shapes = g.slot_shapes;
        devs.push_back(std::move(d));
      }
    }
    return make_static_host(h.name, std::move(devs), std::move(post));
  }
  if (!h.devices.empty())
    return make_error(Errc::invalid_config, "host " + h.name + ": 'devices' is only for backend \"static\"");
#ifdef ACCELPOOL_HAVE_BACKENDS
  auto listed = host_backends(h);
  if (!listed) return listed.error();
  std::vector<std::unique_ptr<backends::DeviceBackend>> made;
  for (const auto& b : *listed) {
    auto backend = backends::make_backend(b.name, b.settings);
    if (!backend) return make_error(Errc::invalid_config, "host " + h.name + ": " + backend.error().message);
    made.push_back(std::move(*backend));
  }
  auto host = make_local_host(h.name, std::move(made), catalog, std::move(post), std::move(on_health));
  if (!host) return make_error(Errc::invalid_config, host.error().message);
  return std::move(*host);
#else
  (void)catalog;
  (void)on_health;
  return make_error(Errc::invalid_config,
                    "host " + h.name + ": this build has no device backends; use backend = \"static\"");
#endif
}

// This manager as the other managers of a shared store see it, from its configuration (addresses as configured;
// published as bound once it leads).
ManagerInfo configured_identity(const Config& config) {
  ManagerInfo me;
  me.name = config.ha.name;
  if (me.name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    me.name = std::string(host) + ":" + config.admin_listen.substr(config.admin_listen.rfind(':') + 1);
  }
  me.admin_url = (config.admin_tls.enabled() ? "https://" : "http://") + config.admin_listen;
  me.guest_tcp = config.guest_tcp;
  if (!config.agents.listen.empty()) me.agents = config.agents.listen.front();
  return me;
}

// This manager stops leading at once: it says why and exits with kSteppedDownExit, before it answers anything
// more (docs/ha.md). What it had not made durable was never acknowledged.
[[noreturn]] void step_down(const Error& why) {
  log::error("stepping down", {{"error", why.message}});
  log::flush();
  std::_Exit(kSteppedDownExit);
}

// A shared store as one PoolCore uses it: every call goes to the store, except those a subclass overrides.
class SharedStoreUse : public Store {
 public:
  explicit SharedStoreUse(SharedStore& store) : store_(store) {}
  Result<Snapshot> load(std::size_t recent_ended) override { return store_.load(recent_ended); }
  Status apply(const Batch& batch) override { return store_.apply(batch); }
  Result<std::optional<Lease>> lease(LeaseId id) override { return store_.lease(id); }
  Result<std::vector<Lease>> ended_leases(const LeaseFilter& filter, const LeasePageSpec& spec) override {
    return store_.ended_leases(filter, spec);
  }
  Status backup(const std::filesystem::path& dest) override { return store_.backup(dest); }

 protected:
  SharedStore& store_;
};

// The leader's shared store: a commit that finds the lead lost ("fenced") or the database connection gone
// ("disconnected") steps down (exit status 3) instead of failing, which would stop the core as a store that
// cannot write does (abort). A lost connection is no broken store: the session, and with it the lead, is gone, and
// a standby takes over from what was committed. Every other failure is the core's to handle.
class LeaderStore final : public SharedStoreUse {
 public:
  using SharedStoreUse::SharedStoreUse;
  Status apply(const Batch& batch) override {
    Status s = store_.apply(batch);
    if (!s && (s.error().code == Errc::fenced || s.error().code == Errc::disconnected)) step_down(s.error());
    return s;
  }
};

// A shared store as a standby's view of the pool uses it: reads go to the store; a batch the view's core commits
// (restoring the pool writes, e.g. live leases' fresh TTLs) is dropped, never written, so the view's changes stay
// in its memory and the standby never writes the leader's store.
class ReadOnlyStore final : public SharedStoreUse {
 public:
  using SharedStoreUse::SharedStoreUse;
  Status apply(const Batch&) override { return Status::ok(); }
  Status backup(const std::filesystem::path&) override {
    return make_error(Errc::not_leader, "a standby does not back up the store");
  }
};

// The admin reads a standby serves (GET): the admin API over the pool as the store holds it, restored as a
// takeover would (but with no host attached: every host shows as not connected), loaded again when older than
// kStandbyViewAge. Never commits: its core's changes stay in memory. Errors: a 503 naming the store's error.
class StandbyView {
 public:
  StandbyView(SharedStore& store, const Config& config) : store_(store), config_(config), reader_(store) {}

  ApiResponse handle(const ApiRequest& request) {
    const auto now = std::chrono::steady_clock::now();
    if (!api_ || now - loaded_ > kStandbyViewAge) {
      api_.reset();
      metrics_.reset();
      core_.reset();
      auto core = PoolCore::create(config_.core, clock_, reader_);
      if (!core)
        return AdminApi::error(Errc::store, "standby: cannot read the pool from the store: " + core.error().message);
      core_ = std::move(*core);
      metrics_ = std::make_unique<Metrics>(*core_, config_.metrics.max_label_values);
      api_ = std::make_unique<AdminApi>(*core_, *metrics_, kOpenApiYaml, [] { return false; });
      api_->set_metrics_token(config_.metrics.token);
      api_->set_leadership([this] { return store_.leadership(); });
      loaded_ = now;
    }
    return api_->handle(request);
  }

 private:
  static constexpr auto kStandbyViewAge = std::chrono::seconds(1);
  SharedStore& store_;
  const Config& config_;
  ReadOnlyStore reader_;
  SystemClock clock_;
  std::unique_ptr<PoolCore> core_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<AdminApi> api_;
  std::chrono::steady_clock::time_point loaded_{};
};

// Blocks until this manager leads the shared store: meanwhile it is a standby, which announces itself, tries to
// take over every standby_poll_s, says on stderr who leads (once per leader), and on the addresses it will serve
// once it leads tells clients where the leader is and serves admin reads from the store (StandbyServer,
// StandbyView; its TLS listeners stay closed). Errors: the
// store's, or a standby address that cannot be bound.
Status wait_for_leadership(SharedStore& store, const ManagerInfo& me, const Config& config) {
  const HaConfig& ha = config.ha;
  asio::io_context ioc(1);
  StandbyAddresses at;
  if (!config.guest_tcp.empty()) at.guest_tcp = config.guest_tcp;
  at.guest_tls = config.guest_tls.enabled();
  if (!config.guest_unix.empty()) {
    std::filesystem::path p = config.guest_unix;
    at.guest_unix = (p.is_relative() ? config.data_dir / p : p).string();
  }
  if (!config.agents.listen.empty() && !config.agents.tls.enabled()) at.agents = config.agents.listen.front();
  if (!config.admin_tls.enabled()) at.admin = config.admin_listen;
  StandbyView view(store, config);
  std::unique_ptr<StandbyServer> standby;
  std::uint64_t told = 0;
  const auto poll = std::chrono::microseconds(static_cast<long>(ha.standby_poll_s * 1e6));
  while (true) {
    auto led = store.try_lead(me, ha.leader_timeout_s);
    if (!led) return led.error();
    if (*led) {
      // Its listeners close before the leader's bind the same addresses.
      standby.reset();
      ioc.restart();
      ioc.poll();
      log::info("leading the pool", {{"manager", me.name}, {"epoch", store.epoch()}});
      return Status::ok();
    }
    if (auto s = store.announce(me, ha.leader_timeout_s); !s) return s;
    auto leading = store.leadership();
    if (!leading) return leading.error();
    if (!standby) {
      auto started = StandbyServer::start(ioc, at, me.name, [&view](const ApiRequest& r) { return view.handle(r); });
      if (!started) return started.error();
      standby = std::move(*started);
    }
    standby->set_leader(*leading);
    if (leading->epoch != told) {
      told = leading->epoch;
      log::info("standby: another manager leads; taking over when it is gone",
                {{"manager", me.name},
                 {"leader", leading->leader.name},
                 {"epoch", leading->epoch},
                 {"leader_admin", leading->leader.admin_url}});
    }
    ioc.restart();
    ioc.run_for(poll);
  }
}

}  // namespace

int run_daemon(const Config& given, std::ostream& out) {
  Config config = given;
  log::configure("accelpool-manager", config.log.level, config.log.format);
  // A peer that goes while TLS writes to it (OpenSSL writes with write(2) on the agent link) is an EPIPE error
  // for that connection, not the end of the manager.
  std::signal(SIGPIPE, SIG_IGN);
  auto fail = [](const std::string& what) {
    log::error("start failed", {{"error", what}});
    return 1;
  };
  // Every connection the limits allow must get a file descriptor: accept() never runs out in normal operation.
  auto fd_limit = common::raise_fd_limit();
  if (!fd_limit) return fail(fd_limit.error().message);
  if (auto notice = config.fit_default_connections(*fd_limit))
    log::warn("connection limit lowered", {{"detail", *notice}});
  if (auto s =
          common::check_fd_budget(config.connection_budget(), *fd_limit,
                                  "[limits] max_connections for guests and for the admin API" +
                                      std::string(config.agents.listen.empty() ? "" : ", [agents] max_connections"));
      !s) {
    return fail(s.error().message);
  }
  std::error_code fec;
  std::filesystem::create_directories(config.data_dir, fec);
  if (fec) return fail("cannot create data folder " + config.data_dir.string() + ": " + fec.message());
  // One manager per data folder (and no offline `accelpool-manager token` meanwhile).
  auto lock = DataLock::acquire(config.data_dir);
  if (!lock) return fail(lock.error().message);

  asio::io_context ioc(1);
  // Host completions run on the owner thread, a slice at a time (HostEventQueue), and their changes join the next
  // group commit (requested when the queue runs dry and every few slices of a storm, or by a guest call).
  std::function<void()> request_commit = [] {};
  HostEventQueue host_events(ioc, [&request_commit] { request_commit(); });
  Poster post = [&host_events](std::function<void()> f) { host_events.post(std::move(f)); };

  // The store first: a store refused (e.g. lost, see --new-store) leaves nothing else created. On a shared
  // (PostgreSQL) store this manager waits as a standby until it leads; then it restores the pool from the store
  // as a restart does (leases continue, each with a fresh TTL).
  std::unique_ptr<SharedStore> shared_store;  // PostgreSQL: the connection, used through `store` (LeaderStore)
  std::unique_ptr<Store> store;
  SharedStore* shared = nullptr;
  if (config.store_url.empty()) {
    auto opened = open_sqlite_store(config.data_dir / config.store_file, config.full_sync,
                                    config.new_store ? StoreCreation::allow_new : StoreCreation::first_only);
    if (!opened) return fail(opened.error().message);
    store = std::move(*opened);
  } else {
    auto opened = open_postgres_store(config.store_url);
    if (!opened) return fail(opened.error().message);
    shared = opened->get();
    if (auto s = wait_for_leadership(*shared, configured_identity(config), config); !s) return fail(s.error().message);
    shared_store = std::move(*opened);
    store = std::make_unique<LeaderStore>(*shared);
  }

  // The bitstream registry: in-process hosts program its images, agents get their sha256, acquires are checked.
  auto registry = bitstreams::SharedRegistry::open(config.bitstreams_dir(), config.bitstreams_seed());
  if (!registry) return fail(registry.error().message);
  for (const auto& r : (*registry)->rejected()) {
    log::warn("bitstream left out", {{"error", r.error.message}});
  }
  // An empty registry is legal (a pool of names only) but usually a missing seed: say so, since every acquire that
  // names a bitstream for a kind an in-process host serves will be refused.
  if ((*registry)->list().empty()) {
    log::warn("bitstream registry empty",
              {{"dir", (*registry)->dir().string()},
               {"detail",
                "acquires naming a bitstream are refused (not_found) until one is registered (accelpoolctl "
                "bitstreams register FILE.toml; [bitstreams] seed fills a new registry, docs/bitstreams.md)"}});
  }
  auto catalog = std::make_shared<ImageCatalog>(*registry);
  CoreOptions core_options = config.core;
  answer_from_catalog(core_options, catalog);

  SystemClock clock;
  auto core_r = PoolCore::create(core_options, clock, *store);
  if (!core_r) return fail(core_r.error().message);
  std::unique_ptr<PoolCore> core = std::move(*core_r);

  std::vector<HostConfig> hosts = config.hosts;
  if (hosts.empty()) {
    HostConfig h;
    h.name = "local";
#ifdef ACCELPOOL_HAVE_BACKENDS
    h.backend = "sim";
    for (const auto& b : backends::built_backends()) {
      if (b == "opencl") {
        h.backend += "+opencl";  // PoCL (or GPU) devices when the ICD loader reports any
        // served to programs on this machine through libaccelpool-opencl.so (docs/remote-opencl.md)
        h.settings["opencl.remote_listen"] = "127.0.0.1:0";
      }
    }
#else
    h.backend = "static";
    h.devices.push_back({"fpga", "static", 4, false});
#endif
    hosts.push_back(h);
  }
  for (const auto& h : hosts) {
    auto driver = make_host(
        h, catalog, post,
        [&core, host = h.name](const std::string& device, const std::string& health, const std::string& detail) {
          device_health(*core, host, device, health, detail);
        });
    if (!driver) return fail(driver.error().message);
    // Devices the host found failed (its first health check) join unusable: never granted while so.
    PoolCore::HostReport report;
    auto listed = (*driver)->devices();
    if (!listed) return fail("host " + h.name + ": " + listed.error().message);
    for (const auto& d : *listed)
      if (!d.usable) report.unusable.insert(d.local_id);
    if (auto s = core->attach_host(std::move(*driver), report); !s)
      return fail("host " + h.name + ": " + s.error().message);
    log::info("host joined", {{"host", h.name}, {"agent", false}, {"unusable", report.unusable.size()}});
  }

#ifdef ACCELPOOL_HAVE_AGENT_LINK
  // Remote host agents: every event arrives through the Poster, on this thread.
  std::unique_ptr<agent::AgentListener> agents;
  std::string agents_text;
  if (!config.agents.listen.empty()) {
    agent::ListenerEvents ev;
    ev.host_joined = [&core](std::unique_ptr<agent::RemoteHost> h) -> Status {
      std::string name = h->name();
      PoolCore::HostReport report;
      for (const auto& d : h->registered_devices()) {
        if (d.health == "failed" || d.attach_state == "quarantined") report.unusable.insert(d.device.local_id);
        if (!d.vm.empty()) report.serving[d.device.local_id] = d.vm;
      }
      bool returning = !core->host_live(name) && core->host_known(name);
      if (auto s = core->attach_host(std::move(h), report); !s) {
        Error why = s.error();
        if (why.code == Errc::conflict)
          why.message +=
              " (a host the manager runs itself, or another live agent, has this name: give the agent "
              "another [agent] host)";
        log::warn("host refused", {{"host", name}, {"error", why.message}});
        return why;
      }
      log::info(returning ? "host returned" : "host joined",
                {{"host", name}, {"agent", true}, {"unusable", report.unusable.size()}});
      return Status::ok();
    };
    ev.host_lost = [&core](const std::string& host, const Error& why) {
      log::warn("host lost", {{"host", host}, {"reason", why.message}});
      if (auto s = core->host_lost(host); !s)
        log::warn("host loss not applied", {{"host", host}, {"error", s.error().message}});
    };
    ev.vm_stopped = [&core](const std::string& host, const agent::VmStopped& vm) {
      std::string reason = "VM " + (vm.vm_name.empty() ? vm.vm_uuid : vm.vm_name) + " on host " + host + " " +
                           (vm.reason.empty() ? std::string("stopped") : vm.reason);
      std::size_t n = 0;
      if (!vm.vm_name.empty()) n += core->end_guest_leases(host, vm.vm_name, reason).size();
      if (!vm.vm_uuid.empty() && vm.vm_uuid != vm.vm_name) n += core->end_guest_leases(host, vm.vm_uuid, reason).size();
      log::info("vm stopped", {{"host", host}, {"reason", reason}, {"leases_ended", n}});
    };
    ev.device_health = [&core](const std::string& host, const std::string& device, const std::string& health,
                               const std::string& detail) { device_health(*core, host, device, health, detail); };
    agent::ListenerOptions lo;
    lo.listen = config.agents.listen;
    lo.token = config.agents.token;
    lo.heartbeat_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.agents.heartbeat_timeout_ms));
    lo.max_connections = config.agents.max_connections;
    lo.images = catalog->registry();  // agents fetch the images they lack over their link
    auto agents_tls = server_tls(config.agents.tls, "agents");
    if (!agents_tls) return fail(agents_tls.error().message);
    lo.tls = *agents_tls;
    auto l = agent::AgentListener::create(std::move(lo), std::move(ev), post,
                                          [&ioc](std::function<void()> f) { asio::post(ioc, std::move(f)); });
    if (!l) return fail("agents.listen: " + l.error().message);
    agents = std::move(*l);
    for (const auto& a : config.agents.listen) {
      if (a.rfind("unix:", 0) == 0) continue;
      agents_text = a.substr(0, a.rfind(':')) + ":" + std::to_string(agents->tcp_port());
      break;
    }
    if (agents_text.empty()) agents_text = config.agents.listen.front();
  }
#else
  std::string agents_text;
  if (!config.agents.listen.empty()) return fail("agents.listen: this build has no agent listener");
#endif

  Metrics metrics(*core, config.metrics.max_label_values);
  GuestProtocol protocol(*core);
  protocol.set_relay_token(config.agents.token);  // host agents relay their VMs' ports with it
  GuestServerOptions guest_options;
  guest_options.max_connections = config.max_connections;
  guest_options.max_silent = config.guest_max_silent;
  guest_options.hello_timeout = std::chrono::milliseconds(
      static_cast<long>(std::min(config.guest_hello_timeout_s, config.request_timeout_s) * 1000));
  guest_options.network_thread = config.guest_network_thread;
  GuestServer guests(ioc, protocol, guest_options);
  core->add_listener(&metrics);
  LeaseLog lease_log;
  core->add_listener(&lease_log);
  core->add_listener(&guests.hub());

  // Time-driven work: expiries, revocation deadlines, scheduler ticks.
  asio::steady_timer timer(ioc);
  std::function<void()> arm;
  double armed_for = -1;
  arm = [&] {
    auto w = core->next_wakeup();
    double now = clock.now();
    double at = w ? std::min(*w, now + 1.0) : now + 1.0;
    if (armed_for > 0 && armed_for <= at && armed_for > now) return;  // already due earlier
    armed_for = at;
    timer.expires_after(std::chrono::microseconds(static_cast<long>(std::max(0.0, at - now) * 1e6) + 1000));
    timer.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      armed_for = -1;
      core->tick();
      request_commit();
    });
  };
  // The dashboards' live view (GET /v1/events): after a commit that changed something, the admin server sends its
  // watchers what changed, at most every kStreamInterval (one refresh serves every watcher). The stream reads
  // again only what the commits touched, kStreamSlice devices, hosts or leases per turn of this thread (guests'
  // calls run between the slices), and nothing while none watch.
  constexpr auto kStreamInterval = std::chrono::milliseconds(250);
  constexpr std::size_t kStreamSlice = 256;
  EventStream events(*core, clock);
  core->track_touched(true);
  AdminServer* watched = nullptr;  // the admin server, once it runs
  asio::steady_timer publish_timer(ioc);
  bool publish_armed = false;
  std::chrono::steady_clock::time_point last_publish{};
  std::function<void()> publish_step = [&] {
    if (!events.work(kStreamSlice)) return asio::post(ioc, publish_step);
    publish_armed = false;
    watched->publish();
    last_publish = std::chrono::steady_clock::now();
  };
  auto request_publish = [&] {
    if (!watched || publish_armed || watched->watchers() == 0) return;
    publish_armed = true;
    publish_timer.expires_at(std::max(std::chrono::steady_clock::now(), last_publish + kStreamInterval));
    publish_timer.async_wait([&](boost::system::error_code ec) {
      if (ec) {
        publish_armed = false;
        return;
      }
      publish_step();
    });
  };
  // Group commit, pipelined: one transaction for everything handled since the last one, written here when the
  // store writes quickly, else on the store writer's thread while this thread goes on serving (StoreWriter); once
  // it is durable, the replies held for it go out, then its notifications. At most one transaction is in flight;
  // what is handled meanwhile waits for the next one.
  StoreWriter writer(*store);
  const auto owner_thread = std::this_thread::get_id();
  struct InFlight {
    std::uint64_t id = 0;
    PoolCore::Commit commit;  // without its batch, which the writer has
    HeldReplies held;
    PoolCore::Touched touched;
    bool changed = false;
    std::optional<std::chrono::steady_clock::time_point> writing_since;  // none: nothing to write
  };
  std::optional<InFlight> in_flight;
  std::uint64_t commits_started = 0;
  bool commit_wanted = false;  // a commit was asked for while one was in flight
  // The transaction in flight is durable (written on the store writer's thread, or on this one): its replies,
  // notifications and the dashboards' view follow.
  auto complete_commit = [&](bool on_writer) {
    InFlight done = std::move(*in_flight);
    in_flight.reset();
    if (done.writing_since) {
      metrics.commit_written(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *done.writing_since).count(), on_writer);
    }
    guests.send_held(std::move(done.held));
    core->finish_commit(std::move(done.commit));
    events.note(std::move(done.touched));
    arm();
    if (done.changed) request_publish();
  };
  // Starts a transaction of everything pending (or asks for one after the transaction in flight).
  auto start_commit = [&] {
    if (in_flight) {
      commit_wanted = true;
      return;
    }
    commit_wanted = false;
    const bool changed = core->has_uncommitted();
    PoolCore::Commit commit = core->take_commit();
    Batch batch = std::move(commit.batch);
    in_flight =
        InFlight{.id = ++commits_started,
                 .commit = std::move(commit),
                 .held = guests.take_held(),
                 .touched = core->take_touched(),
                 .changed = changed,
                 .writing_since = batch.empty() ? std::nullopt : std::optional(std::chrono::steady_clock::now())};
    if (batch.empty()) return complete_commit(false);
    writer.write(std::move(batch), [&, id = in_flight->id](Status s) {
      if (!s) PoolCore::fail_store(s.error());  // the process ends before anything more is sent
      if (std::this_thread::get_id() == owner_thread) return complete_commit(false);  // written here
      asio::post(ioc, [&, id] {
        if (!in_flight || in_flight->id != id) return;  // commit_now completed it already
        complete_commit(true);
        if (commit_wanted) request_commit();
      });
    });
  };
  // Everything handled so far durable before this returns, its replies sent (the admin API's writes, startup and
  // shutdown): waits for the transaction in flight, then writes the rest on this thread.
  auto commit_now = [&] {
    if (in_flight) {
      writer.wait_idle();
      complete_commit(true);  // a quick one would have been completed where it was written
    }
    const bool changed = core->has_uncommitted();
    HeldReplies held = guests.take_held();
    core->commit([&] { guests.send_held(std::move(held)); });
    events.note(core->take_touched());
    arm();
    if (changed) request_publish();
  };
  // Calls the network thread already queued behind the commit join it: under load one transaction (and one
  // write per connection) then covers many calls. Bounded, so a steady stream of calls cannot hold replies back.
  bool commit_posted = false;
  constexpr int kMaxCommitDeferrals = 4;
  int deferrals = 0;
  std::function<void()> run_commit = [&] {
    if (deferrals < kMaxCommitDeferrals && guests.calls_waiting() > 0) {
      ++deferrals;
      asio::post(ioc, run_commit);
      return;
    }
    deferrals = 0;
    commit_posted = false;
    start_commit();
  };
  request_commit = [&] {
    if (commit_posted) return;
    commit_posted = true;
    asio::post(ioc, run_commit);
  };
  guests.set_commit_request([&] { request_commit(); });
  core->set_group_commit(true);
  arm();

  std::string tcp_text, unix_text;
  if (!config.guest_tcp.empty()) {
    auto guest_tls = server_tls(config.guest_tls, "guest");
    if (!guest_tls) return fail(guest_tls.error().message);
    auto bound = guests.listen_tcp(config.guest_tcp, *guest_tls);
    if (!bound) return fail(bound.error().message);
    tcp_text = *bound;
  }
  if (!config.guest_unix.empty()) {
    std::filesystem::path p = config.guest_unix;
    if (p.is_relative()) p = config.data_dir / p;
    auto bound = guests.listen_unix(p);
    if (!bound) return fail(bound.error().message);
    unix_text = *bound;
  }
  guests.start();

  AdminApi api(
      *core, metrics, kOpenApiYaml,
      [&] { return !core->device_page({}, PageSpec{.after = {}, .limit = 1}).devices.empty(); }, [&] { commit_now(); });
  api.set_catalog(catalog);
  api.set_poster(post);  // uploads are written and verified on the catalog's worker, answered back here
  api.set_agent_token(config.agents.token);
  api.set_metrics_token(config.metrics.token);
  if (shared) api.set_leadership([shared] { return shared->leadership(); });
  auto admin_ep = parse_endpoint(config.admin_listen);
  if (!admin_ep) return fail("admin.listen: " + admin_ep.error().message);
  HttpLimits limits;
  limits.max_body_bytes = config.max_body_bytes;
  limits.request_timeout_s = config.request_timeout_s;
  limits.max_connections = config.max_connections;
  limits.header_timeout_s = config.admin_header_timeout_s;
  limits.max_connections_per_source = config.admin_max_connections_per_source;
  auto admin_tls = server_tls(config.admin_tls, "admin");
  if (!admin_tls) return fail(admin_tls.error().message);
  auto admin = AdminServer::start(ioc, admin_ep->first, admin_ep->second, api, limits, &events, *admin_tls);
  if (!admin) return fail(admin.error().message);
  watched = admin->get();
  watched->on_watch([&] { request_publish(); });
  // Tenants and tokens, only now that every listener is bound: a start that failed before created none. Created
  // ones print their token once, after the commit that stores their hashes.
  std::vector<TenantConfig> tenants = config.tenants;
  if (tenants.empty() && core->tenants().empty()) tenants.push_back({"default", 1, 0});
  std::set<std::string> known;
  for (const auto& t : core->tenants()) known.insert(t.name);
  std::vector<std::string> token_lines;
  for (const auto& t : tenants) {
    if (known.count(t.name)) {
      if (auto s = core->update_tenant(t.name, t.weight, t.max_devices); !s)
        return fail("tenant " + t.name + ": " + s.error().message);
      continue;
    }
    auto token = core->create_tenant(t.name, t.weight, t.max_devices);
    if (!token) return fail("tenant " + t.name + ": " + token.error().message);
    token_lines.push_back("guest token for tenant " + t.name + " (shown once): " + *token);
  }
  if (!core->has_admin_token()) {
    auto token = core->issue_admin_token(std::string(AdminTokens::kFirstName));
    if (!token) return fail(token.error().message);
    token_lines.push_back("admin token (shown once): " + *token);
  }
  commit_now();
  for (const auto& line : token_lines) out << line << "\n";

  std::string admin_url =
      (*admin_tls ? "https://" : "http://") + admin_ep->first + ":" + std::to_string((*admin)->port());
  out << "accelpool-manager: admin API " << admin_url << " (metrics at " << admin_url << "/metrics)\n";
  if (!tcp_text.empty())
    out << "accelpool-manager: guests on " << (config.guest_tls.enabled() ? "tls " : "tcp ") << tcp_text << "\n";
  if (!unix_text.empty()) out << "accelpool-manager: guests on unix " << unix_text << "\n";
  if (!agents_text.empty()) out << "accelpool-manager: host agents on " << agents_text << "\n";
  if (shared) {
    // Clients and standbys learn where the leader is from the store: the addresses as bound (ports chosen now).
    ManagerInfo bound = configured_identity(config);
    bound.admin_url = admin_url;
    bound.guest_tcp = tcp_text;
    bound.agents = agents_text;
    if (auto s = shared->publish(bound); !s) return fail(s.error().message);
    out << "accelpool-manager: store PostgreSQL, leading as " << bound.name << " (epoch " << shared->epoch()
        << "), policy " << core->policy() << "\n";
  } else {
    out << "accelpool-manager: store " << (config.data_dir / config.store_file).string() << ", policy "
        << core->policy() << "\n";
  }
  out << "accelpool-manager: bitstream registry " << catalog->registry()->dir().string() << " ("
      << catalog->registry()->list().size() << " bitstreams)\n";
  out.flush();
  log::info("serving", {{"admin", admin_url},
                        {"guest_tcp", tcp_text},
                        {"guest_unix", unix_text},
                        {"agents", agents_text},
                        {"policy", core->policy()},
                        {"bitstreams", catalog->registry()->list().size()}});
  // The leader renews its term every third of its timeout (every commit renews it too). A renewal that fails
  // means another manager leads, or the store is gone: this one steps down at once, before it answers anything
  // more; nothing unwritten was acknowledged.
  asio::steady_timer renew_timer(ioc);
  std::function<void()> arm_renewal = [&] {
    renew_timer.expires_after(std::chrono::microseconds(static_cast<long>(config.ha.leader_timeout_s * 1e6 / 3)));
    renew_timer.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      if (auto s = shared->renew(); !s) step_down(s.error());
      arm_renewal();
    });
  };
  if (shared) arm_renewal();

  // Before endpoints.json: whoever sees it may stop the manager at once, and a SIGTERM then is a graceful stop.
  asio::signal_set signals(ioc, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    log::info("shutting down", {{"signal", sig}});
    (*admin)->stop();
    timer.cancel();
    publish_timer.cancel();
    renew_timer.cancel();
    ioc.stop();
  });
  // Last: whoever waits for endpoints.json (tests, scripts) finds the tokens and URLs above already written.
  if (auto s = write_endpoints(config.data_dir, admin_url, tcp_text, unix_text, agents_text); !s)
    return fail(s.error().message);

  ioc.run();
#ifdef ACCELPOOL_HAVE_AGENT_LINK
  // Its I/O thread posts to the owner queue: it stops first. What it posts while stopping is never run.
  agents.reset();
#endif
  guests.stop();  // its connections are closed; calls they posted are never run
  // Every state change was already durable when it was reported; closing the store finishes the WAL.
  commit_now();  // changes from host completions that no reply waited for
  request_commit = [] {};
  admin->reset();
  core.reset();  // joins the hosts' workers
  store.reset();
  return 0;
}

}  // namespace accelpool::manager
