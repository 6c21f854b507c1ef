#include "guest_server.hpp"

#include "accept_loop.hpp"
#include "config.hpp"

#include <accelpool/common/json_lines.hpp>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

namespace accelpool::manager {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using unix_stream = asio::local::stream_protocol;
using tls_stream = asio::ssl::stream<tcp::socket>;

// A connection as the owner thread sees it: something that can be sent lines.
class GuestConnection {
 public:
  virtual ~GuestConnection() = default;
  // Owner thread. Queues a line; lines queued in one turn of the owner's loop leave in one write.
  virtual void send(std::string line) = 0;
  // Owner thread. Sends a reply that waited for its commit (see GuestServer::take_held).
  virtual void send_held(std::string line) = 0;
  // Owner thread. Ends the session: nothing more is handled; `line` (an error saying why) is sent after the
  // replies already owed, then the connection closes.
  virtual void end_session(std::string line) = 0;
};

namespace {

// A guest whose replies and notifications pile up unwritten (it reads slower than it sends) stops being read while
// more than this waits to be written: pipelined calls slow down rather than fail.
constexpr std::size_t kPauseReadingQueuedBytes = 4 * 1024 * 1024;
// A guest that does not read at all while notifications keep coming is disconnected at this much.
constexpr std::size_t kMaxQueuedBytes = 64 * 1024 * 1024;
// A guest that sends faster than the owner handles its calls stops being read while this much waits.
constexpr std::size_t kMaxBacklogBytes = 1024 * 1024;

// Routes lease events to the connections of the lease's guest. Owner thread only.
class GuestHub final : public CoreListener {
 public:
  void add(const std::string& tenant, const std::string& guest, GuestConnection* c) {
    by_guest_[key(tenant, guest)].insert(c);
  }
  void remove(const std::string& tenant, const std::string& guest, GuestConnection* c) {
    auto it = by_guest_.find(key(tenant, guest));
    if (it == by_guest_.end()) return;
    it->second.erase(c);
    if (it->second.empty()) by_guest_.erase(it);
  }
  void lease_event(const Lease& lease, LeaseEvent event) override {
    auto it = by_guest_.find(key(lease.tenant, lease.guest));
    if (it == by_guest_.end()) return;
    std::string line = GuestProtocol::notification(lease, event);
    for (auto* c : std::set<GuestConnection*>(it->second)) c->send(line);
  }
  // Every session of the tenant authenticated with its old token: they end, told why.
  void tenant_token_changed(const std::string& tenant) override {
    const std::string prefix = tenant + '\n';
    std::set<GuestConnection*> sessions;
    for (auto it = by_guest_.lower_bound(prefix); it != by_guest_.end() && it->first.starts_with(prefix); ++it) {
      sessions.insert(it->second.begin(), it->second.end());
    }
    const std::string line = GuestProtocol::token_rotated_error(tenant);
    for (auto* c : sessions) c->end_session(line);
  }

 private:
  static std::string key(const std::string& t, const std::string& g) { return t + '\n' + g; }
  std::map<std::string, std::set<GuestConnection*>> by_guest_;
};

}  // namespace

struct GuestServer::Impl {
  Impl(asio::io_context& o, GuestProtocol& p, GuestServerOptions opt)
      : owner(o),
        protocol(p),
        options(opt),
        own_net(opt.network_thread ? std::make_unique<asio::io_context>(1) : nullptr),
        net(own_net ? *own_net : o),
        tcp_listener(std::in_place, net.get_executor(), ""),
        unix_listener(std::in_place, net.get_executor(), "") {}  // named by listen_*

  asio::io_context& owner;
  GuestProtocol& protocol;  // owner thread
  GuestServerOptions options;
  std::unique_ptr<asio::io_context> own_net;  // the network thread's, if it has one; reset by stop()
  asio::io_context& net;                      // where the sockets live: own_net, or the owner's
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  std::optional<Listening<tcp>> tcp_listener;
  std::optional<asio::ssl::context> tcp_tls;  // TLS on the TCP listener; none: plain
  std::optional<Listening<unix_stream>> unix_listener;
  std::filesystem::path unix_path;
  std::atomic<std::size_t> connections{0};

