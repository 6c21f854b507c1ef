#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/xclbin.hpp>

#include <catch2/catch.hpp>

#include "skip.hpp"

#include <cctype>
#include <cstring>
#include <optional>

#include "test_support.hpp"

using namespace accelpool::bitstreams;
using accelpool::Errc;
using namespace accelpool::bitstreams::test;
namespace fs = std::filesystem;

namespace {

bool have_samples() {
  if (fs::exists(build_samples / "vadd_u250.xclbin")) return true;
  accelpool::testing::skip("no generated xclbin samples in " + build_samples.string() +
                           " (this build has no XRT headers to write them)");
  return false;
}

// Puts `image` and a manifest for it (sha256 of the damaged bytes, so only the image checks can catch it)
// into `dir` as "<name>.xclbin"/"<name>.toml".
void publish(const fs::path& dir, const std::string& name, const std::string& image, const std::string& platform) {
  write_file(dir / (name + ".xclbin"), image);
  Manifest m;
  m.name = name;
  m.version = "1.0.0";
  m.kind = "fpga";
  m.file = name + ".xclbin";
  m.format = ImageFormat::xclbin;
  m.sha256 = sha256_bytes(image);
  m.programming_seconds = 1;
  m.compatible = {platform};
  m.kernels = {"vadd"};
  write_file(dir / (name + ".toml"), to_toml(m));
}

// Lowercase 8-4-4-4-12 hex with version 4 and the RFC 4122 variant, as the generator writes.
bool is_v4_uuid(const std::string& u) {
  if (u.size() != 36) return false;
  for (std::size_t i = 0; i < u.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash != (u[i] == '-')) return false;
    if (!dash && !std::isxdigit(static_cast<unsigned char>(u[i]))) return false;
    if (!dash && std::isupper(static_cast<unsigned char>(u[i]))) return false;
  }
  return u[14] == '4' && std::string("89ab").find(u[19]) != std::string::npos;
}

}  // namespace

TEST_CASE("generated xclbins are read by XRT's parser: UUID, platform, kernels", "[xclbin][xrt]") {
  if (!have_samples()) return;
  if (!xrt_parser_available()) {
    ACCELPOOL_SKIP("built without XRT, so only the container header is read");
  }
  auto vadd = read_xclbin(build_samples / "vadd_u250.xclbin");
  REQUIRE(vadd.is_ok());
  CHECK(vadd->parsed_by_xrt);
  CHECK(vadd->platform == "xilinx_u250_gen3x16_xdma_4_1_202210_1");
  CHECK(is_v4_uuid(vadd->uuid));
  CHECK(vadd->kernels == std::vector<std::string>{"vadd"});
  CHECK(vadd->num_sections == 5);
  CHECK(vadd->size_bytes == fs::file_size(build_samples / "vadd_u250.xclbin"));

  auto mm = read_xclbin(build_samples / "matmul_u280.xclbin");
  REQUIRE(mm.is_ok());
  CHECK(mm->platform == "xilinx_u280_gen3x16_xdma_1_202211_1");
  CHECK(mm->kernels == std::vector<std::string>{"matmul", "checksum"});
  CHECK(mm->uuid != vadd->uuid);
}

TEST_CASE("the build's sample folder loads completely", "[xclbin][registry]") {
  if (!have_samples()) return;
  auto r = Registry::open(build_samples);
  REQUIRE(r.is_ok());
  for (const auto& x : r->rejected()) FAIL_CHECK(x.error.message);
  CHECK(r->list().size() == 5);
  auto vadd = r->get("vadd_u250");
  REQUIRE(vadd.is_ok());
  REQUIRE(vadd->xclbin.has_value());
  CHECK(vadd->xclbin->platform == "xilinx_u250_gen3x16_xdma_4_1_202210_1");
  CHECK(Registry::compatible(*vadd, "xilinx_u250_gen3x16_xdma_4_1_202210_1").is_ok());
  auto wrong = Registry::compatible(*vadd, "xilinx_u280_gen3x16_xdma_1_202211_1");
  REQUIRE_FALSE(wrong.is_ok());
  CHECK(wrong.error().code == Errc::incompatible);
  // The generator is deterministic: the manifest's checksum is that of the image just built.
  CHECK(vadd->manifest.sha256 == *sha256_file(build_samples / "vadd_u250.xclbin"));
}

