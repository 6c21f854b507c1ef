#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/verified_images.hpp>
#include <accelpool/common/slots.hpp>
#include <accelpool/host/runtime.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace accelpool::host {

std::string DeviceState::attach_state() const {
  if (vm.empty()) return "";
  return quarantined ? "quarantined" : (attached ? "attached" : "recorded");
}

namespace {

std::string health_word(backends::Health h) {
  switch (h) {
    case backends::Health::ok:
      return "ok";
    case backends::Health::degraded:
      return "degraded";
    case backends::Health::failed:
      return "failed";
  }
  return "failed";
}

// Jobs keyed by device: one key's jobs run one after another in the order posted, different keys' jobs in
// parallel on a fixed set of threads. Destruction runs every job already posted, then joins.
class Strands {
 public:
  explicit Strands(std::size_t threads) {
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~Strands() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void post(const std::string& key, std::function<void()> job) {
    std::lock_guard lock(mu_);
    auto& q = queues_[key];
    q.jobs.push_back(std::move(job));
    if (q.busy) return;  // the thread running this key's job picks it up next
    q.busy = true;
    ready_.push_back(key);
    cv_.notify_one();
  }

 private:
  struct Queue {
    std::deque<std::function<void()>> jobs;
    bool busy = false;  // in ready_ or running
  };
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !ready_.empty(); });
      if (ready_.empty()) return;  // stopping, and every posted job has run or is running elsewhere
      std::string key = std::move(ready_.front());
      ready_.pop_front();
      auto& q = queues_[key];  // std::map: the reference stays valid while the lock is dropped
      auto job = std::move(q.jobs.front());
      q.jobs.pop_front();
      lock.unlock();
      job();
      job = nullptr;
      lock.lock();
      if (q.jobs.empty()) {
        q.busy = false;
      } else {
        ready_.push_back(key);
        cv_.notify_one();
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Queue> queues_;
  std::deque<std::string> ready_;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: they start once the rest exists
};

// A hexadecimal id as sysfs or a backend attribute writes it ("0x10ee"); 0 when it is none.
std::uint32_t parse_id(const std::string& text) {
  try {
    return static_cast<std::uint32_t>(std::stoul(text, nullptr, 16));
  } catch (...) {
    return 0;
  }
}

std::string attribute(const backends::DeviceInfo& info, const std::string& key) {
  auto it = info.attributes.find(key);
  return it == info.attributes.end() ? std::string() : it->second;
}

// What the guest can be told about a device: the backend's facts, and for a PCI function its ids from sysfs
// when the backend does not give them.
DeviceDetails details_of(const backends::DeviceInfo& info) {
  DeviceDetails d;
  d.kind = info.kind;
  d.model = info.model;
  d.vendor = attribute(info, "vendor");
  d.host_pci = info.pci_bdf;
  d.pci_vendor_id = parse_id(attribute(info, "pci_vendor_id"));
  d.pci_device_id = parse_id(attribute(info, "pci_device_id"));
  auto sysfs_id = [&](const char* file) {
    std::ifstream in("/sys/bus/pci/devices/" + info.pci_bdf + "/" + file);
    std::string text;
    return in >> text ? parse_id(text) : 0;
  };
  if (!info.pci_bdf.empty() && d.pci_vendor_id == 0) d.pci_vendor_id = sysfs_id("vendor");
  if (!info.pci_bdf.empty() && d.pci_device_id == 0) d.pci_device_id = sysfs_id("device");
  for (const char* key : {"memory_bytes", "global_mem_bytes"}) {
    if (d.memory_bytes != 0) break;
    try {
      d.memory_bytes = std::stoull(attribute(info, key));
    } catch (...) {
    }
  }
  return d;
}

class Runtime final : public HostRuntime {
 public:
  Runtime(RuntimeOptions options, std::unique_ptr<ImageSource> images, std::unique_ptr<hypervisor::Attacher> attacher,
          RuntimeEvents events)
      : options_(std::move(options)),
        images_(std::move(images)),
        attacher_(std::move(attacher)),
        events_(std::move(events)),
        verified_(options_.wall_clock_ns) {}

  ~Runtime() override {
    {
      std::lock_guard lock(timer_mu_);
      stop_timer_ = true;
    }
    timer_cv_.notify_all();
    if (timer_.joinable()) timer_.join();
    if (attacher_) attacher_->set_event_handler({});
    strands_.reset();  // every queued operation finishes
  }

