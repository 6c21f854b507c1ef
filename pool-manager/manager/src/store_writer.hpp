// Makes the core's batches durable on a thread of its own, so that the owner thread goes on serving while a
// transaction is written: the daemon's group commit takes the pending changes (PoolCore::take_commit), hands the
// batch here, and holds the replies that report them until this writer says the batch is durable
// (docs/architecture.md, "Durability").
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/manager/store.hpp>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace accelpool::manager {

class StoreWriter {
 public:
  // Starts the writer thread. `store` must outlive this writer and accept calls from two threads (the Store
  // contract: calls are serialized).
  explicit StoreWriter(Store& store);
  // Waits for the batch in flight, if any, and joins the thread.
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Applies `batch` (Store::apply) on the writer thread, then calls `done` with the outcome there. One batch at a
  // time: call again only after the previous batch's `done` returned (wait_idle() waits for that).
  void write(Batch batch, std::function<void(Status)> done);

  // Blocks until no batch is in flight: the last one written was applied and its `done` returned.
  void wait_idle();

 private:
  void run();

  Store& store_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    Batch batch;
    std::function<void(Status)> done;
  };
  std::optional<Job> job_;  // guarded by mu_: the batch handed over and not applied yet, or in flight
  bool busy_ = false;       // guarded by mu_: a batch was handed over and its `done` has not returned
  bool stopping_ = false;   // guarded by mu_
  std::thread thread_;      // last: starts after the members above exist
};

}  // namespace accelpool::manager
