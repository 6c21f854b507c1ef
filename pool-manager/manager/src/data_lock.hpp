// One process at a time per data folder: the running manager, or an offline `accelpool-manager token` command.
#pragma once

#include <accelpool/common/result.hpp>

#include <filesystem>
#include <memory>

namespace accelpool::manager {

// An exclusive lock (flock) on DATA/manager.lock, held while the object lives and released by the kernel when the
// process ends, however it ends. The file holds the holder's pid, for the error message of the next one.
class DataLock {
 public:
  // Errors: "busy" (another process holds the folder: names its pid), "io_error".
  static Result<std::unique_ptr<DataLock>> acquire(const std::filesystem::path& data_dir);
  ~DataLock();
  DataLock(const DataLock&) = delete;
  DataLock& operator=(const DataLock&) = delete;

 private:
  explicit DataLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace accelpool::manager
