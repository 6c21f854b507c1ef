// HTTP/1.1 for the admin API: one Beast session per connection, one request at a time, bounded header and
// body sizes, a deadline per request. Request handling itself is AdminApi's. A GET /v1/events turns its
// connection into a Server-Sent Events stream (EventStream) until the client goes. With a TLS context the
// sessions speak HTTPS (a TLS handshake within the header deadline first); the session code is the same.
#include "admin_http.hpp"

#include "accept_loop.hpp"
#include "admin_api.hpp"
#include "event_stream.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>

namespace accelpool::manager {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A connection streaming GET /v1/events.
class Watcher {
 public:
  virtual ~Watcher() = default;
  // The event stream's last refresh, as this watcher sees it: its first snapshot, then a delta per refresh.
  virtual void send_delta() = 0;
  virtual void end_stream() = 0;
};

struct AdminServer::Impl : std::enable_shared_from_this<AdminServer::Impl> {
  Impl(asio::io_context& ioc, AdminApi& api, HttpLimits limits, EventStream* events)
      : listening(ioc.get_executor(), ""), api(api), limits(limits), events(events) {}  // named by start()
  Listening<tcp> listening;
  std::optional<asio::ssl::context> tls;  // HTTPS; none: plain HTTP
  AdminApi& api;
  HttpLimits limits;
  EventStream* events;
  std::size_t connections = 0;
  std::map<asio::ip::address, std::size_t> per_source;  // open connections by source address
  std::map<Watcher*, std::weak_ptr<Watcher>> watchers;
  std::function<void()> publish_request;  // asks for a publish() soon (AdminServer::on_watch)
  bool stopped = false;

  void accept();
  // A watcher came: the stream reads the pool (if none watched) and its snapshot goes out at the next publish.
  void watch(Watcher* w, std::weak_ptr<Watcher> weak) {
    watchers[w] = std::move(weak);
    events->start();
    if (publish_request) publish_request();
  }
  // A watcher went (or a connection that never watched): with the last one the stream forgets the pool.
  void forget(Watcher* w) {
    if (watchers.erase(w) && watchers.empty() && events) events->stop();
  }
  void publish() {
    if (watchers.empty() || !events) return;
    events->refresh();
    auto now = watchers;  // a watcher that fails leaves the map meanwhile
    for (auto& [raw, weak] : now) {
      if (auto w = weak.lock()) w->send_delta();
    }
  }
};

namespace {

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// A connection: Stream is beast::tcp_stream (HTTP) or TlsStream (HTTPS).
template <typename Stream>
class Session : public Watcher, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, asio::ip::address source, std::shared_ptr<AdminServer::Impl> server)
      : stream_(std::move(stream)), source_(source), server_(std::move(server)) {
    ++server_->connections;
    ++server_->per_source[source_];
  }
  ~Session() override {
    server_->forget(this);
    --server_->connections;
    if (--server_->per_source[source_] == 0) server_->per_source.erase(source_);
  }

