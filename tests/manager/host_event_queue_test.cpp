// HostEventQueue: host events run in order on the owner thread, a slice per turn, so other work posted to the
// owner thread meanwhile runs between slices instead of after the whole storm.
#include "host_event_queue.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

#include <string>
#include <thread>
#include <vector>

using namespace accelpool::manager;

TEST_CASE("a storm of host events is worked through in slices, in order, with other owner work between them",
          "[daemon][host_events]") {
  boost::asio::io_context owner(1);
  std::vector<std::string> ran;
  std::size_t commits = 0;
  HostEventQueue queue(owner, [&] {
    ++commits;
    ran.push_back("commit");
  });
  constexpr int kStorm = 100;
  // The storm is posted from another thread, as the agent listener posts it, before the owner thread runs.
  std::thread poster([&] {
    for (int i = 0; i < kStorm; ++i) queue.post([&ran, i] { ran.push_back("host " + std::to_string(i)); });
  });
  poster.join();
  // A guest's call reaches the owner thread after the whole storm was posted.
  boost::asio::post(owner, [&] { ran.push_back("guest"); });
  owner.run();

  std::vector<std::string> hosts;
  for (const auto& r : ran) {
    if (r.rfind("host ", 0) == 0) hosts.push_back(r);
  }
  REQUIRE(hosts.size() == kStorm);
  for (int i = 0; i < kStorm; ++i) CHECK(hosts[static_cast<std::size_t>(i)] == "host " + std::to_string(i));
  // The guest ran after the first slice, long before the storm's end.
  auto guest = std::find(ran.begin(), ran.end(), "guest");
  REQUIRE(guest != ran.end());
  CHECK(*(guest - 1) == "host " + std::to_string(HostEventQueue::kPerTurn - 1));
  auto last_host = std::find(ran.begin(), ran.end(), "host " + std::to_string(kStorm - 1));
  CHECK(guest < last_host);
  // A commit after every kSlicesPerCommit slices and one when the queue ran dry: 13 slices of 8, 4 commits.
  constexpr std::size_t kSlices = (kStorm + HostEventQueue::kPerTurn - 1) / HostEventQueue::kPerTurn;
  CHECK(commits == (kSlices + HostEventQueue::kSlicesPerCommit - 1) / HostEventQueue::kSlicesPerCommit);
  const auto per_commit = HostEventQueue::kPerTurn * HostEventQueue::kSlicesPerCommit;
  auto first_commit = std::find(ran.begin(), ran.end(), "commit");
  REQUIRE(first_commit != ran.end());
  CHECK(*(first_commit - 1) == "host " + std::to_string(per_commit - 1));
  CHECK(ran.back() == "commit");

  // Events posted after the queue ran dry start a new slice, committed at once.
  ran.clear();
  queue.post([&] { ran.push_back("late"); });
  owner.restart();
  owner.run();
  CHECK(ran == std::vector<std::string>{"late", "commit"});
}
