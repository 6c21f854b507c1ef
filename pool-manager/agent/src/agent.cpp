#include "agent.hpp"
#include "manager_list.hpp"
#include "relay.hpp"

#include <accelpool/agent/link_stream.hpp>
#include <accelpool/agent/wire.hpp>
#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/common/log.hpp>
#include <accelpool/host/runtime.hpp>
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
#include <accelpool/hypervisor/domain_channels.hpp>
#include <accelpool/hypervisor/libvirt_attacher.hpp>
#endif

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

namespace accelpool::agent {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::int64_t kRegisterId = 1;
// Every this many heartbeats one lists every device's health (docs/agent-protocol.md, "Heartbeats").
constexpr std::uint64_t kHeartbeatFullEvery = 10;
// How long a request of the agent's own (an image piece) waits for the manager's answer.
constexpr std::chrono::seconds kAnswerTimeout{60};

class AgentImpl final : public Agent {
 public:
  explicit AgentImpl(AgentConfig cfg) : cfg_(std::move(cfg)) { wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

  ~AgentImpl() override {
    runtime_.reset();  // its queued operations finish and reply first
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    relay_.reset();
#endif
    ::close(wake_fd_);
  }

  Status init() {
    std::vector<std::unique_ptr<backends::DeviceBackend>> made;
    for (const auto& [name, bc] : cfg_.backends) {
      auto b = backends::make_backend(name, bc);
      if (!b) return make_error(b.error().code, "backend '" + name + "': " + b.error().message);
      made.push_back(std::move(*b));
    }
    std::unique_ptr<host::ImageSource> images;
    if (!cfg_.bitstreams.empty()) {
      auto folder = host::folder_images(cfg_.bitstreams, std::make_shared<LinkImages>(*this));
      if (!folder) return make_error(folder.error().code, "bitstream registry: " + folder.error().message);
      images = std::move(*folder);
    }
    std::unique_ptr<hypervisor::Attacher> attacher;
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (!cfg_.libvirt_uri.empty()) {
      hypervisor::LibvirtOptions o;
      o.uri = cfg_.libvirt_uri;
      o.detach_timeout = cfg_.detach_timeout;
      o.shmem_size_mib = cfg_.shmem_size_mib;
      auto a = hypervisor::make_libvirt_attacher(o);
      if (!a) return make_error(a.error().code, "libvirt '" + cfg_.libvirt_uri + "': " + a.error().message);
      attacher = std::move(*a);
    }
#else
    if (!cfg_.libvirt_uri.empty())
      return make_error(Errc::invalid_config, "libvirt.uri is set but this accelpool-agent was built without libvirt");
#endif
    const bool attaching = attacher != nullptr;
    host::RuntimeOptions ro;
    ro.host = cfg_.host;
    ro.health_interval = cfg_.heartbeat_interval;
    ro.state_file = cfg_.state_file;
    host::RuntimeEvents ev;
    ev.health_changed = [this](const std::string& id, const std::string& health, const std::string& detail) {
      note(notification_line("device.health", json::object{{"device", id}, {"health", health}, {"detail", detail}}));
    };
    ev.vm_stopped = [this](const host::VmStopped& vm) { on_vm_stopped(vm); };
    ev.log = [this](const std::string& line) { log::info("host runtime", {{"host", cfg_.host}, {"detail", line}}); };
    auto rt = host::HostRuntime::create(std::move(ro), std::move(made), std::move(images), std::move(attacher),
                                        std::move(ev));
    if (!rt) return rt.error();
    runtime_ = std::move(*rt);
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (attaching) {
      if (auto s = start_relay(); !s) return s;
    }
#else
    (void)attaching;
#endif
    log::info("devices found", {{"host", cfg_.host}, {"devices", runtime_->devices().size()}});
    return Status::ok();
  }

  void wake() override {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

  // The connection to the manager ended (`how`: "lost" or "broken"), with TLS's reason when TLS ended it.
  void log_link_ended(std::string_view how, const std::string& tls_error) const {
    const std::string event = "connection to the manager " + std::string(how);
    if (tls_error.empty())
      log::warn(event, {{"host", cfg_.host}, {"manager", manager_}});
    else
      log::warn(event, {{"host", cfg_.host}, {"manager", manager_}, {"tls_error", tls_error}});
  }

  int run(const std::atomic<bool>& stop) override {
    auto backoff = cfg_.reconnect_min;
    ManagerList managers(cfg_.managers);
    while (!stop) {
      {
        std::lock_guard lock(mu_);
        manager_ = managers.current();
      }
      leader_hint_.clear();
      auto fd = connect_to(manager_);
      int rc = -1;
      if (fd) {
        if (auto io = link_stream(*fd))
          rc = serve(**io, *fd, stop, backoff);
        else
          log::warn("TLS to the manager failed",
                    {{"host", cfg_.host}, {"manager", manager_}, {"error", io.error().message}});
        ::close(*fd);  // after the stream: TLS says close_notify first
        std::lock_guard lock(mu_);
        registered_ = false;
        out_.clear();
        ++gen_;
        answer_all(make_error(Errc::unavailable, "the connection to the manager at " + manager_ + " ended"));
      } else {
        log::warn("cannot connect to the manager",
                  {{"host", cfg_.host}, {"manager", manager_}, {"error", fd.error().message}});
      }
      if (rc == 2) return 2;
      if (stop) break;
      // A standby's answer names the leader: that address is tried at once, the next of the list after the backoff.
      if (managers.advance(leader_hint_)) continue;
      sleep_for(backoff, stop);
      backoff = std::min(backoff * 2, cfg_.reconnect_max);
    }
    return 0;
  }

 private:
  void sleep_for(std::chrono::milliseconds d, const std::atomic<bool>& stop) {
    auto until = Clock::now() + d;
    while (!stop && Clock::now() < until) {
      pollfd p{wake_fd_, POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left, 1)));
      drain_wake();
    }
  }

