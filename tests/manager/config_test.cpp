// The daemon's TOML configuration: every key read, bad input named by file, line and key.
#include "test_support.hpp"

#include "config.hpp"

#include <fstream>

using namespace accelpool::manager;
using namespace accelpool::manager::test;

namespace {
accelpool::Result<Config> load_text(const TempDir& dir, const std::string& text) {
  auto p = dir.path / "m.toml";
  std::ofstream(p) << text;
  return load_config(p);
}
// The configuration `text`, which must load.
Config loaded(const TempDir& dir, const std::string& text) {
  auto c = load_text(dir, text);
  INFO((c.is_ok() ? std::string() : c.error().message));
  REQUIRE(c.is_ok());
  return std::move(*c);
}
// The error message loading `text` gives ("" when it loads, which the caller's CHECK then reports).
std::string refusal(const TempDir& dir, const std::string& text) {
  auto c = load_text(dir, text);
  return c.is_ok() ? std::string() : c.error().message;
}
// The error message loading `text` gives; the test stops there when it loads.
std::string required_refusal(const TempDir& dir, const std::string& text) {
  auto c = load_text(dir, text);
  REQUIRE_FALSE(c.is_ok());
  return c.error().message;
}
}  // namespace

TEST_CASE("a full configuration file is read", "[config]") {
  TempDir dir;
  Config c = loaded(dir, R"(
data_dir = "data"
[store]
file = "x.db"
full_sync = true
[guest]
tcp = "127.0.0.1:9000"
unix = ""
[admin]
listen = "127.0.0.1:9001"
[leases]
ttl_s = 12.5
revoke_grace_s = 3
history = 50
[scheduler]
policy = "las+affinity"
[limits]
max_body_bytes = 4096
request_timeout_s = 2
max_connections = 10
[[hosts]]
name = "lab"
backend = "static"
[[hosts.devices]]
kind = "gpu"
model = "a100"
count = 3
attach = "passthrough"
[[tenants]]
name = "t1"
weight = 2.5
max_devices = 4
)");
  CHECK(c.data_dir == dir.path / "data");
  CHECK(c.store_file == "x.db");
  CHECK(c.full_sync);
  CHECK(c.guest_tcp == "127.0.0.1:9000");
  CHECK(c.guest_unix.empty());
  CHECK(c.admin_listen == "127.0.0.1:9001");
  CHECK(c.core.lease_ttl_s == 12.5);
  CHECK(c.core.revoke_grace_s == 3);
  CHECK(c.core.history == 50);
  CHECK(c.core.policy == "las+affinity");
  CHECK(c.max_body_bytes == 4096);
  CHECK(c.max_connections == 10);
  REQUIRE(c.hosts.size() == 1);
  CHECK(c.hosts[0].devices.at(0).count == 3);
  CHECK(c.hosts[0].devices.at(0).passthrough);
  REQUIRE(c.tenants.size() == 1);
  CHECK(c.tenants[0].weight == 2.5);
  CHECK(c.tenants[0].max_devices == 4);
}

TEST_CASE("bad configuration names the file, line and key", "[config]") {
  TempDir dir;
  const std::string unknown = required_refusal(dir, "[leases]\nttl_s = 5\nttl = 7\n");
  CHECK(unknown.find("m.toml:3") != std::string::npos);
  CHECK(unknown.find("'ttl'") != std::string::npos);

  const std::string type = required_refusal(dir, "[leases]\nttl_s = \"long\"\n");
  CHECK(type.find("leases.ttl_s must be a number") != std::string::npos);

  CHECK(required_refusal(dir, "[leases\n").find("m.toml:1") != std::string::npos);

  CHECK(required_refusal(dir, "[limits]\nmax_connections = -1\n").find("non-negative integer") != std::string::npos);

  CHECK_FALSE(load_text(dir, "[[hosts]]\nname = \"h\"\n[[hosts.devices]]\nattach = \"usb\"\n").is_ok());
  CHECK_FALSE(parse_endpoint("localhost").is_ok());
  CHECK_FALSE(parse_endpoint("127.0.0.1:99999").is_ok());
  CHECK(parse_endpoint("127.0.0.1:0")->second == 0);
}

