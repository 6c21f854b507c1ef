// HTTP/1.1 for the admin API: one Beast session per connection, one request at a time, bounded header and
// body sizes, a deadline per request. Request handling itself is AdminApi's.
#include "admin_http.hpp"

#include "admin_api.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdio>

namespace accelpool::manager {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct AdminServer::Impl : std::enable_shared_from_this<AdminServer::Impl> {
  Impl(asio::io_context& ioc, AdminApi& api, HttpLimits limits) : acceptor(ioc), api(api), limits(limits) {}
  tcp::acceptor acceptor;
  AdminApi& api;
  HttpLimits limits;
  std::size_t connections = 0;
  bool stopped = false;

  void accept();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<AdminServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {
    ++server_->connections;
  }
  ~Session() { --server_->connections; }

  void start() { read(); }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->limits.max_header_bytes));
    parser_->body_limit(server_->limits.max_body_bytes);
    stream_.expires_after(std::chrono::milliseconds(static_cast<long>(server_->limits.request_timeout_s * 1000)));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_read(ec);
    });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof) {
      return close();
    }
    if (ec) {
      ApiResponse r = ec == http::error::body_limit
                          ? AdminApi::error(413, "too_large", "the body is larger than " +
                                                                   std::to_string(server_->limits.max_body_bytes) + " bytes")
                      : ec == http::error::header_limit
                          ? AdminApi::error(431, "too_large", "the request headers are larger than " +
                                                                   std::to_string(server_->limits.max_header_bytes) + " bytes")
                          : AdminApi::error(400, "bad_request", "malformed HTTP request: " + ec.message());
      return write(r, 11, false);
    }
    auto& req = parser_->get();
    ApiRequest in;
    in.method = std::string(req.method_string());
    in.target = std::string(req.target());
    in.authorization = std::string(req[http::field::authorization]);
    in.body = std::move(req.body());
    ApiResponse out = server_->api.handle(in);
    write(out, req.version(), req.keep_alive() && !server_->stopped);
  }

  void write(const ApiResponse& r, unsigned version, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), version);
    res->set(http::field::server, "accelpool-manager");
    res->set(http::field::content_type, r.content_type);
    if (r.status == 401) res->set(http::field::www_authenticate, "Bearer");
    res->keep_alive(keep_alive);
    res->body() = r.body;
    res->prepare_payload();
    stream_.expires_after(std::chrono::milliseconds(static_cast<long>(server_->limits.request_timeout_s * 1000)));
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive](beast::error_code ec, std::size_t) {
      if (ec || !keep_alive) return self->close();
      self->read();
    });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<AdminServer::Impl> server_;
};

}  // namespace

void AdminServer::Impl::accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (self->stopped || ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (self->connections >= self->limits.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Session>(std::move(socket), self)->start();
      }
    }
    self->accept();
  });
}

AdminServer::AdminServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminServer::~AdminServer() { stop(); }

Result<std::unique_ptr<AdminServer>> AdminServer::start(asio::io_context& ioc, const std::string& address,
                                                         unsigned short port, AdminApi& api, HttpLimits limits) {
  auto impl = std::make_shared<Impl>(ioc, api, limits);
  beast::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec) return make_error("listen", "admin address '" + address + "': " + ec.message());
  tcp::endpoint ep(addr, port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error("listen", "admin API on " + address + ":" + std::to_string(port) + ": " + ec.message());
  impl->accept();
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

unsigned short AdminServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void AdminServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ec;
  impl_->acceptor.close(ec);
}

}  // namespace accelpool::manager