TEST_CASE("corrupt xclbins are rejected with a clear error", "[xclbin][errors]") {
  if (!have_samples()) return;
  const std::string good = read_file(build_samples / "vadd_u250.xclbin");
  const std::string platform = "xilinx_u250_gen3x16_xdma_4_1_202210_1";
  ScratchDir dir("corrupt");

  std::string truncated = good.substr(0, good.size() / 2);
  std::string bad_magic = good;
  std::memcpy(bad_magic.data(), "xclbin1", 7);
  std::string tiny = good.substr(0, 100);
  std::string bad_section = good;
  // First section header's offset (axlf.m_sections[0].m_sectionOffset) points far past the end.
  std::uint64_t far = good.size() * 4;
  std::memcpy(bad_section.data() + 456 + 24, &far, sizeof far);
  std::string no_terminator = good;
  std::memset(no_terminator.data() + 304 + 48, 'x', 64);
  // The offset of the first section of `kind` in the image (axlf.m_sections[i]: kind at +0, offset at +24).
  auto section_offset = [&](std::uint32_t kind) -> std::optional<std::uint64_t> {
    std::uint32_t sections = 0;
    std::memcpy(&sections, good.data() + 304 + 144, sizeof sections);
    for (std::uint32_t i = 0; i < sections; ++i) {
      std::uint32_t k = 0;
      std::uint64_t offset = 0;
      std::memcpy(&k, good.data() + 456 + 40 * i, sizeof k);
      std::memcpy(&offset, good.data() + 456 + 40 * i + 24, sizeof offset);
      if (k == kind) return offset;
    }
    return std::nullopt;
  };
  // The MEM_TOPOLOGY section (kind 6) claims far more entries than its bytes hold: XRT's parser would allocate
  // and read them all (found by fuzz/xclbin_fuzz.cpp: a 40 GB allocation).
  std::string huge_count = good;
  const auto mem_topology = section_offset(6);
  REQUIRE(mem_topology);
  const std::int32_t count = 0x7fffffff;
  std::memcpy(huge_count.data() + *mem_topology, &count, sizeof count);
  // The first CONNECTIVITY entry (kind 7) names argument 2^30: XRT's parser would size the kernel's argument list
  // by it (found by fuzz/xclbin_fuzz.cpp: a 6 GB allocation).
  std::string huge_arg = good;
  const auto connectivity = section_offset(7);
  REQUIRE(connectivity);
  std::int32_t connections = 0;
  std::memcpy(&connections, good.data() + *connectivity, sizeof connections);
  REQUIRE(connections >= 1);
  const std::int32_t arg = 1 << 30;
  std::memcpy(huge_arg.data() + *connectivity + 4, &arg, sizeof arg);

  struct Case {
    std::string name, image, expect;
  };
  std::vector<Case> cases = {{"truncated", truncated, "truncated"},
                             {"bad_magic", bad_magic, "bad magic"},
                             {"tiny", tiny, "too small"},
                             {"bad_section", bad_section, "outside the file"},
                             {"no_terminator", no_terminator, "VBNV"},
                             {"huge_count", huge_count, "MEM_TOPOLOGY) lists 2147483647 entries"},
                             {"huge_arg", huge_arg, "connects argument 1073741824"}};
  for (const auto& c : cases) {
    INFO(c.name);
    auto direct = check_xclbin_container(c.image, c.name);
    REQUIRE_FALSE(direct.is_ok());
    CHECK(direct.error().code == Errc::corrupt_image);
    CHECK_THAT(direct.error().message, Catch::Contains(c.expect));
    publish(dir.path(), c.name, c.image, platform);
  }
  auto r = Registry::open(dir.path());
  REQUIRE(r.is_ok());
  CHECK(r->list().empty());
  REQUIRE(r->rejected().size() == cases.size());
  for (const auto& x : r->rejected()) {
    CHECK(x.error.code == Errc::corrupt_image);
    CHECK_THAT(x.error.message, Catch::Contains(x.manifest_path.string()));
  }
}

TEST_CASE("an xclbin for a platform the manifest does not list is rejected", "[xclbin][errors]") {
  if (!have_samples()) return;
  ScratchDir dir("wrong-platform");
  publish(dir.path(), "vadd_u280", read_file(build_samples / "vadd_u250.xclbin"), "xilinx_u280_*");
  auto r = Registry::open(dir.path());
  REQUIRE(r.is_ok());
  REQUIRE(r->rejected().size() == 1);
  CHECK(r->rejected()[0].error.code == Errc::incompatible);
  CHECK_THAT(r->rejected()[0].error.message, Catch::Contains("'compatible'") && Catch::Contains("xilinx_u250"));
}

TEST_CASE("an xclbin manifest naming a kernel the image lacks is rejected", "[xclbin][errors]") {
  if (!have_samples()) return;
  if (!xrt_parser_available()) {
    ACCELPOOL_SKIP("built without XRT, kernels cannot be read");
  }
  ScratchDir dir("xclbin-kernels");
  fs::copy_file(build_samples / "matmul_u280.xclbin", dir.path() / "matmul_u280.xclbin");
  write_file(dir.path() / "matmul_u280.toml",
             replace_all(read_file(build_samples / "matmul_u280.toml"), "\"checksum\"", "\"fft\""));
  auto r = Registry::open(dir.path());
  REQUIRE(r.is_ok());
  REQUIRE(r->rejected().size() == 1);
  CHECK(r->rejected()[0].error.code == Errc::invalid_manifest);
  CHECK_THAT(r->rejected()[0].error.message, Catch::Contains("fft"));
}

TEST_CASE("an xclbin whose metadata XRT cannot read is rejected by XRT's parser", "[xclbin][xrt][errors]") {
  if (!have_samples()) return;
  if (!xrt_parser_available()) {
    ACCELPOOL_SKIP("built without XRT");
  }
  std::string image = read_file(build_samples / "vadd_u250.xclbin");
  auto at = image.find("<project");
  REQUIRE(at != std::string::npos);
  image.replace(at, 8, "<<<<<<<<");  // same length: the container stays valid
  REQUIRE(check_xclbin_container(image, "damaged").is_ok());
  ScratchDir dir("bad-xml");
  publish(dir.path(), "bad_xml", image, "xilinx_u250_gen3x16_xdma_4_1_202210_1");
  auto direct = read_xclbin(dir.path() / "bad_xml.xclbin");
  REQUIRE_FALSE(direct.is_ok());
  CHECK(direct.error().code == Errc::corrupt_image);
  CHECK_THAT(direct.error().message, Catch::Contains("XRT's parser rejects it"));
  auto r = Registry::open(dir.path());
  REQUIRE(r.is_ok());
  CHECK(r->list().empty());
  REQUIRE(r->rejected().size() == 1);
  CHECK(r->rejected()[0].error.code == Errc::corrupt_image);
}
