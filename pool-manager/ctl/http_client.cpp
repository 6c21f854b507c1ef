#include "http_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>

namespace accelpool::ctl {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;

Result<HttpReply> http_request(const std::string& url, const std::string& method, const std::string& target,
                               const std::string& token, const std::string& body, double timeout_s) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return make_error("invalid_argument", "URL '" + url + "' must start with http://");
  std::string hostport = url.substr(scheme.size());
  while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  auto colon = hostport.rfind(':');
  if (colon == std::string::npos) return make_error("invalid_argument", "URL '" + url + "' must name a port (http://HOST:PORT)");
  std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
  try {
    asio::io_context ioc;
    asio::ip::tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::milliseconds(static_cast<long>(timeout_s * 1000)));
    stream.connect(resolver.resolve(host, port));
    http::request<http::string_body> req(http::string_to_verb(method), target, 11);
    req.set(http::field::host, host);
    req.set(http::field::user_agent, "accelpoolctl");
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    beast::error_code ec;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    return HttpReply{static_cast<int>(res.result_int()), res.body()};
  } catch (const boost::system::system_error& e) {
    return make_error("unreachable", e.code().message());
  } catch (const std::exception& e) {
    return make_error("unreachable", e.what());
  }
}

}  // namespace accelpool::ctl
