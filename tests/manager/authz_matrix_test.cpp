// The admin API's authorization matrix: every operation of the OpenAPI document the daemon serves, called with
// every kind of credential, against the real daemon on loopback.
#include "test_client.hpp"

#include "../support/scratch_dir.hpp"

#include <catch2/catch.hpp>

#include <signal.h>

#include <map>
#include <regex>
#include <sstream>

using namespace accelpool::manager::itest;

namespace {

const std::string kAgentToken = "matrix-agent-token-0123456789";

struct Operation {
  std::string method;      // GET, POST, ...
  std::string path;        // /v1/leases/{id}
  bool is_public = false;  // `security: []`
};

// The operations of an OpenAPI document laid out like docs/api/openapi.yaml (paths at two spaces, methods at
// four, an operation's own `security: []` at six).
std::vector<Operation> operations(const std::string& yaml) {
  std::vector<Operation> out;
  std::istringstream in(yaml);
  bool in_paths = false;
  std::string path;
  const std::regex path_re(R"(^  (/\S*):\s*$)"), method_re(R"(^    (get|put|post|delete|patch):\s*$)");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (line == "paths:") {
      in_paths = true;
    } else if (in_paths && !line.empty() && line[0] != ' ') {
      in_paths = false;
    } else if (in_paths && std::regex_match(line, m, path_re)) {
      path = m[1];
    } else if (in_paths && std::regex_match(line, m, method_re)) {
      std::string method = m[1];
      for (auto& c : method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      out.push_back({method, path, false});
    } else if (in_paths && !out.empty() && line.rfind("      security: []", 0) == 0) {
      out.back().is_public = true;
    }
  }
  return out;
}

// A concrete target for a templated path.
std::string concrete(std::string path) {
  static const std::map<std::string, std::string> values = {{"{host}", "local"},
                                                            {"{local_id}", "fpga0"},
                                                            {"{id}", "1"},
                                                            {"{bitstream}", "vadd"},
                                                            {"{version}", "1.0"},
                                                            {"{name}", "a"},
                                                            {"{sha256}", std::string(64, '0')},
                                                            {"{file}", "app.js"}};
  for (const auto& [k, v] : values) {
    for (auto p = path.find(k); p != std::string::npos; p = path.find(k)) path.replace(p, k.size(), v);
  }
  return path;
}

}  // namespace

TEST_CASE("every admin API operation answers each credential as the authorization matrix says",
          "[integration][authz]") {
  const accelpool::testing::ScratchDir scratch("authz");
  const auto& dir = scratch.path();
  DaemonProcess d(
      dir,
      "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
      "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"" +
          kAgentToken +
          "\"\n"
          "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\ncount = 2\n"
          "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n");
  d.start();
  const int port = d.endpoints().admin_port;
  const std::string admin = d.token("admin token");
  const std::string tenant_b = d.token("guest token for tenant b");
  // A token that was a tenant's until it was rotated.
  const std::string rotated = d.token("guest token for tenant a");
  REQUIRE(http(port, "POST", "/v1/tenants/a/rotate-token", admin).status == 200);

  auto doc = http(port, "GET", "/v1/openapi.yaml", "");
  REQUIRE(doc.status == 200);
  const auto ops = operations(doc.body);
  REQUIRE(ops.size() >= 37);  // the document lists every operation; a parse that finds few is a broken test

  enum class Outcome { allowed, unauthorized, forbidden };
  struct Credential {
    std::string name, token;
  };
  const std::vector<Credential> others = {{"none", ""},
                                          {"garbage", "not-a-token"},
                                          {"tenant token", tenant_b},
                                          {"rotated tenant token", rotated},
                                          {"agent token", kAgentToken}};
  // What each credential may do: public operations are open to all; images by sha256 take the agent token or
  // the admin token; the dashboard's event stream and the queue take the admin token or a tenant's (its own view);
  // everything else under /v1 takes the admin token only. A valid tenant token is told it is the wrong kind of
  // token there.
  auto expected = [](const Operation& op, const std::string& credential) {
    if (op.is_public) return Outcome::allowed;
    const bool images = op.path.rfind("/v1/images/", 0) == 0;
    if (credential == "admin token") return Outcome::allowed;
    if (credential == "agent token" && images) return Outcome::allowed;
    if (credential == "tenant token" && (op.path == "/v1/events" || op.path == "/v1/queue")) return Outcome::allowed;
    if (credential == "tenant token") return Outcome::forbidden;
    return Outcome::unauthorized;
  };
  auto outcome = [](int status) {
    return status == 401 ? Outcome::unauthorized : status == 403 ? Outcome::forbidden : Outcome::allowed;
  };
  std::size_t calls = 0;
  auto check = [&](const Operation& op, const Credential& c) {
    auto r = http(port, op.method, concrete(op.path), c.token, op.method == "GET" ? "" : "{}");
    INFO(op.method << " " << op.path << " with " << c.name << " -> " << r.status << " " << r.body);
    CHECK(r.status != 0);  // answered
    CHECK(r.status < 500);
    CHECK(outcome(r.status) == expected(op, c.name));
    ++calls;
  };
  for (const auto& op : ops) {
    for (const auto& c : others) check(op, c);
  }
  // The admin token last: its calls change the pool (revoke, delete, rotate...).
  for (const auto& op : ops) check(op, {"admin token", admin});
  CHECK(calls == ops.size() * (others.size() + 1));
  // The daemon served the whole matrix and still does.
  CHECK(http(port, "GET", "/healthz", "").status == 200);
  d.stop(SIGKILL);
}
