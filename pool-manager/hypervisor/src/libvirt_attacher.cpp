#include <accelpool/hypervisor/libvirt_attacher.hpp>
#include <accelpool/hypervisor/libvirt_xml.hpp>

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

namespace accelpool::hypervisor {

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------------------
// libvirt errors

// The message of the last libvirt error on this thread. Read it right after the failing call: most libvirt
// calls (virConnectIsAlive included) reset the thread's error first.
std::string last_error_message() {
  const char* m = virGetLastErrorMessage();
  return m != nullptr ? m : "unknown libvirt error";
}

int last_error_code() {
  virErrorPtr e = virGetLastError();
  return e != nullptr ? e->code : VIR_ERR_OK;
}

// libvirt prints every error to stderr unless told otherwise; errors are returned as values here instead.
void discard_error(void* /*opaque*/, virErrorPtr /*error*/) {}

// ---------------------------------------------------------------------------------------------------------
// The process-wide libvirt event loop: one thread runs virEventRunDefaultImpl while any attacher exists.

class EventLoop {
 public:
  static Status acquire() {
    std::lock_guard lock(mutex());
    static const int registered = [] {
      virSetErrorFunc(nullptr, discard_error);
      return virEventRegisterDefaultImpl();
    }();
    if (registered < 0) {
      return make_error(Errc::unavailable, "cannot register libvirt's event loop: " + last_error_message());
    }
    if (users()++ == 0) {
      stop_flag().store(false);
      thread() = std::thread([] {
        while (!stop_flag().load()) {
          if (virEventRunDefaultImpl() < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
    }
    return Status::ok();
  }

  static void release() {
    std::lock_guard lock(mutex());
    if (--users() != 0) return;
    stop_flag().store(true);
    // A timer that fires at once wakes the loop out of poll() so it sees the flag.
    const int wake = virEventAddTimeout(
        0, [](int, void*) {}, nullptr, nullptr);
    if (thread().joinable()) thread().join();
    if (wake >= 0) virEventRemoveTimeout(wake);
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static int& users() {
    static int n = 0;
    return n;
  }
  static std::atomic<bool>& stop_flag() {
    static std::atomic<bool> f{false};
    return f;
  }
  static std::thread& thread() {
    static std::thread t;
    return t;
  }
};

// ---------------------------------------------------------------------------------------------------------
// RAII for libvirt handles

struct ConnClose {
  void operator()(virConnectPtr c) const { virConnectClose(c); }
};
using ConnRef = std::unique_ptr<virConnect, ConnClose>;

struct DomainFree {
  void operator()(virDomainPtr d) const { virDomainFree(d); }
};
using DomainRef = std::unique_ptr<virDomain, DomainFree>;

bool looks_like_uuid(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : std::isxdigit(static_cast<unsigned char>(s[i])) == 0) return false;
  }
  return true;
}

std::string domain_uuid(virDomainPtr d) {
  char buf[VIR_UUID_STRING_BUFLEN] = {};
  if (virDomainGetUUIDString(d, buf) < 0) return {};
  return buf;
}

std::string domain_name(virDomainPtr d) {
  const char* n = virDomainGetName(d);
  return n != nullptr ? n : "";
}

// ---------------------------------------------------------------------------------------------------------
// Events travel from libvirt's loop thread to the attacher's worker through an inbox.

struct InboxEvent {
  enum class Type : std::uint8_t { device_removed, removal_failed, lifecycle };
  Type type = Type::lifecycle;
  std::string uuid;
  std::string name;
  std::string alias;
  int event = 0;
  int detail = 0;
};

struct Inbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<InboxEvent> queue;
  Clock::time_point wake_at = Clock::time_point::max();
  bool closed = false;

  void post(InboxEvent e) {
    {
      std::lock_guard lock(mutex);
      if (closed) return;
      queue.push_back(std::move(e));
    }
    cv.notify_one();
  }
  void wake_by(Clock::time_point t) {
    {
      std::lock_guard lock(mutex);
      wake_at = std::min(wake_at, t);
    }
    cv.notify_one();
  }
};

// libvirt keeps a heap copy of the inbox pointer per registration and frees it with the registration, so a
// callback never touches an attacher that is gone.
Inbox& inbox_of(void* opaque) { return **static_cast<std::shared_ptr<Inbox>*>(opaque); }

InboxEvent event_for(virDomainPtr dom, InboxEvent::Type type) {
  InboxEvent e;
  e.type = type;
  e.uuid = domain_uuid(dom);
  e.name = domain_name(dom);
  return e;
}

void on_device_removed(virConnectPtr, virDomainPtr dom, const char* alias, void* opaque) {
  InboxEvent e = event_for(dom, InboxEvent::Type::device_removed);
  e.alias = alias != nullptr ? alias : "";
  inbox_of(opaque).post(std::move(e));
}

void on_removal_failed(virConnectPtr, virDomainPtr dom, const char* alias, void* opaque) {
  InboxEvent e = event_for(dom, InboxEvent::Type::removal_failed);
  e.alias = alias != nullptr ? alias : "";
  inbox_of(opaque).post(std::move(e));
}

int on_lifecycle(virConnectPtr, virDomainPtr dom, int event, int detail, void* opaque) {
  InboxEvent e = event_for(dom, InboxEvent::Type::lifecycle);
  e.event = event;
  e.detail = detail;
  inbox_of(opaque).post(std::move(e));
  return 0;
}

// ---------------------------------------------------------------------------------------------------------

struct Pending {
  std::string uuid;
  std::string vm_label;  // as the caller named the VM
  std::string device_id;
  std::string alias;
  Clock::time_point started;
  Clock::time_point deadline;
  std::promise<DetachResult> promise;
  DetachFuture future;
};

struct KnownVm {
  std::string name;
  std::vector<AttachedDevice> devices;
};

class LibvirtAttacher final : public Attacher {
 public:
  explicit LibvirtAttacher(const LibvirtOptions& options) : options_(options) {}

  ~LibvirtAttacher() override {
    {
      std::lock_guard lock(inbox_->mutex);
      inbox_->closed = true;
    }
    inbox_->cv.notify_one();
    if (worker_.joinable()) worker_.join();
    {
      std::lock_guard lock(conn_mutex_);
      drop_connection();
    }
    std::map<std::string, std::shared_ptr<Pending>> left;
    {
      std::lock_guard lock(mutex_);
      left.swap(pending_);
    }
    for (auto& [key, p] : left) {
      finish(*p, DetachOutcome::timed_out, "the attacher shut down before the guest confirmed the removal");
    }
    if (loop_acquired_) EventLoop::release();
  }

  Status start() {
    if (Status s = EventLoop::acquire(); !s) return s;
    loop_acquired_ = true;
    {
      std::lock_guard lock(conn_mutex_);
      if (Status s = open_connection(); !s) return s;
    }
    worker_ = std::thread([this] { run_worker(); });
    return Status::ok();
  }

  Result<std::string> attach(std::string_view vm, const DeviceSpec& spec) override {
    const std::uint64_t attachment = next_attachment_.fetch_add(1);
    auto xml = device_xml(spec, attachment, options_.shmem_size_mib);
    if (!xml) return xml.error();
    auto running = running_vm(vm, "devices are attached to running VMs only");
    if (!running) return running.error();
    virConnectPtr c = running->conn.get();
    virDomainPtr d = running->dom.get();
    const std::string uuid = domain_uuid(d);
    const std::string label = describe_vm(vm);
    const std::string alias = device_alias(spec.device_id, attachment);

    std::lock_guard meta(meta_mutex_);
    auto records = read_records(c, d, label);
    if (!records) return records.error();
    for (const auto& r : *records) {
      if (r.device_id == spec.device_id) {
        return make_error(Errc::already_attached, "device '" + spec.device_id + "' is already recorded in " + label +
                                                      " (state " + std::string(to_string(r.state)) + ", lease '" +
                                                      r.lease_id + "')");
      }
    }
    if (auto other = recorded_elsewhere(uuid, spec.device_id)) {
      return make_error(Errc::already_attached, "device '" + spec.device_id + "' is recorded in VM '" + *other + "'");
    }
    auto aliases = live_aliases(c, d, label);
    if (!aliases) return aliases.error();
    // Any attachment of the device, also under an alias of the older form without an attachment number.
    for (const auto& live : *aliases) {
      auto parsed = parse_device_alias(live);
      if (parsed && parsed->device_id == spec.device_id) {
        return make_error(Errc::already_attached, label + " already has device '" + spec.device_id + "' under alias '" +
                                                      live + "', which no record names; remove it by hand first");
      }
    }

    AttachedDevice rec;
    rec.device_id = spec.device_id;
    rec.lease_id = spec.lease_id;
    rec.method = spec.method;
    if (spec.method == AttachMethod::pci_hostdev) rec.pci_bdf = *normalize_bdf(spec.pci_bdf);
    rec.alias = alias;
    rec.state = AttachState::attaching;
    auto updated = *records;
    updated.push_back(rec);
    if (Status s = write_records(c, d, label, updated); !s) return s.error();

    if (virDomainAttachDeviceFlags(d, xml->c_str(), VIR_DOMAIN_AFFECT_LIVE) < 0) {
      Error e = libvirt_error(c, "attaching device '" + spec.device_id + "' to " + label);
      if (Status s = write_records(c, d, label, *records); !s) {
        e.message += "; also failed to remove its record: " + s.error().message;
      } else {
        remember(uuid, domain_name(d), *records);
      }
      return e;
    }
    updated.back().state = AttachState::attached;
    if (Status s = write_records(c, d, label, updated); !s) {
      updated.back().state = AttachState::attaching;  // as the VM's metadata still says: never free
      remember(uuid, domain_name(d), updated);
      return make_error(s.error().code, "device '" + spec.device_id + "' is in " + label +
                                            " but its record could not be updated: " + s.error().message);
    }
    remember(uuid, domain_name(d), updated);
    return guest_address(d, alias);
  }

  Result<DetachFuture> detach(std::string_view vm, std::string_view device_id) override {
    if (Status s = validate_device_id(device_id); !s) return s.error();
    auto running = running_vm(vm, "its devices left with it");
    if (!running) return running.error();
    virConnectPtr c = running->conn.get();
    virDomainPtr d = running->dom.get();
    const std::string uuid = domain_uuid(d);
    const std::string label = describe_vm(vm);

    std::lock_guard meta(meta_mutex_);
    auto records = read_records(c, d, label);
    if (!records) return records.error();
    auto it = std::find_if(records->begin(), records->end(),
                           [&](const AttachedDevice& r) { return r.device_id == device_id; });
    if (it == records->end()) {
      return make_error(Errc::not_attached,
                        "device '" + std::string(device_id) + "' is not recorded as attached to " + label);
    }
    const std::string key = uuid + "|" + it->alias;
    {
      std::lock_guard lock(mutex_);
      if (auto p = pending_.find(key); p != pending_.end()) return p->second->future;
    }
    auto aliases = live_aliases(c, d, label);
    if (!aliases) return aliases.error();
    auto pending = std::make_shared<Pending>();
    pending->uuid = uuid;
    pending->vm_label = std::string(vm);
    pending->device_id = std::string(device_id);
    pending->alias = it->alias;
    pending->started = Clock::now();
    pending->deadline = pending->started + options_.detach_timeout;
    pending->future = pending->promise.get_future().share();

    if (std::find(aliases->begin(), aliases->end(), it->alias) == aliases->end()) {
      auto remaining = *records;
      remaining.erase(remaining.begin() + (it - records->begin()));
      if (Status s = write_records(c, d, label, remaining); !s) return s.error();
      remember(uuid, domain_name(d), remaining);
      finish(*pending, DetachOutcome::removed, "the device was no longer in the VM");
      return pending->future;
    }

    auto updated = *records;
    AttachedDevice& rec = updated[static_cast<std::size_t>(it - records->begin())];
    rec.state = AttachState::detaching;
    rec.note.clear();
    if (Status s = write_records(c, d, label, updated); !s) return s.error();
    {
      std::lock_guard lock(mutex_);
      pending_[key] = pending;
    }
    if (virDomainDetachDeviceAlias(d, it->alias.c_str(), VIR_DOMAIN_AFFECT_LIVE) < 0) {
      Error e = libvirt_error(c, "asking " + label + " to release device '" + std::string(device_id) + "'");
      {
        std::lock_guard lock(mutex_);
        pending_.erase(key);
      }
      if (Status s = write_records(c, d, label, *records); !s) {
        e.message += "; also failed to restore its record: " + s.error().message;
        remember(uuid, domain_name(d), updated);
      } else {
        remember(uuid, domain_name(d), *records);
      }
      return e;
    }
    remember(uuid, domain_name(d), updated);
    inbox_->wake_by(pending->deadline);
    return pending->future;
  }

  Result<std::vector<AttachedDevice>> list_attached(std::string_view vm) override {
    auto running = running_vm(vm, "its devices left with it");
    if (!running) return running.error();
    virConnectPtr c = running->conn.get();
    virDomainPtr d = running->dom.get();
    const std::string label = describe_vm(vm);
    std::lock_guard meta(meta_mutex_);
    auto records = read_records(c, d, label);
    if (!records) return records.error();
    auto aliases = live_aliases(c, d, label);
    if (!aliases) return aliases.error();
    for (auto& r : *records) r.present = std::find(aliases->begin(), aliases->end(), r.alias) != aliases->end();
    remember(domain_uuid(d), domain_name(d), *records);
    return records;
  }

  void set_event_handler(EventHandler handler) override {
    std::lock_guard lock(mutex_);
    handler_ = std::move(handler);
  }

 private:
  // --- connection --------------------------------------------------------------------------------------

  // conn_mutex_ held.
  Status open_connection() {
    virConnectPtr c = virConnectOpen(options_.uri.c_str());
    if (c == nullptr) {
      return make_error(Errc::unavailable,
                        "cannot connect to libvirt at '" + options_.uri + "': " + last_error_message());
    }
    virConnSetErrorFunc(c, nullptr, discard_error);
    // A connection without keepalive is fine: 1 from a remote peer without it, "not supported" from a driver in
    // this process (the test driver, test:///...), which has no peer to lose.
    if (virConnectSetKeepAlive(c, options_.keepalive_interval_s, options_.keepalive_count) < 0 &&
        last_error_code() != VIR_ERR_NO_SUPPORT) {
      Error e = make_error(Errc::unavailable, "libvirt keepalive at '" + options_.uri + "': " + last_error_message());
      virConnectClose(c);
      return e;
    }
    struct Subscription {
      int id;
      virConnectDomainEventGenericCallback cb;
    };
    const Subscription subs[] = {
        {VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED, VIR_DOMAIN_EVENT_CALLBACK(on_device_removed)},
        {VIR_DOMAIN_EVENT_ID_DEVICE_REMOVAL_FAILED, VIR_DOMAIN_EVENT_CALLBACK(on_removal_failed)},
        {VIR_DOMAIN_EVENT_ID_LIFECYCLE, VIR_DOMAIN_EVENT_CALLBACK(on_lifecycle)},
    };
    conn_ = c;
    for (const auto& sub : subs) {
      auto* opaque = new std::shared_ptr<Inbox>(inbox_);
      const int handle = virConnectDomainEventRegisterAny(
          c, nullptr, sub.id, sub.cb, opaque, [](void* o) { delete static_cast<std::shared_ptr<Inbox>*>(o); });
      if (handle < 0) {
        // libvirt does not take ownership of `opaque` when registration fails.
        delete opaque;
        Error e = make_error(Errc::unavailable,
                             "subscribing to domain events at '" + options_.uri + "': " + last_error_message());
        drop_connection();
        return e;
      }
      event_handles_.push_back(handle);
    }
    return Status::ok();
  }

  // conn_mutex_ held.
  void drop_connection() {
    if (conn_ == nullptr) return;
    for (int h : event_handles_) virConnectDomainEventDeregisterAny(conn_, h);
    event_handles_.clear();
    virConnectClose(conn_);
    conn_ = nullptr;
  }

  // A referenced connection, reopened when the daemon went away in the meantime (events sent while no
  // connection was open are lost; pending detaches then end by timeout, i.e. in quarantine).
  Result<ConnRef> connection() {
    std::lock_guard lock(conn_mutex_);
    if (conn_ == nullptr || virConnectIsAlive(conn_) != 1) {
      drop_connection();
      if (Status s = open_connection(); !s) return s.error();
    }
    virConnectRef(conn_);
    return ConnRef(conn_);
  }

  Error libvirt_error(virConnectPtr c, const std::string& what) const {
    const int code = last_error_code();
    const std::string message = last_error_message();
    const bool alive = c != nullptr && virConnectIsAlive(c) == 1;
    const bool lost = !alive || code == VIR_ERR_SYSTEM_ERROR || code == VIR_ERR_RPC || code == VIR_ERR_NO_CONNECT;
    return make_error(lost ? Errc::unavailable : Errc::hypervisor, what + ": " + message);
  }

  static std::string describe_vm(std::string_view vm) { return "VM '" + std::string(vm) + "'"; }

  // A running VM as attach, detach and list_attached need it: a connection and the domain (freed first).
  struct RunningVm {
    ConnRef conn;
    DomainRef dom;
  };
  // Errors: connection()'s, lookup()'s, and require_running()'s ("vm_not_running" saying `why_running`).
  Result<RunningVm> running_vm(std::string_view vm, const char* why_running) {
    auto conn = connection();
    if (!conn) return conn.error();
    auto dom = lookup(conn->get(), vm);
    if (!dom) return dom.error();
    if (Status s = require_running(conn->get(), dom->get(), vm, why_running); !s) return s.error();
    return RunningVm{std::move(*conn), std::move(*dom)};
  }

  Result<DomainRef> lookup(virConnectPtr c, std::string_view vm) const {
    if (vm.empty()) return make_error(Errc::invalid_argument, "VM name is empty");
    const std::string v(vm);
    virDomainPtr d = looks_like_uuid(v) ? virDomainLookupByUUIDString(c, v.c_str()) : nullptr;
    if (d == nullptr) d = virDomainLookupByName(c, v.c_str());
    if (d == nullptr) {
      if (last_error_code() == VIR_ERR_NO_DOMAIN) {
        return make_error(Errc::not_found, "no VM with name or UUID '" + v + "' at '" + options_.uri + "'");
      }
      return libvirt_error(c, "looking up VM '" + v + "'");
    }
    return DomainRef(d);
  }

  Status require_running(virConnectPtr c, virDomainPtr d, std::string_view vm, const char* why) const {
    const int active = virDomainIsActive(d);
    if (active < 0) return libvirt_error(c, "checking whether " + describe_vm(vm) + " runs");
    if (active == 0) return make_error(Errc::vm_not_running, describe_vm(vm) + " is not running: " + why);
    return Status::ok();
  }

  // --- metadata (meta_mutex_ held) ------------------------------------------------------------------------

  Result<std::vector<AttachedDevice>> read_records(virConnectPtr c, virDomainPtr d, const std::string& label) const {
    const std::string ns(kMetadataNamespace);
    char* xml = virDomainGetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, ns.c_str(), VIR_DOMAIN_AFFECT_LIVE);
    if (xml == nullptr) {
      if (last_error_code() == VIR_ERR_NO_DOMAIN_METADATA) return std::vector<AttachedDevice>{};
      return libvirt_error(c, "reading accelpool metadata of " + label);
    }
    std::string text(xml);
    std::free(xml);
    auto records = parse_metadata_xml(text);
    if (!records) return make_error(Errc::hypervisor, label + ": " + records.error().message);
    return records;
  }

  Status write_records(virConnectPtr c, virDomainPtr d, const std::string& label,
                       const std::vector<AttachedDevice>& records) const {
    const std::string ns(kMetadataNamespace);
    const std::string key(kMetadataKey);
    const std::string xml = metadata_xml(records);
    const int rc = virDomainSetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, records.empty() ? nullptr : xml.c_str(),
                                        records.empty() ? nullptr : key.c_str(), ns.c_str(), VIR_DOMAIN_AFFECT_LIVE);
    if (rc < 0) return libvirt_error(c, "writing accelpool metadata of " + label);
    return Status::ok();
  }