TEST_CASE("the [agents] table: listen addresses, token or token file, heartbeat timeout", "[config][agents]") {
  TempDir dir;
  Config none = loaded(dir, "[leases]\nttl_s = 5\n");
  CHECK(none.agents.listen.empty());
  CHECK(none.agents.heartbeat_timeout_ms == 15000);

  Config c = loaded(dir,
                    "[agents]\nlisten = [\"127.0.0.1:0\", \"unix:/tmp/a.sock\"]\ntoken = \"0123456789abcdef\"\n"
                    "heartbeat_timeout_ms = 700\n");
  CHECK(c.agents.listen == std::vector<std::string>{"127.0.0.1:0", "unix:/tmp/a.sock"});
  CHECK(c.agents.token == "0123456789abcdef");
  CHECK(c.agents.heartbeat_timeout_ms == 700);

  std::ofstream(dir.path / "agent-token") << "from-a-file-0123456789\n";
  Config f = loaded(dir, "[agents]\nlisten = [\"127.0.0.1:7071\"]\ntoken_file = \"agent-token\"\n");
  CHECK(f.agents.token == "from-a-file-0123456789");

  CHECK(required_refusal(dir, "[agents]\nlisten = [\"127.0.0.1:7071\"]\n").find("agents.token") != std::string::npos);
  auto short_token = load_text(dir, "[agents]\nlisten = [\"127.0.0.1:7071\"]\ntoken = \"short\"\n");
  CHECK_FALSE(short_token.is_ok());
  const std::string bad_addr =
      required_refusal(dir, "[agents]\nlisten = [\"nowhere\"]\ntoken = \"0123456789abcdef\"\n");
  CHECK(bad_addr.find("m.toml:2") != std::string::npos);
  CHECK(bad_addr.find("agents.listen") != std::string::npos);
  const std::string not_list =
      required_refusal(dir, "[agents]\nlisten = \"127.0.0.1:7071\"\ntoken = \"0123456789abcdef\"\n");
  CHECK(not_list.find("array") != std::string::npos);
  const std::string missing_file =
      required_refusal(dir, "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken_file = \"nope\"\n");
  CHECK(missing_file.find("cannot read") != std::string::npos);
  const std::string zero = required_refusal(dir, "[agents]\nheartbeat_timeout_ms = 0\n");
  CHECK(zero.find("heartbeat_timeout_ms") != std::string::npos);
  CHECK(required_refusal(dir, "[agents]\nlisten = []\ntokn = \"x\"\n").find("'tokn'") != std::string::npos);
}

TEST_CASE("the [bitstreams] table: registry folder and seed", "[config][bitstreams]") {
  TempDir dir;
  Config none = loaded(dir, "data_dir = \"d\"\n");
  CHECK(none.bitstreams_dir() == dir.path / "d" / "bitstreams");
  CHECK_FALSE(none.bitstreams.seed.has_value());

  Config c = loaded(dir, "[bitstreams]\ndir = \"images\"\nseed = \"\"\n");
  CHECK(c.bitstreams_dir() == dir.path / "images");
  REQUIRE(c.bitstreams.seed.has_value());
  CHECK(c.bitstreams_seed().empty());

  Config seeded = loaded(dir, "[bitstreams]\nseed = \"samples\"\n");
  CHECK(seeded.bitstreams_seed() == dir.path / "samples");

  CHECK_THAT(refusal(dir, "[bitstreams]\nfolder = \"x\"\n"), Catch::Contains("'folder'"));
  CHECK_THAT(refusal(dir, "[bitstreams]\ndir = \"\"\n"), Catch::Contains("bitstreams.dir"));
}

TEST_CASE("a static host's device group may name each slot's shape, one per slot", "[config][hosts][slots]") {
  TempDir dir;
  const std::string host = "[[hosts]]\nname = \"lab\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\n";
  Config c = loaded(dir, host + "slots = 3\nslot_shapes = [\"cu2\", \"\", \"cu1\"]\n");
  REQUIRE(c.hosts.at(0).devices.size() == 1);
  CHECK(c.hosts.at(0).devices[0].slot_shapes == std::vector<std::string>{"cu2", "", "cu1"});
  CHECK(loaded(dir, host + "slots = 2\n").hosts.at(0).devices[0].slot_shapes.empty());  // none declared

  CHECK_THAT(refusal(dir, host + "slots = 3\nslot_shapes = [\"cu2\", \"cu1\"]\n"),
             Catch::Contains("m.toml:7") &&
                 Catch::Contains("hosts.devices.slot_shapes lists 2 shapes for devices of 3 slots"));
  CHECK_THAT(refusal(dir, host + "slot_shapes = [\"cu2\"]\n"),
             Catch::Contains("lists 1 shapes for devices of 0 slots"));
  CHECK_THAT(
      refusal(dir, host + "slots = 1\nslot_shapes = [\"cu 2\"]\n"),
      Catch::Contains("m.toml:7") && Catch::Contains("slot_shapes entries must be \"\" (no shape) or 1-64 characters"));
  CHECK_THAT(refusal(dir, host + "slots = 1\nslot_shapes = [2]\n"), Catch::Contains("slot_shapes entries must be"));
  CHECK_THAT(refusal(dir, host + "slots = 1\nslot_shapes = \"cu2\"\n"),
             Catch::Contains("hosts.devices.slot_shapes must be an array of strings"));
  CHECK_THAT(refusal(dir, host + "slots = 1\nslot_shapes = [\"" + std::string(65, 'x') + "\"]\n"),
             Catch::Contains("slot_shapes entries must be"));
}

