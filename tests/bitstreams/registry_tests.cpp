#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/sha256.hpp>

#include <catch2/catch.hpp>

#include <set>

#include "test_support.hpp"

using namespace accelpool::bitstreams;
using accelpool::Errc;
using namespace accelpool::bitstreams::test;
namespace fs = std::filesystem;

namespace {

// Copies the OpenCL samples into a scratch registry folder.
void copy_opencl_samples(const fs::path& to) {
  for (const auto* name : {"vadd", "checksum", "matmul"}) {
    fs::copy_file(opencl_samples / (std::string(name) + ".cl"), to / (std::string(name) + ".cl"));
    fs::copy_file(opencl_samples / (std::string(name) + ".toml"), to / (std::string(name) + ".toml"));
  }
}

std::set<std::string> folder_listing(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.insert(e.path().filename().string() + ":" + std::to_string(e.file_size()));
  return out;
}

// The rejection of the manifest file `manifest_name` in `r`; the test stops there when it has none.
const Rejected& rejection_for(const Registry& r, const std::string& manifest_name) {
  const Rejected* found = nullptr;
  for (const auto& x : r.rejected()) {
    if (x.manifest_path.filename() == manifest_name) {
      found = &x;
      break;
    }
  }
  REQUIRE(found != nullptr);
  return *found;
}

}  // namespace

TEST_CASE("the OpenCL sample manifests load and verify", "[registry]") {
  Registry r = open_registry(opencl_samples);
  CHECK(r.rejected().empty());
  auto all = r.list();
  REQUIRE(all.size() == 3);
  CHECK(all[0].id() == "checksum@1.0.0");
  CHECK(all[1].id() == "matmul@1.0.0");
  CHECK(all[2].id() == "vadd@1.0.0");
  auto vadd = r.get("vadd");
  REQUIRE(vadd.is_ok());
  CHECK(vadd->manifest.format == ImageFormat::opencl_source);
  CHECK(vadd->file_path == opencl_samples / "vadd.cl");
  CHECK(vadd->size_bytes == fs::file_size(opencl_samples / "vadd.cl"));
  CHECK(vadd->manifest.sha256 == *sha256_file(opencl_samples / "vadd.cl"));
  auto by_sha = r.find_by_sha256(vadd->manifest.sha256);
  REQUIRE(by_sha.is_ok());
  CHECK(by_sha->id() == "vadd@1.0.0");
}

TEST_CASE("opening a folder that does not exist is an error", "[registry][errors]") {
  auto r = Registry::open("/nonexistent/accelpool/registry");
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().code == Errc::not_found);
  CHECK_THAT(r.error().message, Catch::Contains("/nonexistent/accelpool/registry"));
}

TEST_CASE("an image whose checksum does not match is rejected and never handed out", "[registry][errors]") {
  ScratchDir dir("checksum");
  copy_opencl_samples(dir.path());
  write_file(dir.path() / "vadd.cl", read_file(dir.path() / "vadd.cl") + "\n// tampered\n");
  Registry r = open_registry(dir.path());
  CHECK(r.list().size() == 2);
  const Rejected& x = rejection_for(r, "vadd.toml");
  CHECK(x.error.code == Errc::checksum_mismatch);
  CHECK_THAT(x.error.message, Catch::Contains("vadd.toml") && Catch::Contains("'sha256'"));
  auto got = r.get("vadd");
  REQUIRE_FALSE(got.is_ok());
  CHECK(got.error().code == Errc::not_found);
}

TEST_CASE("a missing image file is rejected naming the file field", "[registry][errors]") {
  ScratchDir dir("missing");
  copy_opencl_samples(dir.path());
  fs::remove(dir.path() / "matmul.cl");
  Registry r = open_registry(dir.path());
  const Rejected& x = rejection_for(r, "matmul.toml");
  CHECK(x.error.code == Errc::missing_file);
  CHECK_THAT(x.error.message, Catch::Contains("matmul.toml") && Catch::Contains("'file'"));
  CHECK_FALSE(r.get("matmul").is_ok());
}

TEST_CASE("a manifest naming a kernel the source lacks is rejected", "[registry][errors]") {
  ScratchDir dir("kernels");
  copy_opencl_samples(dir.path());
  write_file(dir.path() / "checksum.toml",
             replace_all(read_file(dir.path() / "checksum.toml"), "kernels = [\"checksum\"]", "kernels = [\"crc32\"]"));
  Registry r = open_registry(dir.path());
  const Rejected& x = rejection_for(r, "checksum.toml");
  CHECK(x.error.code == Errc::invalid_manifest);
  CHECK_THAT(x.error.message, Catch::Contains("'kernels'") && Catch::Contains("crc32"));
}

TEST_CASE("two manifests for the same name and version: the second is rejected", "[registry][errors]") {
  ScratchDir dir("duplicate");
  copy_opencl_samples(dir.path());
  fs::copy_file(dir.path() / "vadd.toml", dir.path() / "vadd-copy.toml");
  Registry r = open_registry(dir.path());
  CHECK(r.list().size() == 3);
  const Rejected& x = rejection_for(r, "vadd.toml");  // sorted: "vadd-copy.toml" loads first
  CHECK(x.error.code == Errc::already_exists);
}

