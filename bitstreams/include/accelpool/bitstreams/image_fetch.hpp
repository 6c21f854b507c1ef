// Fetching an image a host lacks from the manager, by sha256, into a local registry folder (the host's cache).
// The transport is the caller's: accelpool-agent asks over its agent link (image.manifest / image.read,
// docs/agent-protocol.md, "Images"), in pieces well under the link's line limit. What arrives is checked here
// exactly as an upload is.
#pragma once

#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/common/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace accelpool::bitstreams {

// Where the missing images come from. Both calls block until the answer arrives (or fail).
class ImageFetcher {
 public:
  virtual ~ImageFetcher() = default;

  struct Described {
    std::string manifest_toml;  // the image's manifest, as the manager's registry holds it
    std::uint64_t size = 0;     // the image file's size in bytes
  };
  // The manifest and size of image `sha256`. Errors: the source's ("not_found", "unavailable", ...).
  virtual Result<Described> describe(std::string_view sha256) = 0;
  // The piece of image `sha256` that starts at `offset` (< its size): at least one byte, at most what the
  // transport carries at once. Errors: the source's.
  virtual Result<std::string> read(std::string_view sha256, std::uint64_t offset) = 0;
};

// Returns the registry's bitstream with image `sha256`; when the registry lacks it, gets the manifest and the
// image from `from` piece by piece into a temporary file of the registry's folder, checks that the manifest
// names this sha256 and that the pieces add up to its size, and registers them (SharedRegistry::add verifies the
// bytes and the format before anything is stored; on any error the folder is unchanged). The registry's lock is
// not held while the pieces arrive nor while they are hashed: lookups of other images go on meanwhile.
// Errors: "invalid_argument" (not a sha256), "checksum_mismatch" (the manifest names another image, or the bytes
// do not hash to it), "unavailable" (the pieces do not add up), `from`'s errors, SharedRegistry::add's errors; messages
// start with "fetch image <sha256>".
Result<Bitstream> fetch_image(SharedRegistry& registry, std::string_view sha256, ImageFetcher& from);

}  // namespace accelpool::bitstreams
