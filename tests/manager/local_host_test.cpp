// The in-process host over a DeviceBackend, with a small in-memory backend written for this test.
#include "test_support.hpp"

#include <accelpool/backends/device_backend.hpp>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

using namespace accelpool;
using namespace accelpool::manager;
using namespace accelpool::manager::test;

namespace {

struct MemoryBackend : backends::DeviceBackend {
  std::map<std::string, std::string> held;  // local id -> sha256
  int programs = 0;
  int resets = 0;
  std::string_view name() const override { return "memory"; }
  Result<std::vector<backends::DeviceInfo>> enumerate() override {
    std::vector<backends::DeviceInfo> out;
    for (const auto& [id, _] : held) out.push_back({id, "fpga", "mem", "", true, {}});
    return out;
  }
  Status program(std::string_view id, const backends::Image& image) override {
    auto it = held.find(std::string(id));
    if (it == held.end()) return make_error("not_found", "no device");
    if (image.name == "broken") return make_error("program_failed", "bad image");
    ++programs;
    it->second = image.sha256;
    return Status::ok();
  }
  Result<std::string> loaded(std::string_view id) override {
    auto it = held.find(std::string(id));
    if (it == held.end()) return make_error("not_found", "no device");
    return it->second;
  }
  Status reset(std::string_view id) override {
    ++resets;
    held[std::string(id)] = "";
    return Status::ok();
  }
  backends::HealthReport health(std::string_view) override { return {}; }
};

// Waits until the host's worker has posted `n` completions.
void wait_for(PostQueue& q, std::mutex& mu, std::size_t n) {
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lock(mu);
      if (q.jobs.size() >= n) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  FAIL("the host did not complete in time");
}

}  // namespace

TEST_CASE("the local host programs, then resets a device through its backend", "[host]") {
  auto backend = std::make_unique<MemoryBackend>();
  backend->held = {{"d0", ""}, {"d1", ""}};
  auto* raw = backend.get();
  PostQueue q;
  std::mutex mu;
  auto host = make_local_host("h", std::move(backend), [&](std::function<void()> f) {
    std::lock_guard lock(mu);
    q.jobs.push_back(std::move(f));
  });
  auto devs = host->devices();
  REQUIRE(devs.is_ok());
  CHECK(devs->size() == 2);

  std::vector<std::string> results;
  host->prepare("d0", "vadd", true, "vm1", [&](Status s, std::string loaded) {
    CHECK(s.is_ok());
    results.push_back(loaded);
  });
  host->prepare("d1", "broken", true, "vm1", [&](Status s, std::string) {
    CHECK_FALSE(s.is_ok());
    results.push_back("error:" + s.error().code);
  });
  wait_for(q, mu, 2);
  {
    std::lock_guard lock(mu);
    q.drain();
  }
  REQUIRE(results.size() == 2);
  CHECK(results[0] == "vadd");
  CHECK(results[1] == "error:program_failed");
  CHECK(raw->programs == 1);

  host->release("d0", [&](Status s, std::string loaded) {
    CHECK(s.is_ok());
    results.push_back("after-reset:" + loaded);
  });
  wait_for(q, mu, 1);
  {
    std::lock_guard lock(mu);
    q.drain();
  }
  CHECK(results.back() == "after-reset:");
  CHECK(raw->resets == 1);
}
