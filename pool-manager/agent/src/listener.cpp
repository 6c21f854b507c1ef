// AgentListener and RemoteHost: one poll loop on a thread of its own serves every agent connection.
#include <accelpool/agent/listener.hpp>
#include <accelpool/agent/wire.hpp>
#include <accelpool/common/listener_limits.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <tuple>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace accelpool::agent {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

// Where a connection's agent.register stands. The I/O thread checks it and sets `pending`; the owner thread
// settles it (host_joined): `admitted`, or back to `none` when the pool refuses the host.
enum class Registration { none, pending, admitted };

// Receives an agent's reply to a request on the owner thread: its error, or ok and its result (null on error).
using ReplyDone = std::function<void(Status status, json::value result)>;

// Shared by a connection (I/O thread) and its RemoteHost (owner thread).
struct Link {
  std::mutex mu;
  std::string host;
  Registration registration = Registration::none;
  std::string out;  // bytes waiting to be sent
  bool alive = true;
  std::int64_t next_id = 1;
  std::map<std::int64_t, ReplyDone> pending;
  manager::Poster post;
  std::function<void()> wake;
};

namespace {

Error host_lost(const std::string& host, const std::string& why) {
  return make_error("host_lost", "host '" + host + "' lost: " + why);
}

// Sends a request for `done`, or fails it at once when the connection is gone.
void call(Link& link, std::string_view method, json::object params, ReplyDone done) {
  {
    std::lock_guard lock(link.mu);
    if (link.alive) {
      std::int64_t id = link.next_id++;
      link.pending.emplace(id, std::move(done));
      link.out += request_line(id, method, std::move(params));
      done = nullptr;
    }
  }
  if (done) {
    auto err = host_lost(link.host, "the agent is not connected");
    link.post([done = std::move(done), err] { done(err, nullptr); });
    return;
  }
  link.wake();
}

// A release or reset reply: what the device holds afterwards.
ReplyDone loaded_reply(manager::HostDriver::Done done) {
  return [done = std::move(done)](Status s, json::value result) {
    std::string loaded;
    if (result.is_object()) {
      if (auto* l = result.get_object().if_contains("loaded"); l && l->is_string()) loaded = std::string(l->get_string());
    }
    done(std::move(s), std::move(loaded));
  };
}

bool valid_health(std::string_view h) { return h == "ok" || h == "degraded" || h == "failed"; }

}  // namespace

RemoteHost::RemoteHost(std::shared_ptr<Link> link, std::vector<AgentDevice> devices)
    : link_(std::move(link)), name_(link_->host), devices_(std::move(devices)) {}

RemoteHost::~RemoteHost() = default;

Result<std::vector<manager::HostDevice>> RemoteHost::devices() {
  std::vector<manager::HostDevice> out;
  for (const auto& d : devices_) out.push_back(d.device);
  return out;
}

void RemoteHost::prepare(const host::PrepareRequest& request, PrepareDone done) {
  call(*link_, "device.prepare", prepare_request_json(request), [done = std::move(done)](Status s, json::value result) {
    if (!s) return done(std::move(s), host::PrepareResult{});
    auto parsed = parse_prepare_result(result, "device.prepare result");
    if (!parsed) return done(parsed.error(), host::PrepareResult{});
    done(Status::ok(), std::move(*parsed));
  });
}

void RemoteHost::release(const std::string& local_id, Done done) {
  call(*link_, "device.release", json::object{{"device", local_id}}, loaded_reply(std::move(done)));
}

void RemoteHost::reset(const std::string& local_id, Done done) {
  call(*link_, "device.reset", json::object{{"device", local_id}}, loaded_reply(std::move(done)));
}

bool RemoteHost::connected() const {
  std::lock_guard lock(link_->mu);
  return link_->alive;
}

struct AgentListener::Impl {
  struct Conn {
    int fd = -1;
    LineBuffer in{kMaxLine};
    std::shared_ptr<Link> link;
    std::string reserved;  // the host name this connection holds in `live` (pending or admitted)
    Clock::time_point last_seen;
    std::map<std::string, std::string> health;  // device -> "health\ndetail"
  };

  ListenerOptions options;
  ListenerEvents events;
  manager::Poster post;
  std::vector<int> listen_fds;
  int wake_fd = -1;
  std::atomic<bool> stop{false};
  mutable std::mutex hosts_mu;
  std::map<std::string, std::shared_ptr<Link>> live;  // host names held by a pending or admitted registration
  std::unordered_map<int, Conn> conns;
  std::thread thread;
  common::AcceptBackoff backoff{"agent listener"};
  Clock::time_point accept_after;  // accepting waits out a back-off until then

