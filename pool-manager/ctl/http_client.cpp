#include "http_client.hpp"

#include <accelpool/common/tls.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <openssl/ssl.h>

#include <chrono>

namespace accelpool::ctl {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;

namespace {

// Writes `req` and reads the answer on a connected stream (HTTP or HTTPS).
template <typename Stream>
HttpReply round_trip(Stream& stream, const http::request<http::string_body>& req) {
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  return HttpReply{static_cast<int>(res.result_int()), res.body()};
}

}  // namespace

Result<HttpReply> http_request(const std::string& url, const std::string& ca_file, const std::string& method,
                               const std::string& target, const std::string& token, const std::string& body,
                               double timeout_s) {
  const bool https = url.rfind("https://", 0) == 0;
  if (!https && url.rfind("http://", 0) != 0) {
    return make_error(Errc::invalid_argument, "URL '" + url + "' must start with http:// or https://");
  }
  std::string hostport = url.substr(https ? 8 : 7);
  while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  auto colon = hostport.rfind(':');
  if (colon == std::string::npos)
    return make_error(Errc::invalid_argument, "URL '" + url + "' must name a port (http://HOST:PORT)");
  std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, hostport);
  req.set(http::field::user_agent, "accelpoolctl");
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  common::tls::Context tls;
  if (https) {
    common::tls::Files files;
    files.ca = ca_file;
    files.ca_name = "--cacert";
    auto ctx = common::tls::client_context(files);
    if (!ctx) return make_error(Errc::invalid_argument, ctx.error().message);
    tls = *ctx;
  }
  try {
    asio::io_context ioc;
    asio::ip::tcp::resolver resolver(ioc);
    const auto deadline = std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    if (!https) {
      beast::tcp_stream stream(ioc);
      stream.expires_after(deadline);
      stream.connect(resolver.resolve(host, port));
      HttpReply reply = round_trip(stream, req);
      beast::error_code ec;
      stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
      return reply;
    }
    SSL_CTX_up_ref(tls.get());  // the asio context takes a reference of its own
    asio::ssl::context ctx(tls.get());
    beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
    if (auto s = common::tls::expect_host(stream.native_handle(), host); !s) return s.error();
    beast::get_lowest_layer(stream).expires_after(deadline);
    beast::get_lowest_layer(stream).connect(resolver.resolve(host, port));
    try {
      stream.handshake(asio::ssl::stream_base::client);
    } catch (const boost::system::system_error& e) {
      // Most often a certificate this client does not trust, or a server that does not speak TLS.
      return make_error(Errc::unreachable, "TLS handshake with " + hostport + " failed: " + e.code().message() +
                                               (ca_file.empty() ? " (give the manager's CA with --cacert?)" : ""));
    }
    HttpReply reply = round_trip(stream, req);
    beast::error_code ec;
    stream.shutdown(ec);  // close_notify; the server's may not come before it closes
    return reply;
  } catch (const boost::system::system_error& e) {
    return make_error(Errc::unreachable, e.code().message());
  } catch (const std::exception& e) {
    return make_error(Errc::unreachable, e.what());
  }
}

}  // namespace accelpool::ctl
