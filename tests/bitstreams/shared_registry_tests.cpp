// SharedRegistry (seeding a new registry folder, reading images by sha256) and base64.
#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>

#include <catch2/catch.hpp>

#include "sim_image.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <future>
#include <latch>
#include <thread>

using namespace accelpool::bitstreams;
using accelpool::Errc;
using namespace accelpool::bitstreams::test;
using accelpool::make_error;
using accelpool::Result;

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
  CHECK(base64_decode("Zm8").error().code == Errc::invalid_argument);
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
  CHECK((*reg)->read_image(std::string(64, '0'), 0, 10, total).error().code == Errc::not_found);

  // Removing one and opening again: the folder exists, so nothing is seeded back.
  REQUIRE((*reg)->remove("vadd", vadd->manifest.version).is_ok());
  auto again = SharedRegistry::open(dir.path() / "reg", build_samples);
  REQUIRE(again.is_ok());
  CHECK((*again)->list().size() == samples->list().size() - 1);
  CHECK((*again)->get("vadd").error().code == Errc::not_found);

  // No seed: an empty registry.
  auto empty = SharedRegistry::open(dir.path() / "empty");
  REQUIRE(empty.is_ok());
  CHECK((*empty)->list().empty());
}

using accelpool::testing::sim_image_manifest;

TEST_CASE("an add copies and hashes without the registry's lock, and of two racing adds of one name one wins",
          "[bitstreams][shared]") {
  ScratchDir dir("shared-add");
  auto opened = SharedRegistry::open(dir.path() / "reg");
  REQUIRE(opened.is_ok());
  auto reg = *opened;
  write_file(dir.path() / "one.bin", "first image");
  write_file(dir.path() / "two.bin", "second image");

  // While an add has staged and verified its image, lookups and another add go through: the lock is free.
  // (Were it held, the calls below would wait for the hook, which waits for them: the test would hang.)
  std::promise<void> staged, go_on;
  Result<Bitstream> first =
      make_error(Errc::internal, "not set yet");  // checked after the join (Catch2 asserts on one thread)
  std::thread adding([&] {
    first = reg->add(sim_image_manifest("one", "one.bin", "first image"), dir.path() / "one.bin", [&] {
      staged.set_value();
      go_on.get_future().wait();
    });
  });
  staged.get_future().wait();
  CHECK(reg->list().empty());
  CHECK(reg->find_by_sha256(sha256_bytes("first image")).error().code == Errc::not_found);
  CHECK(reg->add(sim_image_manifest("two", "two.bin", "second image"), dir.path() / "two.bin").is_ok());
  go_on.set_value();
  adding.join();
  CHECK(first.is_ok());
  CHECK(reg->list().size() == 2);

  // Two adds of one name@version that both staged before either inserted: the second to insert is refused and
  // leaves nothing behind.
  write_file(dir.path() / "a.bin", "image a");
  write_file(dir.path() / "b.bin", "image b");
  std::latch both_staged(2);
  auto racer = [&](const std::string& file, const std::string& bytes) {
    return reg->add(sim_image_manifest("same", file, bytes), dir.path() / file, [&] { both_staged.arrive_and_wait(); });
  };
  Result<Bitstream> ra = make_error(Errc::internal, "not set yet"), rb = make_error(Errc::internal, "not set yet");
  std::thread ta([&] { ra = racer("a.bin", "image a"); });
  std::thread tb([&] { rb = racer("b.bin", "image b"); });
  ta.join();
  tb.join();
  CHECK(ra.is_ok() != rb.is_ok());
  const auto& refused = ra.is_ok() ? rb : ra;
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::already_exists);
  auto same = reg->get("same");
  REQUIRE(same.is_ok());
  CHECK(read_file(same->file_path) == (ra.is_ok() ? "image a" : "image b"));
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "reg"))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{ra.is_ok() ? "a.bin" : "b.bin", "one-1.toml", "one.bin", "same-1.toml",
                                          "two-1.toml", "two.bin"});
}
