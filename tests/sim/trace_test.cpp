#include <accelpool/sim/trace.hpp>

#include <catch2/catch.hpp>

#include <sstream>
#include <utility>
#include <vector>

using namespace accelpool::sim;
using accelpool::Result;

namespace {

Result<Trace> native(const std::string& text) {
  std::istringstream in(text);
  return parse_native_csv(in, "t.csv");
}

Result<Trace> philly(const std::string& text) {
  std::istringstream in(text);
  return parse_philly_csv(in, "p.csv");
}

// The jobs of a trace that must parse.
std::vector<Job> jobs_of(Result<Trace> r) {
  INFO((r.is_ok() ? std::string() : r.error().message));
  REQUIRE(r.is_ok());
  return std::move(r->jobs);
}

std::string error_of(const Result<Trace>& r) {
  REQUIRE_FALSE(r.is_ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("native CSV: required columns and defaults", "[sim][trace]") {
  const std::vector<Job> jobs = jobs_of(native("arrival_s,runtime_s\n0,10\n2.5,3\n"));
  REQUIRE(jobs.size() == 2);
  const Job& j = jobs[1];
  CHECK(j.id == 1);
  CHECK(j.arrival_s == 2.5);
  CHECK(j.runtime_s == 3);
  CHECK(j.devices == 1);
  CHECK(j.bitstream == "default");
  CHECK(j.tenant == "default");
  CHECK(j.kind == "fpga");
  CHECK_FALSE(j.estimate_s.has_value());
  CHECK(j.host.empty());
}

TEST_CASE("native CSV: optional columns in any order, blanks take defaults", "[sim][trace]") {
  const std::vector<Job> jobs =
      jobs_of(native("# a comment\n"
                     "kind,estimate_s,runtime_s,tenant,devices,bitstream,arrival_s,host,label\n"
                     "gpu,12,10,alice,4,aes,1,h1,train.py\n"
                     "\n"
                     ",,20,,,,2,,\r\n"));
  REQUIRE(jobs.size() == 2);
  const Job& a = jobs[0];
  CHECK(a.kind == "gpu");
  CHECK(a.estimate_s == 12.0);
  CHECK(a.runtime_s == 10);
  CHECK(a.tenant == "alice");
  CHECK(a.devices == 4);
  CHECK(a.bitstream == "aes");
  CHECK(a.arrival_s == 1);
  CHECK(a.host == "h1");
  CHECK(a.label == "train.py");
  const Job& b = jobs[1];
  CHECK(b.kind == "fpga");
  CHECK_FALSE(b.estimate_s.has_value());
  CHECK(b.devices == 1);
  CHECK(b.runtime_s == 20);
  CHECK(b.label.empty());
}

TEST_CASE("native CSV: malformed input names file, line and column", "[sim][trace]") {
  CHECK(error_of(native("arrival_s,runtime_s\n0,1\n1,abc\n")) ==
        "t.csv:3:2: runtime_s: expected a number >= 0, got \"abc\"");
  CHECK(error_of(native("arrival_s,runtime_s\n-1,1\n")) == "t.csv:2:1: arrival_s: expected a number >= 0, got \"-1\"");
  CHECK(error_of(native("arrival_s,runtime_s,devices\n0,1,0\n")) ==
        "t.csv:2:3: devices: expected an integer >= 1, got \"0\"");
  CHECK(error_of(native("arrival_s,runtime_s,devices\n0,1,2.5\n")) ==
        "t.csv:2:3: devices: expected an integer >= 1, got \"2.5\"");
  CHECK(error_of(native("arrival_s,runtime_s,estimate_s\n0,1,nan\n")) ==
        "t.csv:2:3: estimate_s: expected a number >= 0, got \"nan\"");
  CHECK(error_of(native("arrival_s,runtime_s\n0,1,7\n")) == "t.csv:2:3: expected 2 fields, got 3");
  CHECK(error_of(native("arrival_s,runtime_s\n0\n")) == "t.csv:2:2: expected 2 fields, got 1");
  CHECK_THAT(error_of(native("arrival_s,runtime_s,colour\n0,1,red\n")),
             Catch::StartsWith("t.csv:1:3: unknown column \"colour\""));
  CHECK(error_of(native("arrival_s,arrival_s\n")) == "t.csv:1:2: column \"arrival_s\" appears twice");
  CHECK(error_of(native("arrival_s,devices\n0,1\n")) == "t.csv:1:1: the header has no column \"runtime_s\"");
  CHECK(error_of(native("")) == "t.csv:1:1: no header line (expected columns arrival_s,...)");
  CHECK(error_of(native("arrival_s,runtime_s\n")) == "t.csv: the trace has no jobs");
  CHECK(error_of(native("arrival_s,runtime_s\n0,1e400\n")) ==
        "t.csv:2:2: runtime_s: expected a number >= 0, got \"1e400\"");
}

TEST_CASE("native CSV: integer-valued floats are accepted as device counts", "[sim][trace]") {
  const std::vector<Job> jobs = jobs_of(native("arrival_s,runtime_s,devices\n0,1,4.0\n"));
  CHECK(jobs[0].devices == 4);
}

TEST_CASE("philly CSV: timestamps become seconds after the first job, sorted by arrival", "[sim][trace]") {
  const std::vector<Job> jobs =
      jobs_of(philly("timestamp,duration,num_gpus,gpu_time,cluster\n"
                     "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
                     "2017-10-09 06:13:03,2951.0,2,5902.0,6214e9\n"
                     "2017-10-10 06:13:03,10,8,80,6214e9\n"
                     "2016-02-29 00:00:00,5,1,5,leap\n"));
  REQUIRE(jobs.size() == 4);
  // 2016-02-29 is first; ids follow arrival order.
  CHECK(jobs[0].tenant == "leap");
  CHECK(jobs[0].arrival_s == 0);
  const double base = jobs[1].arrival_s;
  CHECK(jobs[1].tenant == "6214e9");
  CHECK(jobs[1].devices == 2);
  CHECK(jobs[1].runtime_s == 2951);
  CHECK(jobs[2].arrival_s - base == 48 * 60 + 52);
  CHECK(jobs[3].arrival_s - base == 86400);
  CHECK(jobs[3].devices == 8);
  // 2016-02-29 to 2017-10-09 06:13:03: 588 days.
  CHECK(base == 588.0 * 86400 + 6 * 3600 + 13 * 60 + 3);
  for (std::size_t i = 0; i < jobs.size(); ++i) CHECK(jobs[i].id == i);
}

TEST_CASE("philly CSV: malformed lines name file, line and column", "[sim][trace]") {
  const std::string head = "timestamp,duration,num_gpus,gpu_time,cluster\n";
  CHECK(error_of(philly(head + "2017-13-09 07:01:55,66.0,1,66.0,a\n")) ==
        "p.csv:2:1: timestamp: expected \"YYYY-MM-DD HH:MM:SS\", got \"2017-13-09 07:01:55\"");
  CHECK(error_of(philly(head + "2017-02-29 07:01:55,66.0,1,66.0,a\n")) ==
        "p.csv:2:1: timestamp: expected \"YYYY-MM-DD HH:MM:SS\", got \"2017-02-29 07:01:55\"");
  CHECK(error_of(philly(head + "2017-10-09 07:01:55,x,1,66.0,a\n")) ==
        "p.csv:2:2: duration: expected a number >= 0, got \"x\"");
  CHECK(error_of(philly(head + "2017-10-09 07:01:55,1,0,66.0,a\n")) ==
        "p.csv:2:3: num_gpus: expected an integer >= 1, got \"0\"");
  CHECK(error_of(philly(head + "2017-10-09 07:01:55,1,1,,a\n")) ==
        "p.csv:2:4: gpu_time: expected a number >= 0, got \"\"");
  CHECK(error_of(philly("timestamp,duration,num_gpus,cluster\n")) ==
        "p.csv:1:1: the header has no column \"gpu_time\"");
}

TEST_CASE("load_trace: a missing file is an error naming it", "[sim][trace]") {
  auto r = load_trace("/nonexistent/trace.csv", TraceFormat::native);
  REQUIRE_FALSE(r.is_ok());
  CHECK_THAT(r.error().message, Catch::StartsWith("cannot open trace file /nonexistent/trace.csv"));
}

TEST_CASE("the bundled Philly trace parses completely", "[sim][trace]") {
  const std::vector<Job> jobs =
      jobs_of(load_trace(std::string(ACCELPOOL_SIM_TRACES) + "/philly.csv", TraceFormat::philly));
  CHECK(jobs.size() == 82247);
  double work = 0;
  std::size_t single = 0;
  for (const auto& j : jobs) {
    work += j.devices * j.runtime_s;
    single += j.devices == 1;
  }
  CHECK(single == 76627);
  CHECK(work == Approx(3.52e9).epsilon(0.01));
  CHECK(jobs.front().arrival_s == 0);
}

TEST_CASE("the bundled Alibaba GPU 2023 trace parses completely", "[sim][trace]") {
  const std::vector<Job> jobs =
      jobs_of(load_trace(std::string(ACCELPOOL_SIM_TRACES) + "/alibaba-gpu-2023.csv", TraceFormat::native));
  CHECK(jobs.size() == 6178);
  double work = 0;
  std::size_t single = 0, labelled = 0;
  for (const auto& j : jobs) {
    work += j.devices * j.runtime_s;
    single += j.devices == 1;
    labelled += !j.label.empty();
  }
  CHECK(single == 6105);
  CHECK(labelled == 6178);
  CHECK(work == Approx(6.489e7).epsilon(0.01));
}
