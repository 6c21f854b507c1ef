// A fresh, empty folder for one test, under the test's build folder (ACCELPOOL_TEST_TMP_DIR), removed when the
// object goes away. Shared by the test folders that define ACCELPOOL_TEST_TMP_DIR.
#pragma once

#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace accelpool::testing {

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
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace accelpool::testing
