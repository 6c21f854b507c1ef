// An in-process host: a DeviceBackend driven from a worker thread of its own.
#include <accelpool/backends/device_backend.hpp>
#include <accelpool/backends/device_details.hpp>
#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/manager/auth.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <optional>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace accelpool::manager {

namespace {

class LocalHost final : public HostDriver {
 public:
  // `catalog` null: bitstream names stand for images whose identity is the hash of the name.
  LocalHost(std::string name, std::vector<std::unique_ptr<backends::DeviceBackend>> backends,
            std::shared_ptr<ImageCatalog> catalog, Poster post)
      : name_(std::move(name)), backends_(std::move(backends)), catalog_(std::move(catalog)), post_(std::move(post)),
        worker_([this] { run(); }) {}

  ~LocalHost() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }

  // Maps every device id to its backend. Errors: "invalid_argument" (an id two backends report).
  Status index_devices() {
    std::lock_guard backend_lock(backend_mu_);
    for (std::size_t i = 0; i < backends_.size(); ++i) {
      auto found = backends_[i]->enumerate();
      if (!found) return found.error();
      for (const auto& d : *found) {
        if (!owner_.emplace(d.local_id, i).second)
          return make_error("invalid_argument", "host " + name_ + ": device id '" + d.local_id +
                                                    "' is reported by two backends");
      }
    }
    return Status::ok();
  }

  const std::string& name() const override { return name_; }

  Result<std::vector<HostDevice>> devices() override {
    std::lock_guard backend_lock(backend_mu_);
    std::vector<HostDevice> out;
    for (const auto& backend : backends_) {
      auto found = backend->enumerate();
      if (!found) return found.error();
      for (const auto& d : *found) {
        HostDevice hd;
        hd.local_id = d.local_id;
        hd.kind = d.kind;
        hd.model = d.model;
        hd.passthrough = d.passthrough;
        details_[d.local_id] = backends::details_of(d);
        if (auto loaded = backend->loaded(d.local_id); loaded) hd.loaded = name_of(*loaded);
        out.push_back(std::move(hd));
      }
    }
    if (catalog_) catalog_->add_devices(out);
    return out;
  }

  void prepare(const host::PrepareRequest& request, PrepareDone done) override {
    enqueue([this, request, done = std::move(done)]() mutable {
      const std::string& local_id = request.device;
      const std::string& bitstream = request.bitstream;
      Status s = Status::ok();
      backends::DeviceBackend* backend = backend_of(local_id);
      if (!backend) {
        s = make_error("not_found", "host " + name_ + ": no device '" + local_id + "'");
      } else if (!bitstream.empty()) {
        // A device that already holds the image is not programmed, so its file is not read (hashing a large
        // image takes seconds); one that must be programmed gets the image verified on disk now.
        auto held = backend->loaded(local_id);
        const std::string expected = expected_sha256(bitstream);  // "" when the registry lacks it
        if (request.reprogram || !held || expected.empty() || *held != expected) {
          auto image = image_of(bitstream);
          if (!image) {
            s = make_error(image.error().code, "host " + name_ + ", device " + local_id + ": " + image.error().message);
          } else {
            s = backend->program(local_id, *image);
          }
        }
      }
      host::PrepareResult result;
      result.loaded = loaded_name(local_id);
      if (auto d = details_.find(local_id); d != details_.end()) result.details = d->second;
      // The guest shares the host's process space: nothing to attach.
      if (s) result.attach = host::AttachMode::in_process;
      post_([s = std::move(s), result = std::move(result), done = std::move(done)]() mutable {
        done(std::move(s), std::move(result));
      });
    });
  }

  void release(const std::string& local_id, Done done) override { reset(local_id, std::move(done)); }

  void reset(const std::string& local_id, Done done) override {
    enqueue([this, local_id, done = std::move(done)]() mutable {
      backends::DeviceBackend* backend = backend_of(local_id);
      Status s = backend ? backend->reset(local_id)
                         : Status(make_error("not_found", "host " + name_ + ": no device '" + local_id + "'"));
      finish(local_id, std::move(s), std::move(done));
    });
  }

