// SharedRegistry (seeding a new registry folder, reading images by sha256) and base64.
#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>

#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace accelpool::bitstreams;
using namespace accelpool::bitstreams::test;

TEST_CASE("base64 round-trips every length and refuses bad text", "[bitstreams][base64]") {
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    auto enc = base64_encode(bytes);
    CHECK(enc.size() == (bytes.size() + 2) / 3 * 4);
    auto dec = base64_decode(enc);
    REQUIRE(dec.is_ok());
    CHECK(*dec == bytes);
    bytes.push_back(static_cast<char>(i * 37));
  }
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(*base64_decode("Zm8=") == "fo");
  CHECK(base64_decode("Zm8").error().code == "invalid_argument");
  CHECK_THAT(base64_decode("Zm!v").error().message, Catch::Contains("offset 2"));
  CHECK_FALSE(base64_decode("Z=9v").is_ok());
  CHECK_FALSE(base64_decode("Zm=v").is_ok());
  CHECK_FALSE(base64_decode("Zm8=Zm8=").is_ok());
}

TEST_CASE("a new shared registry folder is seeded with the samples, an existing one is not", "[bitstreams][shared]") {
  ScratchDir dir("shared");
  auto reg = SharedRegistry::open(dir.path() / "reg", build_samples);
  REQUIRE(reg.is_ok());
  auto samples = Registry::open(build_samples);
  REQUIRE(samples.is_ok());
  REQUIRE_FALSE(samples->list().empty());
  CHECK((*reg)->list().size() == samples->list().size());
  CHECK((*reg)->rejected().empty());
  auto vadd = (*reg)->get("vadd");
  REQUIRE(vadd.is_ok());
  CHECK(vadd->file_path.parent_path() == dir.path() / "reg");
  CHECK((*reg)->verify("vadd").is_ok());

  // Reading the image in pieces, as an agent fetch does.
  std::uint64_t total = 0;
  auto head = (*reg)->read_image(vadd->manifest.sha256, 0, 10, total);
  REQUIRE(head.is_ok());
  CHECK(head->size() == 10);
  CHECK(total == vadd->size_bytes);
  auto rest = (*reg)->read_image(vadd->manifest.sha256, 10, 1 << 20, total);
  REQUIRE(rest.is_ok());
  CHECK(sha256_bytes(*head + *rest) == vadd->manifest.sha256);
  CHECK((*reg)->read_image(vadd->manifest.sha256, total + 5, 10, total)->empty());
  CHECK((*reg)->read_image(std::string(64, '0'), 0, 10, total).error().code == "not_found");

  // Removing one and opening again: the folder exists, so nothing is seeded back.
  REQUIRE((*reg)->remove("vadd", vadd->manifest.version).is_ok());
  auto again = SharedRegistry::open(dir.path() / "reg", build_samples);
  REQUIRE(again.is_ok());
  CHECK((*again)->list().size() == samples->list().size() - 1);
  CHECK((*again)->get("vadd").error().code == "not_found");

  // No seed: an empty registry.
  auto empty = SharedRegistry::open(dir.path() / "empty");
  REQUIRE(empty.is_ok());
  CHECK((*empty)->list().empty());
}
