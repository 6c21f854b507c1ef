// AgentListener: one epoll loop on a thread of its own serves every agent connection. Each socket is registered
// once; a wake-up touches only the connections epoll reports ready and those the owner thread gave output (a
// request, a settled registration), never all of them. Heartbeat deadlines wait in a min-heap. The owner thread and
// this one share no lock per request or reply: requests arrive through the Outbox, replies leave in one posted
// function per wake-up, and the pending requests are the owner thread's alone (link.hpp).
#include "image_server.hpp"
#include "link.hpp"

#include <accelpool/agent/link_stream.hpp>
#include <accelpool/agent/wire.hpp>
#include <accelpool/common/listener_limits.hpp>
#include <accelpool/common/log.hpp>

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace accelpool::agent {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

bool valid_health(std::string_view h) { return h == "ok" || h == "degraded" || h == "failed"; }

// epoll user data: a connection's serial (upper 32 bits, never 0) and descriptor, so an event that was queued for
// a connection closed in the same wake-up is not taken for a new one that reuses the descriptor. Listening
// sockets and the wake descriptor carry serial 0.
std::uint64_t tag(std::uint32_t serial, int fd) {
  return (std::uint64_t{serial} << 32) | static_cast<std::uint32_t>(fd);
}
int tag_fd(std::uint64_t t) { return static_cast<int>(t & 0xffffffffu); }
std::uint32_t tag_serial(std::uint64_t t) { return static_cast<std::uint32_t>(t >> 32); }

// Lines on their way to the I/O thread from other threads (requests from the owner thread, image replies from
// the image server's worker), and the eventfd that wakes it. Links hold it through their `send`, and wake-ups
// deferred to the owner thread hold it too, so it outlives the listener; once the listener ends it takes nothing.
struct Outbox : std::enable_shared_from_this<Outbox> {
  struct Line {
    int fd;
    std::uint32_t serial;
    std::string text;  // empty: only look at the connection
  };
  std::mutex mu;
  std::vector<Line> lines;            // guarded by mu
  bool closed = false;                // guarded by mu
  std::atomic<bool> sleeping{false};  // the I/O thread is (about to be) blocked in epoll_wait
  int wake_fd = -1;
  manager::Poster after_turn;  // set before any link exists; may be empty

  Outbox() = default;
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;
  ~Outbox() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() const {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof(one));
  }

  // Any thread. One eventfd write per batch: the first line of a batch wakes the I/O thread, at once, or for the
  // owner thread's requests (`at_turn_end`) once the owner thread's turn ends. False once the listener ended.
  bool put(Line line, bool at_turn_end) {
    bool first;
    {
      std::lock_guard lock(mu);
      if (closed) return false;
      first = lines.empty();
      lines.push_back(std::move(line));
    }
    if (!first || !sleeping.load()) return true;
    if (at_turn_end && after_turn) {
      after_turn([self = shared_from_this()] {
        if (self->sleeping.load()) self->wake();
      });
    } else {
      wake();
    }
    return true;
  }

  bool empty() {
    std::lock_guard lock(mu);
    return lines.empty();
  }

  std::vector<Line> take() {
    std::lock_guard lock(mu);
    return std::exchange(lines, {});
  }

  void close() {
    std::lock_guard lock(mu);
    closed = true;
    lines.clear();
  }
};

}  // namespace

struct AgentListener::Impl {
  struct Conn {
    int fd = -1;
    std::uint32_t serial = 0;
    std::unique_ptr<LinkStream> io;  // plain, or TLS on TCP when options.tls is set
    LineBuffer in{kMaxLine};
    std::shared_ptr<Link> link;
    std::string reserved;  // the host name this connection holds in `live` (pending or admitted)
    Clock::time_point last_seen;
    bool watching_out = false;                  // EPOLLOUT is registered: output waits for the socket to take it
    std::uint64_t served_in = 0;                // the last round of serve_sent() that served it
    std::map<std::string, std::string> health;  // device -> "health\ndetail"
  };
  // When a connection's silence ends it. One entry per connection: an entry that comes due for a connection
  // heard from since is pushed again with its new deadline (lazy), so reading a line costs no heap operation.
  struct Deadline {
    Clock::time_point at;
    int fd;
    std::uint32_t serial;
    bool operator>(const Deadline& o) const { return at > o.at; }
  };