TEST_CASE("a host with several backends takes '<backend>.<key>' settings", "[config][hosts]") {
  TempDir dir;
  Config c = loaded(dir,
                    "[[hosts]]\nname = \"local\"\nbackend = \"sim+opencl\"\n"
                    "[hosts.settings]\n\"opencl.subdevices\" = 2\n\"sim.devices\" = \"fpga:m:2\"\n");
  auto b = host_backends(c.hosts.at(0));
  REQUIRE(b.is_ok());
  REQUIRE(b->size() == 2);
  CHECK(b->at(0).name == "sim");
  CHECK(b->at(0).settings == std::map<std::string, std::string>{{"devices", "fpga:m:2"}});
  CHECK(b->at(1).name == "opencl");
  CHECK(b->at(1).settings == std::map<std::string, std::string>{{"subdevices", "2"}});

  CHECK_THAT(refusal(dir, "[[hosts]]\nname = \"h\"\nbackend = \"sim+opencl\"\n[hosts.settings]\nsubdevices = 2\n"),
             Catch::Contains("'subdevices'") && Catch::Contains("m.toml:1"));
  // An array of integers reaches the backend spelt as a list (the opencl backend's slot counts).
  Config counts =
      loaded(dir, "[[hosts]]\nname = \"local\"\nbackend = \"opencl\"\n[hosts.settings]\nslots = [2, 1, 1]\n");
  CHECK(counts.hosts.at(0).settings == std::map<std::string, std::string>{{"slots", "[2, 1, 1]"}});
  CHECK_THAT(refusal(dir, "[[hosts]]\nname = \"h\"\nbackend = \"opencl\"\n[hosts.settings]\nslots = [\"2\"]\n"),
             Catch::Contains("hosts.settings.slots must be a string, number, boolean or array of integers"));
  CHECK_THAT(refusal(dir, "[[hosts]]\nname = \"h\"\nbackend = \"sim+sim\"\n"), Catch::Contains("twice"));
  CHECK_THAT(refusal(dir, "[[hosts]]\nname = \"h\"\nbackend = \"sim+\"\n"), Catch::Contains("backend 'sim+'"));
  CHECK_THAT(refusal(dir, "[[hosts]]\nname = \"h\"\nbackend = \"static+sim\"\n"), Catch::Contains("stands alone"));

  HostConfig one;
  one.backend = "opencl";
  one.settings = {{"subdevices", "2"}};
  auto single = host_backends(one);
  REQUIRE(single.is_ok());
  CHECK(single->at(0).settings.at("subdevices") == "2");
}

TEST_CASE("connection limits: hello budget and deadline, admin header deadline and per-source limit, agents",
          "[config][limits]") {
  TempDir dir;
  Config c = loaded(dir, R"(
[guest]
max_silent = 16
hello_timeout_s = 0.5
[admin]
header_timeout_s = 1.5
max_connections_per_source = 8
[limits]
max_connections = 100
[agents]
listen = ["127.0.0.1:0"]
token = "0123456789abcdef"
max_connections = 10
)");
  CHECK(c.guest_max_silent == 16);
  CHECK(c.guest_hello_timeout_s == 0.5);
  CHECK(c.admin_header_timeout_s == 1.5);
  CHECK(c.admin_max_connections_per_source == 8);
  CHECK(c.agents.max_connections == 10);
  CHECK(c.connection_budget() == 210);  // guests, admin API, agents
  CHECK(default_config().connection_budget() == 8192);

  CHECK(refusal(dir, "[guest]\nmax_silent = 0\n").find("guest.max_silent must be >= 1") != std::string::npos);
  CHECK(refusal(dir, "[guest]\nhello_timeout_s = 0\n").find("guest.hello_timeout_s must be > 0") != std::string::npos);
  CHECK(refusal(dir, "[admin]\nheader_timeout_s = -1\n").find("admin.header_timeout_s must be > 0") !=
        std::string::npos);
  CHECK(
      refusal(dir, "[admin]\nmax_connections_per_source = 0\n").find("admin.max_connections_per_source must be >= 1") !=
      std::string::npos);
  CHECK(refusal(dir, "[agents]\nmax_connections = 0\n").find("agents.max_connections must be >= 1") !=
        std::string::npos);
  for (const char* bad : {"0", "5001"}) {
    CHECK(refusal(dir, std::string("[leases]\nmax_per_guest = ") + bad + "\n")
              .find("leases.max_per_guest must be in [1, 5000]") != std::string::npos);
  }
}