  Status init(std::vector<std::unique_ptr<backends::DeviceBackend>> backends) {
    const std::string where = "host " + options_.host + ": ";
    if (backends.empty()) return make_error(Errc::invalid_argument, where + "no device backend");
    for (auto& b : backends) {
      if (!b) return make_error(Errc::invalid_argument, where + "a device backend is missing");
      auto found = b->enumerate();
      if (!found) {
        return make_error(found.error().code,
                          where + "backend '" + std::string(b->name()) + "': " + found.error().message);
      }
      for (auto& info : *found) {
        if (devices_.count(info.local_id)) {
          return make_error(Errc::invalid_argument,
                            where + "device id '" + info.local_id + "' is reported by two backends");
        }
        Device d;
        d.backend = backends_.size();
        d.details = details_of(info);
        d.state.info = info;
        devices_.emplace(info.local_id, std::move(d));
      }
      for (const auto& info : *found) {
        for (std::uint32_t n = 0; n < std::min(info.slots, kMaxSlotsPerDevice); ++n) {
          Device slot;
          slot.backend = backends_.size();
          slot.device = info.local_id;
          slot.state.info = slot_info(info, n);
          slot.details = details_of(slot.state.info);
          if (!devices_.emplace(slot.state.info.local_id, std::move(slot)).second) {
            return make_error(Errc::invalid_argument, where + "device id '" + slot_local_id(info.local_id, n) +
                                                          "' is both a device and a slot of device '" + info.local_id +
                                                          "'");
          }
        }
      }
      auto slot = std::make_unique<Backend>();
      slot->parallel = b->parallel_devices();
      slot->impl = std::move(b);
      backends_.push_back(std::move(slot));
    }
    for (auto& [id, d] : devices_) d.state.loaded = loaded_name(d.backend, id);
    if (attacher_) {
      attacher_->set_event_handler([this](const hypervisor::HypervisorEvent& ev) { on_event(ev); });
      reconcile();
    }
    std::size_t threads = options_.threads != 0 ? options_.threads : std::clamp<std::size_t>(devices_.size(), 1, 16);
    strands_ = std::make_unique<Strands>(threads);
    check_health_now();
    if (options_.health_interval.count() > 0) timer_ = std::thread([this] { run_timer(); });
    return Status::ok();
  }

  std::vector<DeviceState> devices() const override {
    std::lock_guard lock(mu_);
    std::vector<DeviceState> out;
    for (const auto& [id, d] : devices_) {
      if (d.device.empty()) out.push_back(d.state);
    }
    return out;
  }

  void prepare(const PrepareRequest& request, PrepareDone done) override {
    strands_->post(strand_of(request.device), [this, request, done = std::move(done)] {
      PrepareResult result;
      Status s = do_prepare(request, result);
      if (!s) result = PrepareResult{result.loaded, AttachMode::none, "", "", DeviceDetails{}};  // only what it holds
      done(std::move(s), std::move(result));
    });
  }

  void release(const std::string& device, ReleaseDone done) override {
    strands_->post(strand_of(device), [this, device, done = std::move(done)] {
      ReleaseResult result;
      Status s = do_release(device, result);
      done(std::move(s), std::move(result));
    });
  }

  void reset(const std::string& device, ResetDone done) override {
    strands_->post(strand_of(device), [this, device, done = std::move(done)] {
      std::string loaded;
      Status s = do_reset(device, loaded);
      done(std::move(s), std::move(loaded));
    });
  }

  std::uint64_t image_hashes() const override { return verified_.hashes(); }

  void check_health() override {
    for (const auto& id : device_ids()) {
      {
        std::lock_guard lock(mu_);
        auto& d = devices_.at(id);
        if (d.health_queued) continue;  // one check waits already (behind a long programming, say)
        d.health_queued = true;
      }
      strands_->post(id, [this, id] { check_device(id); });
    }
  }

 private:
  struct Backend {
    std::unique_ptr<backends::DeviceBackend> impl;
    bool parallel = false;
    std::mutex mu;  // held around each call when !parallel
  };
  struct Device {
    std::size_t backend = 0;
    std::string device;  // a slot: the local id of its device (whose strand and health it shares); "" otherwise
    DeviceDetails details;
    DeviceState state;
    bool health_queued = false;  // a check_health() job waits on the device's strand
  };

