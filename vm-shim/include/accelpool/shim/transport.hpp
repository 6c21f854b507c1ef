// Byte streams to the pool: parsing pool URIs and opening them as file descriptors (POSIX only, no Boost).
#pragma once

#include <accelpool/common/result.hpp>

#include <chrono>
#include <string>

namespace accelpool::shim {

struct PoolUri {
  enum class Kind { tcp, unix_socket, serial };
  Kind kind = Kind::tcp;
  std::string host;  // tcp: host name or address (IPv6 in brackets in the URI, without them here)
  std::string port;  // tcp: port number
  std::string path;  // unix: socket path
  std::string name;  // serial: the virtio-serial port name
  std::string text;  // the URI as given
};

// Parses tcp://HOST:PORT, unix:///PATH (or unix:PATH), serial://NAME. Errors: "invalid_argument" naming the URI
// and what is wrong with it. Changes nothing.
Result<PoolUri> parse_pool_uri(const std::string& uri);

// Finds the character device of the virtio-serial port named `name`: the entry of `sys_dir`
// (default /sys/class/virtio-ports) whose `name` file holds it, mapped to `dev_dir`/<entry>. Errors:
// "unreachable" when no port has that name (the message lists the names seen).
Result<std::string> find_virtio_port(const std::string& name, const std::string& sys_dir = "/sys/class/virtio-ports",
                                     const std::string& dev_dir = "/dev");

// An open stream. Owns the descriptor (non-blocking, close-on-exec).
struct Stream {
  int fd = -1;
  bool socket = false;  // true: use send(MSG_NOSIGNAL); false: write()
};

// Where serial:// ports are looked up (tests and unusual layouts change them).
struct SerialDirs {
  std::string sys_dir = "/sys/class/virtio-ports";
  std::string dev_dir = "/dev";
};

// The local guest daemon's socket (accelpool-guestd --listen default).
inline constexpr const char* kGuestDaemonSocket = "/run/accelpool/guest.sock";

// The pool URI to use when none is given: $ACCELPOOL_POOL when set, else the local guest daemon
// (unix:///run/accelpool/guest.sock) when its socket exists, else tcp://127.0.0.1:7070 (development).
std::string default_pool_uri();

// Opens the stream named by `uri`, waiting at most `timeout` for a TCP connect. Errors: "unreachable" naming
// the URI and the system's reason (connection refused, no such file, timeout, no such port name).
Result<Stream> open_stream(const PoolUri& uri, std::chrono::milliseconds timeout, const SerialDirs& serial = {});

}  // namespace accelpool::shim
