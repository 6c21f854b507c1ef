#include "standby_server.hpp"

#include "config.hpp"

#include <boost/asio.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

namespace accelpool::manager {

namespace asio = boost::asio;
namespace json = boost::json;

namespace {

constexpr std::size_t kMaxRequestBytes = 64 * 1024;
constexpr auto kRequestTimeout = std::chrono::seconds(5);

enum class Listener { guest, agents, admin };

}  // namespace

struct StandbyServer::Impl : std::enable_shared_from_this<StandbyServer::Impl> {
  Impl(asio::io_context& ioc, StandbyAddresses at, std::string self,
       std::function<ApiResponse(const ApiRequest&)> reads)
      : ioc(ioc), at(std::move(at)), self(std::move(self)), reads(std::move(reads)) {}
  asio::io_context& ioc;
  StandbyAddresses at;
  std::string self;
  std::function<ApiResponse(const ApiRequest&)> reads;
  Leadership leader;
  std::vector<std::unique_ptr<asio::ip::tcp::acceptor>> tcp;
  std::vector<std::unique_ptr<asio::local::stream_protocol::acceptor>> local;
  bool stopped = false;

  // The leader's address for a client of `which`, "" when nobody leads (or it has none there).
  std::string leader_address(Listener which) const {
    if (leader.epoch == 0) return "";
    switch (which) {
      case Listener::guest:
        return leader.leader.guest_tcp.empty() ? "" : (at.guest_tls ? "tls://" : "tcp://") + leader.leader.guest_tcp;
      case Listener::agents:
        return leader.leader.agents;
      case Listener::admin:
        return leader.leader.admin_url;
    }
    return "";
  }

  std::string why(Listener which) const {
    std::string where = leader_address(which);
    std::string text = "this manager (" + self + ") is a standby";
    if (leader.epoch == 0) return text + "; no manager leads yet: try again shortly";
    text += "; manager " + leader.leader.name + " leads (epoch " + std::to_string(leader.epoch) + ")";
    if (where.empty()) return text;
    return text + ", at " + where;
  }

  // The answer to a JSON-lines client's first request `line`.
  std::string rpc_answer(Listener which, const std::string& line) const {
    json::value id = nullptr;
    boost::system::error_code ec;
    auto v = json::parse(line, ec);
    if (!ec && v.is_object()) {
      if (auto* i = v.as_object().if_contains("id")) id = *i;
    }
    json::object data{{"code", to_string(Errc::not_leader)}};
    if (auto where = leader_address(which); !where.empty()) data["leader"] = where;
    json::object err{{"code", rpc_code(Errc::not_leader)}, {"message", why(which)}, {"data", std::move(data)}};
    return json::serialize(json::object{{"jsonrpc", "2.0"}, {"id", id}, {"error", std::move(err)}}) + "\n";
  }

  // The answer to an HTTP request whose head is `head`.
  std::string http_answer(const std::string& head) const {
    ApiRequest in;
    std::istringstream lines(head);
    std::string line, version;
    std::getline(lines, line);
    std::istringstream(line) >> in.method >> in.target >> version;
    while (std::getline(lines, line) && line != "\r") {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      value.erase(value.find_last_not_of(" \t\r") + 1);
      if (name == "authorization")
        in.authorization = value;
      else if (name == "origin")
        in.origin = value;
      else if (name == "host")
        in.host = value;
      else if (name == "if-none-match")
        in.if_none_match = value;
    }
    ApiResponse out;
    if (in.method == "GET" && reads && in.target.substr(0, in.target.find('?')) != "/v1/events") {
      out = reads(in);
    } else {
      std::string where = leader_address(Listener::admin);
      json::value leader_url = nullptr;
      if (!where.empty()) leader_url = where;
      out.status = http_status(Errc::not_leader);
      out.body = json::serialize(json::object{
          {"error", json::object{{"code", to_string(Errc::not_leader)}, {"message", why(Listener::admin)}}},
          {"leader", leader_url}});
    }
    std::string text = "HTTP/1.1 " + std::to_string(out.status) + " " + (out.status < 400 ? "OK" : "Error") +
                       "\r\nServer: accelpool-manager\r\nContent-Type: " + out.content_type +
                       "\r\nX-Content-Type-Options: nosniff\r\n";
    for (const auto& [name, value] : out.headers) text += name + ": " + value + "\r\n";
    if (out.status == 401) text += "WWW-Authenticate: Bearer\r\n";
    return text + "Content-Length: " + std::to_string(out.body.size()) + "\r\nConnection: close\r\n\r\n" + out.body;
  }

