// bitstreams::VerifiedImages, the verified-image cache the host runtime and the manager's acquire check share.
#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/verified_images.hpp>

#include <catch2/catch.hpp>

#include "scratch_dir.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>

using namespace accelpool;
using namespace accelpool::bitstreams;

namespace {

std::int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Bitstream entry_for(const std::filesystem::path& dir, const std::string& bytes) {
  std::ofstream(dir / "img.bin", std::ios::binary | std::ios::trunc) << bytes;
  Manifest m;
  m.name = "img";
  m.version = "1";
  m.kind = "fpga";
  m.compatible = {"*"};
  m.file = "img.bin";
  m.sha256 = sha256_bytes(bytes);
  std::ofstream(dir / "img-1.toml") << to_toml(m);
  auto b = verify_bitstream(m, dir / "img-1.toml");
  REQUIRE(b.is_ok());
  return *b;
}

}  // namespace

TEST_CASE("a verified image is hashed again only when its file's stamp changes", "[host][bitstreams]") {
  accelpool::testing::ScratchDir dir("verified");
  auto b = entry_for(dir.path(), "0123456789");
  std::int64_t now = wall_now_ns() + 10'000'000'000;  // the file has settled
  VerifiedImages cache([&] { return now; });
  REQUIRE(cache.verify(b).is_ok());
  REQUIRE(cache.verify(b).is_ok());
  CHECK(cache.hashes() == 1);

  // Rewritten (new size and times): hashed again, and the changed bytes are caught.
  std::ofstream(b.file_path, std::ios::binary | std::ios::trunc) << "tampered!!!";
  now = wall_now_ns() + 10'000'000'000;
  auto bad = cache.verify(b);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.error().code == Errc::checksum_mismatch);
  CHECK(cache.hashes() == 2);
  // A failed verification is not remembered.
  CHECK_FALSE(cache.verify(b).is_ok());
  CHECK(cache.hashes() == 3);

  std::filesystem::remove(b.file_path);
  CHECK_FALSE(stamp_of(b.file_path).has_value());
  CHECK(cache.verify(b).error().code == Errc::missing_file);
}

TEST_CASE("a file written within the last second is hashed on every verification", "[host][bitstreams]") {
  accelpool::testing::ScratchDir dir("verified-fresh");
  auto b = entry_for(dir.path(), "abc");
  const std::int64_t written = std::max(stamp_of(b.file_path)->mtime_ns, stamp_of(b.file_path)->ctime_ns);
  VerifiedImages cache([&] { return written + 500'000'000; });  // half a second after the file was written
  REQUIRE(cache.verify(b).is_ok());
  REQUIRE(cache.verify(b).is_ok());
  CHECK(cache.hashes() == 2);
}