  // Calls `f(backend)` as the backend allows: alone, or beside calls on its other devices.
  template <typename F>
  auto call(std::size_t backend, F&& f) {
    Backend& b = *backends_[backend];
    if (b.parallel) return f(*b.impl);
    std::lock_guard lock(b.mu);
    return f(*b.impl);
  }

  void log(const std::string& line) const {
    if (events_.log) events_.log(line);
  }

  // A slot's operations run on its device's strand (a shell reconfigures one region at a time). Unknown devices
  // share one strand, so their errors too come from a runtime thread.
  std::string strand_of(const std::string& device) const {
    std::lock_guard lock(mu_);
    auto it = devices_.find(device);
    if (it == devices_.end()) return std::string();
    return it->second.device.empty() ? device : it->second.device;
  }

  // The whole devices (a slot's health is its device's).
  std::vector<std::string> device_ids() const {
    std::lock_guard lock(mu_);
    std::vector<std::string> ids;
    for (const auto& [id, d] : devices_) {
      if (d.device.empty()) ids.push_back(id);
    }
    return ids;
  }

  // Slot `n` of `device` as the runtime lists it: the device's model, a slot kind, no PCI function of its own.
  static backends::DeviceInfo slot_info(const backends::DeviceInfo& device, std::uint32_t n) {
    backends::DeviceInfo slot = device;
    slot.local_id = slot_local_id(device.local_id, n);
    slot.kind = slot_kind(device.kind);
    slot.pci_bdf.clear();
    slot.slots = 0;
    return slot;
  }

  // A copy of the device's record. Errors: "not_found" naming the host.
  Result<Device> lookup(const std::string& id, const std::string& what) const {
    std::lock_guard lock(mu_);
    auto it = devices_.find(id);
    if (it == devices_.end())
      return make_error(Errc::not_found, what + ": host '" + options_.host + "' has no device '" + id + "'");
    return it->second;
  }

  template <typename F>
  void update(const std::string& id, F&& f) {
    std::lock_guard lock(mu_);
    f(devices_.at(id).state);
  }

  // --- images ---------------------------------------------------------------------------------------------

  std::string name_of(const std::string& sha) {
    if (sha.empty()) return "";
    {
      std::lock_guard lock(mu_);
      if (auto it = names_.find(sha); it != names_.end()) return it->second;
    }
    if (images_) {
      if (auto name = images_->name_of(sha); !name.empty()) return name;
    }
    return "sha256:" + sha.substr(0, 16);
  }

  // The bitstream name the device holds now (asks the backend).
  std::string loaded_name(std::size_t backend, const std::string& id) {
    auto sha = call(backend, [&](backends::DeviceBackend& b) { return b.loaded(id); });
    return sha ? name_of(*sha) : std::string();
  }

  std::string refresh_loaded(std::size_t backend, const std::string& id) {
    std::string loaded = loaded_name(backend, id);
    update(id, [&](DeviceState& s) { s.loaded = loaded; });
    return loaded;
  }

  // The image `bitstream` is known by without reading a file: the manager's sha256, else the source's, else (no
  // source) the hash of the name. "" when the source does not know it.
  std::string expected_sha256(const std::string& bitstream, const std::string& sha256) {
    if (!sha256.empty()) return sha256;
    if (images_) return images_->sha256_of(bitstream);
    return bitstreams::sha256_bytes("accelpool-bitstream:" + bitstream);
  }

  // The image to program: the source's, verified on disk unless its file is unchanged since it last verified;
  // without a source, an image that is only a name.
  Result<backends::Image> image_for(const std::string& bitstream, const std::string& sha256) {
    backends::Image image;
    if (images_) {
      auto entry = images_->locate(bitstream, sha256);
      if (!entry) return entry.error();
      auto verified = verified_.verify(*entry);
      if (!verified) return verified.error();
      image = backends::make_image(*verified);
    } else {
      image.name = bitstream;
      image.sha256 = expected_sha256(bitstream, sha256);
    }
    std::lock_guard lock(mu_);
    names_[image.sha256] = bitstream;
    return image;
  }

  // --- operations (on the device's strand) ----------------------------------------------------------------

  AttachMode unattached_mode(const backends::DeviceInfo& info) const {
    return info.passthrough ? options_.unattached : AttachMode::network;
  }

