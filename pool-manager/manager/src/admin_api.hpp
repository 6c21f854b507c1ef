// The admin REST API's routes, apart from the HTTP transport (admin_http.cpp): a request in, a response out.
// Internal to the manager; runs on the owner thread.
#pragma once

#include <accelpool/manager/core.hpp>
#include <accelpool/manager/host_driver.hpp>
#include <accelpool/manager/store.hpp>

#include "event_stream.hpp"

#include <boost/json/object.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace accelpool::manager {

class Metrics;
class FieldReader;

struct ApiRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // path and query, e.g. "/v1/leases?state=queued"
  std::string authorization;  // the Authorization header, "" if absent
  std::string body;
  std::string origin = {};         // the Origin header, "" if absent
  std::string host = {};           // the Host header, "" if absent
  std::string if_none_match = {};  // the If-None-Match header, "" if absent
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers = {};  // more response headers (the dashboard's)
};

class AdminApi {
 public:
  // `openapi` is the text served at /v1/openapi.yaml; `ready` says whether /readyz answers 200; `commit` makes
  // the core's pending changes durable (group commit) and runs before every response is returned.
  AdminApi(PoolCore& core, Metrics& metrics, std::string openapi, std::function<bool()> ready,
           std::function<void()> commit = {});
  // Answers `request` on the calling thread (the owner thread), with everything done there (tests, fuzzing).
  ApiResponse handle(const ApiRequest& request);
  // Answers `request`: `respond` runs with the response, at once, or, for a bitstream upload or an image read
  // (GET /v1/images/{sha256}) when a catalog and a poster are set, later on the owner thread through the poster,
  // once the catalog's worker has parsed, decoded, written and verified the upload or read the image (the owner
  // thread does none of that file work; `request.body` is moved there).
  void handle(ApiRequest request, std::function<void(ApiResponse)> respond);
  // Where the worker posts an upload's response (the owner thread's queue).
  void set_poster(Poster post) { post_ = std::move(post); }
  // The manager's bitstream registry, for the /v1/bitstreams routes (list, get, register, delete). Without one,
  // the list shows only the names devices hold or leases ask for, and register/delete answer 404.
  void set_catalog(std::shared_ptr<ImageCatalog> catalog) { catalog_ = std::move(catalog); }
  // The host agents' token: it may read images by sha256 (GET /v1/images/{sha256}[/manifest]) and nothing else.
  void set_agent_token(std::string token) { agent_token_ = std::move(token); }
  // The token GET /metrics needs ([metrics] token): with one, a request without it or an admin token gets 401;
  // "" (the default): no token needed.
  void set_metrics_token(std::string token) { metrics_token_ = std::move(token); }
  // Who may watch GET /v1/events (or page GET /v1/queue) with this request's bearer token: an admin, or the tenant
  // the token belongs to. Errors: an error response (401 missing or wrong token).
  std::variant<Viewer, ApiResponse> stream_viewer(const ApiRequest& request) const;
  // Who leads the managers of a shared (PostgreSQL) store, for GET /v1/leadership (docs/ha.md). Without one the
  // manager is alone on its SQLite store and says so.
  void set_leadership(std::function<Result<Leadership>()> leadership) { leadership_ = std::move(leadership); }
  // A JSON error response: {"error":{"code":...,"message":...}}, with the HTTP status of `code` (errors.hpp).
  static ApiResponse error(Errc code, const std::string& message);

 private:
  PoolCore& core_;
  Metrics& metrics_;
  std::string openapi_;
  std::function<bool()> ready_;
  std::function<void()> commit_;
  std::shared_ptr<ImageCatalog> catalog_;
  std::string agent_token_;
  std::string metrics_token_;
  std::function<Result<Leadership>()> leadership_;
  Poster post_;
  // While handle(request, respond) routes: its request and responder, which an upload takes to answer later.
  ApiRequest* deferrable_ = nullptr;
  std::function<void(ApiResponse)>* respond_later_ = nullptr;
  // POST /v1/bitstreams, and GET /v1/images/{sha256} (the bytes). With a deferrable request, queued on the
  // catalog's worker: returns status 0 (answer pending). Else done here.
  ApiResponse upload(const ApiRequest& request);
  ApiResponse image(const ApiRequest& request, const std::vector<std::string>& segments);
  ApiResponse route(const ApiRequest& request);
  // GET /v1/queue: a page of the caller's queue in the policy's order (an admin's: the whole queue; a tenant's: its
  // own entries), each entry with its position in the whole queue. `query`: limit, cursor (an index into the
  // caller's queue). Errors: 401 (token), 400 (a parameter or a body), 405.
  ApiResponse queue(const ApiRequest& request, const std::map<std::string, std::string>& query);
  ApiResponse admin_tokens(const ApiRequest& request, const std::vector<std::string>& segments, FieldReader& in);
  ApiResponse bitstreams(const ApiRequest& request, const std::vector<std::string>& segments);
};

}  // namespace accelpool::manager
