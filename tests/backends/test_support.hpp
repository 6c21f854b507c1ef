// Helpers for the backend tests: the build's sample registry and scratch folders.
#pragma once

#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/registry.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace accelpool::backends::test {

inline const std::filesystem::path build_samples{ACCELPOOL_BUILD_SAMPLES_DIR};

// The sample registry the build generated (OpenCL sources and generated xclbins).
inline bitstreams::Registry sample_registry() {
  auto r = bitstreams::Registry::open(build_samples);
  REQUIRE(r.is_ok());
  for (const auto& x : r->rejected()) FAIL_CHECK(x.error.message);
  return std::move(*r);
}

inline Image sample_image(const std::string& name) {
  auto b = sample_registry().get(name);
  REQUIRE(b.is_ok());
  return make_image(*b);
}

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::path(ACCELPOOL_TEST_TMP_DIR) /
            (tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace accelpool::backends::test
