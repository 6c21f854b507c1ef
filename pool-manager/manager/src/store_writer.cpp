#include "store_writer.hpp"

#include <utility>

namespace accelpool::manager {

StoreWriter::StoreWriter(Store& store) : store_(store), thread_([this] { run(); }) {}

StoreWriter::~StoreWriter() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StoreWriter::write(Batch batch, std::function<void(Status)> done) {
  {
    std::lock_guard lock(mu_);
    job_.emplace(Job{std::move(batch), std::move(done)});
    busy_ = true;
  }
  cv_.notify_all();
}

void StoreWriter::wait_idle() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
}

void StoreWriter::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return job_.has_value() || stopping_; });
      if (!job_) return;
      job = std::move(*job_);
      job_.reset();
    }
    Status s = store_.apply(job.batch);
    job.batch = Batch{};  // its copies of leases and devices are freed here, not on the owner thread
    job.done(std::move(s));
    {
      std::lock_guard lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace accelpool::manager