  // Socket side: the connections that have not sent a complete line yet (their hello), oldest first, each with
  // what closes it. A connection leaves when its first line arrives (a hello on its way is never evicted; one
  // that sends anything but hello is closed at the hello deadline) or when it closes.
  std::map<std::uint64_t, std::function<void()>> silent;
  std::uint64_t next_seq = 0;

  // Socket side. Whether a new connection may be taken: under both limits it may; over either, closing the
  // oldest silent connection makes room for it (a flood of silent connections then cannot lock real guests
  // out); with none to close it may not.
  bool make_room() {
    if (connections.load() < options.max_connections && silent.size() < options.max_silent) return true;
    if (silent.empty()) return false;
    auto evict = std::move(silent.begin()->second);
    silent.erase(silent.begin());
    evict();
    return true;
  }
  std::atomic<std::size_t> batches_waiting{0};  // posted to the owner by the network thread, not handled yet
  bool stopped = false;                         // owner thread (or after it stopped)

  // Owner thread.
  GuestHub hub;
  HeldReplies held;  // replies waiting for a commit, not taken yet
  std::function<void()> request_commit = [] {};

  // Socket side: the connections, so that stop() can destroy their sockets before the io_context they live on
  // goes (a socket must not outlive its io_context).
  struct Live {
    std::weak_ptr<void> alive;
    std::function<void()> drop_socket;
  };
  std::mutex live_mu;
  std::vector<Live> live;
};

namespace {

// One guest connection. The socket side runs where the sockets live (the network thread, or the owner's
// io_context when there is none), the call side (session, hub registration, what to send) on the owner thread;
// the two talk only by posting to each other. Socket: tcp::socket, tls_stream or unix_stream::socket.
template <typename Socket>
class GuestSessionConn final : public GuestConnection, public std::enable_shared_from_this<GuestSessionConn<Socket>> {
 public:
  GuestSessionConn(Socket socket, std::shared_ptr<GuestServer::Impl> server)
      : keep_(std::move(server)),
        server_(*keep_),
        socket_(std::move(socket)),
        in_(kMaxGuestLine),
        hello_timer_(std::in_place, socket_->get_executor()) {
    ++server_.connections;
  }
  ~GuestSessionConn() override {
    // Normally unregistered on the owner thread already (owner_closed); at shutdown the owner no longer runs.
    if (registered_) server_.hub.remove(session_.tenant, session_.guest, this);
    --server_.connections;
  }

  // --- socket side -------------------------------------------------------------------------------------------

  void start() {
    seq_ = server_.next_seq++;
    server_.silent.emplace(seq_, [weak = this->weak_from_this()] {
      if (auto self = weak.lock()) self->close_net();
    });
    hello_timer_->expires_after(server_.options.hello_timeout);
    hello_timer_->async_wait([weak = this->weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_) return;
      if (!self->handshaken_) return self->close_net();  // TLS: no handshake by the hello deadline
      asio::post(self->server_.owner, [self] { self->hello_deadline(); });
    });
    if constexpr (std::is_same_v<Socket, tls_stream>) {
      // A failed handshake (not TLS, an untrusted client) ends the connection without a word: there is no
      // channel to say it on.
      socket_->async_handshake(asio::ssl::stream_base::server,
                               [self = this->shared_from_this()](boost::system::error_code ec) {
                                 if (self->closed_) return;
                                 if (ec) return self->close_net();
                                 self->handshaken_ = true;
                                 self->read();
                               });
    } else {
      handshaken_ = true;
      read();
    }
  }

  // Destroys the socket and the timer now (stop()): the io_context they belong to is about to go.
  void drop_socket() {
    closed_ = true;
    hello_timer_.reset();
    socket_.reset();
  }

  // --- owner thread ------------------------------------------------------------------------------------------

  void send(std::string line) override {
    if (owner_closed_) return;
    pending_ += line;
    pending_ += '\n';
    schedule_flush();
  }

  void send_held(std::string line) override {
    --held_;
    send(std::move(line));
  }

  void end_session(std::string line) override {
    if (owner_closed_ || owner_closing_) return;
    send(std::move(line));
    close_when_sent();
  }

