#include "agent.hpp"
#include "relay.hpp"

#include <accelpool/agent/wire.hpp>
#include <accelpool/backends/device_details.hpp>
#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/image_fetch.hpp>
#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
#include <accelpool/hypervisor/domain_channels.hpp>
#include <accelpool/hypervisor/libvirt_attacher.hpp>
#endif

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace accelpool::agent {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::int64_t kRegisterId = 1;

struct Device {
  std::size_t backend = 0;
  backends::DeviceInfo info;
  std::string loaded;  // bitstream name held now
  std::string health = "ok";
  std::string detail;
  std::string vm;     // VM the device serves (attached, or only recorded when nothing is attached)
  std::string lease;
  bool attached = false;     // put into `vm` through libvirt
  bool quarantined = false;  // a detach the guest never acknowledged
};

std::string health_word(backends::Health h) {
  switch (h) {
    case backends::Health::ok: return "ok";
    case backends::Health::degraded: return "degraded";
    case backends::Health::failed: return "failed";
  }
  return "failed";
}

class AgentImpl final : public Agent {
 public:
  explicit AgentImpl(AgentConfig cfg) : cfg_(std::move(cfg)) { wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

  ~AgentImpl() override {
    {
      std::lock_guard lock(jobs_mu_);
      stop_worker_ = true;
    }
    jobs_cv_.notify_one();
    if (worker_.joinable()) worker_.join();
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (attacher_) attacher_->set_event_handler({});
#endif
    ::close(wake_fd_);
  }

  Status init() {
    for (const auto& [name, bc] : cfg_.backends) {
      auto b = backends::make_backend(name, bc);
      if (!b) return make_error(b.error().code, "backend '" + name + "': " + b.error().message);
      auto found = (*b)->enumerate();
      if (!found) return make_error(found.error().code, "backend '" + name + "': " + found.error().message);
      for (auto& info : *found) {
        Device d;
        d.backend = backends_.size();
        d.info = info;
        if (devices_.count(info.local_id))
          return make_error("invalid_config", "device id '" + info.local_id + "' is reported by two backends");
        devices_[info.local_id] = std::move(d);
      }
      backends_.push_back(std::move(*b));
    }
    if (!cfg_.bitstreams.empty()) {
      auto reg = bitstreams::Registry::open(cfg_.bitstreams);
      if (!reg) return make_error(reg.error().code, "bitstream registry: " + reg.error().message);
      registry_.emplace(std::move(*reg));
    }
    for (auto& [id, d] : devices_) d.loaded = loaded_name(d);
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (!cfg_.libvirt_uri.empty()) {
      hypervisor::LibvirtOptions o;
      o.uri = cfg_.libvirt_uri;
      o.detach_timeout = cfg_.detach_timeout;
      o.shmem_size_mib = cfg_.shmem_size_mib;
      auto a = hypervisor::make_libvirt_attacher(o);
      if (!a) return make_error(a.error().code, "libvirt '" + cfg_.libvirt_uri + "': " + a.error().message);
      attacher_ = std::move(*a);
      attacher_->set_event_handler([this](const hypervisor::HypervisorEvent& ev) { on_event(ev); });
      reconcile();
      if (auto s = start_relay(); !s) return s;
    }
#else
    if (!cfg_.libvirt_uri.empty())
      return make_error("invalid_config", "libvirt.uri is set but this accelpool-agent was built without libvirt");
#endif
    log("host '" + cfg_.host + "': " + std::to_string(devices_.size()) + " devices");
    worker_ = std::thread([this] { work(); });
    return Status::ok();
  }

  void wake() override {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

  int run(const std::atomic<bool>& stop) override {
    auto backoff = cfg_.reconnect_min;
    while (!stop) {
      auto fd = connect_to(cfg_.manager);
      int rc = -1;
      if (fd) {
        rc = serve(*fd, stop, backoff);
        ::close(*fd);
        std::lock_guard lock(mu_);
        registered_ = false;
        out_.clear();
        ++gen_;
      } else {
        log(fd.error().message);
      }
      if (rc == 2) return 2;
      if (stop) break;
      sleep_for(backoff, stop);
      backoff = std::min(backoff * 2, cfg_.reconnect_max);
    }
    return 0;
  }

 private:
  void log(const std::string& msg) const { std::cerr << "accelpool-agent[" << cfg_.host << "]: " << msg << std::endl; }

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

  // Returns -1 to reconnect, 0 when stopping, 2 when refused for good.
  int serve(int fd, const std::atomic<bool>& stop, std::chrono::milliseconds& backoff) {
    {
      std::lock_guard lock(mu_);
      ++gen_;
      out_ = request_line(kRegisterId, "agent.register", register_params());
    }
    LineBuffer in{kMaxLine};
    std::int64_t next_id = kRegisterId + 1;
    auto next_hb = Clock::now() + cfg_.heartbeat_interval;
    while (!stop) {
      bool want_write;
      {
        std::lock_guard lock(mu_);
        want_write = !out_.empty();
      }
      pollfd fds[2] = {{fd, static_cast<short>(POLLIN | (want_write ? POLLOUT : 0)), 0}, {wake_fd_, POLLIN, 0}};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_hb - Clock::now()).count();
      ::poll(fds, 2, static_cast<int>(std::clamp<std::int64_t>(left, 1, 100)));
      drain_wake();
      bool open = read_some(fd, in);
      while (auto line = in.next_line()) {
        int rc = handle_line(*line, backoff);
        if (rc != 0) return rc;
      }
      if (!open || in.overflow()) {
        log("connection to the manager at " + cfg_.manager + " lost");
        return -1;
      }
      std::lock_guard lock(mu_);
      if (registered_) {
        if (Clock::now() >= next_hb) {
          out_ += request_line(next_id++, "agent.heartbeat", heartbeat_params());
          next_hb = Clock::now() + cfg_.heartbeat_interval;
        }
        while (!notes_.empty()) {
          out_ += notes_.front();
          notes_.pop_front();
        }
      }
      if (!write_some(fd, out_)) {
        log("connection to the manager at " + cfg_.manager + " broken");
        return -1;
      }
    }
    return 0;
  }

  int handle_line(const std::string& line, std::chrono::milliseconds& backoff) {
    auto m = parse_message(line);
    if (!m) {
      log("bad message from the manager: " + m.error().message);
      return 0;
    }
    if (m->method.empty()) {
      bool is_register = m->id.is_int64() && m->id.get_int64() == kRegisterId;
      if (m->error) {
        log((is_register ? "registration refused: " : "heartbeat refused: ") + m->error->message);
        if (is_register && (m->error->code == "unauthorized" || m->error->code == "unsupported_version" ||
                            m->error->code == "invalid_argument" || m->error->code == "conflict"))
          return 2;
        return -1;  // already registered (an old connection not yet noticed as lost), or forgotten: start over
      }
      if (is_register) {
        std::lock_guard lock(mu_);
        registered_ = true;
        backoff = cfg_.reconnect_min;
        log("registered with the manager at " + cfg_.manager);
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
      reply(gen, *m, make_error("invalid_state", method + ": the agent is not registered yet"));
      return 0;
    }
    if (method == "device.prepare" || method == "device.release" || method == "device.reset") {
      enqueue([this, gen, msg = std::move(*m)] {
        json::object result;
        Status s = msg.method == "device.prepare"   ? prepare(msg.params, result)
                   : msg.method == "device.release" ? release(msg.params, result)
                                                    : reset(msg.params, result);
        reply(gen, msg, std::move(s), std::move(result));
      });
      return 0;
    }
    reply(gen, *m, make_error("method_not_found", "no method '" + method + "'"));
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

  json::object register_params() {  // mu_ held
    json::array devs;
    for (const auto& [id, d] : devices_) {
      json::object o{{"id", id},
                     {"kind", d.info.kind},
                     {"model", d.info.model},
                     {"passthrough", d.info.passthrough},
                     {"pci", d.info.pci_bdf},
                     {"loaded", d.loaded},
                     {"health", d.health},
                     {"detail", d.detail}};
      if (!d.vm.empty()) {
        o["vm"] = d.vm;
        o["lease"] = d.lease;
        o["attach_state"] = d.quarantined ? "quarantined" : (d.attached ? "attached" : "recorded");
      }
      devs.push_back(std::move(o));
    }
    return json::object{{"token", cfg_.token},
                        {"host", cfg_.host},
                        {"protocol", kAgentProtocolVersion},
                        {"agent", "accelpool-agent 0.1"},
                        {"devices", std::move(devs)}};
  }

  json::object heartbeat_params() {  // mu_ held
    json::array devs;
    for (const auto& [id, d] : devices_) devs.push_back(json::object{{"id", id}, {"health", d.health}, {"detail", d.detail}});
    return json::object{{"devices", std::move(devs)}};
  }

  // --- the device worker --------------------------------------------------------------------------------------

  void enqueue(std::function<void()> job) {
    {
      std::lock_guard lock(jobs_mu_);
      jobs_.push_back(std::move(job));
    }
    jobs_cv_.notify_one();
  }

  void work() {
    auto next_health = Clock::now();
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(jobs_mu_);
        jobs_cv_.wait_until(lock, next_health, [this] { return stop_worker_ || !jobs_.empty(); });
        if (stop_worker_) return;
        if (!jobs_.empty()) {
          job = std::move(jobs_.front());
          jobs_.pop_front();
        }
      }
      if (job) job();
      if (Clock::now() >= next_health) {
        check_health();
        next_health = Clock::now() + cfg_.heartbeat_interval;
      }
    }
  }

  void check_health() {
    std::vector<std::pair<std::string, std::size_t>> ids;
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, d] : devices_)
        if (!d.quarantined) ids.emplace_back(id, d.backend);
    }
    for (const auto& [id, b] : ids) {
      auto r = backends_[b]->health(id);
      set_health(id, health_word(r.health), r.detail, false);
    }
  }

  // Records a device's health and tells the manager when it changed.
  void set_health(const std::string& id, const std::string& health, const std::string& detail, bool force) {
    std::lock_guard lock(mu_);
    auto it = devices_.find(id);
    if (it == devices_.end()) return;
    if (it->second.quarantined && !force) return;
    if (it->second.health == health && it->second.detail == detail) return;
    it->second.health = health;
    it->second.detail = detail;
    notes_.push_back(notification_line("device.health", json::object{{"device", id}, {"health", health}, {"detail", detail}}));
    wake();
  }

  std::string name_of(const std::string& sha) {  // mu_ held
    if (sha.empty()) return "";
    if (auto it = names_.find(sha); it != names_.end()) return it->second;
    if (registry_)
      if (auto b = registry_->find_by_sha256(sha); b) return b->manifest.name;
    return "sha256:" + sha.substr(0, 16);
  }

  std::string loaded_name(const Device& d) {  // worker (or init), mu_ not held
    auto sha = backends_[d.backend]->loaded(d.info.local_id);
    if (!sha) return "";
    return name_of(*sha);
  }

  // The image for `bitstream`: from the registry (verified on disk now) when one is configured, else an image
  // that is only a name (simulated pools), whose identity is the hash of the name.
  Result<backends::Image> image_for(const std::string& bitstream, const std::string& sha256) {
    backends::Image img;
    if (registry_) {
      if (!sha256.empty() && !registry_->find_by_sha256(sha256)) {
        // Not here yet: the manager's copy is fetched, verified and cached in the registry folder.
        if (cfg_.images_url.empty()) {
          return make_error("missing_file", "bitstream '" + bitstream + "': no image with sha256 " + sha256 +
                                                " here, and agent.images_url is not set to fetch it");
        }
        auto f = bitstreams::fetch_image(*registry_, cfg_.images_url, cfg_.token, sha256);
        if (!f) return make_error(f.error().code, "bitstream '" + bitstream + "': fetching it: " + f.error().message);
      }
      auto b = sha256.empty() ? registry_->get(bitstream) : registry_->find_by_sha256(sha256);
      if (!b) return make_error(b.error().code, "bitstream '" + bitstream + "': " + b.error().message);
      if (b->manifest.name != bitstream)
        return make_error("invalid_argument", "bitstream '" + bitstream + "': sha256 " + sha256 + " is image '" +
                                                  b->manifest.name + "'");
      auto v = registry_->verify(b->manifest.name, b->manifest.version);
      if (!v) return v.error();
      img = backends::make_image(*v);
    } else {
      img.name = bitstream;
      img.sha256 = sha256.empty() ? bitstreams::sha256_bytes("accelpool-bitstream:" + bitstream) : sha256;
    }
    std::lock_guard lock(mu_);
    names_[img.sha256] = bitstream;
    return img;
  }

  Status prepare(const json::object& p, json::object& reply) {
    const std::string w = "device.prepare";
    auto request = parse_prepare_request(p, w);
    if (!request) return request.error();
    const std::string& id = request->device;
    const std::string& vm = request->vm;
    Device d;
    if (auto s = lookup(id, w, d); !s) return s;
    if (d.quarantined) return make_error("invalid_state", w + ": device '" + id + "' is quarantined (" + d.detail + ")");
    if (!d.vm.empty() && d.vm != vm)
      return make_error("invalid_state", w + ": device '" + id + "' serves VM '" + d.vm + "'; release it first");
    auto& backend = *backends_[d.backend];
    if (!request->bitstream.empty()) {
      auto img = image_for(request->bitstream, request->sha256);
      if (!img) return make_error(img.error().code, w + ": " + img.error().message);
      auto held = backend.loaded(id);
      if (request->reprogram || !held || *held != img->sha256) {
        Status s = backend.program(id, *img);
        set_loaded(id, loaded_name(d));
        if (!s) return make_error(s.error().code, w + ": programming '" + id + "': " + s.error().message);
      }
    }
    host::PrepareResult result;
    result.loaded = loaded_name(d);
    result.details = backends::details_of(d.info);
    set_loaded(id, result.loaded);
    auto answer = [&] {
      reply = prepare_result_json(result);
      return Status::ok();
    };
    // A PCI function goes in as a VFIO hostdev; a device with a shared-memory window as an emulated ivshmem.
    const bool pci = !d.info.pci_bdf.empty() && !d.info.attributes.count("shmem_name");
    const auto attach_mode = pci ? host::AttachMode::pci_hostdev : host::AttachMode::emulated;
    if (!d.info.passthrough) {  // the guest reaches it over the network, from any host: nothing to attach
      result.attach = host::AttachMode::network;
      if (auto e = d.info.attributes.find("endpoint"); e != d.info.attributes.end()) result.endpoint = e->second;
    }
    if (vm.empty()) return answer();
    if (d.attached) {  // already in the VM (a retried prepare)
      result.attach = attach_mode;
      return answer();
    }
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (attacher_ && d.info.passthrough) {
      hypervisor::DeviceSpec spec;
      spec.device_id = id;
      spec.lease_id = request->lease.empty() ? "unknown" : request->lease;
      spec.method = pci ? hypervisor::AttachMethod::pci_hostdev : hypervisor::AttachMethod::emulated;
      spec.pci_bdf = pci ? d.info.pci_bdf : "";
      if (auto s = attacher_->attach(vm, spec); !s)
        return make_error("attach_failed", w + ": attaching '" + id + "' to VM '" + vm + "' (" + s.error().code +
                                               "): " + s.error().message);
      result.attach = attach_mode;
      std::lock_guard lock(mu_);
      auto& dd = devices_[id];
      dd.vm = vm;
      dd.lease = request->lease;
      dd.attached = true;
      save_state();
      return answer();
    }
#endif
    std::lock_guard lock(mu_);
    devices_[id].vm = vm;
    devices_[id].lease = request->lease;
    return answer();
  }

  Status release(const json::object& p, json::object& result) {
    const std::string w = "device.release";
    if (auto s = only_fields(p, "device", w); !s) return s;
    auto id = get_string(p, "device", w, true);
    if (!id) return id.status();
    Device d;
    if (auto s = lookup(*id, w, d); !s) return s;
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
    if (d.attached && attacher_) {
      auto fut = attacher_->detach(d.vm, *id);
      if (fut) {
        auto out = fut->get();
        result["detach"] = std::string(hypervisor::to_string(out.outcome));
        result["detach_ms"] = static_cast<std::int64_t>(out.elapsed.count());
        if (!out.device_free()) {
          std::string why = "quarantined in VM '" + d.vm + "': " + out.detail;
          {
            std::lock_guard lock(mu_);
            devices_[*id].quarantined = true;
          }
          set_health(*id, "failed", why, true);
          return make_error("quarantined", w + ": device '" + *id + "' " + why);
        }
      } else if (fut.error().code != "not_attached" && fut.error().code != "not_found") {
        return make_error("detach_failed", w + ": detaching '" + *id + "' from VM '" + d.vm + "': " + fut.error().message);
      }
    }
#endif
    if (d.quarantined)
      return make_error("quarantined", w + ": device '" + *id + "' is quarantined (" + d.detail + ")");
    {
      std::lock_guard lock(mu_);
      auto& dd = devices_[*id];
      dd.vm.clear();
      dd.lease.clear();
      dd.attached = false;
      save_state();
    }
    Status s = backends_[d.backend]->reset(*id);
    std::string loaded = loaded_name(d);
    set_loaded(*id, loaded);
    result["loaded"] = loaded;
    if (!s) return make_error(s.error().code, w + ": resetting '" + *id + "': " + s.error().message);
    return Status::ok();
  }

  Status reset(const json::object& p, json::object& result) {
    const std::string w = "device.reset";
    if (auto s = only_fields(p, "device", w); !s) return s;
    auto id = get_string(p, "device", w, true);
    if (!id) return id.status();
    Device d;
    if (auto s = lookup(*id, w, d); !s) return s;
    if (d.quarantined) return make_error("invalid_state", w + ": device '" + *id + "' is quarantined (" + d.detail + ")");
    if (!d.vm.empty()) return make_error("invalid_state", w + ": device '" + *id + "' serves VM '" + d.vm + "'");
    Status s = backends_[d.backend]->reset(*id);
    std::string loaded = loaded_name(d);
    set_loaded(*id, loaded);
    result["loaded"] = loaded;
    if (!s) return make_error(s.error().code, w + ": " + s.error().message);
    return Status::ok();
  }

  Status lookup(const std::string& id, const std::string& where, Device& out) {
    std::lock_guard lock(mu_);
    auto it = devices_.find(id);
    if (it == devices_.end())
      return make_error("not_found", where + ": host '" + cfg_.host + "' has no device '" + id + "'");
    out = it->second;
    return Status::ok();
  }

  void set_loaded(const std::string& id, const std::string& loaded) {
    std::lock_guard lock(mu_);
    devices_[id].loaded = loaded;
  }

  // --- libvirt ------------------------------------------------------------------------------------------------