  void start() {
    if constexpr (std::is_same_v<Stream, TlsStream>) {
      const auto& limits = server_->limits;
      lowest().expires_after(seconds(std::min(limits.header_timeout_s, limits.request_timeout_s)));
      stream_.async_handshake(asio::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) return self->lowest().close();  // not TLS, or a certificate refused: nothing to answer
        self->read();
      });
    } else {
      read();
    }
  }

 private:
  // The headers within the header deadline, then the body within what is left of the request deadline.
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->limits.max_header_bytes));
    parser_->body_limit(server_->limits.max_body_bytes);
    const auto start = std::chrono::steady_clock::now();
    const auto& limits = server_->limits;
    lowest().expires_at(start + seconds(std::min(limits.header_timeout_s, limits.request_timeout_s)));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this(), start](beast::error_code ec, std::size_t) {
                              if (ec) return self->on_read(ec);
                              self->lowest().expires_at(start + seconds(self->server_->limits.request_timeout_s));
                              http::async_read(self->stream_, self->buffer_, *self->parser_,
                                               [self](beast::error_code ec, std::size_t) { self->on_read(ec); });
                            });
  }

  static std::chrono::steady_clock::duration seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
      return close();
    }
    if (ec) {
      ApiResponse r =
          ec == http::error::body_limit
              ? AdminApi::error(Errc::too_large,
                                "the body is larger than " + std::to_string(server_->limits.max_body_bytes) + " bytes")
          : ec == http::error::header_limit
              ? AdminApi::error(Errc::too_large, "the request headers are larger than " +
                                                     std::to_string(server_->limits.max_header_bytes) + " bytes")
              : AdminApi::error(Errc::bad_request, "malformed HTTP request: " + ec.message());
      if (ec == http::error::header_limit) r.status = 431;  // too_large's status is 413, for a body; 431 for headers
      return write(r, 11, false);
    }
    auto& req = parser_->get();
    ApiRequest in;
    in.method = std::string(req.method_string());
    in.target = std::string(req.target());
    in.authorization = std::string(req[http::field::authorization]);
    in.body = std::move(req.body());
    in.origin = std::string(req[http::field::origin]);
    in.host = std::string(req[http::field::host]);
    in.if_none_match = std::string(req[http::field::if_none_match]);
    if (server_->events && in.method == "GET" && in.target.substr(0, in.target.find('?')) == "/v1/events") {
      return start_stream(in, req.version());
    }
    // Most answers come at once; an upload's comes later, from the owner thread's queue.
    server_->api.handle(std::move(in),
                        [self = this->shared_from_this(), version = req.version(), keep_alive = req.keep_alive()](
                            ApiResponse out) { self->write(out, version, keep_alive && !self->server_->stopped); });
  }

  void write(const ApiResponse& r, unsigned version, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), version);
    res->set(http::field::server, "accelpool-manager");
    res->set(http::field::content_type, r.content_type);
    res->set("X-Content-Type-Options", "nosniff");
    for (const auto& [name, value] : r.headers) res->set(name, value);
    if (r.status == 401) res->set(http::field::www_authenticate, "Bearer");
    res->keep_alive(keep_alive);
    res->body() = r.body;
    res->prepare_payload();
    lowest().expires_after(seconds(server_->limits.request_timeout_s));
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res, keep_alive](beast::error_code ec, std::size_t) {
                        if (ec || !keep_alive) return self->close();
                        self->read();
                      });
  }

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  // HTTPS says close_notify first (bounded by the request deadline), then both close the socket.
  void close() {
    if constexpr (std::is_same_v<Stream, TlsStream>) {
      if (closing_) return;
      closing_ = true;
      lowest().expires_after(seconds(server_->limits.request_timeout_s));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) { self->close_socket(); });
    } else {
      close_socket();
    }
  }

  void close_socket() {
    beast::error_code ec;
    lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    lowest().close();
  }

  // --- GET /v1/events ---------------------------------------------------------------------------------------------
  // The response's headers at once, a snapshot at the next publish, then a delta per publish, until the client
  // closes. No deadline: memory is bounded by the backlog limit instead (a slow reader loses deltas and gets a
  // snapshot).
  void start_stream(const ApiRequest& in, unsigned version) {
    auto admitted = server_->api.stream_viewer(in);
    if (auto* refusal = std::get_if<ApiResponse>(&admitted)) return write(*refusal, version, false);
    if (!in.body.empty()) {
      return write(AdminApi::error(Errc::invalid_argument, "GET /v1/events takes no body"), version, false);
    }
    viewer_ = std::get<Viewer>(admitted);
    lowest().expires_never();
    std::string head = std::string("HTTP/1.") + (version == 10 ? "0" : "1") +
                       " 200 OK\r\nServer: accelpool-manager\r\nContent-Type: text/event-stream\r\n"
                       "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n";
    backlog_.push_back(std::make_shared<const std::string>(std::move(head)));
    awaiting_snapshot_ = true;
    pump();
    watch_close();
    server_->watch(this, std::weak_ptr<Session>(this->shared_from_this()));
  }

  void send_delta() override {
    if (awaiting_snapshot_) {
      // Its first event, the snapshot of this refresh (the others get its delta), in a turn of its own: several new
      // watchers' snapshots do not hold the owner thread at once, and guests' calls run between them.
      awaiting_snapshot_ = false;
      snapshot_posted_ = true;
      asio::post(stream_.get_executor(), [self = this->shared_from_this()] {
        self->snapshot_posted_ = false;
        if (!self->server_->events) return;
        self->backlog_.push_back(self->server_->events->snapshot(self->viewer_));
        self->pump();
      });
      return;
    }
    if (resync_ || snapshot_posted_) return;  // a snapshot follows anyway
    std::string event = server_->events->delta(viewer_);
    if (backlog_bytes_ + event.size() > server_->limits.max_stream_backlog_bytes) {
      backlog_.clear();
      backlog_bytes_ = 0;
      resync_ = true;
      return;
    }
    backlog_bytes_ += event.size();
    backlog_.push_back(std::make_shared<const std::string>(std::move(event)));
    pump();
  }

  void end_stream() override {
    server_->forget(this);
    close_socket();  // a read (and perhaps a write) is pending: no TLS shutdown alongside them
  }

  // Writes the next piece of the event being written, or of the next event, if no write is under way. A piece is at
  // most kWriteChunk bytes, so a large snapshot goes out over several turns of the owner thread.
  static constexpr std::size_t kWriteChunk = 256 << 10;
  void pump() {
    if (writing_) return;
    if (!current_) {
      if (backlog_.empty() && resync_ && server_->events) {
        resync_ = false;
        backlog_.push_back(server_->events->snapshot(viewer_));
      }
      if (backlog_.empty()) return;
      current_ = backlog_.front();
      backlog_.pop_front();
      offset_ = 0;
      if (backlog_bytes_ >= current_->size()) backlog_bytes_ -= current_->size();
    }
    const std::size_t n = std::min(kWriteChunk, current_->size() - offset_);
    writing_ = true;
    asio::async_write(stream_, asio::buffer(current_->data() + offset_, n),
                      [self = this->shared_from_this(), keep = current_, n](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        if (ec) return self->end_stream();
                        self->offset_ += n;
                        if (self->offset_ == self->current_->size()) self->current_.reset();
                        self->pump();
                      });
  }

  // The client sends nothing more; a read ends when it closes.
  void watch_close() {
    stream_.async_read_some(asio::buffer(probe_), [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->end_stream();
      self->watch_close();
    });
  }

  Viewer viewer_;
  std::deque<std::shared_ptr<const std::string>> backlog_;  // events not yet being written
  std::shared_ptr<const std::string> current_;              // the event being written, from offset_ on
  std::size_t offset_ = 0;
  std::size_t backlog_bytes_ = 0;
  bool writing_ = false;
  bool resync_ = false;             // deltas were dropped: the next write is a snapshot
  bool awaiting_snapshot_ = false;  // watching, and the first publish (its snapshot) is still to come
  bool snapshot_posted_ = false;    // its first snapshot is queued to go out in a turn of its own
  std::array<char, 256> probe_{};
  bool closing_ = false;  // HTTPS: the TLS shutdown has begun

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  asio::ip::address source_;
  std::shared_ptr<AdminServer::Impl> server_;
};

}  // namespace