  // One connection: reads its first request (a line, or an HTTP head), answers it, closes.
  template <class Socket>
  void serve(Socket socket, Listener which) {
    struct Conn {
      explicit Conn(Socket s, asio::io_context& ioc) : socket(std::move(s)), timer(ioc) {}
      Socket socket;
      asio::steady_timer timer;
      asio::streambuf in{kMaxRequestBytes};
      std::string out;
    };
    auto c = std::make_shared<Conn>(std::move(socket), ioc);
    c->timer.expires_after(kRequestTimeout);
    c->timer.async_wait([c](boost::system::error_code ec) {
      if (!ec) c->socket.close(ec);
    });
    auto self_ptr = shared_from_this();
    auto answer = [self_ptr, c, which](boost::system::error_code ec, std::size_t n) {
      if (ec && n == 0) {
        c->timer.cancel();
        return;
      }
      std::string request(asio::buffers_begin(c->in.data()), asio::buffers_begin(c->in.data()) + static_cast<long>(n));
      c->out = which == Listener::admin ? self_ptr->http_answer(request) : self_ptr->rpc_answer(which, request);
      // Written, the connection ends from this side; what the client still sends (a body) is read and dropped
      // until it closes too (or the request timeout), so that closing does not reset the answer away.
      asio::async_write(c->socket, asio::buffer(c->out), [c](boost::system::error_code ec, std::size_t) {
        boost::system::error_code ignored;
        if (ec) {
          c->timer.cancel();
          c->socket.close(ignored);
          return;
        }
        c->socket.shutdown(Socket::shutdown_send, ignored);
        drain(c);
      });
    };
    asio::async_read_until(c->socket, c->in, which == Listener::admin ? "\r\n\r\n" : "\n", answer);
  }

  template <class Conn>
  static void drain(const std::shared_ptr<Conn>& c) {
    c->in.consume(c->in.size());
    c->socket.async_read_some(c->in.prepare(4096), [c](boost::system::error_code ec, std::size_t) {
      boost::system::error_code ignored;
      if (!ec) return drain(c);
      c->timer.cancel();
      c->socket.close(ignored);
    });
  }

  template <class Acceptor>
  void accept(Acceptor& a, Listener which) {
    a.async_accept([this, self_ptr = shared_from_this(), &a, which](boost::system::error_code ec, auto socket) {
      if (stopped) return;
      if (!ec) serve(std::move(socket), which);
      accept(a, which);
    });
  }

  // Opens `a` on `e` (reusing a TCP address left in TIME_WAIT) and listens. Returns the error, if any.
  template <class Acceptor, class Endpoint>
  static boost::system::error_code bind_and_listen(Acceptor& a, const Endpoint& e) {
    boost::system::error_code ec;
    a.open(e.protocol(), ec);
    if (!ec && e.protocol().family() != AF_UNIX) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(e, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    return ec;
  }

  Status listen_tcp(const std::string& address, Listener which) {
    auto ep = parse_endpoint(address);
    if (!ep) return make_error(Errc::listen, address + ": " + ep.error().message);
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(ep->first, ec);
    if (ec) return make_error(Errc::listen, address + ": " + ec.message());
    auto a = std::make_unique<asio::ip::tcp::acceptor>(ioc);
    if (auto failed = bind_and_listen(*a, asio::ip::tcp::endpoint(addr, ep->second)))
      return make_error(Errc::listen, "standby: cannot listen on " + address + ": " + failed.message());
    tcp.push_back(std::move(a));
    accept(*tcp.back(), which);
    return Status::ok();
  }

  Status listen_unix(const std::string& path, Listener which) {
    std::error_code fec;
    std::filesystem::remove(path, fec);  // a socket file left by a crash
    auto a = std::make_unique<asio::local::stream_protocol::acceptor>(ioc);
    if (auto failed = bind_and_listen(*a, asio::local::stream_protocol::endpoint(path)))
      return make_error(Errc::listen, "standby: cannot listen on unix:" + path + ": " + failed.message());
    local.push_back(std::move(a));
    accept(*local.back(), which);
    return Status::ok();
  }

  void stop() {
    stopped = true;
    boost::system::error_code ec;
    for (auto& a : tcp) a->close(ec);
    for (auto& a : local) {
      auto path = a->local_endpoint(ec).path();
      a->close(ec);
      std::error_code fec;
      if (!path.empty()) std::filesystem::remove(path, fec);
    }
  }
};

Result<std::unique_ptr<StandbyServer>> StandbyServer::start(asio::io_context& ioc, const StandbyAddresses& at,
                                                            std::string self_name,
                                                            std::function<ApiResponse(const ApiRequest&)> reads) {
  auto impl = std::make_shared<Impl>(ioc, at, std::move(self_name), std::move(reads));
  auto all = [&]() -> Status {
    if (!at.guest_tcp.empty())
      if (auto s = impl->listen_tcp(at.guest_tcp, Listener::guest); !s) return s;
    if (!at.guest_unix.empty())
      if (auto s = impl->listen_unix(at.guest_unix, Listener::guest); !s) return s;
    if (!at.agents.empty()) {
      if (at.agents.rfind("unix:", 0) == 0) {
        if (auto s = impl->listen_unix(at.agents.substr(5), Listener::agents); !s) return s;
      } else if (auto s = impl->listen_tcp(at.agents, Listener::agents); !s) {
        return s;
      }
    }
    if (!at.admin.empty())
      if (auto s = impl->listen_tcp(at.admin, Listener::admin); !s) return s;
    return Status::ok();
  };
  if (auto s = all(); !s) {
    impl->stop();
    return s.error();
  }
  return std::unique_ptr<StandbyServer>(new StandbyServer(std::move(impl)));
}

StandbyServer::StandbyServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

StandbyServer::~StandbyServer() { impl_->stop(); }

void StandbyServer::set_leader(const Leadership& view) { impl_->leader = view; }

}  // namespace accelpool::manager
