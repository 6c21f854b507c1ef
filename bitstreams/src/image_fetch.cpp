#include <accelpool/bitstreams/image_fetch.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <random>

namespace accelpool::bitstreams {
namespace {

struct HttpReply {
  int status = 0;
  std::string body;
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// One GET with "Connection: close"; the reply ends when the server closes.
Result<HttpReply> http_get(const std::string& host, const std::string& port, const std::string& target,
                           std::string_view token, std::chrono::milliseconds timeout) {
  std::string where = "GET http://" + host + ":" + port + target;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return make_error("unavailable", where + ": " + ::gai_strerror(rc));
  int raw = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  Fd fd(raw);
  int connected = raw < 0 ? -1 : ::connect(raw, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (connected != 0) return make_error("unavailable", where + ": cannot connect");
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string request = "GET " + target + " HTTP/1.1\r\nHost: " + host + ":" + port + "\r\nAuthorization: Bearer " +
                        std::string(token) + "\r\nConnection: close\r\n\r\n";
  for (std::size_t sent = 0; sent < request.size();) {
    auto n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return make_error("unavailable", where + ": sending the request failed");
    sent += static_cast<std::size_t>(n);
  }
  std::string in;
  char buf[65536];
  for (;;) {
    auto n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) return make_error("unavailable", where + ": no complete reply (timeout or connection error)");
    in.append(buf, static_cast<std::size_t>(n));
  }
  auto head_end = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos || in.size() < 12)
    return make_error("unavailable", where + ": the reply is not HTTP");
  HttpReply r;
  std::from_chars(in.data() + 9, in.data() + 12, r.status);
  r.body = in.substr(head_end + 4);
  // Content-Length, when given, must match what arrived (a short body means the transfer broke).
  std::string head = in.substr(0, head_end);
  for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (auto at = head.find("\r\ncontent-length:"); at != std::string::npos) {
    std::size_t len = 0;
    std::size_t i = at + 17;
    while (i < head.size() && head[i] == ' ') ++i;
    std::from_chars(head.data() + i, head.data() + head.size(), len);
    if (len != r.body.size())
      return make_error("unavailable", where + ": the body has " + std::to_string(r.body.size()) + " bytes, not " +
                                           std::to_string(len));
  }
  return r;
}

Status check_reply(const HttpReply& r, const std::string& what) {
  if (r.status == 200) return Status::ok();
  std::string code = r.status == 401 || r.status == 403 ? "unauthorized" : r.status == 404 ? "not_found" : "unavailable";
  return make_error(code, what + ": the manager answered HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300));
}

bool is_sha256(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

Result<Bitstream> fetch_image(Registry& registry, std::string_view url, std::string_view token,
                              std::string_view sha256, std::chrono::milliseconds timeout) {
  if (auto have = registry.find_by_sha256(sha256); have) return have;
  if (!is_sha256(sha256))
    return make_error("invalid_argument", "fetch image: '" + std::string(sha256) + "' is not 64 lowercase hex digits");
  const std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme)
    return make_error("invalid_argument", "fetch image: url '" + std::string(url) + "' must be http://HOST:PORT");
  std::string hostport(url.substr(scheme.size()));
  while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  auto colon = hostport.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hostport.size())
    return make_error("invalid_argument", "fetch image: url '" + std::string(url) + "' must be http://HOST:PORT");
  std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
  std::string target = "/v1/images/" + std::string(sha256);
  std::string what = "fetch image " + std::string(sha256) + " from " + std::string(url);

  auto manifest_reply = http_get(host, port, target + "/manifest", token, timeout);
  if (!manifest_reply) return manifest_reply.error();
  if (auto s = check_reply(*manifest_reply, what); !s) return s.error();
  auto manifest = parse_manifest(manifest_reply->body, what);
  if (!manifest) return manifest.error();
  if (manifest->sha256 != sha256)
    return make_error("checksum_mismatch", what + ": the manifest names image " + manifest->sha256);
  auto image_reply = http_get(host, port, target, token, timeout);
  if (!image_reply) return image_reply.error();
  if (auto s = check_reply(*image_reply, what); !s) return s.error();

  static thread_local std::mt19937_64 rng{std::random_device{}()};
  auto tmp = registry.dir() / (".fetch-" + std::to_string(rng()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(image_reply->body.data(), static_cast<std::streamsize>(image_reply->body.size()));
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return make_error("io_error", what + ": cannot write " + tmp.string());
    }
  }
  auto added = registry.add(*manifest, tmp);
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  if (!added) return make_error(added.error().code, what + ": " + added.error().message);
  return added;
}

}  // namespace accelpool::bitstreams