void AdminServer::Impl::accept() {
  accept_loop(listening, shared_from_this(), [self = this->shared_from_this()](tcp::socket socket) {
    if (self->stopped) return;
    beast::error_code ec;
    auto source = socket.remote_endpoint(ec).address();
    auto from_source = self->per_source.find(source);
    if (ec || self->connections >= self->limits.max_connections ||
        (from_source != self->per_source.end() && from_source->second >= self->limits.max_connections_per_source)) {
      socket.close(ec);
      return;
    }
    if (self->tls) {
      std::make_shared<Session<TlsStream>>(TlsStream(std::move(socket), *self->tls), source, self)->start();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), source, self)->start();
    }
  });
}

AdminServer::AdminServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminServer::~AdminServer() { stop(); }

Result<std::unique_ptr<AdminServer>> AdminServer::start(asio::io_context& ioc, const std::string& address,
                                                        unsigned short port, AdminApi& api, HttpLimits limits,
                                                        EventStream* events, common::tls::Context tls) {
  auto impl = std::make_shared<Impl>(ioc, api, limits, events);
  if (tls) {
    SSL_CTX_up_ref(tls.get());  // the asio context takes a reference of its own
    impl->tls.emplace(tls.get());
  }
  beast::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec) return make_error(Errc::listen, "admin address '" + address + "': " + ec.message());
  tcp::endpoint ep(addr, port);
  impl->listening.acceptor.open(ep.protocol(), ec);
  if (!ec) impl->listening.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->listening.acceptor.bind(ep, ec);
  if (!ec) impl->listening.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(Errc::listen, "admin API on " + address + ":" + std::to_string(port) + ": " + ec.message());
  impl->listening.backoff = common::AcceptBackoff("admin API " + address + ":" +
                                                  std::to_string(impl->listening.acceptor.local_endpoint().port()));
  impl->accept();
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

unsigned short AdminServer::port() const { return impl_->listening.acceptor.local_endpoint().port(); }

void AdminServer::publish() { impl_->publish(); }

std::size_t AdminServer::watchers() const { return impl_->watchers.size(); }

void AdminServer::on_watch(std::function<void()> publish_request) {
  impl_->publish_request = std::move(publish_request);
}

void AdminServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ec;
  impl_->listening.acceptor.close(ec);
  auto watchers = impl_->watchers;
  for (auto& [raw, weak] : watchers) {
    if (auto w = weak.lock()) w->end_stream();
  }
  impl_->events = nullptr;  // connections that end later no longer reach it
  impl_->publish_request = nullptr;
}

}  // namespace accelpool::manager
