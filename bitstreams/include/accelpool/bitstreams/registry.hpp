// The bitstream registry: a folder of manifests (*.toml) and the image files they name.
//
// Loading verifies every manifest (fields, file present, sha256, format-specific checks: an .xclbin is read
// with XRT's parser and must target a platform the manifest lists and provide the kernels it names; OpenCL
// source must define the kernels it names). A manifest that fails is rejected, kept out of the registry and
// reported by rejected(); it is never handed out, so never programmed.
//
// Threading: a Registry object is not synchronised; one owner calls it (copies are independent snapshots).
#pragma once

#include <accelpool/bitstreams/manifest.hpp>
#include <accelpool/bitstreams/xclbin.hpp>
#include <accelpool/common/result.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::bitstreams {

// A verified bitstream.
struct Bitstream {
  Manifest manifest;
  std::filesystem::path manifest_path;  // absolute
  std::filesystem::path file_path;      // absolute
  std::uint64_t size_bytes = 0;
  std::optional<XclbinInfo> xclbin;  // set for format xclbin

  std::string id() const { return manifest.id(); }
};

struct Rejected {
  std::filesystem::path manifest_path;
  Error error;
};

class Registry {
 public:
  // Loads every *.toml manifest directly in `dir`. A bad manifest does not fail the load (see rejected()).
  // Errors: "not_found" when `dir` is not a folder.
  static Result<Registry> open(const std::filesystem::path& dir);

  // Re-reads the folder (e.g. after another process changed it). Errors as open(); on error nothing changes.
  Status reload();

  const std::filesystem::path& dir() const { return dir_; }

  // All loaded bitstreams, sorted by name then version.
  std::vector<Bitstream> list() const;

  // Manifests that failed verification at the last load, with the reason.
  const std::vector<Rejected>& rejected() const { return rejected_; }

  // The bitstream `name` at `version`; with an empty version, the highest version (numeric-aware order).
  // Errors: "not_found".
  Result<Bitstream> get(std::string_view name, std::string_view version = {}) const;

  // The bitstream whose image has this sha256 (what agents cache images by). Errors: "not_found".
  Result<Bitstream> find_by_sha256(std::string_view sha256) const;

  // Ok when `bitstream` may be programmed on a device of `device_model`; else "incompatible" naming both.
  static Status compatible(const Bitstream& bitstream, std::string_view device_model);

  // Re-checks the image on disk right before use (sha256 and format checks), since files can change after
  // loading. Errors: "not_found", "missing_file", "checksum_mismatch", "corrupt_image".
  Result<Bitstream> verify(std::string_view name, std::string_view version) const;

  // Registers a new bitstream: copies `source_file` into the folder as `manifest.file` and writes the manifest
  // as "<name>-<version>.toml". The image is copied to a temporary name, verified (sha256, format checks) and
  // renamed into place; the manifest is renamed into place last, so a crash leaves no half-registered entry.
  // Errors: "invalid_manifest", "already_exists" (same name@version, or manifest.file already present),
  // "missing_file", "checksum_mismatch", "corrupt_image", "io_error". On error the folder is unchanged.
  Result<Bitstream> add(const Manifest& manifest, const std::filesystem::path& source_file);

  // add() in steps, so that a caller that shares the registry copies and hashes without holding its lock:
  // can_add() (the cheap checks), stage() (no registry entry read: copies and verifies the image into `dir`
  // under a temporary name), commit() (checks again, since another registration may have come in between, and
  // renames the staged files into place). A Staged that is not committed removes its files.
  class Staged {
   public:
    Staged(Staged&& other) noexcept;
    Staged& operator=(Staged&&) = delete;
    ~Staged();

   private:
    friend class Registry;
    Staged() = default;
    Bitstream verified_;
    std::filesystem::path image_, manifest_file_;  // the temporary files; empty once renamed into place
  };
  // Errors: "invalid_manifest", "already_exists".
  Status can_add(const Manifest& manifest) const;
  // Errors: "invalid_manifest", "missing_file", "checksum_mismatch", "corrupt_image", "io_error".
  static Result<Staged> stage(const std::filesystem::path& dir, const Manifest& manifest,
                              const std::filesystem::path& source_file);
  // Errors: can_add's, "io_error". On error the folder is unchanged.
  Result<Bitstream> commit(Staged staged);

  // Removes a bitstream's manifest, then its image file. Refusing removal of images in use is the caller's
  // job (the registry does not know leases). Errors: "not_found", "io_error".
  Status remove(std::string_view name, std::string_view version);

 private:
  explicit Registry(std::filesystem::path dir) : dir_(std::move(dir)) {}

  std::filesystem::path dir_;
  std::map<std::string, Bitstream> by_id_;  // "name@version"
  std::vector<Rejected> rejected_;
};

// Verifies one manifest against its image (what Registry does per manifest). `manifest_path` locates the
// image (relative to its folder) and names it in messages.
Result<Bitstream> verify_bitstream(const Manifest& manifest, const std::filesystem::path& manifest_path);

// Orders versions numeric-aware: "1.10.0" > "1.9.2". Returns <0, 0, >0.
int compare_versions(std::string_view a, std::string_view b);

}  // namespace accelpool::bitstreams