  void drain_wake() {
    std::uint64_t n;
    [[maybe_unused]] auto r = ::read(wake_fd_, &n, sizeof(n));
  }

  // --- the connection -----------------------------------------------------------------------------------------

  // The stream over the connected `fd`: TLS when configured (checking the manager's name), else plain.
  Result<std::unique_ptr<LinkStream>> link_stream(int fd) const {
    if (!cfg_.tls) return plain_stream(fd);
    return tls_client_stream(fd, cfg_.tls, manager_.substr(0, manager_.rfind(':')));
  }

  // Returns -1 to reconnect, 0 when stopping, 2 when refused for good. `io` is the stream over `fd`.
  int serve(LinkStream& io, int fd, const std::atomic<bool>& stop, std::chrono::milliseconds& backoff) {
    {
      std::lock_guard lock(mu_);
      ++gen_;
      out_ = request_line(kRegisterId, "agent.register", register_params());
    }
    LineBuffer in{kMaxLine};
    auto next_hb = Clock::now() + cfg_.heartbeat_interval;
    while (!stop) {
      bool want_write;
      {
        std::lock_guard lock(mu_);
        want_write = !out_.empty();
      }
      want_write = want_write || io.blocked_on_write();
      pollfd fds[2] = {{fd, static_cast<short>(POLLIN | (want_write ? POLLOUT : 0)), 0}, {wake_fd_, POLLIN, 0}};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_hb - Clock::now()).count();
      ::poll(fds, 2, static_cast<int>(std::clamp<std::int64_t>(left, 1, 100)));
      drain_wake();
      bool open = io.read_some(in);
      while (auto line = in.next_line()) {
        int rc = handle_line(*line, backoff);
        if (rc != 0) return rc;
      }
      if (!open || in.overflow()) {
        log_link_ended("lost", io.error());
        return -1;
      }
      std::lock_guard lock(mu_);
      if (registered_) {
        if (Clock::now() >= next_hb) {
          out_ += request_line(next_id_++, "agent.heartbeat", heartbeat_params());
          next_hb = Clock::now() + cfg_.heartbeat_interval;
        }
        while (!notes_.empty()) {
          out_ += notes_.front();
          notes_.pop_front();
        }
      }
      if (!io.write_some(out_)) {
        log_link_ended("broken", io.error());
        return -1;
      }
    }
    return 0;
  }

