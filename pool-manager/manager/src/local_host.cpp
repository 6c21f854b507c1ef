// The in-process host (a HostRuntime whose completions are posted to the owner thread), the static host, and
// the manager's image catalog.
#include <accelpool/backends/device_backend.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/bitstreams/verified_images.hpp>
#include <accelpool/host/runtime.hpp>
#include <accelpool/manager/core.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <unordered_map>

namespace accelpool::manager {

namespace {

// How often the in-process host checks its devices' health (an agent does so every heartbeat).
constexpr std::chrono::milliseconds kLocalHealthInterval{5000};

class LocalHost final : public HostDriver {
 public:
  LocalHost(std::string name, std::shared_ptr<ImageCatalog> catalog, Poster post)
      : name_(std::move(name)), catalog_(std::move(catalog)), post_(std::move(post)) {}

  Status start(std::vector<std::unique_ptr<backends::DeviceBackend>> backends, DeviceHealth on_health) {
    host::RuntimeOptions o;
    o.host = name_;
    o.health_interval = kLocalHealthInterval;
    o.unattached = host::AttachMode::in_process;  // the guest shares the host's process space
    host::RuntimeEvents ev;
    if (on_health) {
      ev.health_changed = [post = post_, on_health](const std::string& id, const std::string& health,
                                                    const std::string& detail) {
        post([on_health, id, health, detail] { on_health(id, health, detail); });
      };
    }
    auto images = catalog_ ? host::registry_images(catalog_->registry()) : nullptr;
    auto rt = host::HostRuntime::create(std::move(o), std::move(backends), std::move(images), nullptr, std::move(ev));
    if (!rt) return rt.error();
    runtime_ = std::move(*rt);
    return Status::ok();
  }

  const std::string& name() const override { return name_; }

  Result<std::vector<HostDevice>> devices() override {
    std::vector<HostDevice> out;
    for (const auto& d : runtime_->devices()) {
      out.push_back({d.info.local_id, d.info.kind, d.info.model, d.info.passthrough, d.loaded, d.health != "failed",
                     d.info.slots, backends::slot_shapes_of(d.info)});
    }
    if (catalog_) catalog_->add_devices(out);
    return out;
  }

  void prepare(const host::PrepareRequest& request, PrepareDone done) override {
    std::string sha256 = request.sha256;
    runtime_->prepare(request, [post = post_, done = std::move(done), catalog = catalog_, sha256 = std::move(sha256)](
                                   Status s, host::PrepareResult result) {
      // The manager's own file failed to verify: acquires of it are refused from now on, not only after the
      // catalog's worker has looked at it again.
      if (!s && catalog && !sha256.empty() &&
          (s.error().code == Errc::checksum_mismatch || s.error().code == Errc::corrupt_image ||
           s.error().code == Errc::missing_file)) {
        catalog->record_failure(sha256, s.error());
      }
      post([done, s = std::move(s), result = std::move(result)]() mutable { done(std::move(s), std::move(result)); });
    });
  }

  void release(const std::string& local_id, Done done) override {
    runtime_->release(local_id, [post = post_, done = std::move(done)](Status s, host::ReleaseResult result) {
      post([done, s = std::move(s), loaded = std::move(result.loaded)]() mutable {
        done(std::move(s), std::move(loaded));
      });
    });
  }

  void reset(const std::string& local_id, Done done) override {
    runtime_->reset(local_id, [post = post_, done = std::move(done)](Status s, std::string loaded) {
      post([done, s = std::move(s), loaded = std::move(loaded)]() mutable { done(std::move(s), std::move(loaded)); });
    });
  }

