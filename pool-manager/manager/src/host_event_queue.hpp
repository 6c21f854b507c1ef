// HostEventQueue: how host events (operation completions, agents joining, leaving, reporting health) reach the
// owner thread. They wait in one queue, in the order they were posted, and the owner thread runs at most
// kPerTurn of them per turn of its io_context before it goes back to its other work (guest and admin calls). A
// storm of a thousand hosts joining or leaving at once is then worked through in slices, and a guest's call that
// arrives meanwhile waits for one slice, not for the whole storm. The daemon commits what the events changed when
// the queue runs dry and every kSlicesPerCommit slices of a longer run: a storm is then written in a few larger
// transactions rather than one per slice, and a guest call's own commit still writes what came before it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>

namespace accelpool::manager {

class HostEventQueue {
 public:
  static constexpr std::size_t kPerTurn = 8;
  static constexpr std::size_t kSlicesPerCommit = 4;

  // `commit` runs on the owner thread after a slice that left the queue empty and after every kSlicesPerCommit-th
  // slice in a row (the daemon requests a group commit there). Both must outlive the queue's last slice.
  HostEventQueue(boost::asio::io_context& owner, std::function<void()> commit)
      : owner_(owner), commit_(std::move(commit)) {}

  // Any thread. `event` runs on the owner thread, after every event posted before it.
  void post(std::function<void()> event) {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
    if (scheduled_) return;
    scheduled_ = true;
    boost::asio::post(owner_, [this] { run_slice(); });
  }

 private:
  void run_slice() {
    std::function<void()> slice[kPerTurn];  // taken in one lock: the posting threads wait for it once a slice
    std::size_t n = 0;
    {
      std::lock_guard lock(mu_);
      for (; n < kPerTurn && !events_.empty(); ++n) {
        slice[n] = std::move(events_.front());
        events_.pop_front();
      }
    }
    for (std::size_t i = 0; i < n; ++i) slice[i]();
    bool dry;
    {
      std::lock_guard lock(mu_);
      dry = events_.empty();
    }
    if (dry || ++slices_uncommitted_ >= kSlicesPerCommit) {
      slices_uncommitted_ = 0;
      if (commit_) commit_();
    }
    std::lock_guard lock(mu_);
    if (events_.empty()) {
      scheduled_ = false;
    } else {  // behind whatever the owner thread was given meanwhile
      boost::asio::post(owner_, [this] { run_slice(); });
    }
  }

  boost::asio::io_context& owner_;
  std::function<void()> commit_;
  std::size_t slices_uncommitted_ = 0;  // owner thread only
  std::mutex mu_;
  std::deque<std::function<void()>> events_;
  bool scheduled_ = false;
};

}  // namespace accelpool::manager