  int handle_line(const std::string& line, std::chrono::milliseconds& backoff) {
    auto m = parse_message(line);
    if (!m) {
      log::warn("bad message from the manager", {{"host", cfg_.host}, {"error", m.error().message}});
      return 0;
    }
    if (m->method.empty()) {
      if (answered(*m)) return 0;
      bool is_register = m->id.is_int64() && m->id.get_int64() == kRegisterId;
      if (is_register && m->error && m->error->code == Errc::not_leader) {
        // A standby of a shared store: it names the leader's agent address (none while nobody leads).
        leader_hint_ = standby_names_leader(line);
        log::info("the manager is a standby", {{"host", cfg_.host}, {"manager", manager_}, {"leader", leader_hint_}});
        return -1;
      }
      if (m->error) {
        log::error(is_register ? "registration refused" : "heartbeat refused",
                   {{"host", cfg_.host},
                    {"manager", manager_},
                    {"code", std::string(to_string(m->error->code))},
                    {"error", m->error->message}});
        if (is_register && (m->error->code == Errc::unauthorized || m->error->code == Errc::unsupported_version ||
                            m->error->code == Errc::invalid_argument || m->error->code == Errc::conflict))
          return 2;
        return -1;  // already registered (an old connection not yet noticed as lost), or forgotten: start over
      }
      if (is_register) {
        std::lock_guard lock(mu_);
        registered_ = true;
        backoff = cfg_.reconnect_min;
        log::info("registered with the manager", {{"host", cfg_.host}, {"manager", manager_}});
      }
      return 0;
    }
    std::uint64_t gen;
    bool registered;
    {
      std::lock_guard lock(mu_);
      gen = gen_;
      registered = registered_;
    }
    const std::string method = m->method;
    if (!registered) {
      reply(gen, *m, make_error(Errc::invalid_state, method + ": the agent is not registered yet"));
      return 0;
    }
    if (method == "device.prepare") {
      auto request = parse_prepare_request(m->params, method);
      if (!request) {
        reply(gen, *m, request.error());
        return 0;
      }
      runtime_->prepare(
          *request, [this, gen, msg = std::move(*m), request = *request](Status s, host::PrepareResult r) {
            log::write(s ? log::Level::info : log::Level::warn, s ? "device prepared" : "device not prepared",
                       {{"host", cfg_.host},
                        {"device", request.device},
                        {"lease", request.lease},
                        {"vm", request.vm},
                        {"bitstream", request.bitstream},
                        {"reprogram", request.reprogram},
                        {"loaded", r.loaded},
                        {"error", s ? std::string() : s.error().message}});
            reply(gen, msg, std::move(s), prepare_result_json(r));
          });
      return 0;
    }
    if (method == "device.release" || method == "device.reset") {
      auto id = device_param(m->params, method);
      if (!id) {
        reply(gen, *m, id.error());
        return 0;
      }
      if (method == "device.reset") {
        runtime_->reset(*id, [this, gen, msg = std::move(*m), device = *id](Status s, std::string loaded) {
          log::write(s ? log::Level::info : log::Level::warn, "device reset",
                     {{"host", cfg_.host},
                      {"device", device},
                      {"loaded", loaded},
                      {"error", s ? std::string() : s.error().message}});
          reply(gen, msg, std::move(s), json::object{{"loaded", loaded}});
        });
        return 0;
      }
      runtime_->release(*id, [this, gen, msg = std::move(*m), device = *id](Status s, host::ReleaseResult r) {
        log::write(s ? log::Level::info : log::Level::warn, "device released",
                   {{"host", cfg_.host},
                    {"device", device},
                    {"loaded", r.loaded},
                    {"error", s ? std::string() : s.error().message}});
        json::object result{{"loaded", r.loaded}};
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
        if (r.detach) {
          result["detach"] = std::string(hypervisor::to_string(r.detach->outcome));
          result["detach_ms"] = static_cast<std::int64_t>(r.detach->elapsed.count());
        }
#endif
        reply(gen, msg, std::move(s), std::move(result));
      });
      return 0;
    }
    reply(gen, *m, make_error(Errc::method_not_found, "no method '" + method + "'"));
    return 0;
  }

