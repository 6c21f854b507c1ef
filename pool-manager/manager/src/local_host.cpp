// An in-process host: a DeviceBackend driven from a worker thread of its own.
#include <accelpool/backends/device_backend.hpp>
#include <accelpool/manager/auth.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace accelpool::manager {

namespace {

class LocalHost final : public HostDriver {
 public:
  LocalHost(std::string name, std::unique_ptr<backends::DeviceBackend> backend, Poster post)
      : name_(std::move(name)), backend_(std::move(backend)), post_(std::move(post)), worker_([this] { run(); }) {}

  ~LocalHost() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }

  const std::string& name() const override { return name_; }

  Result<std::vector<HostDevice>> devices() override {
    std::lock_guard backend_lock(backend_mu_);
    auto found = backend_->enumerate();
    if (!found) return found.error();
    std::vector<HostDevice> out;
    for (const auto& d : *found) {
      HostDevice hd;
      hd.local_id = d.local_id;
      hd.kind = d.kind;
      hd.model = d.model;
      hd.passthrough = d.passthrough;
      if (auto loaded = backend_->loaded(d.local_id); loaded) hd.loaded = name_of(*loaded);
      out.push_back(std::move(hd));
    }
    return out;
  }

  void prepare(const std::string& local_id, const std::string& bitstream, bool reprogram, const std::string& /*guest*/,
               Done done) override {
    enqueue([this, local_id, bitstream, reprogram, done = std::move(done)]() mutable {
      Status s = Status::ok();
      if (!bitstream.empty()) {
        auto held = backend_->loaded(local_id);
        if (reprogram || !held || *held != image_of(bitstream).sha256) s = backend_->program(local_id, image_of(bitstream));
      }
      finish(local_id, std::move(s), std::move(done));
    });
  }

  void release(const std::string& local_id, Done done) override { reset(local_id, std::move(done)); }

  void reset(const std::string& local_id, Done done) override {
    enqueue([this, local_id, done = std::move(done)]() mutable {
      finish(local_id, backend_->reset(local_id), std::move(done));
    });
  }

 private:
  // Bitstream names stand for images until the registry is wired in: the image's identity is the hash of its name.
  backends::Image image_of(const std::string& bitstream) {
    backends::Image img;
    img.name = bitstream;
    img.sha256 = sha256_hex("accelpool-bitstream:" + bitstream);
    std::lock_guard lock(names_mu_);
    names_[img.sha256] = bitstream;
    return img;
  }
  std::string name_of(const std::string& sha) {
    if (sha.empty()) return "";
    std::lock_guard lock(names_mu_);
    auto it = names_.find(sha);
    return it == names_.end() ? "sha256:" + sha.substr(0, 16) : it->second;
  }

  void finish(const std::string& local_id, Status s, Done done) {
    std::string loaded;
    if (auto l = backend_->loaded(local_id); l) loaded = name_of(*l);
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
  std::unique_ptr<backends::DeviceBackend> backend_;
  Poster post_;
  std::mutex backend_mu_;  // the backend is used from one thread at a time
  std::mutex names_mu_;
  std::unordered_map<std::string, std::string> names_;
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
  void prepare(const std::string& local_id, const std::string& bitstream, bool /*reprogram*/,
               const std::string& /*guest*/, Done done) override {
    complete(local_id, bitstream.empty() ? nullptr : &bitstream, std::move(done));
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
  return std::make_unique<LocalHost>(std::move(name), std::move(backend), std::move(post));
}

}  // namespace accelpool::manager