#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
  // Runs on the attacher's event thread: only bookkeeping and queued notifications.
  void on_event(const hypervisor::HypervisorEvent& ev) {
    std::lock_guard lock(mu_);
    std::set<std::string> ours;
    for (const auto& a : ev.devices) ours.insert(a.device_id);
    auto free_device = [&](const std::string& id, Device& d) {
      d.vm.clear();
      d.lease.clear();
      d.attached = false;
      if (d.quarantined) {
        d.quarantined = false;
        d.health = "ok";
        d.detail.clear();
        notes_.push_back(notification_line("device.health", json::object{{"device", id}, {"health", "ok"}, {"detail", ""}}));
      }
    };
    if (ev.kind == hypervisor::EventKind::device_removed) {
      for (auto& [id, d] : devices_)
        if (ours.count(id)) free_device(id, d);
    } else {
      json::array ids;
      for (auto& [id, d] : devices_) {
        if (ours.count(id) || (!d.vm.empty() && (d.vm == ev.vm_name || d.vm == ev.vm_uuid))) {
          ids.push_back(json::string(id));
          free_device(id, d);
        }
      }
      std::string reason = std::string(hypervisor::to_string(ev.kind));
      if (reason.rfind("vm_", 0) == 0) reason = reason.substr(3);
      if (relay_) relay_->rescan();
      notes_.push_back(notification_line(
          "vm.stopped",
          json::object{{"vm_name", ev.vm_name}, {"vm_uuid", ev.vm_uuid}, {"reason", reason}, {"devices", std::move(ids)}}));
    }
    save_state();
    wake();
  }

  // Relays the guest channel of every running VM to the manager's guest listener (relay.hpp).
  Status start_relay() {
    if (cfg_.relay_manager.empty()) return Status::ok();
    auto finder = hypervisor::ChannelFinder::create(cfg_.libvirt_uri, cfg_.relay_channel);
    if (!finder) return make_error(finder.error().code, "relay: " + finder.error().message);
    channels_ = std::move(*finder);
    RelayOptions o;
    o.manager = cfg_.relay_manager;
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
    auto r = Relay::start(std::move(o), targets, [this](const std::string& m) { log(m); });
    if (!r) return r.error();
    relay_ = std::move(*r);
    log("relaying channel '" + cfg_.relay_channel + "' of the VMs to " + cfg_.relay_manager);
    return Status::ok();
  }

  // Learns from the VMs named in the state file what this agent attached before it restarted.
  void reconcile() {
    if (cfg_.state_file.empty()) return;
    std::ifstream in(cfg_.state_file);
    std::string vm;
    while (std::getline(in, vm)) {
      if (vm.empty()) continue;
      auto list = attacher_->list_attached(vm);
      if (!list) {
        log("reconcile: VM '" + vm + "': " + list.error().message);
        continue;
      }
      for (const auto& a : *list) {
        auto it = devices_.find(a.device_id);
        if (it == devices_.end()) continue;
        auto& d = it->second;
        d.vm = vm;
        d.lease = a.lease_id;
        d.attached = true;
        if (a.state == hypervisor::AttachState::quarantined) {
          d.quarantined = true;
          d.health = "failed";
          d.detail = "quarantined in VM '" + vm + "': " + a.note;
        }
        log("reconcile: '" + a.device_id + "' is in VM '" + vm + "' (" + std::string(hypervisor::to_string(a.state)) + ")");
      }
    }
  }