  ~Impl() {
    for (int fd : listen_fds) ::close(fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() const {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof(one));
  }

  void run() {
    while (!stop) {
      std::vector<pollfd> fds;
      fds.push_back({wake_fd, POLLIN, 0});
      const bool accepting = Clock::now() >= accept_after;
      for (int fd : listen_fds) fds.push_back({fd, static_cast<short>(accepting ? POLLIN : 0), 0});
      for (auto& [fd, c] : conns) {
        short ev = POLLIN;
        std::lock_guard lock(c.link->mu);
        if (!c.link->out.empty() && c.link->registration != Registration::pending) ev |= POLLOUT;
        fds.push_back({fd, ev, 0});
      }
      ::poll(fds.data(), fds.size(), 50);
      if (fds[0].revents & POLLIN) {
        std::uint64_t n;
        [[maybe_unused]] auto r = ::read(wake_fd, &n, sizeof(n));
      }
      for (std::size_t i = 1; i <= listen_fds.size(); ++i)
        if (fds[i].revents & POLLIN) accept_all(fds[i].fd);
      auto now = Clock::now();
      std::vector<std::pair<int, std::string>> dead;
      for (auto& [fd, c] : conns) {
        if (!flush(c)) {
          dead.emplace_back(fd, "connection broken");
          continue;
        }
        release_if_refused(c);
        // Reading is attempted on every pass; it costs one non-blocking recv.
        bool open = read_some(fd, c.in);
        while (auto line = c.in.next_line()) {
          c.last_seen = now;
          handle(c, *line);
        }
        if (c.in.overflow()) {
          std::lock_guard lock(c.link->mu);
          c.link->out += error_line(nullptr, make_error("invalid_request", "line longer than 1 MiB"));
        }
        if (!flush(c) || !open || c.in.overflow()) {
          dead.emplace_back(fd, c.in.overflow() ? "line too long" : "connection closed by the agent");
          continue;
        }
        // A connection that never registers is closed after the same silence (quietly: it was no host).
        if (now - c.last_seen > options.heartbeat_timeout)
          dead.emplace_back(fd, "no heartbeat for " + std::to_string(options.heartbeat_timeout.count()) + " ms");
      }
      for (auto& [fd, why] : dead) drop(fd, why);
    }
    std::vector<int> all;
    for (auto& [fd, c] : conns) all.push_back(fd);
    for (int fd : all) drop(fd, "the manager's agent listener stopped");
  }

  // Nothing is sent while a registration is pending: the pool may already send requests to the host it takes
  // (grants to a returning host), and the agent must read its registration reply first.
  bool flush(Conn& c) {
    std::lock_guard lock(c.link->mu);
    if (c.link->registration == Registration::pending) return true;
    return write_some(c.fd, c.link->out).is_ok();
  }

  // Accepts what waits on `lfd`. Over max_connections a new connection is closed at once; out of descriptors,
  // accepting waits out the back-off (the poll timeout wakes the loop to try again).
  void accept_all(int lfd) {
    for (;;) {
      int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) accept_after = Clock::now() + backoff.failed(errno);
        return;
      }
      backoff.accepted();
      if (conns.size() >= options.max_connections) {
        ::close(fd);
        continue;
      }
      Conn c;
      c.fd = fd;
      c.link = std::make_shared<Link>();
      c.link->post = post;
      c.link->wake = [this] { wake(); };
      c.last_seen = Clock::now();
      conns.emplace(fd, std::move(c));
    }
  }

  void drop(int fd, const std::string& why) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn c = std::move(it->second);
    conns.erase(it);
    ::close(fd);
    std::map<std::int64_t, ReplyDone> pending;
    Registration was;
    {
      std::lock_guard lock(c.link->mu);
      c.link->alive = false;
      c.link->out.clear();
      pending.swap(c.link->pending);
      was = c.link->registration;
    }
    release(c);
    if (was == Registration::none) return;
    Error err = host_lost(c.link->host, why);
    for (auto& [id, done] : pending) post([done = std::move(done), err] { done(err, nullptr); });
    // Only a host the pool took is lost. Checked on the owner thread, where registrations are settled: one still
    // pending here was settled by now, or never will be (its connection is gone), so a host refused or never
    // seen is not reported.
    if (events.host_lost) {
      post([cb = events.host_lost, link = c.link, err] {
        {
          std::lock_guard lock(link->mu);
          if (link->registration != Registration::admitted) return;
        }
        cb(link->host, err);
      });
    }
  }

  // Gives the connection's host name back (it may register again, under any name).
  void release(Conn& c) {
    if (c.reserved.empty()) return;
    std::lock_guard lock(hosts_mu);
    auto h = live.find(c.reserved);
    if (h != live.end() && h->second == c.link) live.erase(h);
    c.reserved.clear();
  }

  // The pool refused the host this connection registered: its name is free again.
  void release_if_refused(Conn& c) {
    if (c.reserved.empty() || registration(c) != Registration::none) return;
    release(c);
  }

  Registration registration(const Conn& c) const {
    std::lock_guard lock(c.link->mu);
    return c.link->registration;
  }

  void reply(Conn& c, const Message& m, Status s, json::value result = json::object{}) {
    if (!m.has_id) return;  // notifications get no reply, errors included
    std::lock_guard lock(c.link->mu);
    c.link->out += s ? result_line(m.id, std::move(result)) : error_line(m.id, s.error());
  }

  void handle(Conn& c, const std::string& line) {
    auto parsed = parse_message(line);
    if (!parsed) {
      std::lock_guard lock(c.link->mu);
      c.link->out += error_line(nullptr, parsed.error());
      return;
    }
    Message& m = *parsed;
    if (m.method.empty()) {  // a reply to one of our requests
      if (registration(c) != Registration::admitted) return;
      ReplyDone done;
      {
        std::lock_guard lock(c.link->mu);
        if (!m.id.is_int64()) return;
        auto it = c.link->pending.find(m.id.get_int64());
        if (it == c.link->pending.end()) return;
        done = std::move(it->second);
        c.link->pending.erase(it);
      }
      Status s = m.error ? Status(*m.error) : Status::ok();
      json::value result = m.error ? json::value(nullptr) : std::move(*m.result);
      post([done = std::move(done), s = std::move(s), result = std::move(result)]() mutable {
        done(std::move(s), std::move(result));
      });
      return;
    }
    if (m.method == "agent.register") return reply_register(c, m);
    if (registration(c) != Registration::admitted)
      return reply(c, m, make_error("unauthorized", m.method + ": the agent is not registered (send agent.register "
                                                               "with the agent token first)"));
    if (m.method == "agent.heartbeat") return reply(c, m, health_update(c, m, "agent.heartbeat"));
    if (m.method == "device.health") return reply(c, m, health_update(c, m, "device.health"));
    if (m.method == "vm.stopped") return reply(c, m, vm_stopped(c, m));
    reply(c, m, make_error("method_not_found", "no method '" + m.method + "'"));
  }

  void reply_register(Conn& c, const Message& m) {
    const char* where = "agent.register";
    release_if_refused(c);
    if (registration(c) != Registration::none)
      return reply(c, m, make_error("invalid_state", "agent.register: this connection is already registered as host '" +
                                                         c.link->host + "'"));
    auto token = get_string(m.params, "token", where, true);
    if (!token) return reply(c, m, token.error());
    if (*token != options.token) return reply(c, m, make_error("unauthorized", "agent.register: wrong agent token"));
    if (auto s = only_fields(m.params, "token,host,protocol,agent,devices", where); !s) return reply(c, m, s);
    auto* proto = m.params.if_contains("protocol");
    if (!proto || !proto->is_int64() || proto->get_int64() != kAgentProtocolVersion)
      return reply(c, m, make_error("unsupported_version", "agent.register: field 'protocol': this manager speaks "
                                                           "agent protocol version " +
                                                               std::to_string(kAgentProtocolVersion)));
    auto host = get_string(m.params, "host", where, true);
    if (!host) return reply(c, m, host.error());
    auto* devs = m.params.if_contains("devices");
    if (!devs || !devs->is_array())
      return reply(c, m, make_error("invalid_argument", "agent.register: field 'devices' must be an array"));
    std::vector<AgentDevice> devices;
    std::map<std::string, std::string> health;
    for (std::size_t i = 0; i < devs->get_array().size(); ++i) {
      const auto& v = devs->get_array()[i];
      std::string w = "agent.register: devices[" + std::to_string(i) + "]";
      if (!v.is_object()) return reply(c, m, make_error("invalid_argument", w + " must be an object"));
      const auto& o = v.get_object();
      if (auto s = only_fields(o, "id,kind,model,passthrough,pci,loaded,health,detail,vm,lease,attach_state", w); !s)
        return reply(c, m, s);
      AgentDevice d;
      auto id = get_string(o, "id", w, true);
      auto kind = get_string(o, "kind", w, true);
      auto model = get_string(o, "model", w, true);
      auto pass = get_bool(o, "passthrough", w, true);
      auto pci = get_string(o, "pci", w, false);
      auto loaded = get_string(o, "loaded", w, false);
      auto hl = get_string(o, "health", w, false);
      auto detail = get_string(o, "detail", w, false);
      auto vm = get_string(o, "vm", w, false);
      auto lease = get_string(o, "lease", w, false);
      auto state = get_string(o, "attach_state", w, false);
      for (const Status& s : {id.status(), kind.status(), model.status(), pass.status(), pci.status(), loaded.status(),
                              hl.status(), detail.status(), vm.status(), lease.status(), state.status()})
        if (!s) return reply(c, m, s);
      if (id->empty()) return reply(c, m, make_error("invalid_argument", w + ": field 'id' is empty"));
      if (health.count(*id)) return reply(c, m, make_error("invalid_argument", w + ": device id '" + *id + "' repeats"));
      std::string h = hl->empty() ? "ok" : *hl;
      if (!valid_health(h))
        return reply(c, m, make_error("invalid_argument", w + ": field 'health' must be ok, degraded or failed"));
      d.device.local_id = *id;
      d.device.kind = *kind;
      d.device.model = *model;
      d.device.passthrough = *pass;
      d.device.loaded = *loaded;
      d.pci_bdf = *pci;
      d.health = h;
      d.detail = *detail;
      if (!state->empty() && *state != "attached" && *state != "quarantined" && *state != "recorded")
        return reply(c, m, make_error("invalid_argument", w + ": field 'attach_state' must be attached, quarantined or "
                                                              "recorded"));
      d.vm = *vm;
      d.lease = *lease;
      d.attach_state = *state;
      health[*id] = h + "\n" + *detail;
      devices.push_back(std::move(d));
    }
    {
      std::lock_guard lock(hosts_mu);
      if (live.count(*host))
        return reply(c, m, make_error("already_registered", "agent.register: host '" + *host +
                                                                "' is already registered by a live agent connection"));
      live[*host] = c.link;
    }
    c.reserved = *host;
    {
      std::lock_guard lock(c.link->mu);
      c.link->host = *host;
      c.link->registration = Registration::pending;
    }
    c.last_seen = Clock::now();
    c.health = std::move(health);
    // The pool decides (on the owner thread) and the reply says what it decided: the agent is told it registered
    // only once its host is in the pool.
    auto rh = std::make_shared<std::unique_ptr<RemoteHost>>(std::make_unique<RemoteHost>(c.link, std::move(devices)));
    json::object result{{"protocol", kAgentProtocolVersion},
                        {"host", *host},
                        {"heartbeat_timeout_ms", static_cast<std::int64_t>(options.heartbeat_timeout.count())}};
    post([cb = events.host_joined, rh, link = c.link, id = m.id, has_id = m.has_id, result = std::move(result)] {
      {
        std::lock_guard lock(link->mu);
        if (!link->alive) return;  // the connection ended first: nothing joins
      }
      Status s = cb ? cb(std::move(*rh)) : Status::ok();
      bool alive;
      {
        std::lock_guard lock(link->mu);
        link->registration = s ? Registration::admitted : Registration::none;
        if (has_id) {  // ahead of what the pool queued meanwhile (nothing was sent while pending)
          link->out.insert(0, s ? result_line(id, result)
                                : error_line(id, make_error(s.error().code, "agent.register: host '" + link->host +
                                                                                "' refused: " + s.error().message)));
        }
        alive = link->alive;
      }
      if (alive) link->wake();  // a live link's listener still exists: its destructor ends every link first
    });
  }

  // agent.heartbeat {"devices":[{"id","health","detail"}]} or device.health {"device","health","detail"}: every
  // entry is checked before any is applied.
  Status health_update(Conn& c, const Message& m, const std::string& where) {
    std::vector<std::tuple<std::string, std::string, std::string>> updates;
    auto read_one = [&](const json::object& o, const std::string& w, const char* id_key) -> Status {
      auto id = get_string(o, id_key, w, true);
      auto h = get_string(o, "health", w, true);
      auto detail = get_string(o, "detail", w, false);
      for (const Status& s : {id.status(), h.status(), detail.status()})
        if (!s) return s;
      if (!valid_health(*h)) return make_error("invalid_argument", w + ": field 'health' must be ok, degraded or failed");
      if (!c.health.count(*id))
        return make_error("not_found", w + ": host '" + c.link->host + "' registered no device '" + *id + "'");
      updates.emplace_back(*id, *h, *detail);
      return Status::ok();
    };
    if (where == "device.health") {
      if (auto s = only_fields(m.params, "device,health,detail", where); !s) return s;
      if (auto s = read_one(m.params, where, "device"); !s) return s;
    } else {
      if (auto s = only_fields(m.params, "devices", where); !s) return s;
      if (auto* devs = m.params.if_contains("devices")) {
        if (!devs->is_array()) return make_error("invalid_argument", where + ": field 'devices' must be an array");
        for (std::size_t i = 0; i < devs->get_array().size(); ++i) {
          std::string w = where + ": devices[" + std::to_string(i) + "]";
          const auto& v = devs->get_array()[i];
          if (!v.is_object()) return make_error("invalid_argument", w + " must be an object");
          if (auto s = only_fields(v.get_object(), "id,health,detail", w); !s) return s;
          if (auto s = read_one(v.get_object(), w, "id"); !s) return s;
        }
      }
    }
    for (auto& [id, h, detail] : updates) {
      std::string key = h + "\n" + detail;
      auto& known = c.health[id];
      if (known == key) continue;
      known = key;
      if (events.device_health)
        post([cb = events.device_health, host = c.link->host, id, h, detail] { cb(host, id, h, detail); });
    }
    return Status::ok();
  }

  Status vm_stopped(Conn& c, const Message& m) {
    const std::string where = "vm.stopped";
    if (auto s = only_fields(m.params, "vm_name,vm_uuid,reason,devices", where); !s) return s;
    VmStopped vm;
    auto name = get_string(m.params, "vm_name", where, false);
    auto uuid = get_string(m.params, "vm_uuid", where, false);
    auto reason = get_string(m.params, "reason", where, false);
    for (const Status& s : {name.status(), uuid.status(), reason.status()})
      if (!s) return s;
    if (name->empty() && uuid->empty()) return make_error("invalid_argument", where + ": needs 'vm_name' or 'vm_uuid'");
    vm.vm_name = *name;
    vm.vm_uuid = *uuid;
    vm.reason = *reason;
    if (auto* devs = m.params.if_contains("devices")) {
      if (!devs->is_array()) return make_error("invalid_argument", where + ": field 'devices' must be an array");
      for (const auto& d : devs->get_array()) {
        if (!d.is_string()) return make_error("invalid_argument", where + ": field 'devices' must hold strings");
        vm.devices.emplace_back(d.get_string());
      }
    }
    if (events.vm_stopped) post([cb = events.vm_stopped, host = c.link->host, vm] { cb(host, vm); });
    return Status::ok();
  }
};

