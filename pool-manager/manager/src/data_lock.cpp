#include "data_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <string>

namespace accelpool::manager {

Result<std::unique_ptr<DataLock>> DataLock::acquire(const std::filesystem::path& data_dir) {
  auto file = data_dir / "manager.lock";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(Errc::io_error, "cannot open " + file.string() + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char pid[32] = {};
    ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : std::string("?");
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (err == EWOULDBLOCK) {
      return make_error(Errc::busy, "data folder " + data_dir.string() + " is in use by accelpool-manager (pid " +
                                        holder + ", lock " + file.string() + ")");
    }
    return make_error(Errc::io_error, "cannot lock " + file.string() + ": " + std::strerror(err));
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    int err = errno;
    ::close(fd);
    return make_error(Errc::io_error, "cannot write " + file.string() + ": " + std::strerror(err));
  }
  return std::unique_ptr<DataLock>(new DataLock(fd));
}

DataLock::~DataLock() { ::close(fd_); }

}  // namespace accelpool::manager
