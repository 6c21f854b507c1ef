#include <accelpool/bitstreams/manifest.hpp>
#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/sha256.hpp>

#include <catch2/catch.hpp>

using namespace accelpool::bitstreams;
using accelpool::Errc;

namespace {

const std::string kValid = R"(
name = "vadd"
version = "1.2.0"
kind = "cpu"
file = "vadd.cl"
sha256 = "0c24b9a18ddb9105e55aa1226c339aac5f402a1a9a242c914a96b121a51a2d69"
programming_seconds = 0.25
compatible = ["pthread-*", "sim-gpu"]
kernels = ["vadd"]
)";

std::string with(const std::string& from, const std::string& to) {
  std::string s = kValid;
  auto pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  return s.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("a valid manifest parses into its fields", "[manifest]") {
  auto m = parse_manifest(kValid, "vadd.toml");
  REQUIRE(m.is_ok());
  CHECK(m->name == "vadd");
  CHECK(m->version == "1.2.0");
  CHECK(m->kind == "cpu");
  CHECK(m->file == "vadd.cl");
  CHECK(m->format == ImageFormat::opencl_source);
  CHECK(m->programming_seconds == Approx(0.25));
  CHECK(m->compatible == std::vector<std::string>{"pthread-*", "sim-gpu"});
  CHECK(m->kernels == std::vector<std::string>{"vadd"});
  CHECK(m->id() == "vadd@1.2.0");
}

TEST_CASE("to_toml output parses back to the same manifest", "[manifest]") {
  auto m = parse_manifest(kValid, "vadd.toml");
  REQUIRE(m.is_ok());
  m->description = "quotes \" and \\ backslashes";
  auto again = parse_manifest(to_toml(*m), "roundtrip");
  REQUIRE(again.is_ok());
  CHECK(again->description == m->description);
  CHECK(again->sha256 == m->sha256);
  CHECK(again->programming_seconds == m->programming_seconds);
  CHECK(again->compatible == m->compatible);
  CHECK(again->format == m->format);
}

TEST_CASE("manifest errors name the manifest and the field", "[manifest][errors]") {
  struct Case {
    std::string text;
    std::string field;
  };
  std::vector<Case> cases = {
      {with("name = \"vadd\"\n", ""), "'name'"},
      {with("\"vadd\"", "\"Vadd!\""), "'name'"},
      {with("sha256 = \"0c24", "sha256 = \"zz24"), "'sha256'"},
      {with("0c24b9a18ddb", "0c24b9a18dd"), "'sha256'"},
      {with("file = \"vadd.cl\"", "file = \"../etc/passwd\""), "'file'"},
      {with("file = \"vadd.cl\"", "file = \"/abs/vadd.cl\""), "'file'"},
      {with("programming_seconds = 0.25", "programming_seconds = -1.0"), "'programming_seconds'"},
      {with("programming_seconds = 0.25", "programming_seconds = \"fast\""), "'programming_seconds'"},
      {with("compatible = [\"pthread-*\", \"sim-gpu\"]", "compatible = []"), "'compatible'"},
      {with("compatible = [\"pthread-*\", \"sim-gpu\"]", "compatible = \"pthread\""), "'compatible'"},
      {with("kernels = [\"vadd\"]", "kernels = []"), "'kernels'"},
      {with("kernels = [\"vadd\"]", "kernels = [\"vadd\", \"vadd\"]"), "'kernels'"},
      {with("kind = \"cpu\"", "kind = \"cpu\"\ncolour = \"red\""), "'colour'"},
      {with("kind = \"cpu\"", "kind = 3"), "'kind'"},
      {with("kind = \"cpu\"", "kind = \"cpu\"\nformat = \"zip\""), "'format'"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    auto m = parse_manifest(c.text, "/srv/bitstreams/vadd.toml");
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.error().code == Errc::invalid_manifest);
    CHECK_THAT(m.error().message, Catch::Contains("/srv/bitstreams/vadd.toml"));
    CHECK_THAT(m.error().message, Catch::Contains(c.field));
  }
}

TEST_CASE("TOML syntax errors report the line", "[manifest][errors]") {
  auto m = parse_manifest("name = \"x\"\nversion = \n", "broken.toml");
  REQUIRE_FALSE(m.is_ok());
  CHECK(m.error().code == Errc::invalid_manifest);
  CHECK_THAT(m.error().message, Catch::Contains("broken.toml") && Catch::Contains("line 2"));
}

TEST_CASE("model patterns match with shell wildcards", "[manifest]") {
  std::vector<std::string> p = {"xilinx_u250_*", "pthread-?aswell*", "exact"};
  CHECK(model_matches(p, "xilinx_u250_gen3x16_xdma_4_1_202210_1"));
  CHECK(model_matches(p, "pthread-haswell-AMD EPYC"));
  CHECK(model_matches(p, "exact"));
  CHECK_FALSE(model_matches(p, "exactly"));
  CHECK_FALSE(model_matches(p, "xilinx_u280_gen3x16_xdma_1_202211_1"));
  CHECK_FALSE(model_matches({}, "anything"));
  CHECK(model_matches({"*"}, ""));
}

TEST_CASE("versions compare numerically", "[manifest]") {
  CHECK(compare_versions("1.10.0", "1.9.2") > 0);
  CHECK(compare_versions("1.2", "1.2") == 0);
  CHECK(compare_versions("1.2", "1.2.1") < 0);
  CHECK(compare_versions("2.0.0-rc1", "2.0.0") > 0);
  CHECK(compare_versions("007", "7") == 0);
}

TEST_CASE("sha256 matches the FIPS 180-2 test vector", "[sha256]") {
  CHECK(sha256_bytes("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_bytes("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  auto missing = sha256_file("/nonexistent/accelpool/file");
  REQUIRE_FALSE(missing.is_ok());
  CHECK(missing.error().code == Errc::io_error);
  CHECK_THAT(missing.error().message, Catch::Contains("/nonexistent/accelpool/file"));
}

TEST_CASE("a partial image names its slot shape and bandwidth demand", "[manifest][slots]") {
  auto m = parse_manifest(
      with("kernels = [\"vadd\"]",
           "kernels = [\"vadd\"]\nimage = \"partial\"\nslot_shape = \"quarter\"\nbandwidth_demand = 0.2"),
      "vadd.toml");
  REQUIRE(m.is_ok());
  CHECK(m->partial);
  CHECK(m->slot_shape == "quarter");
  CHECK(m->bandwidth_demand == Approx(0.2));
  auto back = parse_manifest(to_toml(*m), "again.toml");
  REQUIRE(back.is_ok());
  CHECK(back->partial);
  CHECK(back->slot_shape == "quarter");
  CHECK(back->bandwidth_demand == Approx(0.2));
  // A full image (the default) writes none of the three.
  auto full = parse_manifest(kValid, "vadd.toml");
  REQUIRE(full.is_ok());
  CHECK_FALSE(full->partial);
  CHECK(to_toml(*full).find("image") == std::string::npos);

  auto error = [](const std::string& text) { return parse_manifest(text, "p.toml").error().message; };
  CHECK(error(with("kernels = [\"vadd\"]", "kernels = [\"vadd\"]\nimage = \"partial\"")) ==
        "manifest p.toml: field 'slot_shape': a partial image must name the slot shape it fits ([a-z0-9._-])");
  CHECK(error(with("kernels = [\"vadd\"]", "kernels = [\"vadd\"]\nslot_shape = \"quarter\"")) ==
        "manifest p.toml: field 'slot_shape': only a partial image (image = \"partial\") fits a slot");
  CHECK(error(with("kernels = [\"vadd\"]", "kernels = [\"vadd\"]\nimage = \"half\"")) ==
        "manifest p.toml: field 'image': 'half' is not one of full, partial");
  CHECK(error(with("kernels = [\"vadd\"]", "kernels = [\"vadd\"]\nbandwidth_demand = 1.5")) ==
        "manifest p.toml: field 'bandwidth_demand': must be a share of the device's bandwidth, from 0 to 1");
  CHECK(error(with("kernels = [\"vadd\"]", "kernels = [\"vadd\"]\nbandwidth_demand = \"high\"")) ==
        "manifest p.toml: field 'bandwidth_demand': expected a number");
}
