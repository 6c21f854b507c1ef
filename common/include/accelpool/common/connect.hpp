// Blocking client connections to a local daemon, for the programs that drive one (benchmarks, tests). Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace accelpool::common {

// Connects a new stream socket of `family` to `addr`; the socket (close-on-exec), or -1 with errno set.
inline int connect_stream(int family, const sockaddr* addr, socklen_t len) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, addr, len) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// A connected TCP socket to 127.0.0.1:`port` (close-on-exec), or -1 with errno set.
inline int connect_loopback_tcp(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return connect_stream(AF_INET, reinterpret_cast<const sockaddr*>(&a), sizeof a);
}

// A connected Unix stream socket to `path` (close-on-exec), or -1 with errno set (ENAMETOOLONG when `path` does
// not fit a socket address).
inline int connect_unix_stream(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return connect_stream(AF_UNIX, reinterpret_cast<const sockaddr*>(&a), sizeof a);
}

}  // namespace accelpool::common
