// One rule for the names a bitstream is stored under (name, version, image file name), whatever path stores it:
// Registry::add (the admin upload and an agent's image cache go through it), a manifest parsed from text (an
// upload), and a registry folder loaded at start.
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

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// An opaque image `bytes` at `source`, described as name@version stored under `file`.
Manifest opaque_manifest(const std::string& name, const std::string& version, const std::string& file,
                         const fs::path& source, const std::string& bytes) {
  write_file(source, bytes);
  Manifest m;
  m.name = name;
  m.version = version;
  m.kind = "fpga";
  m.file = file;
  m.sha256 = *sha256_file(source);
  m.compatible = {"*"};
  return m;
}

}  // namespace

TEST_CASE("an image file named like its own manifest is refused, not overwritten by it", "[registry][names]") {
  ScratchDir dir("names-own");
  ScratchDir src("names-own-src");
  Registry r = open_registry(dir.path());
  auto m = opaque_manifest("k", "1.0", "k-1.0.toml", src.path() / "img", "image bytes\n");
  auto added = r.add(m, src.path() / "img");
  REQUIRE_FALSE(added.is_ok());
  CHECK(added.error().code == Errc::invalid_manifest);
  CHECK_THAT(added.error().message, Catch::Contains("'file'") && Catch::Contains("k-1.0.toml"));
  CHECK(names_in(dir.path()).empty());
  CHECK_FALSE(r.find_by_sha256(m.sha256).is_ok());
}

TEST_CASE("an image named like another manifest never becomes a bitstream after a reload", "[registry][names]") {
  ScratchDir dir("names-other");
  ScratchDir src("names-other-src");
  Registry r = open_registry(dir.path());
  // The image's bytes are a valid manifest for "other", whose own image is present too.
  write_file(dir.path() / "other.bin", "other image\n");
  Manifest other = opaque_manifest("other", "2.0", "other.bin", dir.path() / "other.bin", "other image\n");
  auto m = opaque_manifest("k", "1.0", "other-2.0.toml", src.path() / "img", to_toml(other));
  auto added = r.add(m, src.path() / "img");
  REQUIRE_FALSE(added.is_ok());
  CHECK(added.error().code == Errc::invalid_manifest);
  CHECK(names_in(dir.path()) == std::set<std::string>{"other.bin"});
  REQUIRE(r.reload().is_ok());
  CHECK(r.list().empty());
  CHECK_FALSE(r.get("other").is_ok());
}

TEST_CASE("an image file name with a NUL or another control character is refused, not stored truncated",
          "[registry][names]") {
  ScratchDir dir("names-nul");
  ScratchDir src("names-nul-src");
  Registry r = open_registry(dir.path());
  for (const std::string& file : {std::string("k.bin\0.xclbin", 13), std::string("k\n.bin"), std::string("k bin")}) {
    auto m = opaque_manifest("k", "1.0", file, src.path() / "img", "image bytes\n");
    auto added = r.add(m, src.path() / "img");
    REQUIRE_FALSE(added.is_ok());
    CHECK(added.error().code == Errc::invalid_manifest);
    CHECK_THAT(added.error().message, Catch::Contains("'file'"));
    CHECK(added.error().message.find('\0') == std::string::npos);
    CHECK(names_in(dir.path()).empty());
  }
}

TEST_CASE("hidden and temporary image names are refused, plain ones are taken", "[registry][names]") {
  ScratchDir dir("names-hidden");
  ScratchDir src("names-hidden-src");
  Registry r = open_registry(dir.path());
  for (const std::string& file : {std::string(".hidden"), std::string(".tmp-k.bin"), std::string(".upload-1"),
                                  std::string("K.TOML"), std::string(256, 'a')}) {
    auto m = opaque_manifest("k", "1.0", file, src.path() / "img", "image bytes\n");
    auto added = r.add(m, src.path() / "img");
    REQUIRE_FALSE(added.is_ok());
    CHECK(added.error().code == Errc::invalid_manifest);
  }
  CHECK(names_in(dir.path()).empty());
  auto m = opaque_manifest("k", "1.0", "K_1.0+b-2.bin", src.path() / "img", "image bytes\n");
  auto added = r.add(m, src.path() / "img");
  REQUIRE(added.is_ok());
  CHECK(names_in(dir.path()) == std::set<std::string>{"K_1.0+b-2.bin", "k-1.0.toml"});
}

TEST_CASE("uploaded and on-disk manifests follow the same rule", "[registry][names]") {
  std::string text = "name = \"k\"\nversion = \"1.0\"\nkind = \"fpga\"\nfile = \"k-1.0.toml\"\nsha256 = \"" +
                     std::string(64, 'a') + "\"\nprogramming_seconds = 0\ncompatible = [\"*\"]\n";
  auto parsed = parse_manifest(text, "(uploaded)");
  REQUIRE_FALSE(parsed.is_ok());
  CHECK(parsed.error().code == Errc::invalid_manifest);
  CHECK_THAT(parsed.error().message, Catch::Contains("(uploaded)") && Catch::Contains("'file'"));
  auto nul = parse_manifest(replace_all(text, "k-1.0.toml", "k.bin\\u0000.toml"), "(uploaded)");
  REQUIRE_FALSE(nul.is_ok());
  CHECK(nul.error().code == Errc::invalid_manifest);

  // A folder written by hand: the manifest naming a .toml image is rejected at load, the image never read as one.
  ScratchDir dir("names-load");
  write_file(dir.path() / "img.toml", "not a manifest\n");
  write_file(dir.path() / "k.toml", replace_all(replace_all(text, "k-1.0.toml", "img.toml"), std::string(64, 'a'),
                                                *sha256_file(dir.path() / "img.toml")));
  Registry r = open_registry(dir.path());
  CHECK(r.list().empty());
  std::set<std::string> rejected;
  for (const auto& x : r.rejected()) {
    if (x.manifest_path.filename() == "k.toml") CHECK_THAT(x.error.message, Catch::Contains("'file'"));
    rejected.insert(x.manifest_path.filename().string());
  }
  CHECK(rejected == std::set<std::string>{"img.toml", "k.toml"});
}
