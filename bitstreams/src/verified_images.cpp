#include <accelpool/bitstreams/verified_images.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>

namespace accelpool::bitstreams {

std::optional<FileStamp> stamp_of(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                   static_cast<std::uint64_t>(st.st_size),
                   std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec,
                   std::int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec};
}

VerifiedImages::VerifiedImages(std::function<std::int64_t()> wall_clock_ns) : now_ns_(std::move(wall_clock_ns)) {
  if (!now_ns_) {
    now_ns_ = [] {
      return static_cast<std::int64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count());
    };
  }
}

Result<Bitstream> VerifiedImages::verify(const Bitstream& bitstream) {
  const std::string& key = bitstream.manifest.sha256;
  auto stamp = stamp_of(bitstream.file_path);
  {
    std::lock_guard lock(mu_);
    auto it = verified_.find(key);
    if (stamp && it != verified_.end() && it->second == *stamp) return bitstream;
    ++hashes_;
  }
  auto verified = verify_bitstream(bitstream.manifest, bitstream.manifest_path);
  std::lock_guard lock(mu_);
  verified_.erase(key);
  if (!verified) return verified.error();
  if (stamp && std::max(stamp->mtime_ns, stamp->ctime_ns) < now_ns_() - 1'000'000'000) verified_[key] = *stamp;
  return verified;
}

std::uint64_t VerifiedImages::hashes() const {
  std::lock_guard lock(mu_);
  return hashes_;
}

}  // namespace accelpool::bitstreams