  Status do_prepare(const PrepareRequest& r, PrepareResult& out) {
    const std::string what = "host " + options_.host + ", device " + r.device;
    auto found = lookup(r.device, "prepare");
    if (!found) return found.error();
    const Device& d = *found;
    out.details = d.details;
    out.loaded = d.state.loaded;
    if (d.state.quarantined) return make_error(Errc::invalid_state, what + " is quarantined (" + d.state.detail + ")");
    if (!d.state.vm.empty() && d.state.vm != r.vm)
      return make_error(Errc::invalid_state, what + " serves VM '" + d.state.vm + "'; release it first");
    if (!r.bitstream.empty()) {
      // A device that already holds the image is not programmed, and its image file is not read.
      auto held = call(d.backend, [&](backends::DeviceBackend& b) { return b.loaded(r.device); });
      const std::string expected = expected_sha256(r.bitstream, r.sha256);
      if (r.reprogram || !held || held->empty() || expected.empty() || *held != expected) {
        auto image = image_for(r.bitstream, r.sha256);
        if (!image) return make_error(image.error().code, what + ": " + image.error().message);
        Status s = call(d.backend, [&](backends::DeviceBackend& b) { return b.program(r.device, *image); });
        out.loaded = refresh_loaded(d.backend, r.device);
        if (!s) return make_error(s.error().code, what + ": programming: " + s.error().message);
      }
    }
    out.loaded = refresh_loaded(d.backend, r.device);
    out.attach = unattached_mode(d.state.info);
    if (out.attach == AttachMode::network) {
      auto served = serve_remote(d, r);
      if (!served)
        return make_error(served.error().code, what + ": serving it over the network: " + served.error().message);
      out.endpoint = *served;
    }
    if (r.vm.empty()) return Status::ok();
    if (d.state.attached) {  // prepared again for the VM it is in
      out.attach = attach_mode(d.state.info);
      out.guest_pci = d.state.guest_pci;
      return Status::ok();
    }
    if (attacher_ && d.state.info.passthrough && d.device.empty()) {  // a slot is never hot-plugged: it is recorded
      hypervisor::DeviceSpec spec;
      spec.device_id = r.device;
      spec.lease_id = r.lease.empty() ? "unknown" : r.lease;
      const bool pci = attach_mode(d.state.info) == AttachMode::pci_hostdev;
      spec.method = pci ? hypervisor::AttachMethod::pci_hostdev : hypervisor::AttachMethod::emulated;
      spec.pci_bdf = pci ? d.state.info.pci_bdf : "";
      auto at = attacher_->attach(r.vm, spec);
      if (!at) {
        return make_error(Errc::attach_failed, what + ": attaching it to VM '" + r.vm + "' (" +
                                                   std::string(to_string(at.error().code)) +
                                                   "): " + at.error().message);
      }
      std::lock_guard lock(mu_);
      auto& s = devices_.at(r.device).state;
      s.vm = r.vm;
      s.lease = r.lease;
      s.attached = true;
      s.guest_pci = *at;
      save_state();
      out.attach = attach_mode(s.info);
      out.guest_pci = *at;
      return Status::ok();
    }
    update(r.device, [&](DeviceState& s) {
      s.vm = r.vm;
      s.lease = r.lease;
    });
    return Status::ok();
  }

  // The endpoint where lease `r.lease`'s program reaches the network-attached device `d` (open_remote): the one
  // it has when the device is prepared again for the same lease, else a new one ("" when its backend serves none).
  Result<std::string> serve_remote(const Device& d, const PrepareRequest& r) {
    if (!d.state.endpoint.empty() && d.state.lease == r.lease) return d.state.endpoint;
    auto endpoint = call(d.backend, [&](backends::DeviceBackend& b) { return b.open_remote(r.device); });
    if (endpoint)
      update(r.device, [&](DeviceState& s) {
        s.endpoint = *endpoint;
        s.lease = r.lease;
      });
    return endpoint;
  }

  // Ends the device's network service (close_remote) before it is reset for the next tenant.
  void end_remote(const Device& d, const std::string& id) {
    if (d.state.endpoint.empty()) return;
    (void)call(d.backend, [&](backends::DeviceBackend& b) {
      b.close_remote(id);
      return Status::ok();
    });
    update(id, [](DeviceState& s) { s.endpoint.clear(); });
  }

