// A bitstream registry shared by threads. The manager's owner thread registers and removes images (admin API)
// and checks acquires, the in-process host locates images to program, and the
// agent listener serves image bytes to agents that fetch them by sha256.
//
// Threading: every call takes one lock. add copies and hashes the new image without it (taking it only to check
// and to insert), and read_image reads without it; verify holds it while it hashes.
#pragma once

#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/common/result.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::bitstreams {

class SharedRegistry {
 public:
  // Opens (creating it when missing) the registry folder `dir`. When the folder had to be created and `seed` is
  // a folder, every bitstream `seed` holds is registered into it (Registry::add: copied and verified), so a new
  // data folder starts with the sample images. Errors: "io_error" (cannot create `dir`), Registry::open's.
  static Result<std::shared_ptr<SharedRegistry>> open(const std::filesystem::path& dir,
                                                      const std::filesystem::path& seed = {});

  std::filesystem::path dir() const;
  std::vector<Bitstream> list() const;
  std::vector<Rejected> rejected() const;
  // As Registry::get (empty version: the highest). Errors: "not_found".
  Result<Bitstream> get(std::string_view name, std::string_view version = {}) const;
  // Errors: "not_found".
  Result<Bitstream> find_by_sha256(std::string_view sha256) const;
  // As Registry::verify: re-checks the image on disk (sha256 and format checks). With an empty version, the
  // highest version. Errors: "not_found", "missing_file", "checksum_mismatch", "corrupt_image".
  Result<Bitstream> verify(std::string_view name, std::string_view version = {}) const;
  // As Registry::add. On error the folder is unchanged. The image is copied and hashed without the lock; an add
  // of the same name@version or file that comes in meanwhile wins, and this one is "already_exists".
  // `staged_hook`, when set, runs once the image is staged and verified, before the lock is taken to insert it
  // (tests use it to order concurrent adds).
  Result<Bitstream> add(const Manifest& manifest, const std::filesystem::path& source_file,
                        const std::function<void()>& staged_hook = {});
  // As Registry::remove. Errors: "not_found", "io_error".
  Status remove(std::string_view name, std::string_view version);

  // Up to `max_bytes` bytes of the image whose sha256 is `sha256`, from `offset` (what an agent fetches, in
  // pieces). `total` receives the image's size. An offset at or past the end gives an empty piece.
  // Errors: "not_found", "io_error".
  Result<std::string> read_image(std::string_view sha256, std::uint64_t offset, std::size_t max_bytes,
                                 std::uint64_t& total) const;

 private:
  explicit SharedRegistry(Registry registry) : registry_(std::move(registry)) {}
  mutable std::mutex mu_;
  Registry registry_;
};

}  // namespace accelpool::bitstreams
