// The socket side of the remote OpenCL wire (docs/remote-opencl.md), shared by libaccelpool-opencl.so and the opencl
// backend's remote server: whole reads and writes on a blocking TCP socket, and the options both ends set on it.
// POSIX only; no OpenCL types.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>

namespace accelpool::clwire {

// Moves exactly `n` bytes with `step(p, n)`, a read(2)- or send(2)-like call on the connection (plain or TLS) that
// returns how many bytes it moved, 0 or less when the connection ended; EINTR is retried.
template <typename Step, typename Byte>
bool move_all(Step&& step, Byte* p, std::size_t n) {
  while (n > 0) {
    const auto moved = step(p, n);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return false;
    p += moved;
    n -= static_cast<std::size_t>(moved);
  }
  return true;
}

// Reads exactly `n` bytes; false when the peer closed, the connection failed or was cut.
inline bool read_exact(int fd, char* p, std::size_t n) {
  return move_all([fd](char* at, std::size_t left) { return ::recv(fd, at, left, 0); }, p, n);
}

// Writes all `n` bytes (never raising SIGPIPE); false when the connection failed or was cut.
inline bool write_all(int fd, const char* p, std::size_t n) {
  return move_all([fd](const char* at, std::size_t left) { return ::send(fd, at, left, MSG_NOSIGNAL); }, p, n);
}

// What both ends set on a connection: no Nagle delay (requests are whole frames), and a peer that stops answering
// (a cut network, a host that vanished) ends the connection within about 15 s instead of never: keepalive probes
// after 5 s of silence every 2 s, 3 unanswered end it, and data unacknowledged for 15 s ends it too. A peer that is
// busy (a long kernel) still answers probes from its kernel, so it is never taken for gone.
inline void tune_socket(int fd) {
  int one = 1, idle = 5, interval = 2, count = 3;
  unsigned timeout_ms = 15000;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof timeout_ms);
}

}  // namespace accelpool::clwire