  // How the attacher puts the device into a VM: its PCI function, or an emulated device standing in for it.
  static AttachMode attach_mode(const backends::DeviceInfo& info) {
    bool pci = !info.pci_bdf.empty() && !info.attributes.count("shmem_name");
    return pci ? AttachMode::pci_hostdev : AttachMode::emulated;
  }

  Status do_release(const std::string& id, ReleaseResult& out) {
    const std::string what = "host " + options_.host + ", device " + id;
    auto found = lookup(id, "release");
    if (!found) return found.error();
    const DeviceState& d = found->state;
    out.loaded = d.loaded;
    if (d.attached && attacher_) {
      auto pending = attacher_->detach(d.vm, id);
      if (pending) {
        auto outcome = pending->get();
        out.detach = outcome;
        if (!outcome.device_free()) {
          std::string why = "quarantined in VM '" + d.vm + "': " + outcome.detail;
          update(id, [](DeviceState& s) { s.quarantined = true; });
          set_health(id, "failed", why, true);
          return make_error(Errc::quarantined, what + " " + why);
        }
      } else if (pending.error().code != Errc::not_attached && pending.error().code != Errc::not_found) {
        return make_error(Errc::detach_failed,
                          what + ": detaching it from VM '" + d.vm + "': " + pending.error().message);
      }
    }
    if (d.quarantined) return make_error(Errc::quarantined, what + " is quarantined (" + d.detail + ")");
    {
      std::lock_guard lock(mu_);
      auto& s = devices_.at(id).state;
      s.vm.clear();
      s.lease.clear();
      s.guest_pci.clear();
      s.attached = false;
      save_state();
    }
    end_remote(*found, id);
    Status s = call(found->backend, [&](backends::DeviceBackend& b) { return b.reset(id); });
    out.loaded = refresh_loaded(found->backend, id);
    if (!s) return make_error(s.error().code, what + ": resetting: " + s.error().message);
    return Status::ok();
  }

  Status do_reset(const std::string& id, std::string& loaded) {
    const std::string what = "host " + options_.host + ", device " + id;
    auto found = lookup(id, "reset");
    if (!found) return found.error();
    const DeviceState& d = found->state;
    loaded = d.loaded;
    if (d.quarantined) return make_error(Errc::invalid_state, what + " is quarantined (" + d.detail + ")");
    if (!d.vm.empty()) return make_error(Errc::invalid_state, what + " serves VM '" + d.vm + "'");
    end_remote(*found, id);
    Status s = call(found->backend, [&](backends::DeviceBackend& b) { return b.reset(id); });
    loaded = refresh_loaded(found->backend, id);
    if (!s) return make_error(s.error().code, what + ": " + s.error().message);
    return Status::ok();
  }

  // --- health ---------------------------------------------------------------------------------------------

  void check_device(const std::string& id) {
    {
      std::lock_guard lock(mu_);
      devices_.at(id).health_queued = false;
    }
    auto found = lookup(id, "health");
    if (!found || found->state.quarantined) return;
    auto report = call(found->backend, [&](backends::DeviceBackend& b) { return b.health(id); });
    set_health(id, health_word(report.health), report.detail, false);
  }

