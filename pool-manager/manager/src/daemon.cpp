// The daemon: one io_context on one thread owns the pool. Guest connections, the admin API, host completions
// and timers all run as handlers on it, so the core is never touched concurrently.
#include "daemon.hpp"

#include "admin_api.hpp"
#include "admin_http.hpp"
#include "guest_protocol.hpp"
#include "metrics.hpp"

#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/manager/auth.hpp>
#include <accelpool/manager/core.hpp>

#ifdef ACCELPOOL_HAVE_BACKENDS
#include <accelpool/backends/factory.hpp>
#endif
#ifdef ACCELPOOL_HAVE_AGENT_LINK
#include <accelpool/agent/listener.hpp>
#endif

#include <boost/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <unistd.h>

namespace accelpool::manager {

extern const char* const kOpenApiYaml;  // openapi_text.cpp, generated from docs/api/openapi.yaml

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using unix_stream = asio::local::stream_protocol;

namespace {

// A connection that can receive notification lines.
class GuestConnection {
 public:
  virtual ~GuestConnection() = default;
  virtual void send(std::string line) = 0;
};

// Routes lease events to the connections of the lease's guest.
class GuestHub final : public CoreListener {
 public:
  void add(const std::string& tenant, const std::string& guest, GuestConnection* c) { by_guest_[key(tenant, guest)].insert(c); }
  void remove(const std::string& tenant, const std::string& guest, GuestConnection* c) {
    auto it = by_guest_.find(key(tenant, guest));
    if (it == by_guest_.end()) return;
    it->second.erase(c);
    if (it->second.empty()) by_guest_.erase(it);
  }
  void lease_event(const Lease& lease, LeaseEvent event) override {
    auto it = by_guest_.find(key(lease.tenant, lease.guest));
    if (it == by_guest_.end()) return;
    std::string line = GuestProtocol::notification(lease, event);
    for (auto* c : std::set<GuestConnection*>(it->second)) c->send(line);
  }

 private:
  static std::string key(const std::string& t, const std::string& g) { return t + '\n' + g; }
  std::map<std::string, std::set<GuestConnection*>> by_guest_;
};

// What guest connections share. Connections hold it by shared_ptr: they can outlive run_daemon's locals while
// the io_context destroys its pending handlers.
struct Shared {
  Shared(GuestProtocol& p, std::size_t max, double hello_timeout_s)
      : protocol(p), max_connections(max), hello_timeout(std::chrono::milliseconds(static_cast<long>(hello_timeout_s * 1000))) {}
  GuestProtocol& protocol;  // used only while the io_context runs
  GuestHub hub;
  std::size_t connections = 0;
  std::size_t max_connections;
  std::chrono::milliseconds hello_timeout;  // a connection must authenticate within this
  // Group commit: replies wait here until the changes they report are durable.
  std::vector<std::pair<std::weak_ptr<GuestConnection>, std::string>> held;
  std::function<void()> request_commit;
};

constexpr std::size_t kMaxQueuedBytes = 4 * 1024 * 1024;  // a guest that stops reading is disconnected

template <typename Socket>
class GuestSessionConn final : public GuestConnection, public std::enable_shared_from_this<GuestSessionConn<Socket>> {
 public:
  GuestSessionConn(Socket socket, std::shared_ptr<Shared> shared)
      : socket_(std::move(socket)), keep_(std::move(shared)), shared_(*keep_), in_(kMaxGuestLine + 1),
        hello_timer_(socket_.get_executor()) {
    ++shared_.connections;
  }
  ~GuestSessionConn() override {
    unregister();
    --shared_.connections;
  }
  void start() {
    // A peer that never says hello would hold a connection slot forever.
    hello_timer_.expires_after(shared_.hello_timeout);
    hello_timer_.async_wait([weak = this->weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->session_.authenticated || self->session_.relayed) return;
      self->send(GuestProtocol::timeout_error());
      self->closing_ = true;
    });
    read();
  }

  void send(std::string line) override {
    if (in_call_) {  // a notification raised by this connection's own call goes out after the call's reply
      deferred_.push_back(std::move(line));
      return;
    }
    if (closed_) return;
    queued_bytes_ += line.size() + 1;
    if (queued_bytes_ > kMaxQueuedBytes) return close();
    line.push_back('\n');
    out_.push_back(std::move(line));
    // Lines sent in one turn of the event loop (a reply and the notifications of the same commit) leave in one
    // write: one system call and one wake-up of the guest instead of one per line.
    if (writing_ || flush_posted_) return;
    flush_posted_ = true;
    asio::post(socket_.get_executor(), [self = this->shared_from_this()] {
      self->flush_posted_ = false;
      if (!self->writing_ && !self->out_.empty()) self->write();
    });
  }