 private:
  // Reads on, unless a read is in flight, the connection is closing, or reading waits: for the owner to handle
  // the calls already read (paused_; the owner resumes it) or for the replies to be written (write() resumes it).
  void read() {
    if (!socket_ || closed_ || closing_ || reading_ || paused_.load() || queued_bytes_ > kPauseReadingQueuedBytes)
      return;
    reading_ = true;
    socket_->async_read_some(asio::buffer(rbuf_),
                             [self = this->shared_from_this()](boost::system::error_code ec, std::size_t n) {
                               self->reading_ = false;
                               self->on_read(ec, n);
                             });
  }

  void on_read(boost::system::error_code ec, std::size_t n) {
    if (closed_) return;
    if (ec) return close_net();
    in_.append(std::string_view(rbuf_.data(), n));
    std::vector<std::string> lines;
    std::size_t bytes = 0;
    while (auto line = in_.next_line()) {
      bytes += line->size();
      lines.push_back(std::move(*line));
    }
    if (!lines.empty()) {
      server_.silent.erase(seq_);  // it spoke: no longer silent
      backlog_ += bytes;
      ++server_.batches_waiting;
      asio::post(server_.owner, [self = this->shared_from_this(), lines = std::move(lines), bytes] {
        self->handle_lines(lines, bytes);
      });
    }
    if (in_.overflow()) {  // no newline within the limit: the stream cannot be resynchronised
      write_net(GuestProtocol::too_long() + "\n", true);
      return;
    }
    if (backlog_.load() > kMaxBacklogBytes) {
      paused_.store(true);
      // The owner may have drained the backlog between the check and the flag: then resume here.
      if (backlog_.load() > kMaxBacklogBytes / 2 || !paused_.exchange(false)) return;
    }
    read();
  }

  void write_net(std::string bytes, bool close_after) {
    if (closed_) return;
    queued_bytes_ += bytes.size();
    if (queued_bytes_ > kMaxQueuedBytes) return close_net();
    out_ += bytes;
    if (close_after) closing_ = true;
    if (!writing_) write();
  }

  // Writes everything queued in one go: lines that pile up while a write is in flight leave together.
  void write() {
    if (out_.empty()) {
      if (closing_) close_net();
      return;
    }
    batch_.swap(out_);
    out_.clear();
    writing_ = true;
    asio::async_write(*socket_, asio::buffer(batch_),
                      [self = this->shared_from_this()](boost::system::error_code ec, std::size_t) {
                        self->writing_ = false;
                        if (self->closed_) return;
                        if (ec) return self->close_net();
                        self->queued_bytes_ -= self->batch_.size();
                        self->batch_.clear();
                        self->write();
                        self->read();  // if it waited for the replies to leave
                      });
  }

  void close_net() {
    if (closed_) return;
    closed_ = true;
    server_.silent.erase(seq_);
    hello_timer_->cancel();
    boost::system::error_code ignored;
    socket_->lowest_layer().close(ignored);
    asio::post(server_.owner, [self = this->shared_from_this()] { self->owner_closed(); });
  }

  // --- owner thread ------------------------------------------------------------------------------------------

  void handle_lines(const std::vector<std::string>& lines, std::size_t bytes) {
    --server_.batches_waiting;
    // Lease events go out at the commit (group commit), never during a call: a call's reply always leaves
    // before the notifications it caused.
    bool handled = false;
    for (const auto& line : lines) {
      if (owner_closed_ || owner_closing_) break;  // nothing more is handled on a connection being closed
      handled = true;
      std::string before_tenant = session_.tenant, before_guest = session_.guest;
      bool was_auth = session_.authenticated;
      std::string reply = server_.protocol.handle(session_, line);
      if (session_.authenticated && (!was_auth || before_tenant != session_.tenant || before_guest != session_.guest)) {
        if (was_auth) server_.hub.remove(before_tenant, before_guest, this);
        server_.hub.add(session_.tenant, session_.guest, this);
        registered_ = true;
      }
      if (!reply.empty()) {
        ++held_;
        server_.held.emplace_back(this->weak_from_this(), std::move(reply));
      }
      if (session_.close_after_reply) close_when_sent();
    }
    if (handled) server_.request_commit();
    // Resume reading if the network side paused for this backlog.
    if (backlog_.fetch_sub(bytes) - bytes <= kMaxBacklogBytes / 2 && paused_.exchange(false) && !server_.stopped) {
      asio::post(server_.net, [self = this->shared_from_this()] { self->read(); });
    }
  }