  void reply(std::uint64_t gen, const Message& m, Status s, json::object result = {}) {
    if (!m.has_id) return;
    {
      std::lock_guard lock(mu_);
      if (gen != gen_) return;  // the connection that asked is gone; the manager failed the call already
      out_ += s ? result_line(m.id, std::move(result)) : error_line(m.id, s.error());
    }
    wake();
  }

  // Queued notifications survive a reconnect: they are sent after the next registration.
  void note(std::string line) {
    {
      std::lock_guard lock(mu_);
      notes_.push_back(std::move(line));
    }
    wake();
  }

  // --- requests of the agent's own -----------------------------------------------------------------------------

  // What a request of the agent's own is waiting for: the manager's answer. Guarded by mu_.
  struct Asked {
    std::optional<Result<json::value>> answer;
  };

  // Sends `method` to the manager and waits for its answer (up to kAnswerTimeout). Called by the runtime's threads,
  // never by the connection thread. Errors: the manager's error, "unavailable" (not registered, the connection
  // ended, no answer in time).
  Result<json::value> ask(const std::string& method, json::object params) {
    std::unique_lock lock(mu_);
    auto asked = send_locked(method, std::move(params));
    if (!asked) return not_connected(method);
    wake_unlocked(lock);
    return wait_locked(lock, *asked, method);
  }

  // Wakes the connection thread for what send_locked() queued, with mu_ (held by `lock`) released meanwhile.
  void wake_unlocked(std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    wake();
    lock.lock();
  }

  // ask() in two steps, for several requests in flight: queues `method` (the caller wakes the connection thread
  // once mu_ is released), or returns null when not registered. mu_ held.
  std::shared_ptr<Asked> send_locked(const std::string& method, json::object params) {
    if (!registered_) return nullptr;
    auto asked = std::make_shared<Asked>();
    const std::int64_t id = next_id_++;
    asked_[id] = asked;
    out_ += request_line(id, method, std::move(params));
    return asked;
  }

  // Waits up to kAnswerTimeout for the answer to what send_locked() sent; `lock` holds mu_. The request's entry
  // stays until its answer comes (answered() takes it) or the connection ends (answer_all): a late answer is not
  // taken for another reply.
  Result<json::value> wait_locked(std::unique_lock<std::mutex>& lock, Asked& asked, const std::string& method) {
    bool came = answered_.wait_for(lock, kAnswerTimeout, [&] { return asked.answer.has_value(); });
    if (!came)
      return make_error(Errc::unavailable, method + ": no answer from the manager within " +
                                               std::to_string(kAnswerTimeout.count()) + " s");
    return std::move(*asked.answer);
  }

  Error not_connected(const std::string& method) const {
    return make_error(Errc::unavailable, method + ": not connected to the manager at " + manager_);
  }

  // A reply to one of ask()'s requests: hands it over. False for any other reply. Connection thread.
  bool answered(const Message& m) {
    std::lock_guard lock(mu_);
    if (!m.id.is_int64()) return false;
    auto it = asked_.find(m.id.get_int64());
    if (it == asked_.end()) return false;
    if (m.error) {
      it->second->answer = Result<json::value>(*m.error);
    } else {
      it->second->answer = m.result.value_or(json::value(nullptr));
    }
    asked_.erase(it);
    answered_.notify_all();
    return true;
  }