 private:
  void read() {
    asio::async_read_until(socket_, in_, '\n', [self = this->shared_from_this()](boost::system::error_code ec, std::size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(boost::system::error_code ec, std::size_t n) {
    if (closed_) return;
    if (ec == asio::error::not_found) {  // no newline within the limit
      send(GuestProtocol::too_long());
      closing_ = true;
      return;
    }
    if (ec) return close();
    std::string line(asio::buffers_begin(in_.data()), asio::buffers_begin(in_.data()) + static_cast<std::ptrdiff_t>(n) - 1);
    in_.consume(n);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && !closing_) {  // nothing more is handled on a connection being closed
      std::string before_tenant = session_.tenant, before_guest = session_.guest;
      bool was_auth = session_.authenticated;
      in_call_ = true;
      std::string reply = shared_.protocol.handle(session_, line);
      in_call_ = false;
      if (session_.authenticated && (!was_auth || before_tenant != session_.tenant || before_guest != session_.guest)) {
        if (was_auth) shared_.hub.remove(before_tenant, before_guest, this);
        shared_.hub.add(session_.tenant, session_.guest, this);
      }
      if (!reply.empty()) shared_.held.emplace_back(this->weak_from_this(), std::move(reply));
      if (session_.close_after_reply) closing_ = true;  // closed once the reply is written
      auto later = std::move(deferred_);
      deferred_.clear();
      for (auto& l : later) send(std::move(l));
      shared_.request_commit();
    }
    if (!closed_) read();  // the pending read keeps this connection alive until a closing reply is written
  }

  // Writes everything queued in one go: replies and notifications that pile up while a write is in flight
  // leave together.
  void write() {
    batch_.clear();
    for (auto& l : out_) batch_ += l;
    out_.clear();
    writing_ = true;
    asio::async_write(socket_, asio::buffer(batch_), [self = this->shared_from_this()](boost::system::error_code ec, std::size_t) {
      self->writing_ = false;
      if (ec) return self->close();
      self->queued_bytes_ -= self->batch_.size();
      if (!self->out_.empty()) return self->write();
      if (self->closing_) self->close();
    });
  }

  void unregister() {
    if (session_.authenticated) shared_.hub.remove(session_.tenant, session_.guest, this);
    session_.authenticated = false;
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    hello_timer_.cancel();
    unregister();
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  Socket socket_;
  std::shared_ptr<Shared> keep_;
  Shared& shared_;
  asio::streambuf in_;
  std::deque<std::string> out_;
  std::string batch_;  // being written
  bool writing_ = false;
  bool flush_posted_ = false;
  std::size_t queued_bytes_ = 0;
  GuestSession session_;
  bool closed_ = false;
  bool closing_ = false;
  bool in_call_ = false;
  std::vector<std::string> deferred_;
  asio::steady_timer hello_timer_;
};

template <typename Acceptor>
void accept_loop(Acceptor& acceptor, std::shared_ptr<Shared> shared) {
  acceptor.async_accept([&acceptor, shared](boost::system::error_code ec, typename Acceptor::protocol_type::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      if (shared->connections >= shared->max_connections) {
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        if constexpr (std::is_same_v<typename Acceptor::protocol_type, tcp>) {
          boost::system::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);  // replies are small and latency matters
        }
        std::make_shared<GuestSessionConn<typename Acceptor::protocol_type::socket>>(std::move(socket), shared)->start();
      }
    }
    accept_loop(acceptor, shared);
  });
}

Status write_endpoints(const std::filesystem::path& dir, const std::string& admin, const std::string& tcp_ep,
                       const std::string& unix_path, const std::string& agents) {
  auto tmp = dir / "endpoints.json.tmp";
  {
    std::ofstream o(tmp);
    o << "{\"admin\":\"" << admin << "\",\"guest_tcp\":\"" << tcp_ep << "\",\"guest_unix\":\"" << unix_path
      << "\",\"agents\":\"" << agents << "\",\"pid\":" << getpid() << "}\n";
    if (!o) return make_error("io", "cannot write " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dir / "endpoints.json", ec);
  if (ec) return make_error("io", "cannot write " + (dir / "endpoints.json").string() + ": " + ec.message());
  return Status::ok();
}

Result<std::unique_ptr<HostDriver>> make_host(const HostConfig& h, const std::shared_ptr<ImageCatalog>& catalog,
                                               Poster post) {
  if (h.backend == "static") {
    std::vector<HostDevice> devs;
    std::map<std::string, int> next;
    for (const auto& g : h.devices) {
      for (int i = 0; i < g.count; ++i) devs.push_back({g.kind + std::to_string(next[g.kind]++), g.kind, g.model, g.passthrough, ""});
    }
    return make_static_host(h.name, std::move(devs), std::move(post));
  }
  if (!h.devices.empty()) return make_error("config", "host " + h.name + ": 'devices' is only for backend \"static\"");
#ifdef ACCELPOOL_HAVE_BACKENDS
  auto listed = host_backends(h);
  if (!listed) return listed.error();
  std::vector<std::unique_ptr<backends::DeviceBackend>> made;
  for (const auto& b : *listed) {
    auto backend = backends::make_backend(b.name, b.settings);
    if (!backend) return make_error("config", "host " + h.name + ": " + backend.error().message);
    made.push_back(std::move(*backend));
  }
  auto host = make_local_host(h.name, std::move(made), catalog, std::move(post));
  if (!host) return make_error("config", host.error().message);
  return std::move(*host);
#else
  (void)catalog;
  return make_error("config", "host " + h.name + ": this build has no device backends; use backend = \"static\"");
#endif
}

}  // namespace

int run_daemon(const Config& config, std::ostream& out) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "accelpool-manager: %s\n", what.c_str());
    return 1;
  };
  std::error_code fec;
  std::filesystem::create_directories(config.data_dir, fec);
  if (fec) return fail("cannot create data folder " + config.data_dir.string() + ": " + fec.message());

  asio::io_context ioc(1);
  // Host completions run on the owner thread and their changes join the next group commit.
  std::function<void()> request_commit = [] {};
  Poster post = [&ioc, &request_commit](std::function<void()> f) {
    asio::post(ioc, [f = std::move(f), &request_commit] {
      f();
      request_commit();
    });
  };

  // The bitstream registry: in-process hosts program its images, agents get their sha256, acquires are checked.
  auto registry = bitstreams::SharedRegistry::open(config.bitstreams_dir(), config.bitstreams_seed());
  if (!registry) return fail(registry.error().message);
  for (const auto& r : (*registry)->rejected()) {
    std::fprintf(stderr, "accelpool-manager: bitstream left out: %s\n", r.error.message.c_str());
  }
  auto catalog = std::make_shared<ImageCatalog>(*registry);
  CoreOptions core_options = config.core;
  core_options.acquire_check = [catalog](const AcquireParams& p) { return catalog->check(p.kind, p.bitstream); };

  auto store = open_sqlite_store(config.data_dir / config.store_file, config.full_sync);
  if (!store) return fail(store.error().message);
  SystemClock clock;
  auto core_r = PoolCore::create(core_options, clock, **store);
  if (!core_r) return fail(core_r.error().message);
  std::unique_ptr<PoolCore> core = std::move(*core_r);

  std::vector<HostConfig> hosts = config.hosts;
  if (hosts.empty()) {
    HostConfig h;
    h.name = "local";
#ifdef ACCELPOOL_HAVE_BACKENDS
    h.backend = "sim";
    for (const auto& b : backends::built_backends()) {
      if (b == "opencl") h.backend += "+opencl";  // PoCL (or GPU) devices when the ICD loader reports any
    }
#else
    h.backend = "static";
    h.devices.push_back({"fpga", "static", 4, false});
#endif
    hosts.push_back(h);
  }
  for (const auto& h : hosts) {
    auto driver = make_host(h, catalog, post);
    if (!driver) return fail(driver.error().message);
    if (auto s = core->attach_host(std::move(*driver)); !s) return fail("host " + h.name + ": " + s.error().message);
  }

  // Tenants and tokens: created ones print their token once; only hashes are kept.
  std::vector<TenantConfig> tenants = config.tenants;
  if (tenants.empty() && core->tenants().empty()) tenants.push_back({"default", 1, 0});
  std::set<std::string> known;
  for (const auto& t : core->tenants()) known.insert(t.name);
  for (const auto& t : tenants) {
    if (known.count(t.name)) {
      if (auto s = core->update_tenant(t.name, t.weight, t.max_devices); !s) return fail("tenant " + t.name + ": " + s.error().message);
      continue;
    }
    auto token = core->create_tenant(t.name, t.weight, t.max_devices);
    if (!token) return fail("tenant " + t.name + ": " + token.error().message);
    out << "guest token for tenant " << t.name << " (shown once): " << *token << "\n";
  }
  if (!core->has_admin_token()) {
    std::string token = generate_token("apa_");
    if (auto s = core->set_admin_token(token); !s) return fail(s.error().message);
    out << "admin token (shown once): " << token << "\n";
  }

