// Makes the core's batches durable, on a thread of its own when writing takes long, so that the owner thread goes
// on serving while a transaction is written: the daemon's group commit takes the pending changes
// (PoolCore::take_commit), hands the batch here, and holds the replies that report them until this writer says
// the batch is durable (docs/architecture.md, "Durability").
//
// A quick transaction (SQLite's WAL append: a tenth of a millisecond) is written on the calling thread: handing it
// to another thread and back costs two thread wake-ups, more than the write, and a single guest's grant would
// wait for them. A slow one (PostgreSQL's round trip and the server's WAL flush, SQLite with full_sync, the
// 100,000 device rows of a join storm) is written on the writer thread, and calls handled meanwhile join the next.
// Which one is decided by how long the previous transaction took.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/manager/store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace accelpool::manager {

class StoreWriter {
 public:
  // A transaction that took at least this long makes the next one go to the writer thread (by default).
  static constexpr std::chrono::microseconds kSlowWrite{500};

  // Starts the writer thread. `store` must outlive this writer and accept calls from two threads (the Store
  // contract: calls are serialized).
  explicit StoreWriter(Store& store, std::chrono::microseconds slow_write = kSlowWrite);
  // Waits for the batch in flight, if any, and joins the thread.
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Applies `batch` (Store::apply), then calls `done` with the outcome: on the calling thread before this returns
  // when the previous transaction was quicker than `slow_write` (the first always is), else on the writer thread.
  // One batch at a time: call again only after the previous batch's `done` returned (wait_idle() waits for that).
  void write(Batch batch, std::function<void(Status)> done);

  // Blocks until no batch is in flight: the last one written was applied and its `done` returned.
  void wait_idle();

 private:
  void run();
  // Applies the batch and records how long it took.
  Status apply(const Batch& batch);

  Store& store_;
  const std::chrono::microseconds slow_write_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    Batch batch;
    std::function<void(Status)> done;
  };
  std::optional<Job> job_;         // guarded by mu_: the batch handed over and not applied yet, or in flight
  bool busy_ = false;              // guarded by mu_: a batch was handed over and its `done` has not returned
  bool stopping_ = false;          // guarded by mu_
  std::atomic<bool> slow_{false};  // the last transaction took slow_write_ or longer
  std::thread thread_;             // last: starts after the members above exist
};

}  // namespace accelpool::manager