  // Ends every wait of ask() with `why` (the connection ended). mu_ held.
  void answer_all(const Error& why) {
    for (auto& [id, asked] : asked_)
      if (!asked->answer) asked->answer = Result<json::value>(why);
    asked_.clear();
    answered_.notify_all();
  }

  // The manager's images, over this agent's link: image.manifest, then image.read piece by piece, reading ahead:
  // a fetch keeps up to kImageRequestsAhead pieces asked for, so the manager reads and encodes the next pieces
  // while this agent decodes and writes the last. The manager refuses image requests beyond its bound on one
  // link, so the window is the agent's, shared by every fetch in progress (each device's strand fetches on its
  // own thread).
  class LinkImages final : public bitstreams::ImageFetcher {
   public:
    explicit LinkImages(AgentImpl& agent) : agent_(agent) {}
    Result<Described> describe(std::string_view sha256) override {
      const std::string method = "image.manifest";
      std::unique_lock lock(agent_.mu_);
      if (!wait_for_window(lock)) return window_error(method);
      auto asked = send(method, json::object{{"sha256", sha256}});
      if (!asked) return agent_.not_connected(method);
      agent_.wake_unlocked(lock);
      auto r = agent_.wait_locked(lock, *asked, method);
      if (!r) return r.error();
      const auto* o = r->if_object();
      const auto* manifest = o ? o->if_contains("manifest") : nullptr;
      const auto* size = o ? o->if_contains("size") : nullptr;
      if (!manifest || !manifest->is_string() || !size || !size->is_number())
        return make_error(Errc::invalid_argument, "image.manifest: the answer lacks a string 'manifest' and a 'size'");
      std::error_code ec;
      auto bytes = size->to_number<std::uint64_t>(ec);
      if (ec) return make_error(Errc::invalid_argument, "image.manifest: field 'size' must be a non-negative integer");
      Ahead& mine = ahead_[std::this_thread::get_id()];
      mine = Ahead{std::string(sha256), bytes, 0, {}};
      return Described{std::string(manifest->get_string()), bytes};
    }
    Result<std::string> read(std::string_view sha256, std::uint64_t offset) override {
      const std::string method = "image.read";
      std::unique_lock lock(agent_.mu_);
      Ahead& mine = ahead_[std::this_thread::get_id()];  // a map's elements stay where they are
      if (mine.sha256 != sha256 || mine.pieces.empty() || mine.pieces.front().offset != offset) {
        // Not what was asked ahead (another image, or a piece shorter than asked): start again at `offset`. What
        // was asked ahead still holds its place in the window until its answer comes.
        const std::uint64_t size = mine.sha256 == sha256 ? mine.size : offset + 1;  // unknown: this piece only
        mine = Ahead{std::string(sha256), size, offset, {}};
      }
      bool sent = false;
      while (mine.pieces.size() < static_cast<std::size_t>(kImageRequestsAhead) && mine.next < mine.size) {
        if (mine.pieces.empty() ? !wait_for_window(lock) : !window_open()) break;
        auto asked = send(method, json::object{{"sha256", sha256},
                                               {"offset", mine.next},
                                               {"length", static_cast<std::uint64_t>(kImageChunk)}});
        if (!asked) break;
        mine.pieces.push_back({mine.next, asked});
        mine.next += kImageChunk;
        sent = true;
      }
      if (mine.pieces.empty()) return agent_.registered_ ? window_error(method) : agent_.not_connected(method);
      if (sent) agent_.wake_unlocked(lock);
      const auto asked = mine.pieces.front().asked;
      mine.pieces.pop_front();
      auto r = agent_.wait_locked(lock, *asked, method);
      if (!r) mine = Ahead{};  // the pieces asked after it are not waited for
      lock.unlock();
      if (!r) return r.error();
      const auto* data = r->is_object() ? r->get_object().if_contains("data") : nullptr;
      if (!data || !data->is_string())
        return make_error(Errc::invalid_argument, "image.read: the answer lacks a string 'data'");
      auto bytes = bitstreams::base64_decode(data->get_string());
      if (!bytes) return make_error(bytes.error().code, "image.read: field 'data': " + bytes.error().message);
      return bytes;
    }

