#include <accelpool/backends/factory.hpp>

#include <algorithm>

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
