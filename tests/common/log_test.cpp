#include <accelpool/common/log.hpp>

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <string>

namespace lg = accelpool::log;

TEST_CASE("a text log line is readable and quotes values that are not one plain word", "[log]") {
  auto line = lg::format_line(lg::Format::text, "accelpool-manager", lg::Level::info, "lease granted",
                              {{"lease", 7},
                               {"tenant", "team a"},
                               {"bitstream", ""},
                               {"wait_s", 0.25},
                               {"ok", true},
                               {"reason", "said \"no\"\nthen left"}},
                              "2026-01-02T03:04:05.006Z");
  CHECK(line ==
        "2026-01-02T03:04:05.006Z info accelpool-manager: lease granted lease=7 tenant=\"team a\" bitstream=\"\" "
        "wait_s=0.25 ok=true reason=\"said \\\"no\\\"\\nthen left\"\n");
}

TEST_CASE("a JSON log line is one valid JSON object with typed fields, whatever the text holds", "[log]") {
  const std::string nasty =
      std::string("quote\" backslash\\ newline\n tab\t bell\x07 nul") + std::string(1, '\0') + " utf8 \xc3\xa9 end";
  auto line = lg::format_line(lg::Format::json, "accelpool-agent", lg::Level::warn, "device \"x\" failed",
                              {{"lease", std::uint64_t{18446744073709551615ull}},
                               {"detail", nasty},
                               {"wait_s", 1e-9},
                               {"nan", std::numeric_limits<double>::quiet_NaN()},
                               {"ok", false}},
                              "2026-01-02T03:04:05.006Z");
  REQUIRE(line.back() == '\n');
  REQUIRE(line.find('\n') == line.size() - 1);  // one line, whatever the values held
  auto v = boost::json::parse(line.substr(0, line.size() - 1)).as_object();
  CHECK(v.at("ts") == "2026-01-02T03:04:05.006Z");
  CHECK(v.at("level") == "warn");
  CHECK(v.at("program") == "accelpool-agent");
  CHECK(v.at("event") == "device \"x\" failed");
  CHECK(v.at("lease").as_uint64() == 18446744073709551615ull);
  CHECK(v.at("detail").as_string() == boost::json::string_view(nasty.data(), nasty.size()));
  CHECK(v.at("wait_s").as_double() == 1e-9);
  CHECK(v.at("nan").is_null());
  CHECK(v.at("ok") == false);
}

TEST_CASE("levels and formats are parsed by name, anything else is refused", "[log]") {
  CHECK(lg::parse_level("debug") == lg::Level::debug);
  CHECK(lg::parse_level("info") == lg::Level::info);
  CHECK(lg::parse_level("warn") == lg::Level::warn);
  CHECK(lg::parse_level("warning") == lg::Level::warn);
  CHECK(lg::parse_level("error") == lg::Level::error);
  CHECK_FALSE(lg::parse_level("INFO"));
  CHECK_FALSE(lg::parse_level("trace"));
  CHECK(lg::parse_format("text") == lg::Format::text);
  CHECK(lg::parse_format("json") == lg::Format::json);
  CHECK_FALSE(lg::parse_format("xml"));
}

TEST_CASE("lines below the configured level are not written", "[log]") {
  lg::configure("test", lg::Level::warn, lg::Format::text);
  CHECK_FALSE(lg::enabled(lg::Level::debug));
  CHECK_FALSE(lg::enabled(lg::Level::info));
  CHECK(lg::enabled(lg::Level::warn));
  CHECK(lg::enabled(lg::Level::error));
  lg::configure("test", lg::Level::debug, lg::Format::text);
  CHECK(lg::enabled(lg::Level::debug));
  lg::configure("accelpool", lg::Level::info, lg::Format::text);
}

TEST_CASE("written lines reach stderr whole and in order once flushed", "[log]") {
  const auto file = std::filesystem::temp_directory_path() / ("log_test_" + std::to_string(::getpid()) + ".txt");
  const int saved = ::dup(STDERR_FILENO);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  ::dup2(fd, STDERR_FILENO);
  lg::configure("log-test", lg::Level::info, lg::Format::json);
  lg::debug("not written", {{"n", 0}});
  for (int i = 0; i < 1000; ++i) lg::info("numbered", {{"n", i}});
  lg::flush();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fd);
  lg::configure("accelpool", lg::Level::info, lg::Format::text);
  std::ifstream in(file);
  int expected = 0;
  for (std::string line; std::getline(in, line); ++expected) {
    auto v = boost::json::parse(line).as_object();
    CHECK(v.at("program") == "log-test");
    CHECK(v.at("n").as_int64() == expected);
    // An ISO 8601 UTC time with milliseconds, e.g. 2026-12-02T11:33:59.134Z.
    const std::string time(v.at("ts").as_string());
    CHECK(std::regex_match(time, std::regex(R"(20\d\d-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-6]\d\.\d{3}Z)")));
  }
  CHECK(expected == 1000);
  std::filesystem::remove(file);
}