   private:
    struct Piece {
      std::uint64_t offset;
      std::shared_ptr<Asked> asked;
    };
    // One fetch's read-ahead (one per fetching thread): the image, its size, the next offset to ask for, and the
    // pieces asked for and not yet read, in order.
    struct Ahead {
      std::string sha256;
      std::uint64_t size = 0;
      std::uint64_t next = 0;
      std::deque<Piece> pieces;
    };

    // Queues an image request, counted in the window until its answer comes; null when not connected. mu_ held.
    std::shared_ptr<Asked> send(const std::string& method, json::object params) {
      auto asked = agent_.send_locked(method, std::move(params));
      if (asked) outstanding_.push_back(asked);
      return asked;
    }
    // Whether another image request may go out now: fewer than kImageRequestsAhead unanswered. mu_ held.
    bool window_open() {
      std::erase_if(outstanding_, [](const auto& a) { return a->answer.has_value(); });
      return outstanding_.size() < static_cast<std::size_t>(kImageRequestsAhead);
    }
    // Waits until window_open() (false after kAnswerTimeout, or when the connection ended). mu_ held.
    bool wait_for_window(std::unique_lock<std::mutex>& lock) {
      agent_.answered_.wait_for(lock, kAnswerTimeout, [&] { return window_open() || !agent_.registered_; });
      return window_open() && agent_.registered_;
    }
    Error window_error(const std::string& method) const {
      return make_error(Errc::unavailable, method +
                                               ": the manager answered none of this agent's image requests within " +
                                               std::to_string(kAnswerTimeout.count()) + " s");
    }

    AgentImpl& agent_;
    std::vector<std::shared_ptr<Asked>> outstanding_;  // image requests sent; mu_
    std::map<std::thread::id, Ahead> ahead_;           // mu_
  };

  // The {"device"} params of device.release and device.reset. Errors: "invalid_argument" naming the field.
  static Result<std::string> device_param(const json::object& params, const std::string& where) {
    if (auto s = only_fields(params, "device", where); !s) return s.error();
    return get_string(params, "device", where, true);
  }

  json::object register_params() {  // mu_ held
    json::array devs;
    heartbeat_told_.clear();
    beats_ = 0;
    for (const auto& d : runtime_->devices()) {
      heartbeat_told_[d.info.local_id] = d.health + "\n" + d.detail;
      json::object o{
          {"id", d.info.local_id}, {"kind", d.info.kind}, {"model", d.info.model}, {"passthrough", d.info.passthrough},
          {"pci", d.info.pci_bdf}, {"loaded", d.loaded},  {"health", d.health},    {"detail", d.detail}};
      if (!d.vm.empty()) {
        o["vm"] = d.vm;
        o["lease"] = d.lease;
        o["attach_state"] = d.attach_state();
      }
      if (d.info.slots > 0) o["slots"] = d.info.slots;
      if (auto shapes = backends::slot_shapes_of(d.info); !shapes.empty()) {
        o["slot_shapes"] = json::array(shapes.begin(), shapes.end());
      }
      devs.push_back(std::move(o));
    }
    return json::object{{"token", cfg_.token},
                        {"host", cfg_.host},
                        {"protocol", kAgentProtocolVersion},
                        {"agent", "accelpool-agent 0.1"},
                        {"devices", std::move(devs)}};
  }

  // A heartbeat carries the devices whose health changed since the last heartbeat (or the registration), and
  // every device on each kHeartbeatFullEvery-th beat ("full": true), so a manager that missed a change learns it.
  json::object heartbeat_params() {  // mu_ held
    const bool full = ++beats_ % kHeartbeatFullEvery == 0;
    json::array devs;
    for (const auto& d : runtime_->devices()) {
      const std::string& id = d.info.local_id;
      std::string said = d.health + "\n" + d.detail;
      std::string& told = heartbeat_told_[id];
      if (!full && told == said) continue;
      told = std::move(said);
      devs.push_back(json::object{{"id", id}, {"health", d.health}, {"detail", d.detail}});
    }
    json::object p{{"devices", std::move(devs)}};
    if (full) p["full"] = true;
    return p;
  }

