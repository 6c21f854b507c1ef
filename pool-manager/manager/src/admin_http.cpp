// HTTP/1.1 for the admin API: one Beast session per connection, one request at a time, bounded header and
// body sizes, a deadline per request. Request handling itself is AdminApi's.
#include "admin_http.hpp"

#include "accept_loop.hpp"
#include "admin_api.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdio>
#include <map>

namespace accelpool::manager {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct AdminServer::Impl : std::enable_shared_from_this<AdminServer::Impl> {
  Impl(asio::io_context& ioc, AdminApi& api, HttpLimits limits)
      : listening(ioc.get_executor(), ""), api(api), limits(limits) {}  // named by start()
  Listening<tcp> listening;
  AdminApi& api;
  HttpLimits limits;
  std::size_t connections = 0;
  std::map<asio::ip::address, std::size_t> per_source;  // open connections by source address
  bool stopped = false;

  void accept();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, asio::ip::address source, std::shared_ptr<AdminServer::Impl> server)
      : stream_(std::move(socket)), source_(source), server_(std::move(server)) {
    ++server_->connections;
    ++server_->per_source[source_];
  }
  ~Session() {
    --server_->connections;
    if (--server_->per_source[source_] == 0) server_->per_source.erase(source_);
  }

  void start() { read(); }

 private:
  // The headers within the header deadline, then the body within what is left of the request deadline.
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->limits.max_header_bytes));
    parser_->body_limit(server_->limits.max_body_bytes);
    const auto start = std::chrono::steady_clock::now();
    const auto& limits = server_->limits;
    stream_.expires_at(start + seconds(std::min(limits.header_timeout_s, limits.request_timeout_s)));
    http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this(), start](beast::error_code ec, std::size_t) {
      if (ec) return self->on_read(ec);
      self->stream_.expires_at(start + seconds(self->server_->limits.request_timeout_s));
      http::async_read(self->stream_, self->buffer_, *self->parser_, [self](beast::error_code ec, std::size_t) {
        self->on_read(ec);
      });
    });
  }

  static std::chrono::steady_clock::duration seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
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
    // Most answers come at once; an upload's comes later, from the owner thread's queue.
    server_->api.handle(std::move(in), [self = shared_from_this(), version = req.version(),
                                        keep_alive = req.keep_alive()](ApiResponse out) {
      self->write(out, version, keep_alive && !self->server_->stopped);
    });
  }

  void write(const ApiResponse& r, unsigned version, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), version);
    res->set(http::field::server, "accelpool-manager");
    res->set(http::field::content_type, r.content_type);
    if (r.status == 401) res->set(http::field::www_authenticate, "Bearer");
    res->keep_alive(keep_alive);
    res->body() = r.body;
    res->prepare_payload();
    stream_.expires_after(seconds(server_->limits.request_timeout_s));
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
  asio::ip::address source_;
  std::shared_ptr<AdminServer::Impl> server_;
};

}  // namespace

void AdminServer::Impl::accept() {
  accept_loop(listening, shared_from_this(), [self = shared_from_this()](tcp::socket socket) {
    if (self->stopped) return;
    beast::error_code ec;
    auto source = socket.remote_endpoint(ec).address();
    auto from_source = self->per_source.find(source);
    if (ec || self->connections >= self->limits.max_connections ||
        (from_source != self->per_source.end() && from_source->second >= self->limits.max_connections_per_source)) {
      socket.close(ec);
      return;
    }
    std::make_shared<Session>(std::move(socket), source, self)->start();
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
  impl->listening.acceptor.open(ep.protocol(), ec);
  if (!ec) impl->listening.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->listening.acceptor.bind(ep, ec);
  if (!ec) impl->listening.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error("listen", "admin API on " + address + ":" + std::to_string(port) + ": " + ec.message());
  impl->listening.backoff =
      common::AcceptBackoff("admin API " + address + ":" + std::to_string(impl->listening.acceptor.local_endpoint().port()));
  impl->accept();
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

unsigned short AdminServer::port() const { return impl_->listening.acceptor.local_endpoint().port(); }

void AdminServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ec;
  impl_->listening.acceptor.close(ec);
}

}  // namespace accelpool::manager
