// GET /metrics of the real manager, read with the official Prometheus client's parser (tests/manager/
// parse_metrics.py): wait and JCT histograms per tenant and bitstream, with a bounded number of label values.
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include "skip.hpp"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace accelpool::manager::itest;

namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The samples of an exposition text, as the Prometheus client's parser reads them; the test fails when it does not
// parse.
std::vector<Sample> parse_exposition(const std::filesystem::path& dir, const std::string& text) {
  const auto file = dir / "metrics.txt";
  std::ofstream(file) << text;
  auto [rc, out] = run_command(std::string(ACCELPOOL_DEBIAN_PYTHON) + " " + ACCELPOOL_PARSE_METRICS + " < " +
                               file.string() + " 2>&1");
  INFO(out);
  REQUIRE(rc == 0);
  std::vector<Sample> samples;
  const json::value parsed = json::parse(out);
  for (const auto& v : parsed.as_array()) {
    const auto& o = v.as_object();
    Sample s{std::string(o.at("name").as_string()), {}, o.at("value").to_number<double>()};
    for (const auto& [k, l] : o.at("labels").as_object()) s.labels[std::string(k)] = std::string(l.as_string());
    samples.push_back(std::move(s));
  }
  return samples;
}

// Sample `name` with exactly `labels`, or nullopt.
std::optional<double> value_of(const std::vector<Sample>& samples, const std::string& name,
                               const std::map<std::string, std::string>& labels) {
  for (const auto& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

// Every series of histogram `family`: its buckets never decrease with `le`, its +Inf bucket equals its count.
// Returns the label sets (without `le`) of its series.
std::set<std::map<std::string, std::string>> check_histogram(const std::vector<Sample>& samples,
                                                             const std::string& family) {
  std::set<std::map<std::string, std::string>> series;
  for (const auto& s : samples) {
    if (s.name == family + "_count") series.insert(s.labels);
  }
  for (const auto& labels : series) {
    double last = 0;
    std::size_t buckets = 0;
    for (const auto& s : samples) {
      if (s.name != family + "_bucket") continue;
      auto without_le = s.labels;
      without_le.erase("le");
      if (without_le != labels) continue;
      CHECK(s.value >= last);
      last = s.value;
      ++buckets;
    }
    CHECK(buckets > 1);
    CHECK(value_of(samples, family + "_count", labels) == last);
    CHECK(value_of(samples, family + "_sum", labels).has_value());
  }
  return series;
}

std::string metrics_config(const std::string& metrics_table) {
  return "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
         "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\ncount = 2\n"
         "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n[[tenants]]\nname = \"c\"\n" +
         metrics_table;
}

}  // namespace

TEST_CASE("wait and JCT histograms are labelled by tenant and bitstream, the first N values of each, then 'other'",
          "[integration][metrics]") {
  ScratchDaemon m("apm-metrics-", metrics_config("[metrics]\nmax_label_values = 2\n"));
  m.daemon.start();
  const int port = m.daemon.endpoints().admin_port;
  // One lease after the other, so the order in which label values are first seen is known: (a, vadd), (b, conv),
  // then (c, any image) and (a, aes), whose tenant or bitstream came third: "other".
  const std::vector<std::tuple<std::string, std::string, std::string>> leases = {
      {"a", "vadd", "vm-a"}, {"b", "conv", "vm-b"}, {"c", "", "vm-c"}, {"a", "aes", "vm-a2"}};
  for (const auto& [tenant, bitstream, vm] : leases) {
    auto g = GuestClient::tcp(m.daemon.endpoints().guest_port);
    REQUIRE(g.hello(m.daemon.token("guest token for tenant " + tenant), vm).contains("result"));
    json::object params{{"kind", "fpga"}};
    if (!bitstream.empty()) params["bitstream"] = bitstream;
    auto acquired = g.call("acquire", params);
    REQUIRE(lease_state(acquired) == "granted");
    REQUIRE(lease_state(g.call("release", {{"lease", lease_id(acquired)}})) == "released");
  }
  auto scraped = http(port, "GET", "/metrics", "");
  REQUIRE(scraped.status == 200);
  auto samples = parse_exposition(m.dir, scraped.body);

  using Labels = std::map<std::string, std::string>;
  const std::set<Labels> expected = {{{"tenant", "a"}, {"bitstream", "vadd"}},
                                     {{"tenant", "b"}, {"bitstream", "conv"}},
                                     {{"tenant", "other"}, {"bitstream", "other"}},
                                     {{"tenant", "a"}, {"bitstream", "other"}}};
  for (const std::string family : {"accelpool_wait_seconds", "accelpool_jct_seconds"}) {
    INFO(family);
    CHECK(check_histogram(samples, family) == expected);
    for (const auto& labels : expected) CHECK(value_of(samples, family + "_count", labels) == 1);
  }
  CHECK(value_of(samples, "accelpool_grants_total", {}) == 4);
  // Every grant and release was durable before its reply: the store's transactions were counted, each by the thread
  // that wrote it (quick SQLite ones on the owner thread; the first is always written there).
  auto commit_series = check_histogram(samples, "accelpool_store_commit_seconds");
  REQUIRE(commit_series.count({{"written_on", "owner"}}) == 1);
  double commits = 0;
  for (const auto& labels : commit_series)
    commits += *value_of(samples, "accelpool_store_commit_seconds_count", labels);
  CHECK(commits >= 8);  // at least an acquire and a release each, for four leases
}

TEST_CASE("with [metrics] token, GET /metrics needs that token or an admin token", "[integration][metrics][auth]") {
  const std::string metrics_token = "metrics-token-0123456789abcdef";
  ScratchDaemon m("apm-metrics-token-", metrics_config("[metrics]\ntoken = \"" + metrics_token + "\"\n"));
  m.daemon.start();
  const int port = m.daemon.endpoints().admin_port;
  auto none = http(port, "GET", "/metrics", "");
  CHECK(none.status == 401);
  CHECK_THAT(none.body, Catch::Contains("[metrics] token"));
  CHECK(http(port, "GET", "/metrics", metrics_token + "x").status == 401);
  CHECK(http(port, "GET", "/metrics", m.daemon.token("guest token for tenant a")).status == 401);
  auto with_token = http(port, "GET", "/metrics", metrics_token);
  CHECK(with_token.status == 200);
  CHECK_FALSE(parse_exposition(m.dir, with_token.body).empty());
  CHECK(http(port, "GET", "/metrics", m.daemon.token("admin token")).status == 200);
  // The metrics token opens nothing else.
  CHECK(http(port, "GET", "/v1/leases", metrics_token).status == 401);
  // Probes stay open.
  CHECK(http(port, "GET", "/healthz", "").status == 200);
}

TEST_CASE("without [metrics] token, GET /metrics is open", "[integration][metrics][auth]") {
  ScratchDaemon m("apm-metrics-open-", metrics_config(""));
  m.daemon.start();
  CHECK(http(m.daemon.endpoints().admin_port, "GET", "/metrics", "").status == 200);
}