  // Where the guest sees the device with `alias`, from the live definition; "" when it cannot be read (the
  // device is in the VM either way).
  static std::string guest_address(virDomainPtr d, const std::string& alias) {
    char* xml = virDomainGetXMLDesc(d, 0);
    if (xml == nullptr) return "";
    std::string text(xml);
    std::free(xml);
    auto address = guest_pci_address(text, alias);
    return address ? *address : "";
  }

  Result<std::vector<std::string>> live_aliases(virConnectPtr c, virDomainPtr d, const std::string& label) const {
    char* xml = virDomainGetXMLDesc(d, 0);
    if (xml == nullptr) return libvirt_error(c, "reading the live definition of " + label);
    std::string text(xml);
    std::free(xml);
    auto aliases = device_aliases(text);
    if (!aliases) return make_error(Errc::hypervisor, label + ": " + aliases.error().message);
    return aliases;
  }

  // --- in-memory view (mutex_) ----------------------------------------------------------------------------

  void remember(const std::string& uuid, const std::string& name, const std::vector<AttachedDevice>& devices) {
    std::lock_guard lock(mutex_);
    if (devices.empty()) {
      known_.erase(uuid);
    } else {
      known_[uuid] = KnownVm{name, devices};
    }
  }

  std::optional<std::string> recorded_elsewhere(const std::string& uuid, const std::string& device_id) {
    std::lock_guard lock(mutex_);
    for (const auto& [other_uuid, vm] : known_) {
      if (other_uuid == uuid) continue;
      for (const auto& r : vm.devices) {
        if (r.device_id == device_id) return vm.name;
      }
    }
    return std::nullopt;
  }