 private:
  std::string name_;
  std::shared_ptr<ImageCatalog> catalog_;
  Poster post_;
  std::unique_ptr<host::HostRuntime> runtime_;  // last: destroyed first, finishing (and posting) queued operations
};

// Devices declared by configuration; a bitstream "load" is a record in memory.
class StaticHost final : public HostDriver {
 public:
  StaticHost(std::string name, std::vector<HostDevice> devices, Poster post)
      : name_(std::move(name)), devices_(std::move(devices)), post_(std::move(post)) {
    for (const auto& d : devices_) {
      loaded_[d.local_id] = d.loaded;
      for (std::uint32_t n = 0; n < d.slots; ++n) loaded_[slot_local_id(d.local_id, n)] = "";
    }
  }
  const std::string& name() const override { return name_; }
  Result<std::vector<HostDevice>> devices() override { return devices_; }
  void prepare(const host::PrepareRequest& request, PrepareDone done) override {
    host::PrepareResult result;  // what the configuration declares; nothing is attached
    for (const auto& d : devices_) {
      for (std::uint32_t n = 0; n < d.slots && result.details.kind.empty(); ++n) {
        if (slot_local_id(d.local_id, n) == request.device) result.details.kind = slot_kind(d.kind);
      }
      if (d.local_id == request.device) result.details.kind = d.kind;
      if (!result.details.kind.empty()) {
        result.details.model = d.model;
        break;
      }
    }
    complete(request.device, request.bitstream.empty() ? nullptr : &request.bitstream,
             [done = std::move(done), result = std::move(result)](Status s, std::string loaded) mutable {
               result.loaded = std::move(loaded);
               done(std::move(s), std::move(result));
             });
  }
  void release(const std::string& local_id, Done done) override { complete(local_id, nullptr, std::move(done)); }
  void reset(const std::string& local_id, Done done) override {
    static const std::string kNone;
    complete(local_id, &kNone, std::move(done));
  }

 private:
  void complete(const std::string& local_id, const std::string* load, Done done) {
    auto it = loaded_.find(local_id);
    if (it == loaded_.end()) {
      post_([done = std::move(done), local_id] { done(make_error(Errc::not_found, "no device " + local_id), ""); });
      return;
    }
    if (load) it->second = *load;
    std::string held = it->second;
    post_([done = std::move(done), held = std::move(held)] { done(Status::ok(), held); });
  }

  std::string name_;
  std::vector<HostDevice> devices_;
  Poster post_;
  std::unordered_map<std::string, std::string> loaded_;
};

}  // namespace

std::unique_ptr<HostDriver> make_static_host(std::string name, std::vector<HostDevice> devices, Poster post) {
  return std::make_unique<StaticHost>(std::move(name), std::move(devices), std::move(post));
}

Result<std::unique_ptr<HostDriver>> make_local_host(std::string name,
                                                    std::vector<std::unique_ptr<backends::DeviceBackend>> backends,
                                                    std::shared_ptr<ImageCatalog> catalog, Poster post,
                                                    DeviceHealth on_health) {
  auto host = std::make_unique<LocalHost>(std::move(name), std::move(catalog), std::move(post));
  if (auto s = host->start(std::move(backends), std::move(on_health)); !s) return s.error();
  return std::unique_ptr<HostDriver>(std::move(host));
}

// --- ImageCatalog ---------------------------------------------------------------------------------------------

ImageCatalog::ImageCatalog(std::shared_ptr<bitstreams::SharedRegistry> registry, std::shared_ptr<const Clock> clock)
    : registry_(std::move(registry)),
      clock_(std::move(clock)),
      verified_(std::make_unique<bitstreams::VerifiedImages>(
          [c = clock_] { return static_cast<std::int64_t>(c->now() * 1e9); })),
      worker_([this] { work(); }) {}

ImageCatalog::~ImageCatalog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void ImageCatalog::work() {
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    job();
    lock.lock();
    busy_ = false;
    if (jobs_.empty()) idle_.notify_all();
  }
}

void ImageCatalog::run_on_worker(std::function<void()> job) {
  std::lock_guard lock(mu_);
  jobs_.push_back(std::move(job));
  wake_.notify_one();
}

void ImageCatalog::queue_verification(const std::string& bitstream) const {
  std::lock_guard lock(mu_);
  queue_verification_locked(bitstream);
}

void ImageCatalog::queue_verification_locked(const std::string& bitstream) const {
  if (!queued_.insert(bitstream).second) return;
  jobs_.push_back([this, bitstream] { const_cast<ImageCatalog*>(this)->verify(bitstream); });
  wake_.notify_one();
}