  void hello_deadline() {
    if (owner_closed_ || session_.authenticated || session_.relayed) return;
    send(GuestProtocol::timeout_error());
    close_when_sent();
  }

  // The connection closes once every reply it is owed, and what is queued now, is written.
  void close_when_sent() {
    owner_closing_ = true;
    schedule_flush();
  }

  void schedule_flush() {
    if (flush_posted_) return;
    flush_posted_ = true;
    asio::post(server_.owner, [self = this->shared_from_this()] {
      self->flush_posted_ = false;
      self->flush();
    });
  }

  void flush() {
    if (owner_closed_ || server_.stopped) return;
    const bool close = owner_closing_ && held_ == 0;
    if (pending_.empty() && !close) return;
    asio::post(server_.net, [self = this->shared_from_this(), bytes = std::move(pending_), close]() mutable {
      self->write_net(std::move(bytes), close);
    });
    pending_.clear();
  }

  void owner_closed() {
    owner_closed_ = true;
    if (registered_) server_.hub.remove(session_.tenant, session_.guest, this);
    registered_ = false;
  }

  std::shared_ptr<GuestServer::Impl> keep_;
  GuestServer::Impl& server_;

  // Socket side. The socket and the timer are destroyed by drop_socket() when the server stops.
  std::optional<Socket> socket_;
  std::array<char, 16384> rbuf_{};
  common::LineBuffer in_;
  std::string out_;    // queued
  std::string batch_;  // being written
  bool writing_ = false;
  bool closed_ = false;
  bool closing_ = false;          // close once out_ is written
  bool reading_ = false;          // a read is in flight
  bool handshaken_ = false;       // TLS: the handshake is done (plain: from the start)
  std::size_t queued_bytes_ = 0;  // in out_ and batch_
  std::uint64_t seq_ = 0;         // its key in Impl::silent
  std::optional<asio::steady_timer> hello_timer_;

  // Both: bytes of lines posted to the owner and not handled yet, and whether reading waits for them.
  std::atomic<std::size_t> backlog_{0};
  std::atomic<bool> paused_{false};

  // Owner thread.
  GuestSession session_;
  bool registered_ = false;  // in the hub under session_'s tenant and guest
  std::string pending_;      // lines to send, joined
  bool flush_posted_ = false;
  std::size_t held_ = 0;  // replies in Impl::held, not sent yet
  bool owner_closing_ = false;
  bool owner_closed_ = false;
};

// Serves a connection (socket side), remembered in Impl::live.
template <typename Socket>
void serve_connection(Socket socket, const std::shared_ptr<GuestServer::Impl>& keep) {
  auto& server = *keep;
  using Conn = GuestSessionConn<Socket>;
  auto conn = std::make_shared<Conn>(std::move(socket), keep);
  {
    std::lock_guard lock(server.live_mu);
    // Forget connections that are gone, now and then, so the list stays as long as the live ones.
    if (server.live.size() >= 64 && server.live.size() % 64 == 0) {
      std::erase_if(server.live, [](const GuestServer::Impl::Live& l) { return l.alive.expired(); });
    }
    server.live.push_back({conn, [weak = std::weak_ptr<Conn>(conn)] {
                             if (auto c = weak.lock()) c->drop_socket();
                           }});
  }
  conn->start();
}

// Takes an accepted guest connection (socket side), or closes it when there is no room (Impl::make_room).
template <typename Socket>
void take_connection(Socket socket, const std::shared_ptr<GuestServer::Impl>& keep) {
  auto& server = *keep;
  if (!server.make_room()) {
    boost::system::error_code ignored;
    socket.close(ignored);
    return;
  }
  if constexpr (std::is_same_v<Socket, tcp::socket>) {
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // replies are small and latency matters
    if (server.tcp_tls) return serve_connection(tls_stream(std::move(socket), *server.tcp_tls), keep);
  }
  serve_connection(std::move(socket), keep);
}

template <typename Protocol>
void accept_guests(Listening<Protocol>& l, std::shared_ptr<GuestServer::Impl> keep) {
  accept_loop(l, keep, [keep](typename Protocol::socket socket) { take_connection(std::move(socket), keep); });
}

}  // namespace