  static void finish(Pending& p, DetachOutcome outcome, std::string detail) {
    DetachResult r;
    r.vm = p.vm_label;
    r.device_id = p.device_id;
    r.outcome = outcome;
    r.detail = std::move(detail);
    r.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - p.started);
    p.promise.set_value(std::move(r));
  }

  void emit(const HypervisorEvent& event) {
    EventHandler handler;
    {
      std::lock_guard lock(mutex_);
      handler = handler_;
    }
    if (!handler) return;
    // A throwing handler must not take the worker (and with it every pending detach) down.
    try {
      handler(event);
    } catch (...) {
    }
  }

  std::shared_ptr<Pending> take_pending(const std::string& uuid, const std::string& alias) {
    std::lock_guard lock(mutex_);
    auto it = pending_.find(uuid + "|" + alias);
    if (it == pending_.end()) return nullptr;
    auto p = it->second;
    pending_.erase(it);
    return p;
  }

  // Applies `change` to the record with `alias` in the VM with `uuid` and writes the result back. Returns the
  // record as it was before, or nothing when the VM or the record is gone. meta_mutex_ must not be held.
  template <typename Change>
  std::optional<AttachedDevice> update_record(const std::string& uuid, const std::string& alias, Change change,
                                              std::string* problem) {
    std::lock_guard meta(meta_mutex_);
    auto conn = connection();
    if (!conn) {
      *problem = conn.error().message;
      return std::nullopt;
    }
    virDomainPtr d = virDomainLookupByUUIDString(conn->get(), uuid.c_str());
    if (d == nullptr) {
      *problem = "the VM is gone";
      return std::nullopt;
    }
    DomainRef dom(d);
    const std::string label = describe_vm(domain_name(d));
    auto records = read_records(conn->get(), d, label);
    if (!records) {
      *problem = records.error().message;
      return std::nullopt;
    }
    auto it = std::find_if(records->begin(), records->end(), [&](const AttachedDevice& r) { return r.alias == alias; });
    if (it == records->end()) return std::nullopt;
    AttachedDevice before = *it;
    change(*records, it);
    if (Status s = write_records(conn->get(), d, label, *records); !s) *problem = s.error().message;
    remember(uuid, domain_name(d), *records);
    return before;
  }