  ListenerOptions options;
  ListenerEvents events;
  manager::Poster owner_post;
  // The completions of the replies read in this wake-up, posted as one event when it ends (or before any other
  // event, which keeps their order): one hand-over to the owner thread for all of them, where the agents' other
  // events (a registration, a loss) go one by one, so that the owner's event queue can slice a storm of them.
  std::vector<std::function<void()>> replies;
  std::vector<int> listen_fds;
  std::shared_ptr<Outbox> outbox = std::make_shared<Outbox>();
  std::uint64_t rounds = 0;  // of serve_sent()
  int epoll_fd = -1;
  std::atomic<bool> stop{false};
  mutable std::mutex hosts_mu;
  std::map<std::string, std::shared_ptr<Link>> live;  // host names held by a pending or admitted registration
  std::unordered_map<int, Conn> conns;
  std::uint32_t next_serial = 1;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> deadlines;
  std::thread thread;
  common::AcceptBackoff backoff{"agent listener"};
  std::optional<Clock::time_point> accept_after;  // accepting is paused (out of descriptors) until then
  std::unique_ptr<ImageServer> images;            // image.manifest / image.read, on a worker of its own

  ~Impl() {
    images.reset();  // its worker may still send on a link
    for (int fd : listen_fds) ::close(fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
  }

  // I/O thread: `event` runs on the owner thread after every reply and event handed over before it.
  void post(std::function<void()> event) {
    post_replies();
    owner_post(std::move(event));
  }

  void post_replies() {
    if (replies.empty()) return;
    owner_post([batch = std::exchange(replies, {})] {
      for (const auto& done : batch) done();
    });
  }

  bool watch(int fd, std::uint32_t events, std::uint64_t data, int op = EPOLL_CTL_ADD) const {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    return ::epoll_ctl(epoll_fd, op, fd, &ev) == 0;
  }

  Conn* find(int fd, std::uint32_t serial) {
    auto it = conns.find(fd);
    return it == conns.end() || it->second.serial != serial ? nullptr : &it->second;
  }

  // How long the I/O thread stays awake after a batch of requests when batches come that close together: the next
  // one then needs no eventfd write from the owner thread (a wake-up of another core, the owner's costliest system
  // call under load; docs/benchmarks.md). A lone guest's requests, farther apart, cost no polling.
  static constexpr std::chrono::microseconds kLinger{50};

  void run() {
    std::vector<epoll_event> ready(256);
    auto last_sent = Clock::now();
    bool busy = false;  // the owner thread's last two batches came within kLinger of each other
    while (!stop) {
      int timeout = wait_ms();
      const bool lingering = busy && Clock::now() - last_sent < kLinger;
      if (lingering) {
        timeout = 0;
      } else {
        outbox->sleeping.store(true);
        if (!outbox->empty()) timeout = 0;
      }
      int n = ::epoll_wait(epoll_fd, ready.data(), static_cast<int>(ready.size()), timeout);
      outbox->sleeping.store(false);
      if (n < 0) {
        if (errno == EINTR) continue;
        log::error("agent listener: epoll_wait failed", {{"error", std::strerror(errno)}});
        break;
      }
      for (int i = 0; i < n && !stop; ++i) {
        const std::uint64_t t = ready[static_cast<std::size_t>(i)].data.u64;
        const std::uint32_t what = ready[static_cast<std::size_t>(i)].events;
        const int fd = tag_fd(t);
        if (tag_serial(t) != 0) {
          if (Conn* c = find(fd, tag_serial(t))) serve(*c, (what & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0);
        } else if (fd == outbox->wake_fd) {
          std::uint64_t count;
          [[maybe_unused]] auto r = ::read(outbox->wake_fd, &count, sizeof(count));
        } else {
          accept_all(fd);
        }
      }
      if (serve_sent()) {
        const auto now = Clock::now();
        busy = now - last_sent < kLinger;
        last_sent = now;
      } else if (lingering) {
        sched_yield();
      }
      expire(Clock::now());
      resume_accepting();
      post_replies();
    }
    outbox->close();  // from now on a request fails at once
    std::vector<int> all;
    for (auto& [fd, c] : conns) all.push_back(fd);
    for (int fd : all) drop(fd, "the manager's agent listener stopped");
    post_replies();
  }

  // Until the next heartbeat deadline or the end of an accept pause; -1 (no limit) when there is neither.
  int wait_ms() const {
    std::optional<Clock::time_point> until;
    if (!deadlines.empty()) until = deadlines.top().at;
    if (accept_after && (!until || *accept_after < *until)) until = accept_after;
    if (!until) return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*until - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<std::int64_t>(ms, 0, 60'000));
  }

  // The connections whose silence lasted the heartbeat timeout end. A connection that never registers is closed
  // after the same silence (quietly: it was no host).
  void expire(Clock::time_point now) {
    while (!deadlines.empty() && deadlines.top().at <= now) {
      Deadline d = deadlines.top();
      deadlines.pop();
      Conn* c = find(d.fd, d.serial);
      if (!c) continue;
      auto due = c->last_seen + options.heartbeat_timeout;
      if (due > now) {
        deadlines.push({due, d.fd, d.serial});
      } else {
        drop(d.fd, "no heartbeat for " + std::to_string(options.heartbeat_timeout.count()) + " ms");
      }
    }
  }

  // Queues what other threads sent on their connections, then serves each of those connections once.
  bool serve_sent() {
    std::vector<Outbox::Line> lines = outbox->take();
    if (lines.empty()) return false;
    for (auto& l : lines) {
      if (l.text.empty()) continue;          // only to look at
      if (Conn* c = find(l.fd, l.serial)) {  // else it ended: the owner thread fails its requests (end_requests)
        std::lock_guard lock(c->link->mu);
        if (c->link->out.empty()) {
          c->link->out = std::move(l.text);  // an image piece (512 KiB) is not copied
        } else {
          c->link->out += l.text;
        }
      }
    }
    ++rounds;
    for (const auto& l : lines) {
      Conn* c = find(l.fd, l.serial);
      if (!c || c->served_in == rounds) continue;
      c->served_in = rounds;
      serve(*c, false);
    }
    return true;
  }

  // One connection's turn: reads what arrived (when `readable`), answers it, settles a refused registration, and
  // sends what waits; EPOLLOUT is watched only while output is left over. Drops the connection when it ended.
  void serve(Conn& c, bool readable) {
    bool open = true;
    if (readable || c.io->blocked_on_write()) {
      open = c.io->read_some(c.in);
      auto now = Clock::now();
      while (auto line = c.in.next_line()) {
        c.last_seen = now;
        handle(c, *line);
      }
      if (c.in.overflow()) {
        std::lock_guard lock(c.link->mu);
        c.link->out += error_line(nullptr, make_error(Errc::invalid_request, "line longer than 1 MiB"));
      }
    }
    release_if_refused(c);
    bool written = flush(c);
    if (!written || !open || c.in.overflow()) {
      const std::string tls_error = c.io->error();
      if (!tls_error.empty() && c.link->host.empty()) {
        log::warn("agent connection refused at the TLS handshake", {{"error", tls_error}});
      }
      drop(c.fd, !tls_error.empty() ? "TLS: " + tls_error
                 : !written         ? "connection broken"
                 : c.in.overflow()  ? "line too long"
                                    : "connection closed by the agent");
      return;
    }
    bool left_over;
    {
      std::lock_guard lock(c.link->mu);
      left_over = (!c.link->out.empty() && c.link->registration != Registration::pending) || c.io->blocked_on_write();
    }
    if (left_over != c.watching_out) {
      c.watching_out = left_over;
      watch(c.fd, EPOLLIN | EPOLLRDHUP | (left_over ? EPOLLOUT : 0u), tag(c.serial, c.fd), EPOLL_CTL_MOD);
    }
  }

  // Nothing is sent while a registration is pending: the pool may already send requests to the host it takes
  // (grants to a returning host), and the agent must read its registration reply first. The bytes are written
  // outside `mu`, so the owner thread queueing a request never waits for a system call; what the socket does
  // not take goes back to the front.
  bool flush(Conn& c) {
    std::string bytes;
    {
      std::lock_guard lock(c.link->mu);
      if (c.link->registration == Registration::pending || c.link->out.empty()) return true;
      bytes.swap(c.link->out);
    }
    const bool written = c.io->write_some(bytes).is_ok();
    if (!bytes.empty()) {
      std::lock_guard lock(c.link->mu);
      c.link->out.insert(0, bytes);
    }
    return written;
  }

  // Accepts what waits on `lfd`. Over max_connections a new connection is closed at once; out of descriptors,
  // accepting pauses for the back-off (the listening sockets are not watched meanwhile).
  void accept_all(int lfd) {
    for (;;) {
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof peer;
      int fd = ::accept4(lfd, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) pause_accepting(backoff.failed(errno));
        return;
      }
      backoff.accepted();
      if (conns.size() >= options.max_connections) {
        ::close(fd);
        continue;
      }
      std::uint32_t serial = next_serial++;
      if (next_serial == 0) next_serial = 1;
      if (!watch(fd, EPOLLIN | EPOLLRDHUP, tag(serial, fd))) {
        ::close(fd);
        continue;
      }
      Conn c;
      c.fd = fd;
      c.serial = serial;
      if (options.tls && peer.ss_family != AF_UNIX) {  // Unix sockets stay plain
        auto io = tls_server_stream(fd, options.tls);
        if (!io) {
          ::close(fd);
          continue;
        }
        c.io = std::move(*io);
      } else {
        c.io = plain_stream(fd);
      }
      c.link = std::make_shared<Link>();
      c.link->post = owner_post;
      c.link->post_reply = [this](std::function<void()> done) { replies.push_back(std::move(done)); };
      c.link->send = [box = outbox, fd, serial](std::string line, bool at_turn_end) {
        return box->put({fd, serial, std::move(line)}, at_turn_end);
      };
      c.last_seen = Clock::now();
      deadlines.push({c.last_seen + options.heartbeat_timeout, fd, serial});
      conns.emplace(fd, std::move(c));
    }
  }

  void pause_accepting(std::chrono::milliseconds for_how_long) {
    accept_after = Clock::now() + for_how_long;
    for (int fd : listen_fds) watch(fd, 0, tag(0, fd), EPOLL_CTL_MOD);
  }

  void resume_accepting() {
    if (!accept_after || Clock::now() < *accept_after) return;
    accept_after.reset();
    for (int fd : listen_fds) watch(fd, EPOLLIN, tag(0, fd), EPOLL_CTL_MOD);
  }

  void drop(int fd, const std::string& why) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn c = std::move(it->second);
    conns.erase(it);
    Registration was;
    {
      std::lock_guard lock(c.link->mu);
      c.link->alive = false;
      c.link->out.clear();
      was = c.link->registration;
    }
    ::close(fd);  // leaves the epoll set with it
    release(c);
    if (was == Registration::none) return;  // no host: no requests either
    Error err = host_lost_error(c.link->host, why);
    post([link = c.link, err] { end_requests(*link, err); });
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
    if (m.method.empty()) {  // a reply to one of our requests (RemoteHost reads it)
      if (registration(c) == Registration::admitted) complete(c.link, m.id, m.result, m.error);
      return;
    }
    if (m.method == "agent.register") return reply_register(c, m);
    if (registration(c) != Registration::admitted)
      return reply(c, m,
                   make_error(Errc::unauthorized, m.method + ": the agent is not registered (send agent.register "
                                                             "with the agent token first)"));
    if (m.method == "agent.heartbeat") return reply(c, m, health_update(c, m, "agent.heartbeat"));
    if (m.method == "device.health") return reply(c, m, health_update(c, m, "device.health"));
    if (m.method == "vm.stopped") return reply(c, m, vm_stopped(c, m));
    if (m.method.rfind("image.", 0) == 0) return images->serve(c.link, std::move(m));
    reply(c, m, make_error(Errc::method_not_found, "no method '" + m.method + "'"));
  }

  void reply_register(Conn& c, const Message& m) {
    const char* where = "agent.register";
    release_if_refused(c);
    if (registration(c) != Registration::none)
      return reply(c, m,
                   make_error(Errc::invalid_state,
                              "agent.register: this connection is already registered as host '" + c.link->host + "'"));
    auto token = get_string(m.params, "token", where, true);
    if (!token) return reply(c, m, token.error());
    if (*token != options.token)
      return reply(c, m, make_error(Errc::unauthorized, "agent.register: wrong agent token"));
    if (auto s = only_fields(m.params, "token,host,protocol,agent,devices", where); !s) return reply(c, m, s);
    auto* proto = m.params.if_contains("protocol");
    if (!proto || !proto->is_int64() || proto->get_int64() != kAgentProtocolVersion)
      return reply(c, m,
                   make_error(Errc::unsupported_version,
                              "agent.register: field 'protocol': this manager speaks "
                              "agent protocol version " +
                                  std::to_string(kAgentProtocolVersion)));
    auto host = get_string(m.params, "host", where, true);
    if (!host) return reply(c, m, host.error());
    auto* devs = m.params.if_contains("devices");
    if (!devs || !devs->is_array())
      return reply(c, m, make_error(Errc::invalid_argument, "agent.register: field 'devices' must be an array"));
    std::vector<AgentDevice> devices;
    devices.reserve(devs->get_array().size());
    std::map<std::string, std::string> health;
    std::string w = "agent.register: devices[";  // where, in errors: "agent.register: devices[i]"
    const std::size_t w_prefix = w.size();
    for (std::size_t i = 0; i < devs->get_array().size(); ++i) {
      const auto& v = devs->get_array()[i];
      w.resize(w_prefix);
      w += std::to_string(i);
      w += ']';
      if (!v.is_object()) return reply(c, m, make_error(Errc::invalid_argument, w + " must be an object"));
      const auto& o = v.get_object();
      if (auto s = only_fields(
              o, "id,kind,model,passthrough,pci,loaded,health,detail,vm,lease,attach_state,slots,slot_shapes", w);
          !s)
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
      if (id->empty()) return reply(c, m, make_error(Errc::invalid_argument, w + ": field 'id' is empty"));
      if (health.count(*id))
        return reply(c, m, make_error(Errc::invalid_argument, w + ": device id '" + *id + "' repeats"));
      std::string h = hl->empty() ? "ok" : *hl;
      if (!valid_health(h))
        return reply(c, m, make_error(Errc::invalid_argument, w + ": field 'health' must be ok, degraded or failed"));
      d.device.local_id = *id;
      d.device.kind = *kind;
      d.device.model = *model;
      d.device.passthrough = *pass;
      d.device.loaded = *loaded;
      if (const auto* slots = o.if_contains("slots")) {  // optional (docs/agent-protocol.md): 0 when absent
        if (!slots->is_int64() || slots->get_int64() < 0 || slots->get_int64() > manager::kMaxSlotsPerDevice) {
          return reply(c, m,
                       make_error(Errc::invalid_argument, w + ": field 'slots' must be an integer in 0.." +
                                                              std::to_string(manager::kMaxSlotsPerDevice)));
        }
        d.device.slots = static_cast<std::uint32_t>(slots->get_int64());
      }
      if (const auto* shapes = o.if_contains("slot_shapes")) {  // optional: no shapes when absent
        const auto* list = shapes->if_array();
        if (!list || !std::all_of(list->begin(), list->end(), [](const json::value& v) { return v.is_string(); }))
          return reply(c, m,
                       make_error(Errc::invalid_argument, w + ": field 'slot_shapes' must be an array of strings"));
        for (const auto& shape : *list) d.device.slot_shapes.emplace_back(shape.get_string());
      }
      d.pci_bdf = *pci;
      d.health = h;
      d.detail = *detail;
      if (!state->empty() && *state != "attached" && *state != "quarantined" && *state != "recorded")
        return reply(c, m,
                     make_error(Errc::invalid_argument, w + ": field 'attach_state' must be attached, quarantined or "
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
        return reply(c, m,
                     make_error(Errc::already_registered, "agent.register: host '" + *host +
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
      if (alive) link->send("", false);
    });
  }

  // agent.heartbeat {"devices":[{"id","health","detail"}], "full": bool} or device.health {"device","health",
  // "detail"}: every entry is checked before any is applied. A heartbeat lists the devices whose health changed
  // since the agent's last one, and every device when `full` (a periodic full state); either way only changes
  // against what the listener knows are reported, so a full list that repeats the known health reports nothing.
  Status health_update(Conn& c, const Message& m, const std::string& where) {
    std::vector<std::tuple<std::string, std::string, std::string>> updates;
    auto read_one = [&](const json::object& o, const std::string& w, const char* id_key) -> Status {
      auto id = get_string(o, id_key, w, true);
      auto h = get_string(o, "health", w, true);
      auto detail = get_string(o, "detail", w, false);
      for (const Status& s : {id.status(), h.status(), detail.status()})
        if (!s) return s;
      if (!valid_health(*h))
        return make_error(Errc::invalid_argument, w + ": field 'health' must be ok, degraded or failed");
      if (!c.health.count(*id))
        return make_error(Errc::not_found, w + ": host '" + c.link->host + "' registered no device '" + *id + "'");
      updates.emplace_back(*id, *h, *detail);
      return Status::ok();
    };
    if (where == "device.health") {
      if (auto s = only_fields(m.params, "device,health,detail", where); !s) return s;
      if (auto s = read_one(m.params, where, "device"); !s) return s;
    } else {
      if (auto s = only_fields(m.params, "devices,full", where); !s) return s;
      if (auto full = get_bool(m.params, "full", where, false); !full) return full.status();
      if (auto* devs = m.params.if_contains("devices")) {
        if (!devs->is_array()) return make_error(Errc::invalid_argument, where + ": field 'devices' must be an array");
        for (std::size_t i = 0; i < devs->get_array().size(); ++i) {
          std::string w = where + ": devices[" + std::to_string(i) + "]";
          const auto& v = devs->get_array()[i];
          if (!v.is_object()) return make_error(Errc::invalid_argument, w + " must be an object");
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
    if (name->empty() && uuid->empty())
      return make_error(Errc::invalid_argument, where + ": needs 'vm_name' or 'vm_uuid'");
    vm.vm_name = *name;
    vm.vm_uuid = *uuid;
    vm.reason = *reason;
    if (auto* devs = m.params.if_contains("devices")) {
      if (!devs->is_array()) return make_error(Errc::invalid_argument, where + ": field 'devices' must be an array");
      for (const auto& d : devs->get_array()) {
        if (!d.is_string()) return make_error(Errc::invalid_argument, where + ": field 'devices' must hold strings");
        vm.devices.emplace_back(d.get_string());
      }
    }
    if (events.vm_stopped) post([cb = events.vm_stopped, host = c.link->host, vm] { cb(host, vm); });
    return Status::ok();
  }
};

Result<std::unique_ptr<AgentListener>> AgentListener::create(ListenerOptions options, ListenerEvents events,
                                                             manager::Poster post, manager::Poster after_turn) {
  if (options.listen.empty()) return make_error(Errc::invalid_argument, "agent listener: no address to listen on");
  if (options.token.empty()) return make_error(Errc::invalid_argument, "agent listener: the agent token is empty");
  if (options.heartbeat_timeout.count() <= 0)
    return make_error(Errc::invalid_argument, "agent listener: heartbeat timeout must be positive");
  if (options.max_connections == 0)
    return make_error(Errc::invalid_argument, "agent listener: max_connections must be positive");
  if (!post) return make_error(Errc::invalid_argument, "agent listener: no poster");
  auto impl = std::make_unique<Impl>();
  std::unique_ptr<AgentListener> self(new AgentListener());
  for (const auto& a : options.listen) {
    auto fd = listen_on(a);
    if (!fd) return fd.error();  // impl's destructor closes what was bound
    impl->listen_fds.push_back(*fd);
    if (self->tcp_port_ == 0 && a.rfind("unix:", 0) != 0) self->tcp_port_ = bound_port(*fd);
  }
  impl->outbox->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->outbox->wake_fd < 0) return make_error(Errc::io_error, "agent listener: eventfd failed");
  impl->outbox->after_turn = std::move(after_turn);
  impl->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (impl->epoll_fd < 0) return make_error(Errc::io_error, "agent listener: epoll_create1 failed");
  bool watched = impl->watch(impl->outbox->wake_fd, EPOLLIN, tag(0, impl->outbox->wake_fd));
  for (int fd : impl->listen_fds) watched = watched && impl->watch(fd, EPOLLIN, tag(0, fd));
  if (!watched) return make_error(Errc::io_error, "agent listener: epoll_ctl failed");
  impl->images = std::make_unique<ImageServer>(options.images);
  impl->options = std::move(options);
  impl->events = std::move(events);
  impl->owner_post = std::move(post);
  impl->thread = std::thread([p = impl.get()] {
    ::pthread_setname_np(::pthread_self(), "ap-agents");  // how `top -H` and the scale benchmark find it
    p->run();
  });
  self->impl_ = std::move(impl);
  return self;
}

AgentListener::~AgentListener() {
  if (!impl_) return;
  impl_->stop = true;
  impl_->outbox->wake();
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
