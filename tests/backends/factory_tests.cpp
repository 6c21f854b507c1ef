#include <accelpool/backends/factory.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "test_support.hpp"

using namespace accelpool::backends;
using accelpool::Errc;

TEST_CASE("factory: backends are created by name", "[factory]") {
  auto names = built_backends();
  CHECK(std::find(names.begin(), names.end(), "sim") != names.end());
  auto sim = make_backend("sim", {{"devices", "gpu:sim-gpu:2"}});
  REQUIRE(sim.is_ok());
  CHECK((*sim)->name() == "sim");
  CHECK((*sim)->enumerate()->size() == 2);
}

TEST_CASE("factory: unknown names and bad config are clear errors", "[factory][errors]") {
  auto none = make_backend("cuda", {});
  REQUIRE_FALSE(none.is_ok());
  CHECK(none.error().code == Errc::not_found);
  CHECK_THAT(none.error().message, Catch::Contains("cuda") && Catch::Contains("sim"));
  auto bad = make_backend("sim", {{"colour", "red"}});
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.error().code == Errc::invalid_argument);
  CHECK_THAT(bad.error().message, Catch::Contains("'colour'"));
}

TEST_CASE("config: a list value reads back as its integers, a malformed one is refused naming the key",
          "[config][errors]") {
  const BackendConfig config{{"counts", "[2, 1,1]"},  {"none", "[]"},      {"one", "[ -3 ]"}, {"plain", "4"},
                             {"trailing", "[1, 2,]"}, {"words", "[2, x]"}, {"open", "[1, 2"}, {"gap", "[1 2]"}};
  ConfigReader r("test", config);
  CHECK(r.is_list("counts"));
  CHECK_FALSE(r.is_list("plain"));
  CHECK_FALSE(r.is_list("absent"));
  CHECK(r.get_int_list("counts").value() == std::vector<std::int64_t>{2, 1, 1});
  CHECK(r.get_int_list("none").value().empty());
  CHECK(r.get_int_list("one").value() == std::vector<std::int64_t>{-3});
  CHECK(r.get_int_list("absent").value().empty());
  for (const char* key : {"plain", "trailing", "words", "open", "gap"}) {
    auto bad = r.get_int_list(key);
    REQUIRE_FALSE(bad.is_ok());
    CHECK(bad.error().code == Errc::invalid_argument);
    CHECK(bad.error().message == "backend test: config key '" + std::string(key) + "': '" + config.at(key) +
                                     "' is not a list of integers such as [2, 1, 1]");
  }
}

TEST_CASE("factory: make_image carries the registry's facts", "[factory]") {
  auto reg = accelpool::backends::test::sample_registry();
  auto vadd = reg.get("vadd");
  REQUIRE(vadd.is_ok());
  Image image = make_image(*vadd);
  CHECK(image.name == "vadd");
  CHECK(image.sha256 == vadd->manifest.sha256);
  CHECK(image.file == vadd->file_path);
  CHECK(image.format == "opencl-source");
  CHECK(image.size_bytes == vadd->size_bytes);
  CHECK(image.compatible == vadd->manifest.compatible);
  CHECK(image.kernels == std::vector<std::string>{"vadd"});
}