TEST_CASE("the PostgreSQL store and [ha]: a URL, this manager's name, the leader's timeout", "[config][ha]") {
  TempDir dir;
  Config c = loaded(dir,
                    "[store]\nurl = \"postgresql:///pool?host=/run/postgresql\"\n"
                    "[ha]\nname = \"m1\"\nleader_timeout_s = 3\nstandby_poll_s = 0.25\n");
  CHECK(c.store_url == "postgresql:///pool?host=/run/postgresql");
  CHECK(c.ha.name == "m1");
  CHECK(c.ha.leader_timeout_s == 3);
  CHECK(c.ha.standby_poll_s == 0.25);
  CHECK(default_config().store_url.empty());  // SQLite stays the default

  CHECK(
      required_refusal(dir, "[store]\nurl = \"mysql://x\"\n").find("m.toml:2:7: store.url must be a PostgreSQL URL") !=
      std::string::npos);
  CHECK(required_refusal(dir, "[store]\nurl = \"postgresql://h/db\"\nfile = \"x.db\"\n")
            .find("store.file is for the SQLite store; it cannot go with store.url") != std::string::npos);
  CHECK(required_refusal(dir, "[ha]\nname = \"m1\"\n").find("[ha] needs the PostgreSQL store ([store] url)") !=
        std::string::npos);
  CHECK(required_refusal(dir, "[store]\nurl = \"postgresql://h/db\"\n[ha]\nleader_timeout_s = 0\n")
            .find("ha.leader_timeout_s must be > 0") != std::string::npos);
}

TEST_CASE("the [log] table: level and format, bad values named", "[config][log]") {
  TempDir dir;
  Config defaults = loaded(dir, "");
  CHECK(defaults.log.level == accelpool::log::Level::info);
  CHECK(defaults.log.format == accelpool::log::Format::text);
  Config c = loaded(dir, "[log]\nlevel = \"debug\"\nformat = \"json\"\n");
  CHECK(c.log.level == accelpool::log::Level::debug);
  CHECK(c.log.format == accelpool::log::Format::json);
  CHECK_THAT(required_refusal(dir, "[log]\nlevel = \"loud\"\n"),
             Catch::Contains("m.toml:2:") && Catch::Contains("log.level must be"));
  CHECK_THAT(required_refusal(dir, "[log]\nformat = \"xml\"\n"), Catch::Contains("log.format must be"));
  CHECK_THAT(required_refusal(dir, "[log]\nfile = \"x\"\n"), Catch::Contains("unknown key 'file' in [log]"));
  CHECK_THAT(required_refusal(dir, "log = \"debug\"\n"), Catch::Contains("log must be a table"));
}

TEST_CASE("the [metrics] table: token and label bound, bad values named", "[config][metrics]") {
  TempDir dir;
  Config defaults = loaded(dir, "");
  CHECK(defaults.metrics.token.empty());
  CHECK(defaults.metrics.max_label_values == 32);
  Config c = loaded(dir, "[metrics]\ntoken = \"metrics-token-0123456789\"\nmax_label_values = 5\n");
  CHECK(c.metrics.token == "metrics-token-0123456789");
  CHECK(c.metrics.max_label_values == 5);
  auto short_token = required_refusal(dir, "[metrics]\ntoken = \"short-secret\"\n");
  CHECK_THAT(short_token, Catch::Contains("metrics.token must be at least 16 characters"));
  CHECK(short_token.find("short-secret") == std::string::npos);  // an error never repeats a token
  CHECK_THAT(required_refusal(dir, "[metrics]\nmax_label_values = 0\n"), Catch::Contains("metrics.max_label_values"));
  CHECK_THAT(required_refusal(dir, "[metrics]\nmax_label_values = 1001\n"), Catch::Contains("1..1000"));
  CHECK_THAT(required_refusal(dir, "[metrics]\nlabels = 3\n"), Catch::Contains("unknown key 'labels' in [metrics]"));
}