  // --- worker ---------------------------------------------------------------------------------------------

  void run_worker() {
    for (;;) {
      std::deque<InboxEvent> events;
      {
        std::unique_lock lock(inbox_->mutex);
        inbox_->cv.wait_until(lock, inbox_->wake_at, [&] {
          return inbox_->closed || !inbox_->queue.empty() || Clock::now() >= inbox_->wake_at;
        });
        if (inbox_->closed) return;
        events.swap(inbox_->queue);
        inbox_->wake_at = Clock::time_point::max();
      }
      for (const auto& e : events) handle(e);
      expire_pending();
    }
  }

  void handle(const InboxEvent& e) {
    switch (e.type) {
      case InboxEvent::Type::device_removed:
        return handle_removed(e);
      case InboxEvent::Type::removal_failed:
        return handle_removal_failed(e);
      case InboxEvent::Type::lifecycle:
        return handle_lifecycle(e);
    }
  }

  void handle_removed(const InboxEvent& e) {
    if (e.alias.rfind(kAliasPrefix, 0) != 0) return;  // not one of ours
    auto pending = take_pending(e.uuid, e.alias);
    std::string problem;
    auto before = update_record(
        e.uuid, e.alias, [](auto& records, auto it) { records.erase(it); }, &problem);
    if (pending) {
      std::string detail = "the guest released the device";
      if (!problem.empty()) detail += " (its record could not be removed: " + problem + ")";
      finish(*pending, DetachOutcome::removed, std::move(detail));
      return;
    }
    if (before) {
      HypervisorEvent ev;
      ev.kind = EventKind::device_removed;
      ev.vm_name = e.name;
      ev.vm_uuid = e.uuid;
      ev.detail = "device '" + before->device_id + "' left the VM while " + std::string(to_string(before->state));
      ev.devices.push_back(*before);
      emit(ev);
    }
  }