Result<std::unique_ptr<AgentListener>> AgentListener::create(ListenerOptions options, ListenerEvents events,
                                                             manager::Poster post) {
  if (options.listen.empty()) return make_error("invalid_argument", "agent listener: no address to listen on");
  if (options.token.empty()) return make_error("invalid_argument", "agent listener: the agent token is empty");
  if (options.heartbeat_timeout.count() <= 0)
    return make_error("invalid_argument", "agent listener: heartbeat timeout must be positive");
  if (options.max_connections == 0) return make_error("invalid_argument", "agent listener: max_connections must be positive");
  if (!post) return make_error("invalid_argument", "agent listener: no poster");
  auto impl = std::make_unique<Impl>();
  std::unique_ptr<AgentListener> self(new AgentListener());
  for (const auto& a : options.listen) {
    auto fd = listen_on(a);
    if (!fd) return fd.error();  // impl's destructor closes what was bound
    impl->listen_fds.push_back(*fd);
    if (self->tcp_port_ == 0 && a.rfind("unix:", 0) != 0) self->tcp_port_ = bound_port(*fd);
  }
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) return make_error("io_error", "agent listener: eventfd failed");
  impl->options = std::move(options);
  impl->events = std::move(events);
  impl->post = std::move(post);
  impl->thread = std::thread([p = impl.get()] { p->run(); });
  self->impl_ = std::move(impl);
  return self;
}

AgentListener::~AgentListener() {
  if (!impl_) return;
  impl_->stop = true;
  impl_->wake();
  impl_->thread.join();
}

std::vector<std::string> AgentListener::hosts() const {
  std::lock_guard lock(impl_->hosts_mu);
  std::vector<std::string> out;
  for (const auto& [h, l] : impl_->live) {
    std::lock_guard link_lock(l->mu);
    if (l->registration == Registration::admitted) out.push_back(h);
  }
  return out;
}

}  // namespace accelpool::agent