 private:
  backends::DeviceBackend* backend_of(const std::string& local_id) {
    if (backends_.size() == 1) return backends_.front().get();
    auto it = owner_.find(local_id);
    return it == owner_.end() ? nullptr : backends_[it->second].get();
  }

  // The sha256 the registry records for `bitstream` (no file read), or the name-only image's.
  std::string expected_sha256(const std::string& bitstream) const {
    return catalog_ ? catalog_->sha256_of(bitstream) : sha256_hex("accelpool-bitstream:" + bitstream);
  }

  // The image to program: with a catalog, the registry's image verified on disk now; else a name-only image.
  Result<backends::Image> image_of(const std::string& bitstream) {
    if (catalog_) {
      auto verified = catalog_->registry()->verify(bitstream);
      if (!verified) return verified.error();
      return backends::make_image(*verified);
    }
    backends::Image img;
    img.name = bitstream;
    img.sha256 = expected_sha256(bitstream);
    std::lock_guard lock(names_mu_);
    names_[img.sha256] = bitstream;
    return img;
  }

  std::string name_of(const std::string& sha) {
    if (sha.empty()) return "";
    if (catalog_) {
      if (auto b = catalog_->registry()->find_by_sha256(sha); b) return b->manifest.name;
    } else {
      std::lock_guard lock(names_mu_);
      if (auto it = names_.find(sha); it != names_.end()) return it->second;
    }
    return "sha256:" + sha.substr(0, 16);
  }

  // The name of the bitstream the device holds now, "" for none or unknown.
  std::string loaded_name(const std::string& local_id) {
    auto* backend = backend_of(local_id);
    if (!backend) return "";
    auto held = backend->loaded(local_id);
    return held ? name_of(*held) : std::string();
  }

  void finish(const std::string& local_id, Status s, Done done) {
    std::string loaded = loaded_name(local_id);
    post_([s = std::move(s), loaded = std::move(loaded), done = std::move(done)]() mutable {
      done(std::move(s), std::move(loaded));
    });
  }

  void enqueue(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every queued job has run
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::lock_guard backend_lock(backend_mu_);
      job();
    }
  }

  std::string name_;
  std::vector<std::unique_ptr<backends::DeviceBackend>> backends_;
  std::unordered_map<std::string, std::size_t> owner_;  // device id -> backend index (filled before use)
  std::unordered_map<std::string, host::DeviceDetails> details_;  // as devices() last enumerated (backend_mu_)
  std::shared_ptr<ImageCatalog> catalog_;
  Poster post_;
  std::mutex backend_mu_;  // the backends are used from one thread at a time
  std::mutex names_mu_;
  std::unordered_map<std::string, std::string> names_;  // without a catalog: sha256 -> name
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread worker_;  // last: starts after every other member exists
};

