// Verifying an image once per version of its file. Hashing a large image takes seconds, so whoever checks an
// image often (the manager's acquire check, a host right before programming) remembers how the file looked when
// it last verified (device, inode, size, modification and change times) and hashes it again only when that
// stamp changed.
//
// Threading: every call locks; any thread. The hash itself runs outside the lock.
#pragma once

#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/common/result.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace accelpool::bitstreams {

// What a file looks like now, without reading it.
struct FileStamp {
  std::uint64_t device = 0, inode = 0, size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// The stamp of `path`; nullopt when it cannot be stat'ed.
std::optional<FileStamp> stamp_of(const std::filesystem::path& path);

class VerifiedImages {
 public:
  // `wall_clock_ns`: wall time in nanoseconds since the epoch (file times are wall times); empty: the system
  // clock.
  explicit VerifiedImages(std::function<std::int64_t()> wall_clock_ns = {});

  // `bitstream` verified (verify_bitstream: sha256 and format checks), keyed by its image's sha256: when its file
  // still has the stamp it had when it last verified, without reading the file. File times tick coarsely, so a
  // stamp is remembered only once its file has not been written for a second (a file written within the last
  // second is hashed on every call). A failed verification forgets the stamp. Errors: verify_bitstream's
  // ("missing_file", "checksum_mismatch", "corrupt_image").
  Result<Bitstream> verify(const Bitstream& bitstream);

  // How many times an image was hashed (verified in full) so far.
  std::uint64_t hashes() const;

 private:
  std::function<std::int64_t()> now_ns_;
  mutable std::mutex mu_;
  std::map<std::string, FileStamp> verified_;  // sha256 -> the file's stamp when it last verified
  std::uint64_t hashes_ = 0;
};

}  // namespace accelpool::bitstreams
