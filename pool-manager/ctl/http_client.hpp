// A blocking HTTP/1.1 client for accelpoolctl (Boost.Beast, in http_client.cpp only).
#pragma once

#include <accelpool/common/result.hpp>

#include <string>

namespace accelpool::ctl {

struct HttpReply {
  int status = 0;
  std::string body;
};

// Sends one request to `url` ("http://HOST:PORT" or "https://HOST:PORT") + `target`. HTTPS verifies the server's
// certificate against the PEM CA file `ca_file` (the system's CAs when "") and its host name against the URL's.
// Errors: "unreachable" (connect, TLS handshake or I/O failed, with the reason), "invalid_argument" (a URL that
// is not http(s)://HOST:PORT, an unreadable CA file).
Result<HttpReply> http_request(const std::string& url, const std::string& ca_file, const std::string& method,
                               const std::string& target, const std::string& token, const std::string& body,
                               double timeout_s);

}  // namespace accelpool::ctl