TEST_CASE("compatible() accepts listed models and refuses others", "[registry]") {
  Registry r = open_registry(opencl_samples);
  auto vadd = r.get("vadd");
  REQUIRE(vadd.is_ok());
  CHECK(Registry::compatible(*vadd, "pthread-haswell-AMD EPYC 7B13").is_ok());
  auto no = Registry::compatible(*vadd, "xilinx_u250_gen3x16_xdma_4_1_202210_1");
  REQUIRE_FALSE(no.is_ok());
  CHECK(no.error().code == Errc::incompatible);
  CHECK_THAT(no.error().message, Catch::Contains("vadd@1.0.0") && Catch::Contains("xilinx_u250"));
}

TEST_CASE("add registers an image atomically, bad registrations change nothing", "[registry]") {
  ScratchDir dir("add");
  ScratchDir upload("upload");
  Registry r = open_registry(dir.path());
  CHECK(r.list().empty());

  fs::path source = upload.path() / "scale.cl";
  write_file(source, "__kernel void scale(__global float* x, const float f) { x[get_global_id(0)] *= f; }\n");
  Manifest m;
  m.name = "scale";
  m.version = "0.9.1";
  m.kind = "gpu";
  m.file = "scale.cl";
  m.format = ImageFormat::opencl_source;
  m.sha256 = *sha256_file(source);
  m.programming_seconds = 0.5;
  m.compatible = {"pthread-*"};
  m.kernels = {"scale"};

  SECTION("a good image is copied in with its manifest and survives a reload") {
    auto added = r.add(m, source);
    REQUIRE(added.is_ok());
    CHECK(added->file_path == dir.path() / "scale.cl");
    CHECK(fs::exists(dir.path() / "scale-0.9.1.toml"));
    CHECK(read_file(dir.path() / "scale.cl") == read_file(source));
    auto again = Registry::open(dir.path());
    REQUIRE(again.is_ok());
    CHECK(again->rejected().empty());
    REQUIRE(again->get("scale", "0.9.1").is_ok());

    auto before = folder_listing(dir.path());
    auto dup = r.add(m, source);
    REQUIRE_FALSE(dup.is_ok());
    CHECK(dup.error().code == Errc::already_exists);
    CHECK(folder_listing(dir.path()) == before);

    SECTION("and remove deletes manifest and image") {
      REQUIRE(r.remove("scale", "0.9.1").is_ok());
      CHECK(folder_listing(dir.path()).empty());
      CHECK_FALSE(r.get("scale").is_ok());
      auto gone = r.remove("scale", "0.9.1");
      REQUIRE_FALSE(gone.is_ok());
      CHECK(gone.error().code == Errc::not_found);
    }
  }
  SECTION("a wrong checksum is refused and leaves no file behind") {
    m.sha256 = std::string(64, 'a');
    auto added = r.add(m, source);
    REQUIRE_FALSE(added.is_ok());
    CHECK(added.error().code == Errc::checksum_mismatch);
    CHECK(folder_listing(dir.path()).empty());
  }
  SECTION("an invalid manifest is refused") {
    m.file = "../escape.cl";
    auto added = r.add(m, source);
    REQUIRE_FALSE(added.is_ok());
    CHECK(added.error().code == Errc::invalid_manifest);
    CHECK_THAT(added.error().message, Catch::Contains("'file'"));
    CHECK(folder_listing(dir.path()).empty());
  }
  SECTION("a missing source is refused") {
    auto added = r.add(m, upload.path() / "nope.cl");
    REQUIRE_FALSE(added.is_ok());
    CHECK(added.error().code == Errc::missing_file);
    CHECK(folder_listing(dir.path()).empty());
  }
}

TEST_CASE("get without a version returns the highest version", "[registry]") {
  ScratchDir dir("versions");
  ScratchDir upload("versions-src");
  Registry r = open_registry(dir.path());
  for (const auto* v : {"1.9.0", "1.10.0", "1.2.0"}) {
    fs::path src = upload.path() / (std::string("k") + v + ".cl");
    write_file(src, std::string("__kernel void k(__global int* x) { x[0] = 1; } // ") + v + "\n");
    Manifest m;
    m.name = "k";
    m.version = v;
    m.kind = "cpu";
    m.file = std::string("k-") + v + ".cl";
    m.format = ImageFormat::opencl_source;
    m.sha256 = *sha256_file(src);
    m.compatible = {"*"};
    m.kernels = {"k"};
    REQUIRE(r.add(m, src).is_ok());
  }
  auto latest = r.get("k");
  REQUIRE(latest.is_ok());
  CHECK(latest->manifest.version == "1.10.0");
  CHECK(r.get("k", "1.2.0").is_ok());
  CHECK_FALSE(r.get("k", "3.0").is_ok());
}

TEST_CASE("verify re-checks an image changed on disk after loading", "[registry][errors]") {
  ScratchDir dir("verify");
  copy_opencl_samples(dir.path());
  Registry r = open_registry(dir.path());
  REQUIRE(r.verify("vadd", "1.0.0").is_ok());
  write_file(dir.path() / "vadd.cl", "__kernel void vadd() {}\n");
  auto v = r.verify("vadd", "1.0.0");
  REQUIRE_FALSE(v.is_ok());
  CHECK(v.error().code == Errc::checksum_mismatch);
  fs::remove(dir.path() / "vadd.cl");
  CHECK(r.verify("vadd", "1.0.0").error().code == Errc::missing_file);
  CHECK(r.verify("nope", "1.0.0").error().code == Errc::not_found);
}
