// The admin REST API's routes, apart from the HTTP transport (admin_http.cpp): a request in, a response out.
// Internal to the manager; runs on the owner thread.
#pragma once

#include <accelpool/manager/core.hpp>

#include <functional>
#include <string>

namespace accelpool::manager {

class Metrics;

struct ApiRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // path and query, e.g. "/v1/leases?state=queued"
  std::string authorization;  // the Authorization header, "" if absent
  std::string body;
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

class AdminApi {
 public:
  // `openapi` is the text served at /v1/openapi.yaml; `ready` says whether /readyz answers 200; `commit` makes
  // the core's pending changes durable (group commit) and runs before every response is returned.
  AdminApi(PoolCore& core, Metrics& metrics, std::string openapi, std::function<bool()> ready,
           std::function<void()> commit = {});
  ApiResponse handle(const ApiRequest& request);
  // A JSON error response: {"error":{"code":...,"message":...}}.
  static ApiResponse error(int status, const std::string& code, const std::string& message);

 private:
  PoolCore& core_;
  Metrics& metrics_;
  std::string openapi_;
  std::function<bool()> ready_;
  std::function<void()> commit_;
  ApiResponse route(const ApiRequest& request);
};

}  // namespace accelpool::manager