// Devices declared by configuration; a bitstream "load" is a record in memory.
class StaticHost final : public HostDriver {
 public:
  StaticHost(std::string name, std::vector<HostDevice> devices, Poster post)
      : name_(std::move(name)), devices_(std::move(devices)), post_(std::move(post)) {
    for (const auto& d : devices_) loaded_[d.local_id] = d.loaded;
  }
  const std::string& name() const override { return name_; }
  Result<std::vector<HostDevice>> devices() override { return devices_; }
  void prepare(const host::PrepareRequest& request, PrepareDone done) override {
    host::PrepareResult result;  // what the configuration declares; nothing is attached
    for (const auto& d : devices_) {
      if (d.local_id != request.device) continue;
      result.details.kind = d.kind;
      result.details.model = d.model;
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
      post_([done = std::move(done), local_id] { done(make_error("not_found", "no device " + local_id), ""); });
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

std::unique_ptr<HostDriver> make_local_host(std::string name, std::unique_ptr<backends::DeviceBackend> backend,
                                            Poster post) {
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  list.push_back(std::move(backend));
  return std::make_unique<LocalHost>(std::move(name), std::move(list), nullptr, std::move(post));
}

Result<std::unique_ptr<HostDriver>> make_local_host(std::string name,
                                                    std::vector<std::unique_ptr<backends::DeviceBackend>> backends,
                                                    std::shared_ptr<ImageCatalog> catalog, Poster post) {
  if (backends.empty()) return make_error("invalid_argument", "host " + name + ": no device backend");
  for (const auto& b : backends) {
    if (!b) return make_error("invalid_argument", "host " + name + ": a device backend is missing");
  }
  auto host = std::make_unique<LocalHost>(std::move(name), std::move(backends), std::move(catalog), std::move(post));
  if (auto s = host->index_devices(); !s) return s.error();
  return std::unique_ptr<HostDriver>(std::move(host));
}

// --- ImageCatalog ---------------------------------------------------------------------------------------------

ImageCatalog::ImageCatalog(std::shared_ptr<bitstreams::SharedRegistry> registry, std::shared_ptr<const Clock> clock)
    : registry_(std::move(registry)), clock_(std::move(clock)) {}

void ImageCatalog::add_devices(const std::vector<HostDevice>& devices) {
  std::lock_guard lock(mu_);
  for (const auto& d : devices) models_[d.kind].insert(d.model);
}

bool ImageCatalog::kind_uses_images(const std::string& kind) const {
  std::lock_guard lock(mu_);
  return models_.count(kind) > 0;
}

std::string ImageCatalog::sha256_of(const std::string& bitstream) const {
  auto b = registry_->get(bitstream);
  return b ? b->manifest.sha256 : std::string();
}

Status ImageCatalog::check(const std::string& kind, const std::string& bitstream) const {
  if (bitstream.empty()) return Status::ok();
  std::set<std::string> models;
  {
    std::lock_guard lock(mu_);
    auto it = models_.find(kind);
    if (it == models_.end()) return Status::ok();
    models = it->second;
  }
  auto b = registry_->get(bitstream);
  if (!b) {
    return make_error("not_found", "bitstream '" + bitstream + "' is not in the manager's registry (" +
                                       registry_->dir().string() +
                                       "); register it first (accelpoolctl bitstreams register)");
  }
  bool fits = false;
  std::string listed;
  for (const auto& m : models) {
    if (bitstreams::Registry::compatible(*b, m)) fits = true;
    listed += (listed.empty() ? "'" : ", '") + m + "'";
  }
  if (!fits) {
    std::string patterns;
    for (const auto& c : b->manifest.compatible) patterns += (patterns.empty() ? "" : ", ") + c;
    return make_error("incompatible", "bitstream " + b->id() + " fits device models " + patterns +
                                          ", but the devices of kind '" + kind + "' are " + listed);
  }
  // The file as it is now; if it still looks as it did when it last verified, its bytes are the same.
  std::optional<FileStamp> stamp;
  struct stat st {};
  if (::stat(b->file_path.c_str(), &st) == 0) {
    stamp = FileStamp{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                      static_cast<std::uint64_t>(st.st_size),
                      std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec,
                      std::int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec};
  }
  {
    std::lock_guard lock(mu_);
    auto it = verified_.find(b->id());
    if (stamp && it != verified_.end() && it->second == *stamp) return Status::ok();
  }
  auto verified = registry_->verify(b->manifest.name, b->manifest.version);
  std::lock_guard lock(mu_);
  verified_.erase(b->id());
  if (!verified) return verified.error();
  // File times tick coarsely: a write in the same tick as the stamp could leave it unchanged. Trust only a
  // stamp whose file has not been written for a second.
  const auto now_ns = static_cast<std::int64_t>(clock_->now() * 1e9);
  if (stamp && std::max(stamp->mtime_ns, stamp->ctime_ns) < now_ns - 1'000'000'000) verified_[b->id()] = *stamp;
  return Status::ok();
}

}  // namespace accelpool::manager