  void handle_removal_failed(const InboxEvent& e) {
    if (e.alias.rfind(kAliasPrefix, 0) != 0) return;
    auto pending = take_pending(e.uuid, e.alias);
    const std::string note = "the guest refused to release the device";
    std::string problem;
    update_record(
        e.uuid, e.alias,
        [&](auto&, auto it) {
          it->state = AttachState::quarantined;
          it->note = note;
        },
        &problem);
    if (pending) finish(*pending, DetachOutcome::rejected, note + "; quarantined");
  }

  void expire_pending() {
    std::vector<std::shared_ptr<Pending>> expired;
    Clock::time_point next = Clock::time_point::max();
    const auto now = Clock::now();
    {
      std::lock_guard lock(mutex_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second->deadline <= now) {
          expired.push_back(it->second);
          it = pending_.erase(it);
        } else {
          next = std::min(next, it->second->deadline);
          ++it;
        }
      }
    }
    for (auto& p : expired) {
      const std::string note =
          "no removal confirmation from the guest within " + std::to_string(options_.detach_timeout.count()) + " ms";
      std::string problem;
      auto before = update_record(
          p->uuid, p->alias,
          [&](auto&, auto it) {
            it->state = AttachState::quarantined;
            it->note = note;
          },
          &problem);
      if (!before && problem == "the VM is gone") {
        finish(*p, DetachOutcome::vm_stopped, "the VM ended while the removal was pending");
      } else {
        std::string detail = note + "; quarantined";
        if (!problem.empty()) detail += " (record not updated: " + problem + ")";
        finish(*p, DetachOutcome::timed_out, std::move(detail));
      }
    }
    if (next != Clock::time_point::max()) inbox_->wake_by(next);
  }

  // The event kind and its words for a libvirt VIR_DOMAIN_EVENT_STOPPED detail.
  static std::pair<EventKind, std::string> stop_kind(int detail) {
    switch (detail) {
      case VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN:
        return {EventKind::vm_shutdown, "the VM shut down"};
      case VIR_DOMAIN_EVENT_STOPPED_DESTROYED:
        return {EventKind::vm_destroyed, "the VM was destroyed"};
      case VIR_DOMAIN_EVENT_STOPPED_CRASHED:
        return {EventKind::vm_crashed, "the VM crashed"};
      case VIR_DOMAIN_EVENT_STOPPED_FAILED:
        return {EventKind::vm_crashed, "the hypervisor failed"};
      default:
        return {EventKind::vm_stopped, "the VM stopped (libvirt detail " + std::to_string(detail) + ")"};
    }
  }

  void handle_lifecycle(const InboxEvent& e) {
    if (e.event != VIR_DOMAIN_EVENT_STOPPED) return;
    HypervisorEvent ev;
    ev.vm_name = e.name;
    ev.vm_uuid = e.uuid;
    std::tie(ev.kind, ev.detail) = stop_kind(e.detail);
    std::vector<std::shared_ptr<Pending>> ended;
    {
      std::lock_guard lock(mutex_);
      if (auto it = known_.find(e.uuid); it != known_.end()) {
        ev.devices = std::move(it->second.devices);
        known_.erase(it);
      }
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second->uuid == e.uuid) {
          ended.push_back(it->second);
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& p : ended) finish(*p, DetachOutcome::vm_stopped, ev.detail + " while the removal was pending");
    emit(ev);
  }

  // The number of the next attach (device_alias): starts at the microseconds since the epoch when this attacher was
  // made, so it also keeps growing across agent restarts, and an alias is never that of an earlier attachment.
  static std::uint64_t first_attachment_number() {
    const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(since_epoch).count());
  }

  const LibvirtOptions options_;
  std::atomic<std::uint64_t> next_attachment_{first_attachment_number()};
  bool loop_acquired_ = false;
  std::shared_ptr<Inbox> inbox_ = std::make_shared<Inbox>();

  std::mutex conn_mutex_;
  virConnectPtr conn_ = nullptr;
  std::vector<int> event_handles_;

  // Serialises read-modify-write of domain metadata. Taken before mutex_, never while holding it.
  std::mutex meta_mutex_;

  std::mutex mutex_;                                         // guards the members below
  std::map<std::string, std::shared_ptr<Pending>> pending_;  // key: domain uuid + "|" + alias
  std::map<std::string, KnownVm> known_;                     // key: domain uuid
  EventHandler handler_;

  std::thread worker_;
};

}  // namespace

Result<std::unique_ptr<Attacher>> make_libvirt_attacher(const LibvirtOptions& options) {
  if (options.uri.empty()) return make_error(Errc::invalid_argument, "libvirt URI is empty");
  if (options.detach_timeout.count() <= 0) {
    return make_error(Errc::invalid_argument,
                      "detach timeout must be positive, got " + std::to_string(options.detach_timeout.count()) + " ms");
  }
  if (Status s = validate_shmem_size(options.shmem_size_mib); !s) return s.error();
  auto attacher = std::make_unique<LibvirtAttacher>(options);
  if (Status s = attacher->start(); !s) return s.error();
  return std::unique_ptr<Attacher>(std::move(attacher));
}

}  // namespace accelpool::hypervisor