GuestServer::GuestServer(asio::io_context& owner, GuestProtocol& protocol, GuestServerOptions options)
    : impl_(std::make_shared<Impl>(owner, protocol, options)) {}

GuestServer::~GuestServer() { stop(); }

CoreListener& GuestServer::hub() { return impl_->hub; }

void GuestServer::set_commit_request(std::function<void()> request) { impl_->request_commit = std::move(request); }

std::size_t GuestServer::calls_waiting() const { return impl_->batches_waiting.load(std::memory_order_relaxed); }

HeldReplies GuestServer::take_held() { return std::exchange(impl_->held, {}); }

void GuestServer::send_held(HeldReplies held) {
  for (auto& [weak, line] : held) {
    if (auto c = weak.lock()) c->send_held(std::move(line));
  }
}

Result<std::string> GuestServer::listen_tcp(const std::string& endpoint, common::tls::Context tls) {
  if (tls) {
    SSL_CTX_up_ref(tls.get());  // the asio context takes a reference of its own
    impl_->tcp_tls.emplace(tls.get());
  }
  auto ep = parse_endpoint(endpoint);
  if (!ep) return make_error(Errc::invalid_config, "guest.tcp: " + ep.error().message);
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(ep->first, ec);
  if (ec) return make_error(Errc::invalid_config, "guest.tcp: address '" + ep->first + "': " + ec.message());
  tcp::endpoint bind_to(addr, ep->second);
  auto& a = impl_->tcp_listener->acceptor;
  a.open(bind_to.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(bind_to, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(Errc::invalid_config, "guest.tcp: cannot listen on " + endpoint + ": " + ec.message());
  std::string bound = ep->first + ":" + std::to_string(a.local_endpoint().port());
  impl_->tcp_listener->backoff = common::AcceptBackoff("guest listener tcp " + bound);
  accept_guests(*impl_->tcp_listener, impl_);
  return bound;
}

Result<std::string> GuestServer::listen_unix(const std::filesystem::path& path) {
  std::error_code fec;
  std::filesystem::remove(path, fec);  // a socket file left by a crash
  boost::system::error_code ec;
  impl_->unix_listener->backoff = common::AcceptBackoff("guest listener unix " + path.string());
  auto& a = impl_->unix_listener->acceptor;
  a.open(unix_stream(), ec);
  if (!ec) a.bind(unix_stream::endpoint(path.string()), ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(Errc::invalid_config, "guest.unix: cannot listen on " + path.string() + ": " + ec.message());
  impl_->unix_path = path;
  accept_guests(*impl_->unix_listener, impl_);
  return path.string();
}

void GuestServer::start() {
  auto& impl = *impl_;
  if (!impl.own_net) return;  // the owner's io_context runs the sockets too
  impl.work.emplace(impl.own_net->get_executor());
  impl.thread = std::thread([&impl] { impl.own_net->run(); });
}

void GuestServer::stop() {
  auto& impl = *impl_;
  if (impl.stopped) return;
  impl.stopped = true;
  if (impl.thread.joinable()) {
    impl.work.reset();
    impl.own_net->stop();
    impl.thread.join();
  }
  // Nothing runs on the network io_context now. Stop accepting and destroy every socket and timer: the
  // connections that pending owner handlers still hold must not keep them past the io_context.
  boost::system::error_code ignored;
  impl.tcp_listener->acceptor.close(ignored);
  impl.unix_listener->acceptor.close(ignored);
  std::vector<Impl::Live> live;
  {
    std::lock_guard lock(impl.live_mu);
    live.swap(impl.live);
  }
  for (auto& l : live) l.drop_socket();
  impl.tcp_listener.reset();
  impl.unix_listener.reset();
  impl.own_net.reset();  // destroys the handlers still pending, and with them the connections only they held
  if (!impl.unix_path.empty()) {
    std::error_code fec;
    std::filesystem::remove(impl.unix_path, fec);
  }
}

}  // namespace accelpool::manager