#endif

  void save_state() {  // mu_ held
    if (cfg_.state_file.empty()) return;
    std::set<std::string> vms;
    for (const auto& [id, d] : devices_)
      if (d.attached) vms.insert(d.vm);
    auto tmp = cfg_.state_file;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      for (const auto& v : vms) out << v << "\n";
    }
    std::error_code ec;
    std::filesystem::rename(tmp, cfg_.state_file, ec);
    if (ec) log("cannot write state file '" + cfg_.state_file.string() + "': " + ec.message());
  }

  AgentConfig cfg_;
  std::vector<std::unique_ptr<backends::DeviceBackend>> backends_;
  std::optional<bitstreams::Registry> registry_;
#ifdef ACCELPOOL_AGENT_HAVE_LIBVIRT
  std::unique_ptr<hypervisor::Attacher> attacher_;
  std::unique_ptr<hypervisor::ChannelFinder> channels_;  // used by relay_'s thread only
  std::unique_ptr<Relay> relay_;                         // destroyed first
#endif
  int wake_fd_ = -1;

  std::mutex mu_;  // everything below up to the worker's fields
  std::map<std::string, Device> devices_;
  std::map<std::string, std::string> names_;  // sha256 -> bitstream name
  std::uint64_t gen_ = 0;                     // connection generation: replies to an old connection are dropped
  bool registered_ = false;
  std::string out_;
  std::deque<std::string> notes_;

  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_worker_ = false;
  std::thread worker_;
};

}  // namespace

Result<std::unique_ptr<Agent>> Agent::create(AgentConfig config) {
  auto a = std::make_unique<AgentImpl>(std::move(config));
  if (auto s = a->init(); !s) return s.error();
  return std::unique_ptr<Agent>(std::move(a));
}

}  // namespace accelpool::agent
