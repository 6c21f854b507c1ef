#include <accelpool/shim/transport.hpp>

#include <accelpool/common/tls.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

namespace accelpool::shim {

namespace {

Error bad_uri(const std::string& uri, const std::string& why) {
  return make_error(
      Errc::invalid_argument,
      "pool URI '" + uri + "': " + why + " (expected tcp://HOST:PORT, tls://HOST:PORT, unix:///PATH or serial://NAME)");
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

Result<Stream> connect_tcp(const PoolUri& uri, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(uri.host.c_str(), uri.port.c_str(), &hints, &res);
  if (rc != 0)
    return make_error(Errc::unreachable,
                      "pool " + uri.text + ": cannot resolve '" + uri.host + "': " + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int pr;
      do {
        pr = poll(&p, 1, static_cast<int>(timeout.count()));
      } while (pr < 0 && errno == EINTR);
      if (pr == 0) {
        last = "connect timed out after " + std::to_string(timeout.count()) + " ms";
        ::close(fd);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r != 0) {
      last = std::strerror(errno);
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    freeaddrinfo(res);
    return Stream{fd, true};
  }
  freeaddrinfo(res);
  return make_error(Errc::unreachable, "pool " + uri.text + " is unreachable: " + last);
}

// While it lives, a write on a closed socket (OpenSSL writes with write(2), not send(MSG_NOSIGNAL)) raises no
// SIGPIPE in the program: the signal is blocked on this thread, and one it caused is taken back before unblocking.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Waits until `fd` is ready for `events`, at most until `deadline`. False on timeout.
bool wait_ready(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int pr = poll(&p, 1, static_cast<int>(left));
    if (pr > 0) return true;
    if (pr < 0 && errno != EINTR) return true;  // let the caller's next call report it
  }
}

// The TLS handshake of a client on the connected `tcp`, verifying the pool's certificate and host name.
Result<Stream> start_tls(const PoolUri& uri, Stream tcp, std::chrono::milliseconds timeout, const TlsOptions& tls) {
  common::tls::Files files;
  files.ca = tls.ca_file;
  files.ca_name = "the CA file";
  if (files.ca.empty()) {
    if (const char* e = std::getenv("ACCELPOOL_POOL_CA"); e != nullptr) files.ca = e;
    files.ca_name = "ACCELPOOL_POOL_CA";
  }
  auto ctx = common::tls::client_context(files);
  if (!ctx) {
    close_stream(tcp);
    return make_error(Errc::invalid_argument, "pool " + uri.text + ": " + ctx.error().message);
  }
  tcp.tls = SSL_new(ctx->get());
  if (tcp.tls == nullptr || SSL_set_fd(tcp.tls, tcp.fd) != 1) {
    close_stream(tcp);
    return make_error(Errc::internal, "pool " + uri.text + ": " + common::tls::last_error("SSL_new failed"));
  }
  // Partial writes: the caller's buffer grows and moves between a write that could not finish and its retry.
  SSL_set_mode(tcp.tls, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (auto s = common::tls::expect_host(tcp.tls, uri.host); !s) {
    close_stream(tcp);
    return make_error(Errc::invalid_argument, "pool " + uri.text + ": " + s.error().message);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ERR_clear_error();
    int r;
    {
      NoSigpipe quiet;
      r = SSL_connect(tcp.tls);
    }
    if (r == 1) return tcp;
    int err = SSL_get_error(tcp.tls, r);
    short wait = err == SSL_ERROR_WANT_READ ? POLLIN : err == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    std::string why;
    if (wait == 0) {
      long verify = SSL_get_verify_result(tcp.tls);
      why = verify != X509_V_OK
                ? std::string("the pool's certificate is not trusted: ") + X509_verify_cert_error_string(verify) +
                      (files.ca.empty() ? " (set the CA file, e.g. ACCELPOOL_POOL_CA)" : "")
                : common::tls::last_error(err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN
                                              ? "the pool closed the connection (is it TLS?)"
                                              : "handshake failed");
    } else if (!wait_ready(tcp.fd, wait, deadline)) {
      why = "no answer in time";
    } else {
      continue;
    }
    close_stream(tcp);
    return make_error(Errc::unreachable, "pool " + uri.text + ": TLS handshake failed: " + why);
  }
}

Result<Stream> connect_unix(const PoolUri& uri) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (uri.path.size() >= sizeof addr.sun_path) {
    return make_error(Errc::invalid_argument, "pool " + uri.text + ": socket path longer than " +
                                                  std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, uri.path.c_str(), uri.path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(Errc::unreachable, "pool " + uri.text + ": socket: " + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    return make_error(Errc::unreachable, "pool " + uri.text + " is unreachable: " + why);
  }
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  return Stream{fd, true};
}

Result<Stream> open_serial(const PoolUri& uri, const SerialDirs& dirs) {
  auto dev = find_virtio_port(uri.name, dirs.sys_dir, dirs.dev_dir);
  if (!dev) return dev.error();
  int fd = ::open(dev->c_str(), O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return make_error(Errc::unreachable, "pool " + uri.text + ": cannot open " + *dev + ": " + std::strerror(errno));
  return Stream{fd, false};
}

}  // namespace

Result<PoolUri> parse_pool_uri(const std::string& uri) {
  PoolUri u;
  u.text = uri;
  auto starts = [&](const char* p) { return uri.rfind(p, 0) == 0; };
  if (starts("tcp://") || starts("tls://")) {
    std::string rest = uri.substr(6);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::string host, port;
    if (!rest.empty() && rest[0] == '[') {
      auto close = rest.find(']');
      if (close == std::string::npos) return bad_uri(uri, "unclosed '[' in the host");
      host = rest.substr(1, close - 1);
      if (close + 1 >= rest.size() || rest[close + 1] != ':') return bad_uri(uri, "missing ':PORT'");
      port = rest.substr(close + 2);
    } else {
      auto colon = rest.rfind(':');
      if (colon == std::string::npos) return bad_uri(uri, "missing ':PORT'");
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
    }
    if (host.empty()) return bad_uri(uri, "empty host");
    if (!all_digits(port) || port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return bad_uri(uri, "port '" + port + "' is not a number in 1..65535");
    }
    u.kind = starts("tls://") ? PoolUri::Kind::tls : PoolUri::Kind::tcp;
    u.host = host;
    u.port = port;
    return u;
  }
  if (starts("unix:")) {
    std::string path = uri.substr(5);
    if (path.rfind("//", 0) == 0) path = path.substr(2);
    if (path.empty()) return bad_uri(uri, "empty socket path");
    u.kind = PoolUri::Kind::unix_socket;
    u.path = path;
    return u;
  }
  if (starts("serial://")) {
    std::string name = uri.substr(9);
    if (name.empty()) return bad_uri(uri, "empty port name");
    if (name.find('/') != std::string::npos) return bad_uri(uri, "a port name may not contain '/'");
    u.kind = PoolUri::Kind::serial;
    u.name = name;
    return u;
  }
  return bad_uri(uri, "unknown scheme");
}

Result<std::vector<PoolUri>> parse_pool_uris(const std::string& list) {
  std::vector<PoolUri> uris;
  std::size_t start = 0;
  for (;;) {
    auto comma = list.find(',', start);
    std::string entry = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) {
      return make_error(Errc::invalid_argument, "pool URI list '" + list + "': entry " +
                                                    std::to_string(uris.size() + 1) +
                                                    " is empty (expected URIs separated by commas)");
    }
    auto uri = parse_pool_uri(entry);
    if (!uri) return uri.error();
    uris.push_back(std::move(*uri));
    if (comma == std::string::npos) return uris;
    start = comma + 1;
  }
}

Result<std::string> find_virtio_port(const std::string& name, const std::string& sys_dir, const std::string& dev_dir) {
  DIR* d = opendir(sys_dir.c_str());
  if (!d) {
    return make_error(Errc::unreachable, "no virtio-serial port named '" + name + "': cannot read " + sys_dir + ": " +
                                             std::strerror(errno));
  }
  std::vector<std::string> seen;
  std::string found;
  while (dirent* e = readdir(d)) {
    std::string entry = e->d_name;
    if (entry == "." || entry == "..") continue;
    std::ifstream f(sys_dir + "/" + entry + "/name");
    if (!f) continue;
    std::string n;
    std::getline(f, n);
    n = trim(n);
    if (n.empty()) continue;
    seen.push_back(n + " (" + entry + ")");
    if (n == name && found.empty()) found = entry;
  }
  closedir(d);
  if (found.empty()) {
    std::sort(seen.begin(), seen.end());
    std::string list;
    for (const auto& s : seen) list += (list.empty() ? "" : ", ") + s;
    return make_error(Errc::unreachable, "no virtio-serial port named '" + name + "' under " + sys_dir +
                                             (list.empty() ? " (no named ports)" : " (ports: " + list + ")"));
  }
  return dev_dir + "/" + found;
}

std::string default_pool_uri() {
  if (const char* e = std::getenv("ACCELPOOL_POOL"); e != nullptr && *e != '\0') return e;
  struct stat st {};
  if (::stat(kGuestDaemonSocket, &st) == 0 && S_ISSOCK(st.st_mode)) return std::string("unix://") + kGuestDaemonSocket;
  return "tcp://127.0.0.1:7070";
}

ssize_t stream_read(const Stream& s, char* buf, std::size_t size) {
  if (s.tls == nullptr) return ::read(s.fd, buf, size);
  ERR_clear_error();
  NoSigpipe quiet;  // a read may write (a key update)
  int n = SSL_read(s.tls, buf, static_cast<int>(std::min<std::size_t>(size, 1 << 30)));
  if (n > 0) return n;
  switch (SSL_get_error(s.tls, n)) {
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_SYSCALL:
      if (errno == 0) return 0;
      return -1;  // EOF without close_notify, or the system's error
    default:
      errno = EPROTO;
      return -1;
  }
}

ssize_t stream_write(const Stream& s, const char* data, std::size_t size) {
  if (s.tls == nullptr) return s.socket ? ::send(s.fd, data, size, MSG_NOSIGNAL) : ::write(s.fd, data, size);
  if (size == 0) return 0;
  ERR_clear_error();
  NoSigpipe quiet;
  int n = SSL_write(s.tls, data, static_cast<int>(std::min<std::size_t>(size, 1 << 30)));
  if (n > 0) return n;
  switch (SSL_get_error(s.tls, n)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_SYSCALL:
      if (errno == 0) errno = EPIPE;
      return -1;
    default:
      errno = EPROTO;
      return -1;
  }
}

void close_stream(Stream& s) {
  if (s.tls != nullptr) {
    {
      NoSigpipe quiet;
      SSL_shutdown(s.tls);  // close_notify if it fits in the socket buffer; no wait for the pool's
    }
    SSL_free(s.tls);
    s.tls = nullptr;
  }
  if (s.fd >= 0) ::close(s.fd);
  s.fd = -1;
}

Result<Stream> open_stream(const PoolUri& uri, std::chrono::milliseconds timeout, const SerialDirs& serial,
                           const TlsOptions& tls) {
  switch (uri.kind) {
    case PoolUri::Kind::tcp:
      return connect_tcp(uri, timeout);
    case PoolUri::Kind::tls: {
      auto tcp = connect_tcp(uri, timeout);
      if (!tcp) return tcp;
      return start_tls(uri, *tcp, timeout, tls);
    }
    case PoolUri::Kind::unix_socket:
      return connect_unix(uri);
    case PoolUri::Kind::serial:
      return open_serial(uri, serial);
  }
  return make_error(Errc::internal, "unknown URI kind");
}

}  // namespace accelpool::shim