#ifdef ACCELPOOL_HAVE_AGENT_LINK
  // Remote host agents: every event arrives through the Poster, on this thread.
  std::unique_ptr<agent::AgentListener> agents;
  std::string agents_text;
  if (!config.agents.listen.empty()) {
    agent::ListenerEvents ev;
    ev.host_joined = [&core, catalog](std::unique_ptr<agent::RemoteHost> h) {
      std::string name = h->name();
      PoolCore::HostReport report;
      for (const auto& d : h->registered_devices()) {
        if (d.health == "failed" || d.attach_state == "quarantined") report.unusable.insert(d.device.local_id);
        if (!d.vm.empty()) report.serving[d.device.local_id] = d.vm;
      }
      auto known = core->hosts();
      bool returning = !core->host_live(name) && std::find(known.begin(), known.end(), name) != known.end();
      // Agents check (or fetch) the manager's image by its sha256.
      agent::RemoteHost* remote = h.get();
      auto driver = with_catalog_images(std::move(h), catalog,
                                        [remote](const std::string& local_id, const std::string& bitstream,
                                                 const std::string& sha256, bool reprogram, const std::string& guest,
                                                 HostDriver::Done done) {
                                          remote->prepare_lease(local_id, bitstream, sha256, reprogram, guest, "",
                                                                std::move(done));
                                        });
      if (auto s = core->attach_host(std::move(driver), report); !s) {
        std::fprintf(stderr, "accelpool-manager: agent host %s refused: %s\n", name.c_str(), s.error().message.c_str());
        return;
      }
      std::fprintf(stderr, "accelpool-manager: agent host %s %s (%zu unusable devices)\n", name.c_str(),
                   returning ? "returned" : "joined", report.unusable.size());
    };
    ev.host_lost = [&core](const std::string& host, const Error& why) {
      std::fprintf(stderr, "accelpool-manager: agent host %s lost: %s\n", host.c_str(), why.message.c_str());
      if (auto s = core->host_lost(host); !s) {
        std::fprintf(stderr, "accelpool-manager: host %s: %s\n", host.c_str(), s.error().message.c_str());
      }
    };
    ev.vm_stopped = [&core](const std::string& host, const agent::VmStopped& vm) {
      std::string reason = "VM " + (vm.vm_name.empty() ? vm.vm_uuid : vm.vm_name) + " on host " + host + " " +
                           (vm.reason.empty() ? std::string("stopped") : vm.reason);
      std::size_t n = 0;
      if (!vm.vm_name.empty()) n += core->end_guest_leases(vm.vm_name, reason).size();
      if (!vm.vm_uuid.empty() && vm.vm_uuid != vm.vm_name) n += core->end_guest_leases(vm.vm_uuid, reason).size();
      std::fprintf(stderr, "accelpool-manager: %s: %zu leases ended\n", reason.c_str(), n);
    };
    ev.device_health = [&core](const std::string& host, const std::string& device, const std::string& health,
                               const std::string& detail) {
      std::string name = host + "/" + device;
      bool usable = health != "failed";
      if (!usable) {
        std::fprintf(stderr, "accelpool-manager: device %s failed: %s\n", name.c_str(), detail.c_str());
      }
      if (auto s = core->set_device_usable(name, usable); !s) {
        std::fprintf(stderr, "accelpool-manager: device health of %s: %s\n", name.c_str(), s.error().message.c_str());
      }
    };
    agent::ListenerOptions lo;
    lo.listen = config.agents.listen;
    lo.token = config.agents.token;
    lo.heartbeat_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.agents.heartbeat_timeout_ms));
    auto l = agent::AgentListener::create(std::move(lo), std::move(ev), post);
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

  Metrics metrics(*core);
  GuestProtocol protocol(*core);
  protocol.set_relay_token(config.agents.token);  // host agents relay their VMs' ports with it
  auto shared = std::make_shared<Shared>(protocol, config.max_connections, config.request_timeout_s);
  core->add_listener(&metrics);
  core->add_listener(&shared->hub);

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
  // One transaction for everything handled since the last one, then the held replies, then notifications.
  bool commit_posted = false;
  auto commit_all = [&] {
    auto held = std::move(shared->held);
    shared->held.clear();
    core->commit([&] {
      for (auto& [conn, line] : held) {
        if (auto c = conn.lock()) c->send(std::move(line));
      }
    });
    arm();
  };
  request_commit = [&] {
    if (commit_posted) return;
    commit_posted = true;
    asio::post(ioc, [&] {
      commit_posted = false;
      commit_all();
    });
  };
  shared->request_commit = [&] { request_commit(); };
  core->set_group_commit(true);
  arm();

  std::string tcp_text, unix_text;
  tcp::acceptor tcp_acceptor(ioc);
  unix_stream::acceptor unix_acceptor(ioc);
  if (!config.guest_tcp.empty()) {
    auto ep = parse_endpoint(config.guest_tcp);
    if (!ep) return fail("guest.tcp: " + ep.error().message);
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(ep->first, ec);
    if (ec) return fail("guest.tcp: address '" + ep->first + "': " + ec.message());
    tcp::endpoint endpoint(addr, ep->second);
    tcp_acceptor.open(endpoint.protocol(), ec);
    if (!ec) tcp_acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) tcp_acceptor.bind(endpoint, ec);
    if (!ec) tcp_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return fail("guest.tcp: cannot listen on " + config.guest_tcp + ": " + ec.message());
    tcp_text = ep->first + ":" + std::to_string(tcp_acceptor.local_endpoint().port());
    accept_loop(tcp_acceptor, shared);
  }
  if (!config.guest_unix.empty()) {
    std::filesystem::path p = config.guest_unix;
    if (p.is_relative()) p = config.data_dir / p;
    std::filesystem::remove(p, fec);  // a socket file left by a crash
    boost::system::error_code ec;
    unix_acceptor.open(unix_stream(), ec);
    if (!ec) unix_acceptor.bind(unix_stream::endpoint(p.string()), ec);
    if (!ec) unix_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return fail("guest.unix: cannot listen on " + p.string() + ": " + ec.message());
    unix_text = p.string();
    accept_loop(unix_acceptor, shared);
  }

  AdminApi api(*core, metrics, kOpenApiYaml, [&] { return !core->devices().empty(); }, [&] { commit_all(); });
  api.set_catalog(catalog);
  api.set_agent_token(config.agents.token);
  auto admin_ep = parse_endpoint(config.admin_listen);
  if (!admin_ep) return fail("admin.listen: " + admin_ep.error().message);
  HttpLimits limits;
  limits.max_body_bytes = config.max_body_bytes;
  limits.request_timeout_s = config.request_timeout_s;
  limits.max_connections = config.max_connections;
  auto admin = AdminServer::start(ioc, admin_ep->first, admin_ep->second, api, limits);
  if (!admin) return fail(admin.error().message);
  std::string admin_url = "http://" + admin_ep->first + ":" + std::to_string((*admin)->port());
  out << "accelpool-manager: admin API " << admin_url << " (metrics at " << admin_url << "/metrics)\n";
  if (!tcp_text.empty()) out << "accelpool-manager: guests on tcp " << tcp_text << "\n";
  if (!unix_text.empty()) out << "accelpool-manager: guests on unix " << unix_text << "\n";
  if (!agents_text.empty()) out << "accelpool-manager: host agents on " << agents_text << "\n";
  out << "accelpool-manager: store " << (config.data_dir / config.store_file).string() << ", policy "
      << core->policy() << "\n";
  out << "accelpool-manager: bitstream registry " << catalog->registry()->dir().string() << " ("
      << catalog->registry()->list().size() << " bitstreams)\n";
  out.flush();
  // Last: whoever waits for endpoints.json (tests, scripts) finds the tokens and URLs above already written.
  if (auto s = write_endpoints(config.data_dir, admin_url, tcp_text, unix_text, agents_text); !s) return fail(s.error().message);

  asio::signal_set signals(ioc, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    std::fprintf(stderr, "accelpool-manager: signal %d, shutting down\n", sig);
    boost::system::error_code ignored;
    tcp_acceptor.close(ignored);
    unix_acceptor.close(ignored);
    (*admin)->stop();
    timer.cancel();
    ioc.stop();
  });
  ioc.run();
#ifdef ACCELPOOL_HAVE_AGENT_LINK
  // Its I/O thread posts to the owner queue: it stops first. What it posts while stopping is never run.
  agents.reset();
#endif
  // Every state change was already durable when it was reported; closing the store finishes the WAL.
  if (!unix_text.empty()) std::filesystem::remove(unix_text, fec);
  core->commit();  // changes from host completions that no reply waited for
  request_commit = [] {};
  shared->request_commit = [] {};
  admin->reset();
  core.reset();  // joins the hosts' workers
  store->reset();
  return 0;
}

}  // namespace accelpool::manager
