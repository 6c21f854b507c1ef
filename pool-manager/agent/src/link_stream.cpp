#include <accelpool/agent/link_stream.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace accelpool::agent {

namespace {

class PlainStream final : public LinkStream {
 public:
  explicit PlainStream(int fd) : fd_(fd) {}
  bool read_some(LineBuffer& in) override { return agent::read_some(fd_, in); }
  Status write_some(std::string& out) override { return agent::write_some(fd_, out); }
  bool blocked_on_write() const override { return false; }
  std::string error() const override { return {}; }

 private:
  int fd_;
};

// SSL on the non-blocking socket: a call that cannot finish reports WANT_READ (the loop watches the socket for
// reading anyway) or WANT_WRITE (blocked_on_write: the loop watches it for writing and calls again).
class TlsStream final : public LinkStream {
 public:
  explicit TlsStream(SSL* ssl) : ssl_(ssl) {}
  ~TlsStream() override {
    if (!failed_) SSL_shutdown(ssl_);  // close_notify when the socket takes it; the peer's is not awaited
    SSL_free(ssl_);
  }

  bool read_some(LineBuffer& in) override {
    char buf[16384];
    for (;;) {
      ERR_clear_error();
      int n = SSL_read(ssl_, buf, sizeof buf);
      if (n > 0) {
        blocked_on_write_ = false;
        in.append(std::string_view(buf, static_cast<std::size_t>(n)));
        continue;  // until the socket and the SSL buffer are drained
      }
      int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        blocked_on_write_ = err == SSL_ERROR_WANT_WRITE;
        return true;
      }
      if (err != SSL_ERROR_ZERO_RETURN) fail(err);
      return false;
    }
  }

  Status write_some(std::string& out) override {
    while (!out.empty()) {
      ERR_clear_error();
      int n = SSL_write(ssl_, out.data(), static_cast<int>(std::min<std::size_t>(out.size(), 1 << 30)));
      if (n > 0) {
        blocked_on_write_ = false;
        out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        blocked_on_write_ = err == SSL_ERROR_WANT_WRITE;
        return Status::ok();
      }
      fail(err);
      return make_error(Errc::io_error, "TLS write: " + error_);
    }
    return Status::ok();
  }

  bool blocked_on_write() const override { return blocked_on_write_; }
  std::string error() const override { return error_; }

 private:
  void fail(int err) {
    failed_ = true;
    if (err == SSL_ERROR_SYSCALL) {
      error_ = errno != 0 ? std::string(std::strerror(errno)) : "the peer closed the connection";
    } else {
      long verify = SSL_get_verify_result(ssl_);
      error_ = common::tls::last_error("TLS error " + std::to_string(err));
      if (verify != X509_V_OK) error_ += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
    }
  }

  SSL* ssl_;
  bool blocked_on_write_ = false;
  bool failed_ = false;  // no close_notify after a fatal error
  std::string error_;
};

Result<std::unique_ptr<LinkStream>> tls_stream(int fd, const common::tls::Context& ctx, bool server,
                                               const std::string& host) {
  SSL* ssl = SSL_new(ctx.get());
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    if (ssl != nullptr) SSL_free(ssl);
    return make_error(Errc::internal, common::tls::last_error("SSL_new failed"));
  }
  // write_some's buffer moves and grows between a write that could not finish and its retry.
  SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (server) {
    SSL_set_accept_state(ssl);
  } else {
    if (auto s = common::tls::expect_host(ssl, host); !s) {
      SSL_free(ssl);
      return s.error();
    }
    SSL_set_connect_state(ssl);
  }
  return std::unique_ptr<LinkStream>(new TlsStream(ssl));
}

}  // namespace

std::unique_ptr<LinkStream> plain_stream(int fd) { return std::make_unique<PlainStream>(fd); }

Result<std::unique_ptr<LinkStream>> tls_server_stream(int fd, const common::tls::Context& ctx) {
  return tls_stream(fd, ctx, true, "");
}

Result<std::unique_ptr<LinkStream>> tls_client_stream(int fd, const common::tls::Context& ctx,
                                                      const std::string& host) {
  return tls_stream(fd, ctx, false, host);
}

}  // namespace accelpool::agent
