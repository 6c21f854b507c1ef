// Byte streams to the pool: parsing pool URIs and opening them as file descriptors (POSIX only, no Boost), with
// TLS (OpenSSL) on tls:// streams.
#pragma once

#include <accelpool/common/result.hpp>

#include <chrono>
#include <string>
#include <vector>

#include <sys/types.h>

struct ssl_st;  // OpenSSL's SSL

namespace accelpool::shim {

struct PoolUri {
  enum class Kind { tcp, tls, unix_socket, serial };
  Kind kind = Kind::tcp;
  std::string host;  // tcp, tls: host name or address (IPv6 in brackets in the URI, without them here)
  std::string port;  // tcp, tls: port number
  std::string path;  // unix: socket path
  std::string name;  // serial: the virtio-serial port name
  std::string text;  // the URI as given
};

// Parses tcp://HOST:PORT, tls://HOST:PORT (TCP with TLS), unix:///PATH (or unix:PATH), serial://NAME. Errors:
// "invalid_argument" naming the URI and what is wrong with it. Changes nothing.
Result<PoolUri> parse_pool_uri(const std::string& uri);

// Parses a list of pool URIs separated by commas, the managers of one pool in the order to try them
// ("unix:///run/a.sock,tcp://h1:7070,tcp://h2:7070"; one URI is a list of one; blanks around entries are
// ignored). Errors: "invalid_argument" naming the entry that is wrong (as parse_pool_uri), or an empty entry or list.
Result<std::vector<PoolUri>> parse_pool_uris(const std::string& list);

// Finds the character device of the virtio-serial port named `name`: the entry of `sys_dir`
// (default /sys/class/virtio-ports) whose `name` file holds it, mapped to `dev_dir`/<entry>. Errors:
// "unreachable" when no port has that name (the message lists the names seen).
Result<std::string> find_virtio_port(const std::string& name, const std::string& sys_dir = "/sys/class/virtio-ports",
                                     const std::string& dev_dir = "/dev");

// An open stream. Owns the descriptor (non-blocking, close-on-exec) and, on tls://, the TLS connection over it.
// Read and write it with stream_read/stream_write, wait on `fd` with poll(), end it with close_stream.
struct Stream {
  int fd = -1;
  bool socket = false;    // true: use send(MSG_NOSIGNAL); false: write()
  ssl_st* tls = nullptr;  // tls:// only
};

// TLS settings of tls:// streams.
struct TlsOptions {
  // PEM CA file that verifies the pool's certificate; "": $ACCELPOOL_POOL_CA when set, else the system's CAs.
  std::string ca_file;
};

// Like read(2)/send(2) on the stream: bytes moved (> 0), 0 when the pool closed the stream (read only), or -1 with
// errno (EAGAIN: poll for `fd` and try again; EPROTO: a TLS error).
ssize_t stream_read(const Stream& s, char* buf, std::size_t size);
ssize_t stream_write(const Stream& s, const char* data, std::size_t size);
// Closes the stream (TLS: says close_notify first, without waiting). Leaves fd at -1.
void close_stream(Stream& s);

// Where serial:// ports are looked up (tests and unusual layouts change them).
struct SerialDirs {
  std::string sys_dir = "/sys/class/virtio-ports";
  std::string dev_dir = "/dev";
};

// The local guest daemon's socket (accelpool-guestd --listen default).
inline constexpr const char* kGuestDaemonSocket = "/run/accelpool/guest.sock";

// The pool URI to use when none is given (a list of URIs, see parse_pool_uris): $ACCELPOOL_POOL when set, else the
// local guest daemon (unix:///run/accelpool/guest.sock) when its socket exists, else tcp://127.0.0.1:7070
// (development).
std::string default_pool_uri();

// Opens the stream named by `uri`, waiting at most `timeout` for a TCP connect, and as long again for a TLS
// handshake, which verifies the pool's certificate (against `tls`'s CA) and its host name (the URI's).
// Errors: "unreachable" naming the URI and the reason (connection refused, no such file, timeout, no such port
// name, a TLS handshake that failed or a certificate that was not trusted); "invalid_argument" for a CA file
// that cannot be read.
Result<Stream> open_stream(const PoolUri& uri, std::chrono::milliseconds timeout, const SerialDirs& serial = {},
                           const TlsOptions& tls = {});

}  // namespace accelpool::shim