  // --- hypervisor ---------------------------------------------------------------------------------------------

  // A VM that held devices of this host ended (the runtime freed them): the manager ends its leases.
  void on_vm_stopped(const host::VmStopped& vm) {
    json::array ids;
    for (const auto& id : vm.devices) ids.push_back(json::string(id));
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (relay_) relay_->rescan();
#endif
    note(notification_line(
        "vm.stopped",
        json::object{
            {"vm_name", vm.vm_name}, {"vm_uuid", vm.vm_uuid}, {"reason", vm.reason}, {"devices", std::move(ids)}}));
  }

#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
  // Relays the guest channel of every running VM to the manager's guest listener (relay.hpp).
  Status start_relay() {
    if (cfg_.relay_managers.empty()) return Status::ok();
    auto finder = hypervisor::ChannelFinder::create(cfg_.libvirt_uri, cfg_.relay_channel);
    if (!finder) return make_error(finder.error().code, "relay: " + finder.error().message);
    channels_ = std::move(*finder);
    RelayOptions o;
    o.managers = cfg_.relay_managers;
    o.token = cfg_.token;
    o.host = cfg_.host;
    o.scan_interval = cfg_.relay_scan_interval;
    o.reconnect_min = cfg_.reconnect_min;
    o.reconnect_max = cfg_.reconnect_max;
    auto targets = [this]() -> Result<std::vector<RelayTarget>> {
      auto found = channels_->list();
      if (!found) return found.error();
      std::vector<RelayTarget> out;
      for (auto& c : *found) out.push_back({c.vm, c.socket});
      return out;
    };
    auto r = Relay::start(std::move(o), targets, [this](const std::string& m) {
      log::info("relay", {{"host", cfg_.host}, { "detail", m }});
    });
    if (!r) return r.error();
    relay_ = std::move(*r);
    std::string managers;
    for (const auto& m : cfg_.relay_managers) managers += (managers.empty() ? "" : ",") + m;
    log::info("relaying the VMs' guest channel", {{"host", cfg_.host},
                                                  {"channel", cfg_.relay_channel},
                                                  { "manager",
                                                    managers }});
    return Status::ok();
  }

#endif

  AgentConfig cfg_;
  // The manager connected to or tried last (written by the connection thread under mu_), and the leader's address
  // a standby named in its answer ("" for none; the connection thread only).
  std::string manager_;
  std::string leader_hint_;
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
  std::unique_ptr<hypervisor::ChannelFinder> channels_;  // used by relay_'s thread only
  std::unique_ptr<Relay> relay_;
#endif
  std::unique_ptr<host::HostRuntime> runtime_;  // the devices; destroyed first (its completions reply)
  int wake_fd_ = -1;

  std::mutex mu_;          // the connection state below
  std::uint64_t gen_ = 0;  // connection generation: replies to an old connection are dropped
  bool registered_ = false;
  std::int64_t next_id_ = kRegisterId + 1;                // of the agent's own requests (heartbeats, ask())
  std::map<std::int64_t, std::shared_ptr<Asked>> asked_;  // ask()'s requests waiting for an answer
  std::condition_variable answered_;
  std::map<std::string, std::string> heartbeat_told_;  // device -> "health\ndetail" last sent to the manager
  std::uint64_t beats_ = 0;                            // heartbeats since the registration
  std::string out_;
  std::deque<std::string> notes_;
};

}  // namespace

Result<std::unique_ptr<Agent>> Agent::create(AgentConfig config) {
  auto a = std::make_unique<AgentImpl>(std::move(config));
  if (auto s = a->init(); !s) return s.error();
  return std::unique_ptr<Agent>(std::move(a));
}

}  // namespace accelpool::agent