  // Every device checked once, in parallel as the backends allow; returns when all are done.
  void check_health_now() {
    auto ids = device_ids();
    std::mutex m;
    std::condition_variable cv;
    std::size_t left = ids.size();
    for (const auto& id : ids) {
      strands_->post(id, [&, id] {
        check_device(id);
        std::lock_guard lock(m);
        if (--left == 0) cv.notify_all();
      });
    }
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return left == 0; });
  }

  // Records a device's health and reports a change. A quarantined device keeps "failed" unless `force`.
  void set_health(const std::string& id, const std::string& health, const std::string& detail, bool force) {
    {
      std::lock_guard lock(mu_);
      auto& s = devices_.at(id).state;
      if (s.quarantined && !force) return;
      if (s.health == health && s.detail == detail) return;
      s.health = health;
      s.detail = detail;
    }
    if (events_.health_changed) events_.health_changed(id, health, detail);
  }

  void run_timer() {
    std::unique_lock lock(timer_mu_);
    while (!timer_cv_.wait_for(lock, options_.health_interval, [this] { return stop_timer_; })) {
      lock.unlock();
      check_health();
      lock.lock();
    }
  }

  // --- hypervisor -----------------------------------------------------------------------------------------

  // On the attacher's event thread: bookkeeping, then the owner hears of it.
  void on_event(const hypervisor::HypervisorEvent& ev) {
    std::set<std::string> listed;
    for (const auto& a : ev.devices) listed.insert(a.device_id);
    std::vector<std::string> freed, recovered;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, d] : devices_) {
        auto& s = d.state;
        bool in_vm = ev.kind == hypervisor::EventKind::device_removed
                         ? listed.count(id) > 0
                         : listed.count(id) > 0 || (!s.vm.empty() && (s.vm == ev.vm_name || s.vm == ev.vm_uuid));
        if (!in_vm) continue;
        freed.push_back(id);
        s.vm.clear();
        s.lease.clear();
        s.guest_pci.clear();
        s.attached = false;
        if (s.quarantined) {
          s.quarantined = false;
          s.health = "ok";
          s.detail.clear();
          recovered.push_back(id);
        }
      }
      save_state();
    }
    for (const auto& id : recovered)
      if (events_.health_changed) events_.health_changed(id, "ok", "");
    if (ev.kind == hypervisor::EventKind::device_removed) return;
    VmStopped stopped;
    stopped.vm_name = ev.vm_name;
    stopped.vm_uuid = ev.vm_uuid;
    stopped.reason = std::string(hypervisor::to_string(ev.kind));
    if (stopped.reason.rfind("vm_", 0) == 0) stopped.reason = stopped.reason.substr(3);
    stopped.devices = std::move(freed);
    if (events_.vm_stopped) events_.vm_stopped(stopped);
  }

  // Learns from the VMs named in the state file what was attached before a restart (create only).
  void reconcile() {
    if (options_.state_file.empty()) return;
    std::ifstream in(options_.state_file);
    std::string vm;
    while (std::getline(in, vm)) {
      if (vm.empty()) continue;
      auto list = attacher_->list_attached(vm);
      if (!list) {
        log("reconcile: VM '" + vm + "': " + list.error().message);
        continue;
      }
      for (const auto& a : *list) {
        std::lock_guard lock(mu_);  // the attacher's events may arrive meanwhile
        auto it = devices_.find(a.device_id);
        if (it == devices_.end()) continue;
        auto& s = it->second.state;
        s.vm = vm;
        s.lease = a.lease_id;
        s.attached = true;
        if (a.state == hypervisor::AttachState::quarantined) {
          s.quarantined = true;
          s.health = "failed";
          s.detail = "quarantined in VM '" + vm + "': " + a.note;
        }
        log("reconcile: '" + a.device_id + "' is in VM '" + vm + "' (" + std::string(hypervisor::to_string(a.state)) +
            ")");
      }
    }
  }

  void save_state() {  // mu_ held
    if (options_.state_file.empty()) return;
    std::set<std::string> vms;
    for (const auto& [id, d] : devices_)
      if (d.state.attached) vms.insert(d.state.vm);
    auto tmp = options_.state_file;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      for (const auto& v : vms) out << v << "\n";
    }
    std::error_code ec;
    std::filesystem::rename(tmp, options_.state_file, ec);
    if (ec) log("cannot write state file '" + options_.state_file.string() + "': " + ec.message());
  }

  RuntimeOptions options_;
  std::unique_ptr<ImageSource> images_;
  std::unique_ptr<hypervisor::Attacher> attacher_;
  RuntimeEvents events_;
  bitstreams::VerifiedImages verified_;
  std::vector<std::unique_ptr<Backend>> backends_;  // fixed after init

  mutable std::mutex mu_;                     // the records below
  std::map<std::string, Device> devices_;     // the set of ids is fixed after init
  std::map<std::string, std::string> names_;  // sha256 -> bitstream name of images this runtime programmed

  std::unique_ptr<Strands> strands_;
  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  bool stop_timer_ = false;
  std::thread timer_;
};

}  // namespace

Result<std::unique_ptr<HostRuntime>> HostRuntime::create(RuntimeOptions options,
                                                         std::vector<std::unique_ptr<backends::DeviceBackend>> backends,
                                                         std::unique_ptr<ImageSource> images,
                                                         std::unique_ptr<hypervisor::Attacher> attacher,
                                                         RuntimeEvents events) {
  auto runtime =
      std::make_unique<Runtime>(std::move(options), std::move(images), std::move(attacher), std::move(events));
  if (auto s = runtime->init(std::move(backends)); !s) return s.error();
  return std::unique_ptr<HostRuntime>(std::move(runtime));
}

}  // namespace accelpool::host
