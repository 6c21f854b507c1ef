#include <accelpool/bitstreams/image_fetch.hpp>

#include <fstream>
#include <random>

namespace accelpool::bitstreams {
namespace {

bool is_sha256(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

Result<Bitstream> fetch_image(SharedRegistry& registry, std::string_view sha256, ImageFetcher& from) {
  if (auto have = registry.find_by_sha256(sha256); have) return have;
  const std::string what = "fetch image " + std::string(sha256);
  if (!is_sha256(sha256)) return make_error(Errc::invalid_argument, what + ": not 64 lowercase hex digits");
  auto described = from.describe(sha256);
  if (!described) return make_error(described.error().code, what + ": " + described.error().message);
  auto manifest = parse_manifest(described->manifest_toml, what);
  if (!manifest) return manifest.error();
  if (manifest->sha256 != sha256)
    return make_error(Errc::checksum_mismatch, what + ": the manifest names image " + manifest->sha256);

  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const auto tmp = registry.dir() / (".fetch-" + std::to_string(rng()));
  struct RemoveOnExit {  // Registry::add copies the file: the temporary one goes in every case
    const std::filesystem::path& path;
    ~RemoveOnExit() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } remove_tmp{tmp};
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    for (std::uint64_t offset = 0; offset < described->size;) {
      auto piece = from.read(sha256, offset);
      if (!piece)
        return make_error(piece.error().code,
                          what + ": at byte " + std::to_string(offset) + ": " + piece.error().message);
      if (piece->empty() || piece->size() > described->size - offset)
        return make_error(Errc::unavailable, what + ": the piece at byte " + std::to_string(offset) + " has " +
                                                 std::to_string(piece->size()) + " bytes, but the image has " +
                                                 std::to_string(described->size));
      out.write(piece->data(), static_cast<std::streamsize>(piece->size()));
      offset += piece->size();
    }
    out.flush();
    if (!out) return make_error(Errc::io_error, what + ": cannot write " + tmp.string());
  }
  auto added = registry.add(*manifest, tmp);
  if (!added) return make_error(added.error().code, what + ": " + added.error().message);
  return added;
}

}  // namespace accelpool::bitstreams