// On the worker: verifies the image (a stat; a hash only when its file changed) and records the verdict.
void ImageCatalog::verify(const std::string& bitstream) {
  std::uint64_t failures_before;
  {
    std::lock_guard lock(mu_);
    queued_.erase(bitstream);
    failures_before = failures_recorded_;
  }
  auto b = registry_->get(bitstream);
  if (!b) return;
  auto verified = verified_->verify(*b);
  std::lock_guard lock(mu_);
  if (failures_recorded_ != failures_before) return;  // a host found a file bad meanwhile: its verdict stands
  verdicts_.insert_or_assign(b->manifest.sha256, verified ? Status::ok() : Status(verified.error()));
}

void ImageCatalog::settle() const {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return jobs_.empty() && !busy_; });
}

std::uint64_t ImageCatalog::image_hashes() const { return verified_->hashes(); }

void ImageCatalog::record_failure(const std::string& sha256, const Error& error) {
  std::lock_guard lock(mu_);
  ++failures_recorded_;
  verdicts_.insert_or_assign(sha256, Status(error));
}

void ImageCatalog::add_devices(const std::vector<HostDevice>& devices) {
  std::lock_guard lock(mu_);
  for (const auto& d : devices) image_kinds_.insert(d.kind);
}

bool ImageCatalog::kind_uses_images(const std::string& kind) const {
  std::lock_guard lock(mu_);
  return image_kinds_.count(kind) > 0;
}

std::string ImageCatalog::sha256_of(const std::string& bitstream) const {
  auto b = registry_->get(bitstream);
  return b ? b->manifest.sha256 : std::string();
}

std::optional<std::vector<std::string>> ImageCatalog::compatible_of(const std::string& bitstream) const {
  auto b = registry_->get(bitstream);
  if (!b) return std::nullopt;
  return b->manifest.compatible;
}

std::optional<bool> ImageCatalog::is_partial(const std::string& bitstream) const {
  auto b = registry_->get(bitstream);
  if (!b) return std::nullopt;
  return b->manifest.partial;
}

double ImageCatalog::demand_of(const std::string& bitstream) const {
  auto b = registry_->get(bitstream);
  return b ? b->manifest.bandwidth_demand : 0.0;
}

std::string ImageCatalog::slot_shape_of(const std::string& bitstream) const {
  auto b = registry_->get(bitstream);
  return b ? b->manifest.slot_shape : std::string();
}

void answer_from_catalog(CoreOptions& options, std::shared_ptr<ImageCatalog> catalog) {
  options.acquire_check = [catalog](const AcquireParams& p) { return catalog->check(p.kind, p.bitstream); };
  // Hosts check (agents also fetch) the manager's image by its sha256.
  options.image_sha256 = [catalog](const std::string& bitstream) { return catalog->sha256_of(bitstream); };
  // Leases go only to devices of the models their bitstream's manifest lists as compatible.
  options.image_models = [catalog](const std::string& bitstream) { return catalog->compatible_of(bitstream); };
  options.image_partial = [catalog](const std::string& bitstream) { return catalog->is_partial(bitstream); };
  // Partial images go only on slots of their shape.
  options.image_slot_shape = [catalog](const std::string& bitstream) { return catalog->slot_shape_of(bitstream); };
  // Slot leases are spread by their images' bandwidth demands.
  options.image_demand = [catalog](const std::string& bitstream) { return catalog->demand_of(bitstream); };
}

Status ImageCatalog::check(const std::string& kind, const std::string& bitstream) const {
  if (bitstream.empty() || !kind_uses_images(kind)) return Status::ok();
  auto b = registry_->get(bitstream);
  if (!b) {
    return make_error(Errc::not_found, "bitstream '" + bitstream + "' is not in the manager's registry (" +
                                           registry_->dir().string() +
                                           "); register it first (accelpoolctl bitstreams register)");
  }
  std::lock_guard lock(mu_);
  auto verdict = verdicts_.find(b->manifest.sha256);
  Status known = verdict == verdicts_.end() ? Status::ok() : verdict->second;
  queue_verification_locked(bitstream);  // after reading: this check answers from what was known before it
  return known;
}

}  // namespace accelpool::manager
