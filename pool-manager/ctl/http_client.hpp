// A blocking HTTP/1.1 client for accelpoolctl (Boost.Beast, in http_client.cpp only).
#pragma once

#include <accelpool/common/result.hpp>

#include <string>

namespace accelpool::ctl {

struct HttpReply {
  int status = 0;
  std::string body;
};

// Sends one request to `url` ("http://HOST:PORT") + `target`. Errors: "unreachable" (connect or I/O failed,
// with the system's message), "invalid_argument" (a URL that is not http://HOST:PORT).
Result<HttpReply> http_request(const std::string& url, const std::string& method, const std::string& target,
                               const std::string& token, const std::string& body, double timeout_s);

}  // namespace accelpool::ctl
