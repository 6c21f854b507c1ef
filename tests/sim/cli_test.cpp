// Runs the real accelpool-sim binary.
#include <catch2/catch.hpp>

#include "run_command.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

using Output = accelpool::testing::CommandOutput;

Output run_sim(const std::string& args) {
  return accelpool::testing::run_command(std::string(ACCELPOOL_SIM_BIN) + " " + args + " 2>&1");
}

// Runs the CLI with `args` and checks that it exits 1 with `message` in its output.
void check_rejected(const std::string& args, const std::string& message) {
  INFO("accelpool-sim " << args);
  const auto r = run_sim(args);
  CHECK(r.code == 1);
  CHECK(r.text.find(message) != std::string::npos);
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("accelpool-sim-test-" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace

TEST_CASE("cli: same seed gives byte-identical JSON", "[sim][cli]") {
  TempDir dir;
  const std::string args =
      "--synthetic 3000 --devices 16 --load 0.9 --gangs 1:0.8,2:0.15,4:0.05 --bitstreams 4 --reconfig-s 5 "
      "--runtime-dist lognormal --estimates noisy:0.5 --policy fifo,sjf+affinity,las:600,djsf+pack --quiet "
      "--deterministic";
  auto a = run_sim(args + " --seed 7 --json " + dir.file("a.json") + " --csv " + dir.file("a.csv"));
  INFO(a.text);
  REQUIRE(a.code == 0);
  auto b = run_sim(args + " --seed 7 --json " + dir.file("b.json") + " --csv " + dir.file("b.csv"));
  REQUIRE(b.code == 0);
  const std::string ja = slurp(dir.file("a.json"));
  CHECK(ja.size() > 1000);
  CHECK(ja == slurp(dir.file("b.json")));
  CHECK(slurp(dir.file("a.csv")) == slurp(dir.file("b.csv")));
  CHECK(ja.find("\"wall_s\": 0.0") != std::string::npos);
  for (const char* key : {"policy", "jobs", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "max_jct_s",
                          "avg_wait_s", "p99_wait_s", "avg_slowdown", "p99_slowdown", "utilization", "reconfigurations",
                          "preemptions", "makespan_s", "lower_bound_avg_jct_s", "wall_s", "events"}) {
    CHECK(ja.find("\"" + std::string(key) + "\":") != std::string::npos);
  }
  auto c = run_sim(args + " --seed 8 --json " + dir.file("c.json"));
  REQUIRE(c.code == 0);
  CHECK(slurp(dir.file("c.json")) != ja);
}

TEST_CASE("cli: table, CSV and plots", "[sim][cli]") {
  TempDir dir;
  auto r = run_sim("--synthetic 500 --devices 8 --load 0.8 --policy fifo,sjf --quiet --csv " + dir.file("jobs.csv") +
                   " --plot " + dir.file("plots"));
  INFO(r.text);
  REQUIRE(r.code == 0);
  CHECK(r.text.find("lower bound on avg JCT") != std::string::npos);
  CHECK(r.text.find("fifo+first-fit") != std::string::npos);
  CHECK(r.text.find("/bound") != std::string::npos);
  const std::string csv = slurp(dir.file("jobs.csv"));
  std::size_t lines = 0;
  for (char ch : csv) lines += ch == '\n';
  CHECK(lines == 1 + 2 * 500);
  CHECK(csv.rfind("policy,id,arrival_s,runtime_s,devices,", 0) == 0);
  for (const char* svg : {"jct_cdf.svg", "queue.svg"}) {
    const std::string s = slurp(dir.path / "plots" / svg);
    CHECK(s.rfind("<svg", 0) == 0);
    CHECK(s.find("<polyline") != std::string::npos);
    CHECK(s.find("sjf+first-fit") != std::string::npos);
  }
}

TEST_CASE("cli: bad input exits non-zero with a clear message and writes nothing", "[sim][cli]") {
  TempDir dir;
  {
    std::ofstream t(dir.file("bad.csv"));
    t << "arrival_s,runtime_s\n0,10\n5,abc\n";
  }
  auto r = run_sim("--trace " + dir.file("bad.csv") + " --devices 2 --json " + dir.file("out.json"));
  CHECK(r.code == 1);
  CHECK(r.text.find(dir.file("bad.csv") + ":3:2: runtime_s: expected a number >= 0, got \"abc\"") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("out.json")));

  r = run_sim("--synthetic 10 --devices 2 --no-such-flag");
  CHECK(r.code != 0);
  CHECK(r.text.find("no-such-flag") != std::string::npos);

  check_rejected("--synthetic 10", "--devices N or --pool FILE");
  check_rejected("--devices 2", "--trace FILE or --synthetic N");
  check_rejected("--synthetic 10 --devices 2 --policy fifo,bogus", "--policy \"bogus\"");
  check_rejected("--synthetic 10 --devices 2 --gangs 4:1", "asks for 4 fpga devices but only 2");

  {
    std::ofstream p(dir.file("pool.json"));
    p << "{\"hosts\": [{\"devices\": [{\"count\": -3}]}]}";
  }
  check_rejected("--synthetic 10 --pool " + dir.file("pool.json"),
                 dir.file("pool.json") + ": hosts[0].devices[0].count");
  check_rejected("--synthetic 10 --devices 2 --estimates magic",
                 "estimates: expected trace, oracle, none or noisy:SIGMA");
  // Not an alias of none any more: refused with the reason, so no run reads it as another experiment.
  check_rejected("--synthetic 10 --devices 2 --estimates learned",
                 "estimates: \"learned\" is not a mode (the scheduler learns from finished jobs in every mode)");

  r = run_sim("--trace x.csv --synthetic 10 --devices 2");
  CHECK(r.code != 0);
}

TEST_CASE("cli: the Philly sample replays at a given load", "[sim][cli]") {
  TempDir dir;
  // The first 2000 lines of the bundled trace.
  std::ifstream in(std::string(ACCELPOOL_SIM_TRACES) + "/philly.csv");
  REQUIRE(in);
  std::ofstream out(dir.file("philly2k.csv"));
  std::string line;
  for (int i = 0; i < 2001 && std::getline(in, line); ++i) out << line << '\n';
  out.close();
  auto r = run_sim("--trace " + dir.file("philly2k.csv") +
                   " --format philly --devices 128 --load 0.85 --policy fifo,las --quiet --deterministic --json " +
                   dir.file("p.json"));
  INFO(r.text);
  REQUIRE(r.code == 0);
  const std::string j = slurp(dir.file("p.json"));
  CHECK(j.find("\"jobs\": 2000") != std::string::npos);
  CHECK(j.find("\"offered_load\": 0.85") != std::string::npos);
}

TEST_CASE("cli: slots, partial images and the hold rule", "[sim][cli][slots]") {
  // Every image partial, 4 slots per device: the run succeeds and programs slots (partial images).
  auto r = run_sim(
      "--synthetic 300 --devices 4 --slots 4 --slot-share 0.5 --partial-reconfig-s 0.5 "
      "--partial-fraction 1 --demand 0.1:0.4 --bitstreams 4 --load 2 --policy fifo+affinity+hold=30 "
      "--self-check --quiet");
  INFO(r.text);
  CHECK(r.code == 0);
  CHECK(r.text.find("fifo+affinity+hold=30") != std::string::npos);
  check_rejected("--synthetic 10 --devices 2 --partial-fraction 1 --demand 0.5", "--demand \"0.5\": expected MIN:MAX");
  check_rejected("--synthetic 10 --devices 2 --slots 2 --slot-share 0.25 --partial-fraction 1 --demand 0.3:0.4",
                 "exceeds the share of every slot");
  check_rejected("--synthetic 10 --devices 2 --partial-fraction 1", "the pool has no devices of kind \"fpga/slot\"");
  check_rejected("--synthetic 10 --devices 2 --policy fifo+hold=-1", "hold needs a positive number of seconds");
}
