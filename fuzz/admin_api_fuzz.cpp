// The admin API's routing (docs/api/openapi.yaml): AdminApi::handle on requests as admin_http.cpp hands them
// over (method, target, Authorization header, body), against a fresh pool with a bitstream registry.
//
// Input: requests separated by a line "%%". In each, the first line is "METHOD TARGET", the second the
// Authorization header's value, the rest the body. $TOKEN / $ADMIN / $AGENT stand for the pool's tokens.
#include "pool_fixture.hpp"

#include <admin_api.hpp>
#include <metrics.hpp>

#include <cstddef>
#include <cstdint>

namespace {

// Splits off the text up to `sep` (or all of it) and removes it with its separator from `text`.
std::string_view take_until(std::string_view& text, std::string_view sep) {
  auto at = text.find(sep);
  std::string_view head = text.substr(0, at);
  text.remove_prefix(at == std::string_view::npos ? text.size() : at + sep.size());
  return head;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool;
  fuzz::Pool pool;
  manager::Metrics metrics(*pool.core);
  manager::AdminApi api(*pool.core, metrics, "openapi: 3.0.3\n", [] { return true; });
  api.set_catalog(pool.catalog);
  api.set_agent_token(std::string(fuzz::kAgentToken));
  const std::string input = pool.with_tokens(std::string_view(reinterpret_cast<const char*>(data), size));
  std::string_view rest = input;
  while (!rest.empty()) {
    std::string_view request = take_until(rest, "\n%%\n");
    manager::ApiRequest req;
    std::string_view first = take_until(request, "\n");
    req.method = std::string(take_until(first, " "));
    req.target = std::string(first);
    req.authorization = std::string(take_until(request, "\n"));
    req.body = std::string(request);
    (void)api.handle(req);
    pool.drain();
  }
  pool.clock.advance(3600);
  pool.drain();
  (void)metrics.scrape();
  return 0;
}
