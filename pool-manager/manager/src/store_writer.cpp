#include "store_writer.hpp"

#include <utility>

namespace accelpool::manager {

StoreWriter::StoreWriter(Store& store, std::chrono::microseconds slow_write)
    : store_(store), slow_write_(slow_write), thread_([this] { run(); }) {}

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
  if (!slow_) return done(apply(batch));
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
    Status s = apply(job.batch);
    job.batch = Batch{};  // its copies of leases and devices are freed here, not on the owner thread
    job.done(std::move(s));
    {
      std::lock_guard lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

Status StoreWriter::apply(const Batch& batch) {
  const auto start = std::chrono::steady_clock::now();
  Status s = store_.apply(batch);
  slow_ = std::chrono::steady_clock::now() - start >= slow_write_;
  return s;
}

}  // namespace accelpool::manager
