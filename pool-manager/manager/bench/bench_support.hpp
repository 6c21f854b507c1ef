// What the manager's in-process benchmarks share: fatal errors, the owner thread's queue of posted completions,
// a pseudo-random image file and percentiles. Benchmarks only; not a test helper.
#pragma once

#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/manager/host_driver.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace accelpool::manager::bench {

// Prints "<program>: <what>" and exits with status 1.
[[noreturn]] inline void die(const char* program, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program, what.c_str());
  std::exit(1);
}

// Completions posted by hosts and the agent link, run on the thread that calls run_until (the owner).
class OwnerQueue {
 public:
  Poster poster() {
    return [this](std::function<void()> f) {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(f));
      cv_.notify_one();
    };
  }
  // Runs posted completions until `done()` holds.
  template <class Done>
  void run_until(Done done) {
    while (!done()) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !jobs_.empty(); });
      auto f = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      f();
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
};

// Writes a file of `mib` MiB of pseudo-random bytes (the same for every run). False when it cannot be written.
inline bool write_random_image(const std::filesystem::path& path, int mib) {
  std::ofstream out(path, std::ios::binary);
  std::mt19937_64 rng(7);
  std::vector<std::uint64_t> block((1 << 20) / sizeof(std::uint64_t));
  for (int i = 0; i < mib; ++i) {
    for (auto& w : block) w = rng();
    out.write(reinterpret_cast<const char*>(block.data()),
              static_cast<std::streamsize>(block.size() * sizeof(std::uint64_t)));
  }
  return static_cast<bool>(out);
}

// A registry folder `dir`/registry holding one image "big" (version 1, kind fpga, for the simulated models) of
// `mib` MiB of pseudo-random bytes; `sha256` receives its sha256. Exits through die(program, ...) on error.
inline std::shared_ptr<bitstreams::SharedRegistry> registry_with_image(const char* program,
                                                                       const std::filesystem::path& dir, int mib,
                                                                       std::string& sha256) {
  std::filesystem::create_directories(dir / "upload");
  const auto source = dir / "upload" / "big.bin";
  if (!write_random_image(source, mib)) die(program, "cannot write " + source.string());
  auto sha = bitstreams::sha256_file(source);
  if (!sha) die(program, sha.error().message);
  auto registry = bitstreams::SharedRegistry::open(dir / "registry");
  if (!registry) die(program, registry.error().message);
  bitstreams::Manifest m;
  m.name = "big";
  m.version = "1";
  m.kind = "fpga";
  m.compatible = {"sim-*"};
  m.file = "big.bin";
  m.sha256 = *sha;
  if (auto added = (*registry)->add(m, source); !added) die(program, added.error().message);
  std::filesystem::remove(source);
  sha256 = *sha;
  return *registry;
}

// The `q` quantile (0..1) of `v`, nearest rank below; 0 for none.
inline double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace accelpool::manager::bench
